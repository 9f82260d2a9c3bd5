// TMA loads into shared memory (sm_90): cp.async.bulk.tensor.2d of one box of a tiled tensor
// map, or .4d.im2col of an im2col one (kernels/tma.h), written through the async proxy in the map's swizzle and counted on an
// mbarrier's transaction count (the mbarrier's phase completes once the bytes an
// mbarrier_arrive_expect_tx announced have landed). Inline PTX under nvcc; under emulation a
// twin that copies the box at once, zero-fills what lies outside the tensor, and reports the
// write and its bytes to runtime/emu/warpgroup.cpp (which publishes them by that phase alone).
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

// A box's shared destination: 128-byte aligned, and where a swizzle's pattern starts (1024, 512 or
// 256 bytes: the pattern is taken from the address's own bits, so a box elsewhere would land
// permuted against what wgmma's descriptors read).
inline void check_destination(uint32_t dst, wgmma::Swizzle s) {
  const uint32_t pattern = s == wgmma::Swizzle::None ? 128 : 8 * wgmma::swizzle_bytes(s);
  if (dst % pattern != 0)
    throw Error("TMA: the shared destination " + std::to_string(dst) + " is not " + std::to_string(pattern) +
                "-byte aligned" + (s == wgmma::Swizzle::None ? "" : " (where its swizzle pattern starts)"));
}

inline void load_2d(uint32_t dst, const TensorMap& map, int col, int row, uint32_t bar) {
  Map m;
  std::memcpy(&m, map.bytes, sizeof m);
  if (m.magic != kMagic) throw Error("TMA: the tensor map was not made by tma::encode_2d");
  const wgmma::Swizzle s = wgmma::Swizzle(m.swizzle);
  check_destination(dst, s);
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
  yolo::emu::async_copy_landed(box, bytes, bar);
}

// The im2col maps of encode_im2col.
constexpr uint64_t kIm2colMagic = 0x4c4f43324d494d54ull;
struct Im2colMap {
  uint64_t magic;
  Im2colNhwc tensor;
};

void count_im2col_load();  // for emulated_im2col_loads (tma.h)

// The traversal of tma.h (Im2colNhwc), one pixel a box row. The first pixel must lie inside the
// bounding box (the twin refuses otherwise: a kernel that computed its coordinates wrongly).
inline void load_im2col(uint32_t dst, const TensorMap& map, int c, int w, int h, int n, uint16_t off_w,
                        uint16_t off_h, uint32_t bar) {
  Im2colMap m;
  std::memcpy(&m, map.bytes, sizeof m);
  if (m.magic != kIm2colMagic) throw Error("TMA im2col: the tensor map was not made by tma::encode_im2col");
  const Im2colNhwc& t = m.tensor;
  const wgmma::Swizzle s = wgmma::Swizzle(t.swizzle);
  check_destination(dst, s);
  const uint32_t row_bytes = t.channels_per_pixel * t.element_bytes, bytes = row_bytes * t.pixels_per_column;
  if (s != wgmma::Swizzle::None && row_bytes != wgmma::swizzle_bytes(s))
    throw Error("TMA (emulated): a box row narrower than its swizzle is not emulated");
  const int64_t end_w = int64_t(t.w) + t.upper_w, end_h = int64_t(t.h) + t.upper_h;  // exclusive
  if (w < t.lower_w || w >= end_w || h < t.lower_h || h >= end_h)
    throw Error("TMA im2col (emulated): the first pixel (w " + std::to_string(w) + ", h " + std::to_string(h) +
                ") lies outside the bounding box");
  unsigned char* box = static_cast<unsigned char*>(yolo::emu::shared_pointer(dst, bytes));
  int64_t x = w, y = h, image = n;  // the traversal's position, before the offsets
  for (uint32_t p = 0; p < t.pixels_per_column; ++p) {
    const int64_t gx = x + off_w, gy = y + off_h;
    const bool pixel_inside = image >= 0 && uint64_t(image) < t.n && gy >= 0 && uint64_t(gy) < t.h && gx >= 0 &&
                              uint64_t(gx) < t.w;
    for (uint32_t ch = 0; ch < t.channels_per_pixel; ++ch) {
      const int64_t gc = int64_t(c) + ch;
      unsigned char value[4] = {};
      if (pixel_inside && gc >= 0 && uint64_t(gc) < t.c)
        std::memcpy(value,
                    static_cast<const unsigned char*>(t.base) +
                        ((uint64_t(image) * t.h + uint64_t(gy)) * t.w + uint64_t(gx)) * t.pixel_stride_bytes +
                        uint64_t(gc) * t.element_bytes,
                    t.element_bytes);
      uint32_t address = dst + p * row_bytes + ch * t.element_bytes;
      if (s != wgmma::Swizzle::None) address = wgmma::swizzled(address, s);
      std::memcpy(box + (address - dst), value, t.element_bytes);
    }
    if ((x += t.stride) >= end_w) {
      x = t.lower_w;
      if ((y += t.stride) >= end_h) y = t.lower_h, ++image;
    }
  }
  count_im2col_load();
  yolo::emu::async_copy_landed(box, bytes, bar);
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

// The im2col box of `map` (encode_im2col; a __grid_constant__ kernel parameter) whose first pixel
// is (n, h, w) in the traversal's coordinates, from channel c, every pixel read at the tap
// (off_h, off_w) from it, to shared memory at `dst` as load_2d's box goes; `bar` completes by the
// whole box's bytes.
__device__ __forceinline__ void load_im2col(void* dst, const TensorMap* map, int c, int w, int h, int n, uint16_t off_w,
                                            uint16_t off_h, uint64_t* bar) {
#if YOLO_MBARRIER_NATIVE
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};"
      ::"r"(wgmma::shared_address(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(w), "r"(h), "r"(n),
      "r"(wgmma::shared_address(bar)), "h"(off_w), "h"(off_h)
      : "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  emulated::load_im2col(wgmma::shared_address(dst), *map, c, w, h, n, off_w, off_h, wgmma::shared_address(bar));
#endif
}

}  // namespace yolo::tma
