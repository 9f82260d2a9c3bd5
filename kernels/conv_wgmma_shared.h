// What the wgmma convolutions (kernels/conv_wgmma.cu: forward, conv_wgmma_data.cu: backward
// data, conv_wgmma_weights.cu: weight gradient) share, defined in conv_wgmma_shared.cu: the im2col
// tensor maps they read their input through (kernels/tma.h), the choice of that source, the
// launch checks. Internal to those files (and tests/test_kernel_tma_im2col.cpp, which checks
// the maps' boxes against a convolution's im2col rows).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/conv.h"
#include "kernels/conv_wgmma.h"
#include "kernels/tma.h"

namespace yolo::wgmma {

constexpr size_t kMaxRowTiles = 65535;  // a grid's y: a tile of 128 pixels each

// Throws yolo::Error naming `op` where the current device runs no sm_90a code.
void require_wgmma(const char* op);

// Whether an im2col map can describe the convolution's taps: a stride of at most 8 (the
// traversal's), a kernel of at most 16 (the taps' offsets), corners within -128..127.
bool conv_im2col_geometry_fits(const Conv2dShape& s);

// A map of the convolution's input (`data`, pixels `pixel_stride_bytes` apart, c_in channels
// of `element_bytes`) whose boxes hold `pixels_per_column` consecutive output pixels' im2col rows
// at one tap (the load's offsets), `channels_per_pixel` channels from the load's channel, in the
// 128-byte swizzle: the bounding box from -pad to (out - 1) * stride + 1 - size - pad and the
// traversal's stride walk the output pixels' top-left taps; a load's first pixel is its first
// output pixel's (ox * stride - pad, oy * stride - pad, b).
tma::TensorMap conv_im2col_map(const Conv2dShape& s, const void* data, uint64_t pixel_stride_bytes,
                               uint32_t element_bytes, uint32_t channels_per_pixel, uint32_t pixels_per_column);

// Resolves `input` for a pass (`op`: `pass` in `precision`) whose im2col path `fits`: Im2col
// where it does not throws naming what the path `needs`; Auto takes it where it fits and the
// device's self-check passed that pass through im2col (kernels/wgmma_check.h).
bool uses_im2col(bool fits, WgmmaInput input, const char* op, const std::string& needs, Precision precision,
                 tc::TcPass pass);

}  // namespace yolo::wgmma
