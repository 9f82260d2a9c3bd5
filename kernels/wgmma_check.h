// Hopper's wgmma convolutions checked on the device itself before the planner trusts them. They
// were built against emulated twins that follow the PTX ISA as this project reads it; a fact the
// twins get wrong would otherwise train a network on wrong numbers without a word. Small shapes
// of every pass the planner may send to wgmma (bf16 and fp16: forward, backward data at stride 1
// and 2, weight gradient; tf32: forward, backward data), each through both operand sources (the
// gather, and TMA's im2col mode where the shape allows it), run against an FP64 reference of the
// operands as the tensor cores read them, within their precision's bound; one block walks all of a
// shape's tiles (persistent blocks), one shape having several. Every case runs, whatever the
// others did, and the planner reads one verdict per (precision, pass, source): a failure keeps
// that one off wgmma (or off im2col) and no other.
#pragma once
#include <string>
#include <vector>

#include "kernels/precision.h"
#include "kernels/tc_plan.h"

namespace yolo {

// How a wgmma pass brings its im2col operand (the forward's and backward data's A, the weight
// gradient's B; kernels/conv_wgmma.h): gathered by the producers' cp.async, or by TMA's im2col mode.
enum class WgmmaSource { Gather, Im2col };
const char* wgmma_source_name(WgmmaSource source);  // "gathered", "im2col"

// One case of the self-check and how it went.
struct WgmmaCheckCase {
  Precision precision = Precision::Bf16;  // bf16, fp16 or tf32
  tc::TcPass pass = tc::TcPass::Forward;  // Forward, BackwardData or BackwardWeights
  WgmmaSource source = WgmmaSource::Gather;
  std::string shape;    // "3x3 s1", "3x3 s2 tiles" (one block walks several), "3x3 s1 doubled"
  std::string failure;  // empty where it agreed with the reference; else how far off, or what it threw
  std::string name() const;  // "bf16 fwd, gathered, 3x3 s1"
};

// A device's cases, and the verdicts they give.
struct WgmmaVerdicts {
  std::vector<WgmmaCheckCase> cases;
  // Whether the key's cases all passed (false where no case checks it: there is no tf32 weight
  // gradient on wgmma).
  bool trusts(Precision precision, tc::TcPass pass, WgmmaSource source) const;
  // The planner's mask (tc::GpuDesc::wgmma_passes): the keys trusted with the gather, the source
  // every shape can take (a pass whose gather failed stays on mma.sync, im2col or not).
  unsigned gathered_passes() const;
  // One line per key with a failed case: the key, how many of its cases failed, the first reason.
  std::vector<std::string> failed_keys() const;
};

// Runs every case on the current device (it must run sm_90a code: current_device_runs_wgmma). A
// case that throws (the TMA encoder refusing a map, say) fails with what it threw. What cannot be
// recovered in this process throws yolo::Error naming YOLO_WGMMA=off: on a GPU, kernels that have
// not finished within 20 s (a hang), or an error that leaves the context unusable (an illegal
// address, say).
WgmmaVerdicts wgmma_self_check();

// The verdicts of the current device, checked at its first question (with the sm_90a probe, before
// any graph capture) and cached; a failed key prints one warning line naming it and what runs
// instead. Emulated devices trust every key without running the check (their twins are the
// reading of the ISA the check would compare against), unless a test set verdicts
// (EmulatedWgmmaVerdicts).
bool current_device_trusts_wgmma(Precision precision, tc::TcPass pass, WgmmaSource source);
unsigned current_device_wgmma_passes();  // WgmmaVerdicts::gathered_passes of the current device

// What the tensor cores make of an FP32 operand in TF32: a 1x1 convolution of 32 channels of
// 1 + 3 * 2^-12 by weights of 1 on wgmma. 32 where they drop the low 13 bits (as the twins assume),
// 32.03125 where they round to nearest (the check's tf32 cases would then fail).
double wgmma_tf32_probe();

#if !YOLO_CUDA
// While one lives, the current emulated device answers with `verdicts` (tests of the planner's
// and the convolutions' response to a failed key).
class EmulatedWgmmaVerdicts {
 public:
  explicit EmulatedWgmmaVerdicts(WgmmaVerdicts verdicts);
  ~EmulatedWgmmaVerdicts();
  EmulatedWgmmaVerdicts(const EmulatedWgmmaVerdicts&) = delete;
  EmulatedWgmmaVerdicts& operator=(const EmulatedWgmmaVerdicts&) = delete;

 private:
  WgmmaVerdicts verdicts_;
  const WgmmaVerdicts* previous_;
};
#endif

}  // namespace yolo
