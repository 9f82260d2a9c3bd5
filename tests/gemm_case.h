// A gemm test case: the shape, bias and accumulate, and the stored sizes of A, B and C (rows x
// pitch) that tests/test_kernel_gemm.cpp and _gemm_tc.cpp allocate.
#pragma once
#include <cstddef>
#include <string>

#include "kernels/gemm.h"

namespace yolo::testing {

struct GemmCase {
  GemmShape s;
  bool bias = true, accumulate = false;
  // Stored sizes of A, B and C (rows x pitch).
  size_t a_size() const { return size_t(s.trans_a ? s.k : s.m) * s.a_pitch(); }
  size_t b_size() const { return size_t(s.trans_b ? s.n : s.k) * s.b_pitch(); }
  size_t c_size() const { return size_t(s.m) * s.c_pitch(); }
  bool in_c(size_t i) const { return int(i % size_t(s.c_pitch())) < s.n; }
  std::string describe() const {
    return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + (s.trans_a ? " A^T" : " A") +
           (s.trans_b ? " B^T" : " B") + " pitches " + std::to_string(s.a_pitch()) + "/" + std::to_string(s.b_pitch()) +
           "/" + std::to_string(s.c_pitch()) + (bias ? " bias" : "") + (accumulate ? " accumulate" : "");
  }
};

}  // namespace yolo::testing
