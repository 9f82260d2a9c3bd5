// The CPU micro-kernels' instruction set (see cpu_isa.h). Compiled for the baseline: it only
// asks the CPU what it has.
#include "kernels/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "runtime/check.h"

namespace yolo {
namespace {

// GCC's __builtin_cpu_supports reads CPUID and, for AVX and AVX-512, whether the OS saves
// those registers (XGETBV), as libgcc's cpuinfo does.
CpuIsa detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return CpuIsa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::Avx2;
#endif
  return CpuIsa::Baseline;
}

// Each variant's table is built on its first use, by its own file's function: that function is
// compiled for its ISA too (avx512_tiles copies the table with zmm stores), so it may only run
// where the CPU has it. (One table of all three, built at once, died of SIGILL on AVX2 CPUs.)
const cpu_micro::Tiles& tiles_of(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512: {
      static const cpu_micro::Tiles tiles = cpu_micro::avx512_tiles();
      return tiles;
    }
    case CpuIsa::Avx2: {
      static const cpu_micro::Tiles tiles = cpu_micro::avx2_tiles();
      return tiles;
    }
    case CpuIsa::Baseline:
      break;
  }
  static const cpu_micro::Tiles tiles = cpu_micro::baseline_tiles();
  return tiles;
}

CpuIsa parse_isa(const std::string& text, const char* where) {
  for (int i = 0; i < kCpuIsaCount; ++i)
    if (text == cpu_isa_name(static_cast<CpuIsa>(i))) return static_cast<CpuIsa>(i);
  throw Error(std::string(where) + "=" + text + ": not an instruction set (baseline, avx2 or avx512)");
}

void check_runs_here(CpuIsa isa, const char* where) {
  if (static_cast<int>(isa) > static_cast<int>(cpu_isa_best()))
    throw Error(std::string(where) + ": " + cpu_isa_name(isa) + " is not available on this CPU (the best here is " +
                cpu_isa_name(cpu_isa_best()) + ")");
}

CpuIsa initial_isa() {
  const char* env = std::getenv("YOLO_CPU_ISA");
  if (!env || !*env) return cpu_isa_best();
  const CpuIsa isa = parse_isa(env, "YOLO_CPU_ISA");
  check_runs_here(isa, "YOLO_CPU_ISA");
  return isa;
}

std::atomic<int>& current() {
  static std::atomic<int> isa{static_cast<int>(initial_isa())};
  return isa;
}

std::atomic<uint64_t> g_runs[kCpuKernelCount][kCpuIsaCount];

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Avx512:
      return "avx512";
    default:
      return "baseline";
  }
}

CpuIsa cpu_isa_best() {
  static const CpuIsa best = detect();
  return best;
}

CpuIsa cpu_isa() { return static_cast<CpuIsa>(current().load(std::memory_order_relaxed)); }

void set_cpu_isa(CpuIsa isa) {
  check_runs_here(isa, "set_cpu_isa");
  current().store(static_cast<int>(isa));
}

std::string cpu_isa_text() {
  const cpu_micro::Tiles& t = cpu_micro_tiles();
  std::string text = std::string(cpu_isa_name(cpu_isa())) + " micro-kernels (" + std::to_string(t.mr) + "x" +
                     std::to_string(t.nr) + " blocks; best here: " + cpu_isa_name(cpu_isa_best());
  if (cpu_isa_best() != CpuIsa::Baseline) text += "; YOLO_CPU_ISA=baseline|avx2|avx512 for a lower one";
  return text + ")";
}

const cpu_micro::Tiles& cpu_micro_tiles() { return tiles_of(cpu_isa()); }

void count_cpu_kernel(CpuKernel kernel, CpuIsa isa) {
  g_runs[static_cast<int>(kernel)][static_cast<int>(isa)].fetch_add(1, std::memory_order_relaxed);
}

uint64_t cpu_kernel_runs(CpuKernel kernel, CpuIsa isa) {
  return g_runs[static_cast<int>(kernel)][static_cast<int>(isa)].load(std::memory_order_relaxed);
}

}  // namespace yolo
