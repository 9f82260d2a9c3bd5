// Tests of the CPU ops run once per micro-kernel variant this CPU can run (kernels/cpu_isa.h),
// and check through the dispatcher's counts that the variant asked for is the one that ran.
#pragma once
#include <doctest/doctest.h>

#include <vector>

#include "kernels/cpu_isa.h"

namespace yolo::testing {

// baseline, then avx2 and avx512 where this CPU has them.
inline std::vector<CpuIsa> cpu_isas_here() {
  std::vector<CpuIsa> isas;
  for (int i = 0; i <= static_cast<int>(cpu_isa_best()); ++i) isas.push_back(static_cast<CpuIsa>(i));
  return isas;
}

// Uses `isa` for the scope, then the variant in use before; counts its runs of `kernel`.
class UseCpuIsa {
 public:
  UseCpuIsa(CpuIsa isa, CpuKernel kernel) : isa_(isa), kernel_(kernel), saved_(cpu_isa()) {
    set_cpu_isa(isa);
    runs_before_ = cpu_kernel_runs(kernel, isa);
  }
  ~UseCpuIsa() { set_cpu_isa(saved_); }
  UseCpuIsa(const UseCpuIsa&) = delete;
  UseCpuIsa& operator=(const UseCpuIsa&) = delete;
  // Calls of `kernel` in this variant since the scope began.
  uint64_t runs() const { return cpu_kernel_runs(kernel_, isa_) - runs_before_; }

 private:
  CpuIsa isa_;
  CpuKernel kernel_;
  CpuIsa saved_;
  uint64_t runs_before_ = 0;
};

}  // namespace yolo::testing
