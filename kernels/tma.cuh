// TMA loads into shared memory (sm_90): cp.async.bulk.tensor.2d of one box of a tensor map
// (kernels/tma.h), written through the async proxy in the map's swizzle and counted on an
// mbarrier's transaction count (the mbarrier's phase completes once the bytes an
// mbarrier_arrive_expect_tx announced have landed). Inline PTX under nvcc; under emulation a
// twin that copies the box at once, zero-fills what lies outside the tensor, and reports the
// write and its bytes to runtime/emu/warpgroup.cpp.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common.cuh"
#include "kernels/tma.h"
#include "kernels/wgmma.cuh"

namespace yolo::tma {

#if !defined(__CUDACC__)
namespace emulated {

constexpr uint64_t kMagic = 0x4d415445554d4554ull;  // marks maps tma::encode_2d made
struct Map {
  uint64_t magic;
  const void* base;
  uint64_t cols, rows, row_stride;
  uint32_t box_cols, box_rows, swizzle;
};

inline void load_2d(uint32_t dst, const TensorMap& map, int col, int row, uint32_t bar) {
  Map m;
  std::memcpy(&m, map.bytes, sizeof m);
  if (m.magic != kMagic) throw Error("TMA: the tensor map was not made by tma::encode_2d");
  if (dst % 128 != 0) throw Error("TMA: the shared destination " + std::to_string(dst) + " is not 128-byte aligned");
  const wgmma::Swizzle s = wgmma::Swizzle(m.swizzle);
  const uint32_t row_bytes = m.box_cols * 2, bytes = row_bytes * m.box_rows;
  if (s != wgmma::Swizzle::None && row_bytes != wgmma::swizzle_bytes(s))
    throw Error("TMA (emulated): a box row narrower than its swizzle is not emulated");
  unsigned char* box = static_cast<unsigned char*>(yolo::emu::shared_pointer(dst, bytes));
  for (uint32_t r = 0; r < m.box_rows; ++r)
    for (uint32_t c = 0; c < m.box_cols; ++c) {
      const int64_t gr = int64_t(row) + r, gc = int64_t(col) + c;
      uint16_t v = 0;
      if (gr >= 0 && gc >= 0 && uint64_t(gr) < m.rows && uint64_t(gc) < m.cols)
        std::memcpy(&v, static_cast<const unsigned char*>(m.base) + uint64_t(gr) * m.row_stride + uint64_t(gc) * 2, 2);
      uint32_t address = dst + r * row_bytes + c * 2;
      if (s != wgmma::Swizzle::None) address = wgmma::swizzled(address, s);
      std::memcpy(box + (address - dst), &v, 2);
    }
  yolo::emu::note_async_shared_write(box, bytes);
  yolo::emu::mbarrier_complete_tx(bar, bytes);
}

}  // namespace emulated
#endif

// The box whose first element is (col, row) of `map` (a __grid_constant__ kernel parameter) to
// shared memory at `dst` (128-byte aligned; 1024 for the 128-byte swizzle to start its pattern),
// completing `bar`'s transactions by the box's bytes (out-of-bounds elements count: they are
// written as zeros).
__device__ __forceinline__ void load_2d(void* dst, const TensorMap* map, int col, int row, uint64_t* bar) {
#if YOLO_MBARRIER_NATIVE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(wgmma::shared_address(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row),
      "r"(wgmma::shared_address(bar))
      : "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  emulated::load_2d(wgmma::shared_address(dst), *map, col, row, wgmma::shared_address(bar));
#endif
}

}  // namespace yolo::tma
