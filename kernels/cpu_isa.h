// Which instruction set the CPU ops' micro-kernels use (kernels/cpu_micro.h): chosen once, by
// CPUID (and the OS's saved register state), as the best this machine runs: AVX-512, else AVX2
// with FMA, else the x86-64 baseline. YOLO_CPU_ISA=baseline|avx2|avx512 asks for a lower one
// (a higher one than the CPU has is an error). One binary runs on every x86-64 machine.
//
// Results are deterministic for a given variant and independent of the thread count, but differ
// between variants in the last bits (FMA rounds once): a resume on a machine with another
// variant is not bit-exact. The optimizer does not use them: its bits do not depend on the ISA.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/cpu_micro.h"

namespace yolo {

enum class CpuIsa : int { Baseline = 0, Avx2 = 1, Avx512 = 2 };
constexpr int kCpuIsaCount = 3;

const char* cpu_isa_name(CpuIsa isa);  // "baseline", "avx2", "avx512"
CpuIsa cpu_isa_best();                 // what this CPU and OS can run
CpuIsa cpu_isa();                      // in use (YOLO_CPU_ISA read on first use)
// Tests and benchmarks: use `isa` from now on (process-wide; not while CPU ops run). Throws
// yolo::Error when this CPU cannot run it.
void set_cpu_isa(CpuIsa isa);
// For --list-devices: "avx512 (best here: avx512; YOLO_CPU_ISA=baseline|avx2 for a lower one)".
std::string cpu_isa_text();

// The micro-kernels of the variant in use.
const cpu_micro::Tiles& cpu_micro_tiles();

// Which variant each CPU op ran (the Tiles' own `variant`): counted on every call (tests assert
// it, so that code running only the baseline cannot pass them all).
// Batchnorm's counts are of its per-ISA channel loops (linear and leaky only: see batchnorm_cpu.cpp).
enum class CpuKernel : int {
  ConvForward = 0,
  ConvBackwardData,
  ConvBackwardWeights,
  Gemm,
  BatchnormForward,
  BatchnormBackward,
  MaxpoolForward,
  MaxpoolBackward
};
constexpr int kCpuKernelCount = 8;
void count_cpu_kernel(CpuKernel kernel, CpuIsa isa);
uint64_t cpu_kernel_runs(CpuKernel kernel, CpuIsa isa);

}  // namespace yolo
