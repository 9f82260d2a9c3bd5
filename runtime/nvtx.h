// Named ranges of host time for Nsight Systems (NVTX) in builds with CUDA; nothing elsewhere.
// Guard the calls with kNvtxRanges so that other builds do not even build the names.
#pragma once
#include <string>

namespace yolo {

constexpr bool kNvtxRanges = YOLO_CUDA != 0;
void nvtx_push(const std::string& name);
void nvtx_pop();

}  // namespace yolo
