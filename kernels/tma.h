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
// Throws yolo::Error naming the rule a map breaks: a 16-byte aligned base (128-byte with a
// swizzle: swizzled_base_fits), a row stride that is a multiple of 16 bytes, dimensions of
// 1..2^32, a box of 1..256 per dimension whose rows are a multiple of 16 bytes and, with a
// swizzle, no wider than it.
TensorMap encode_2d(const void* base, uint64_t cols, uint64_t rows, uint64_t row_stride_bytes, uint32_t box_cols,
                    uint32_t box_rows, int swizzle);

// Whether a swizzled map may start at `base`: 128-byte aligned, as the CUDA Programming Guide's
// TMA swizzle section asks (the driver's encoder itself asks 16). The wgmma passes check it before
// they choose a TMA operand: where it fails they gather instead, or stay on mma.sync.
bool swizzled_base_fits(const void* base);
// While one lives on this thread, swizzled maps may start 16-byte aligned (the driver's rule): for
// the GPU check that asks the hardware whether the Guide's 128 bytes matter
// (tests/test_kernel_wgmma.cpp).
class DriverBaseRule {
 public:
  DriverBaseRule();
  ~DriverBaseRule();
  DriverBaseRule(const DriverBaseRule&) = delete;
  DriverBaseRule& operator=(const DriverBaseRule&) = delete;

 private:
  bool previous_;
};

// An im2col map of an NHWC tensor (cuTensorMapEncodeIm2col, rank 4: dimensions C, W, H, N from
// the innermost). One load (tma.cuh: load_im2col) moves `pixels_per_column` pixels of
// `channels_per_pixel` elements each, one row of the box per pixel. The pixels are those a
// traversal visits inside the bounding box, per image: W from lower_w to w + upper_w
// (exclusive), then H likewise, then the next image, in steps of `stride` in W and H. The load's
// coordinates name the first pixel (inside the box) and the channel it starts at; its offsets
// (a filter tap) shift where each visited pixel is read, and pixels then outside the tensor read
// as zeros. For a convolution of padding p: lower = -p, upper = (out - 1) * stride + 1 - size - p
// (the box then visits exactly the output pixels' top-left taps).
struct Im2colNhwc {
  const void* base;
  uint32_t element_bytes;       // 2 (BF16, FP16) or 4 (FP32, read as TF32)
  uint64_t n, h, w, c;          // the tensor (c: the channels the map may read)
  uint64_t pixel_stride_bytes;  // consecutive pixels' distance (a channel slice: more than c)
  int lower_h, lower_w, upper_h, upper_w;
  uint32_t stride;              // the traversal's step in H and W, 1..8
  uint32_t channels_per_pixel, pixels_per_column;
  int swizzle;                  // as encode_2d's
};
// Throws yolo::Error naming the rule a map breaks: encode_2d's alignment (swizzled_base_fits with a
// swizzle), dimension and stride rules (the row and image strides follow from the pixel stride),
// corners within -128..127 (rank 4) and a box of at least one pixel, 1..256 channels a pixel whose
// bytes are a multiple of 16 and fit the swizzle, 1..1024 pixels a load, a stride of 1..8.
TensorMap encode_im2col(const Im2colNhwc& tensor);

// The im2col loads the emulated TMA has run (tests check which path a kernel took); 0 natively.
unsigned long long emulated_im2col_loads();

}  // namespace yolo::tma
