// The precisions convolutions and matrix products run in (--precision), what each needs of the
// device, and the element types they store. fp32 runs on CUDA cores (kernels/conv.cu, gemm.cu);
// tf32, bf16 and fp16 on tensor cores through mma.sync (kernels/conv_tc.cu), accumulating in FP32.
//   tf32: FP32 tensors, rounded to TF32 (10 mantissa bits) on the way into the MMA; sm_80+.
//   bf16: activations, weights and activation gradients stored as Bf16; sm_80+.
//   fp16: the same as Fp16; sm_75+ (the T4 path).
// Weight gradients, bias and its gradient stay FP32 in every precision.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>

#include "kernels/half_types.h"

namespace yolo {

enum class Precision { Fp32, Tf32, Bf16, Fp16 };

const char* precision_name(Precision p);  // "fp32", "tf32", "bf16", "fp16"
// The precision named `name` (as precision_name writes it); throws yolo::Error naming `what` (a
// flag or cfg option) and the choices otherwise.
Precision parse_precision(const std::string& name, const std::string& what);
// Whether activations and their gradients are stored in 16 bits (bf16, fp16).
constexpr bool stores_16_bits(Precision p) { return p == Precision::Bf16 || p == Precision::Fp16; }
// Bytes of one stored activation element in `p`.
constexpr size_t activation_bytes(Precision p) { return stores_16_bits(p) ? 2 : 4; }
// "auto" (as nullopt) or a precision name, as parse_precision.
std::optional<Precision> parse_precision_choice(const std::string& name, const std::string& what);
// --precision auto: bf16 on sm_80 and newer, fp16 on sm_75 (a T4), fp32 below that and on the
// CPU backend (runs_kernels false). `why`, when set, gets the reason in words.
Precision automatic_precision(bool runs_kernels, int compute_capability, std::string* why = nullptr);
// The lowest compute capability (10*major + minor) that runs `p` (0 for fp32: any).
int min_compute_capability(Precision p);
// The compute capability of the device kernels launch on now: the current GPU's, or under
// emulation the current emulated device's (90 when none is current).
int current_compute_capability();
// Throws yolo::Error naming `op`, the precision and the device's sm_XY unless the current
// device runs `p` on its tensor cores.
void require_precision(Precision p, const char* op);

// The tensor-core precision of element type T: float -> tf32, Bf16 -> bf16, Fp16 -> fp16.
template <typename T>
constexpr Precision tc_precision() {
  if constexpr (std::is_same_v<T, float>) return Precision::Tf32;
  else if constexpr (std::is_same_v<T, Bf16>) return Precision::Bf16;
  else return Precision::Fp16;
}

}  // namespace yolo
