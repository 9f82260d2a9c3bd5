// Tensor maps for Hopper's tensor memory accelerator (TMA): a 2-D tiled map of 16-bit elements
// (rows of `cols` elements, `row_stride_bytes` apart), moved one box of box_cols x box_rows at a
// time into shared memory in a swizzle wgmma reads (kernels/tma.cuh loads with it). The rules
// of cuTensorMapEncodeTiled (CUDA driver API documentation) are checked here first, so a GPU and
// the emulation refuse the same maps with the same message; on a GPU the driver's encoder,
// reached through cudaGetDriverEntryPointByVersion (only the static runtime is linked), then
// writes the opaque 128 bytes; under emulation they hold the emulation's own fields.
#pragma once
#include <cstdint>

namespace yolo::tma {

// The map as a kernel takes it: `const __grid_constant__ TensorMap` (a GPU reads it in the
// parameter space, where the TMA unit finds it; it must not be copied into local memory).
struct alignas(128) TensorMap {
  unsigned char bytes[128];
};

// The swizzles of wgmma.cuh's Swizzle codes: 0 none, 1 128-byte, 2 64-byte, 3 32-byte.
// Throws yolo::Error naming the rule a map breaks: a 16-byte aligned base, a row stride that is
// a multiple of 16 bytes, dimensions of 1..2^32, a box of 1..256 per dimension whose rows are a
// multiple of 16 bytes and, with a swizzle, no wider than it.
TensorMap encode_2d(const void* base, uint64_t cols, uint64_t rows, uint64_t row_stride_bytes, uint32_t box_cols,
                    uint32_t box_rows, int swizzle);

}  // namespace yolo::tma
