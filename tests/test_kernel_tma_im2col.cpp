// TMA's im2col mode (kernels/tma.h, tma.cuh: encode_im2col, load_im2col), one box at a time
// through tests/wgmma_test_kernels.h: the traversal on the cases whose hardware results the
// Triton project documents for its TMA im2col tutorial (padding, offsets, crossing into the
// next image; our reading of the PTX ISA must reproduce them), and on a convolution's geometry
// (a box is then exactly the im2col rows of 128 output pixels at one tap: what
// conv2d_forward_wgmma relies on) at odd sizes, strides 1 to 3, unequal height and width and a
// channel slice, through the map the wgmma convolutions build (kernels/conv_wgmma_shared.h);
// which geometries that map takes; the encoder's refusals. Emulated in tests_emu; natively on
// an H100/H200, where the same expectations check the hardware itself.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/conv.h"
#include "kernels/conv_wgmma_shared.h"
#include "kernels/half_types.h"
#include "kernels/hopper.h"
#include "kernels/tma.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/test_support.h"
#include "tests/wgmma_test_kernels.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// A [n][4][4][32] FP32 tensor whose pixel i (from 0, in memory order) holds i + 1 in every channel.
std::vector<float> numbered_pixels(int n) {
  std::vector<float> v(size_t(n) * 16 * 32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i / 32 + 1);
  return v;
}

// The first channel of each of the 16 rows a box of 16 pixels x 32 FP32 channels (128-byte
// swizzle) brings from `map`, after checking every row holds one value throughout.
std::vector<float> box_values(Device device, const tma::TensorMap& map, int w, int h, int n, int off_w, int off_h) {
  DeviceArray<unsigned char> out(device, 16 * 128);
  out.poison();
  launch_im2col_box(map, 0, w, h, n, off_w, off_h, 1, 16 * 128, out.data());
  const std::vector<unsigned char> bytes = out.download();
  std::vector<float> firsts(16);
  for (int p = 0; p < 16; ++p) {
    float row[32];
    std::memcpy(row, bytes.data() + size_t(p) * 128, 128);
    firsts[size_t(p)] = row[0];
    for (float v : row) CHECK(v == row[0]);
  }
  return firsts;
}

tma::Im2colNhwc numbered_map(const float* data, int n, int lower, int upper) {
  tma::Im2colNhwc t{};
  t.base = data;
  t.element_bytes = 4;
  t.n = uint64_t(n), t.h = 4, t.w = 4, t.c = 32;
  t.pixel_stride_bytes = 128;
  t.lower_h = t.lower_w = lower;
  t.upper_h = t.upper_w = upper;
  t.stride = 1;
  t.channels_per_pixel = 32;
  t.pixels_per_column = 16;
  t.swizzle = 1;
  return t;
}

}  // namespace

TEST_CASE("tma im2col: the traversal gives the documented hardware results (padding, offsets, the next image)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (TMA)");
  const std::vector<float> one = numbered_pixels(1), two = numbered_pixels(2);
  DeviceArray<float> d_one(device, one), d_two(device, two);
  const auto values = [](std::initializer_list<float> v) { return std::vector<float>(v); };
  // A box of corners -1: the pixels from (-1, -1), zeros outside the tensor; the offsets (1, 1)
  // shift every read back onto the tensor.
  const tma::TensorMap padded = tma::encode_im2col(numbered_map(d_one.data(), 1, -1, -1));
  CHECK(box_values(device, padded, -1, -1, 0, 0, 0) == values({0, 0, 0, 0, 0, 1, 2, 3, 0, 5, 6, 7, 0, 9, 10, 11}));
  CHECK(box_values(device, padded, -1, -1, 0, 1, 1) ==
        values({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}));
  // From (h 1, w 3) of image 0 on into image 1; then with corners -1 from (h 1, w 2): the box's
  // rows wrap at w 3 (exclusive) and image 1 starts at its box's corner (-1, -1).
  const tma::TensorMap whole = tma::encode_im2col(numbered_map(d_two.data(), 2, 0, 0));
  CHECK(box_values(device, whole, 3, 1, 0, 0, 0) ==
        values({8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}));
  const tma::TensorMap shifted = tma::encode_im2col(numbered_map(d_two.data(), 2, -1, -1));
  CHECK(box_values(device, shifted, 2, 1, 0, 0, 0) == values({7, 0, 9, 10, 11, 0, 0, 0, 0, 0, 17, 18, 19, 0, 21, 22}));
}

namespace {

struct Geometry {
  int n, h, w, k, stride;
  int c_in, c_offset, c_total;  // the convolution reads channels c_offset.. of c_total a pixel
};

// Boxes of 128 output pixels x 64 BF16 channels (128-byte swizzle) of a convolution's input, by
// the map the wgmma convolutions build (kernels/conv_wgmma_shared.h, conv_im2col_map): row
// p of the box at output pixel m0 + p, tap (kh, kw), channel c0 must be the im2col element, the
// input at (oy * stride - pad + kh, ox * stride - pad + kw), or zero outside the image and past
// c_in (the memory there holds other channels, which must not leak in). Returns the elements that
// are not, and the first in `first`.
int conv_box_mismatches(Device device, Rng& rng, const Geometry& g, std::string& first) {
  CAPTURE(g.n);
  CAPTURE(g.h);
  CAPTURE(g.w);
  CAPTURE(g.k);
  CAPTURE(g.stride);
  CAPTURE(g.c_in);
  const int pad = g.k / 2, oh = (g.h + 2 * pad - g.k) / g.stride + 1, ow = (g.w + 2 * pad - g.k) / g.stride + 1;
  const int pixels = g.n * oh * ow;
  std::vector<Bf16> x(size_t(g.n) * g.h * g.w * g.c_total);
  for (Bf16& v : x) v = from_float<Bf16>(rng.uniform(-1.0f, 1.0f));
  DeviceArray<Bf16> d_x(device, x);
  const Conv2dShape s{g.n, g.h, g.w, g.c_in, 64, g.k, g.stride};
  REQUIRE(wgmma::conv_im2col_geometry_fits(s));
  const tma::TensorMap map = wgmma::conv_im2col_map(s, d_x.data() + g.c_offset, uint64_t(g.c_total) * 2, 2, 64, 128);
  DeviceArray<unsigned char> out(device, 128 * 128);
  int wrong = 0;
  for (int m0 = 0; m0 < pixels; m0 += 128)
    for (int tap = 0; tap < g.k * g.k; ++tap)
      for (int c0 = 0; c0 < g.c_in; c0 += 64) {
        const int b0 = m0 / (oh * ow), y0 = m0 % (oh * ow) / ow * g.stride - pad, x0 = m0 % ow * g.stride - pad;
        out.poison();
        launch_im2col_box(map, c0, x0, y0, b0, tap % g.k, tap / g.k, 1, 128 * 128, out.data());
        const std::vector<unsigned char> bytes = out.download();
        for (int p = 0; p < 128 && m0 + p < pixels; ++p) {
          const int m = m0 + p, b = m / (oh * ow), oy = m % (oh * ow) / ow, ox = m % ow;
          const int iy = oy * g.stride - pad + tap / g.k, ix = ox * g.stride - pad + tap % g.k;
          for (int ch = 0; ch < 64; ++ch) {
            uint16_t expected = 0, got;
            if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w && c0 + ch < g.c_in)
              std::memcpy(&expected, &x[((size_t(b) * g.h + iy) * g.w + ix) * g.c_total + g.c_offset + c0 + ch], 2);
            std::memcpy(&got, bytes.data() + size_t(p) * 128 + size_t(ch) * 2, 2);
            if (got != expected && wrong++ == 0)
              first = "pixel " + std::to_string(m) + " tap " + std::to_string(tap) + " channel " +
                      std::to_string(c0 + ch) + ": " + std::to_string(got) + ", expected " + std::to_string(expected);
          }
        }
      }
  return wrong;
}

void check_conv_boxes(Device device, Rng& rng, const Geometry& g) {
  std::string first;
  CHECK_MESSAGE(conv_box_mismatches(device, rng, g, first) == 0, first);
}

}  // namespace

TEST_CASE("tma im2col: a convolution's boxes are its im2col rows (3x3 strides 1-3, 1x1; odd sizes; a channel slice)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (TMA)");
  Rng rng;
  CAPTURE(rng.seed());
  // Several boxes cross rows and images; the last is part-filled; c_in 96 leaves the second
  // k-tile half past the slice's channels.
  // (A slice's data must be 128-byte aligned for the swizzled map: channel 64 of 16-bit pixels.)
  check_conv_boxes(device, rng, Geometry{2, 9, 13, 3, 1, 64, 0, 64});
  check_conv_boxes(device, rng, Geometry{3, 10, 7, 3, 2, 96, 64, 168});
  check_conv_boxes(device, rng, Geometry{2, 11, 8, 3, 2, 64, 0, 64});
  check_conv_boxes(device, rng, Geometry{1, 14, 9, 3, 3, 64, 64, 136});
  check_conv_boxes(device, rng, Geometry{2, 6, 11, 1, 1, 64, 0, 72});
}

TEST_CASE("tma im2col: boxes of a slice only 16-byte aligned, under the driver's base rule (a probe of the hardware)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (TMA)");
  Rng rng;
  CAPTURE(rng.seed());
  // Channel 8 of 112: 16 bytes in. The encoder refuses it for a swizzled map (the Programming
  // Guide asks 128-byte aligned bases); the driver's own rule (16) lets the hardware answer
  // whether that matters. The emulation's twin has no such rule: it must match.
  const Geometry g{3, 10, 7, 3, 2, 96, 8, 112};
  std::string first;
  CHECK_THROWS_WITH_AS(conv_box_mismatches(device, rng, g, first), doctest::Contains("128-byte aligned"), Error);
  const tma::DriverBaseRule driver_rule;
  const int wrong = conv_box_mismatches(device, rng, g, first);
#if YOLO_EMULATED_KERNELS
  CHECK_MESSAGE(wrong == 0, first);
#else
  MESSAGE("swizzled im2col boxes from a base 16 bytes past a 128-byte boundary: " << wrong << " elements wrong"
          << (wrong ? " (first " + first + ")" : ""));
#endif
}

TEST_CASE("tma im2col: conv_im2col_geometry_fits takes strides up to 8 and kernels up to 16") {
  CHECK(wgmma::conv_im2col_geometry_fits(Conv2dShape{1, 40, 40, 64, 64, 3, 8}));
  CHECK_FALSE(wgmma::conv_im2col_geometry_fits(Conv2dShape{1, 40, 40, 64, 64, 3, 9}));
  CHECK(wgmma::conv_im2col_geometry_fits(Conv2dShape{1, 40, 40, 64, 64, 15, 1}));
  CHECK_FALSE(wgmma::conv_im2col_geometry_fits(Conv2dShape{1, 40, 40, 64, 64, 17, 1}));
}

TEST_CASE("tma im2col: the encoder refuses what cuTensorMapEncodeIm2col refuses, naming the rule") {
  alignas(128) static uint16_t data[4 * 8 * 8 * 64];
  const tma::Im2colNhwc good{data, 2, 4, 8, 8, 64, 128, -1, -1, -1, -1, 1, 64, 128, 1};
  auto refused = [](tma::Im2colNhwc t) {
    try {
      tma::encode_im2col(t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
#if YOLO_EMULATED_KERNELS
  CHECK(refused(good) == "accepted");  // natively a good map goes on to the driver's encoder
#endif
  auto with = [&](auto change) {
    tma::Im2colNhwc t = good;
    change(t);
    return refused(t);
  };
  CHECK(with([](tma::Im2colNhwc& t) { t.base = reinterpret_cast<const char*>(t.base) + 8; })
            .find("16-byte aligned") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.base = reinterpret_cast<const char*>(t.base) + 16; })
            .find("swizzled map's global address must be 128-byte aligned") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.element_bytes = 8; }).find("2 or 4") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.h = 0; }).find("1..2^32") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.pixel_stride_bytes = 120; }).find("multiple of 16") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.pixel_stride_bytes = 112; }).find("holds a pixel") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.lower_w = -129; }).find("-128..127") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.upper_h = -9; }).find("no pixel") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.channels_per_pixel = 257; }).find("1..256") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.channels_per_pixel = 12; }).find("multiple of 16 bytes") !=
        std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.pixels_per_column = 1025; }).find("1..1024") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.stride = 9; }).find("1..8") != std::string::npos);
  CHECK(with([](tma::Im2colNhwc& t) { t.swizzle = 2; }).find("wider than its 64-byte swizzle") != std::string::npos);
}
