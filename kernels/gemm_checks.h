// The argument checks every gemm entry point runs (kernels/gemm.cu, gemm_cpu.cpp): the shape's
// sizes and pitches, null pointers. Each throws yolo::Error naming the op.
#pragma once
#include <string>

#include "kernels/gemm.h"
#include "runtime/check.h"

namespace yolo::gemm_detail {

template <typename T>
inline void check_gemm_args(const char* op, const GemmShape& s, const T* a, const T* b, T* c) {
  s.validate(op);
  bool reads = size_t(s.m) * size_t(s.n) * size_t(s.k) > 0;
  if (reads && (a == nullptr || b == nullptr)) throw Error(std::string(op) + ": A or B is null");
  if (size_t(s.m) * size_t(s.n) > 0 && c == nullptr) throw Error(std::string(op) + ": C is null");
}

}  // namespace yolo::gemm_detail
