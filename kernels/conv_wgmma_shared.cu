// The wgmma convolutions' shared pieces (kernels/conv_wgmma_shared.h).
#include "kernels/conv_wgmma_shared.h"

#include <algorithm>
#include <string>

#include "kernels/common.cuh"
#include "kernels/hopper.h"
#include "kernels/tc_plan.h"
#include "kernels/wgmma_check.h"

namespace yolo::wgmma {

void require_wgmma(const char* op) {
  if (!current_device_runs_wgmma())
    throw Error(std::string(op) + ": wgmma needs sm_90a code on an sm_90 device (H100, H200) and a build whose ARCH "
                "has 90");
}

bool conv_im2col_geometry_fits(const Conv2dShape& s) {
  const int upper_h = (s.out_h() - 1) * s.stride + 1 - s.h - s.pad();
  const int upper_w = (s.out_w() - 1) * s.stride + 1 - s.w - s.pad();
  return s.stride <= 8 && s.k <= 16 && s.pad() <= 128 && upper_h >= -128 && upper_h <= 127 && upper_w >= -128 &&
         upper_w <= 127;
}

tma::TensorMap conv_im2col_map(const Conv2dShape& s, const void* data, uint64_t pixel_stride_bytes,
                                      uint32_t element_bytes, uint32_t channels_per_pixel,
                                      uint32_t pixels_per_column) {
  tma::Im2colNhwc t{};
  t.base = data;
  t.element_bytes = element_bytes;
  t.n = uint64_t(s.n), t.h = uint64_t(s.h), t.w = uint64_t(s.w), t.c = uint64_t(s.c_in);
  t.pixel_stride_bytes = pixel_stride_bytes;
  t.lower_h = t.lower_w = -s.pad();
  t.upper_h = (s.out_h() - 1) * s.stride + 1 - s.h - s.pad();
  t.upper_w = (s.out_w() - 1) * s.stride + 1 - s.w - s.pad();
  t.stride = uint32_t(s.stride);
  t.channels_per_pixel = channels_per_pixel;
  t.pixels_per_column = pixels_per_column;
  t.swizzle = 1;  // 128-byte
  return tma::encode_im2col(t);
}

bool uses_im2col(bool fits, WgmmaInput input, const char* op, const std::string& needs, Precision precision,
                 tc::TcPass pass) {
  if (input == WgmmaInput::Im2col && !fits)
    throw Error(std::string(op) + ": TMA's im2col mode cannot bring this input: it needs " + needs);
  return input == WgmmaInput::Im2col || (input == WgmmaInput::Auto && fits && tma_im2col_allowed_by_environment() &&
                                         current_device_trusts_wgmma(precision, pass, WgmmaSource::Im2col));
}

}  // namespace yolo::wgmma

namespace yolo {

bool tma_im2col_allowed_by_environment() {
  return tc::switch_from_environment("YOLO_TMA_IM2COL", "to keep the wgmma convolutions on their gathers");
}

namespace {
thread_local unsigned g_block_cap = 0;  // WgmmaBlockCap's: 0, none
}  // namespace

unsigned wgmma_conv_blocks(long long tiles) {
  const bool persistent =
      tc::switch_from_environment("YOLO_WGMMA_PERSISTENT", "to launch the wgmma convolutions a block a tile");
  const long long sms = tc::current_gpu().sms;
  long long blocks = persistent ? std::min(tiles, sms) : tiles;
  if (g_block_cap > 0) blocks = std::min(blocks, (long long)g_block_cap);
  return unsigned(std::max(1LL, blocks));
}

WgmmaBlockCap::WgmmaBlockCap(unsigned blocks) : previous_(g_block_cap) { g_block_cap = blocks; }
WgmmaBlockCap::~WgmmaBlockCap() { g_block_cap = previous_; }

}  // namespace yolo
