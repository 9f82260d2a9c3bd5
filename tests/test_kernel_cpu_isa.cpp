// The CPU micro-kernels' dispatcher (kernels/cpu_isa.h): the best variant is what the CPU
// reports, YOLO_CPU_ISA picks a lower one (a fresh process: it is read once), a variant the CPU
// lacks or a misspelt one is refused naming the variable. The kernels themselves are checked
// against the references per variant in test_kernel_conv.cpp and test_kernel_gemm.cpp.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "kernels/cpu_isa.h"
#include "tests/cpu_isa_fixtures.h"
#include "runtime/check.h"
#include "tests/child_process.h"
#include "tests/test_support.h"

using namespace yolo;
using yolo::testing::ChildProcess;
using yolo::testing::TempDir;

// Prints the variant in use and exits with its number (9: refused).
TEST_ROLE(cpu_isa_in_use) {
  try {
    const CpuIsa isa = cpu_isa();
    std::printf("in use: %s\n", cpu_isa_text().c_str());
    return static_cast<int>(isa);
  } catch (const Error& e) {
    std::printf("error: %s\n", e.what());
    return 9;
  }
}

TEST_CASE("cpu micro-kernels: the best variant the CPU has; YOLO_CPU_ISA forces a lower one, refuses others") {
  __builtin_cpu_init();
  const CpuIsa expected = __builtin_cpu_supports("avx512f")                                 ? CpuIsa::Avx512
                          : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? CpuIsa::Avx2
                                                                                            : CpuIsa::Baseline;
  CHECK(cpu_isa_best() == expected);
  MESSAGE("this CPU: " << std::string(cpu_isa_name(cpu_isa_best())));
  TempDir dir;
  auto run = [&](const std::string& value, std::string* log) {
    ChildProcess child("cpu_isa_in_use", {"YOLO_CPU_ISA=" + value}, dir / "isa.log");
    const int code = child.wait(30);
    std::ifstream in(dir / "isa.log");
    *log = std::string(std::istreambuf_iterator<char>(in), {});
    return code;
  };
  std::string log;
  for (int i = 0; i <= static_cast<int>(cpu_isa_best()); ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    CHECK(run(cpu_isa_name(isa), &log) == i);
    CHECK(log.find(std::string("in use: ") + cpu_isa_name(isa) + " micro-kernels") != std::string::npos);
  }
  CHECK(run("avx1024", &log) == 9);
  CHECK(log.find("YOLO_CPU_ISA=avx1024: not an instruction set (baseline, avx2 or avx512)") != std::string::npos);
  if (cpu_isa_best() != CpuIsa::Avx512) {
    const CpuIsa above = static_cast<CpuIsa>(static_cast<int>(cpu_isa_best()) + 1);
    CHECK(run(cpu_isa_name(above), &log) == 9);
    CHECK(log.find("is not available on this CPU") != std::string::npos);
    CHECK_THROWS_WITH_AS(set_cpu_isa(above), doctest::Contains("not available on this CPU"), Error);
  }
}

// bench_kernels' %peak on the CPU divides by what this loop reaches (tools/ceilings.cu), so it must
// run the flops it claims: kPeakChains chains, each as wide as the variant's vectors.
TEST_CASE("cpu micro-kernels: each variant's multiply-add ceiling loop computes all its chains and lanes") {
  const CpuIsa saved = cpu_isa();
  for (const CpuIsa isa : yolo::testing::cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    set_cpu_isa(isa);
    const cpu_micro::Tiles& tiles = cpu_micro_tiles();
    CHECK(tiles.peak_lanes == 4 << static_cast<int>(isa));  // SSE2, AVX2, AVX-512: 4, 8, 16 floats
    const long steps = 777;
    const float seed = 0.37f;
    double expected = 0;
    for (int k = 0; k < cpu_micro::kPeakChains; ++k) {
      double v = double(seed) * (k + 1);
      for (long i = 0; i < steps; ++i) v = v * double(0.999f) + double(0.001f);
      expected += v * tiles.peak_lanes;
    }
    CHECK(tiles.peak(steps, seed) == doctest::Approx(expected).epsilon(1e-4));
  }
  set_cpu_isa(saved);
}
