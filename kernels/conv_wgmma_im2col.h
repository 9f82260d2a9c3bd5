// The im2col tensor maps the wgmma convolutions read their input through (kernels/tma.h), shared
// by conv_wgmma.cu (the forward's A) and conv_wgmma_weights.cu (the weight gradient's B); defined
// in conv_wgmma.cu. Internal to those files.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/conv.h"
#include "kernels/conv_wgmma.h"
#include "kernels/tma.h"

namespace yolo::wgmma {

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

// Resolves `input` for a pass (`op`) whose im2col path `fits`: Im2col where it does not throws
// naming what the path `needs`; Auto takes it where it fits and the device's im2col self-check
// passed (kernels/wgmma_check.h).
bool uses_im2col(bool fits, WgmmaInput input, const char* op, const std::string& needs);

}  // namespace yolo::wgmma
