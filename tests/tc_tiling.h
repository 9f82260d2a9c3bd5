// Forces the tensor-core planner's choice for a scope (kernels/gemm.h, set_tc_tiling_for_tests:
// tile, splits, pipeline; pipeline 3 forces wgmma where it can run) and restores automatic
// planning when the scope ends, also when a check fails.
#pragma once
#include "kernels/gemm.h"

namespace yolo::testing {

struct TcTiling {
  TcTiling(int tile, int splits, int pipeline) { set_tc_tiling_for_tests(tile, splits, pipeline); }
  ~TcTiling() { set_tc_tiling_for_tests(-1, 0, 0); }
  TcTiling(const TcTiling&) = delete;
  TcTiling& operator=(const TcTiling&) = delete;
};

}  // namespace yolo::testing
