// conv2d_forward_wgmma and conv2d_backward_data_wgmma (kernels/conv_wgmma.cu,
// conv_wgmma_data.cu): against an FP64 reference of the same 16-bit inputs (TF32: the FP32
// inputs truncated as wgmma reads them) at odd sizes, 3x3 (stride 1 and 2: taps outside the
// image, a K not a multiple of the 64-wide k-tile) and 1x1, BF16 and FP16, with and without
// bias, into a channel slice of a wider output whose other channels must stay untouched,
// outputs poisoned first; the input gathered and by TMA's im2col mode (strides up to 3, input
// slices); which source Auto picks; their refusals. Emulated in tests_emu (the happens-before,
// proxy-fence and mbarrier checks of runtime/emu/warpgroup.cpp run on every case); natively
// where sm_90a code runs. The weight gradient: test_kernel_conv_wgmma_weights.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/conv_wgmma.h"
#include "kernels/hopper.h"
#include "kernels/tc_plan.h"
#include "kernels/tma.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/tc_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// An operand as the tensor cores read it: 16-bit values as stored; TF32 (float) with the low 13
// bits of each FP32 word dropped (truncated toward zero; kernels/wgmma.cuh).
template <typename T>
double operand(T v) {
  if constexpr (std::is_same_v<T, float>) return double(truncate_to_tf32(v));
  else return double(to_float(v));
}

// The relative bound on a stored output: its own rounding (16 bits, or FP32's with room for
// the hardware's summation order).
template <typename T>
double output_unit() {
  return std::is_same_v<T, Bf16> ? std::ldexp(1.0, -8) : std::is_same_v<T, Fp16> ? std::ldexp(1.0, -11)
                                                                                  : std::ldexp(1.0, -21);
}

// out (c_total channels a pixel, the convolution's at channel `offset`) against the FP64 sum of
// the operands as the tensor cores read them; the other channels keep the poison. The input:
// channels in_offset.. of in_total a pixel (0: c_in, dense), its A brought as `input` says.
template <typename T>
void check_conv(Device device, Rng& rng, const Conv2dShape& s, bool with_bias, int offset, int c_total,
                WgmmaInput input = WgmmaInput::Auto, int in_offset = 0, int in_total = 0) {
  if (in_total == 0) in_total = s.c_in;
  CAPTURE(s.n);
  CAPTURE(s.h);
  CAPTURE(s.w);
  CAPTURE(s.c_in);
  CAPTURE(s.c_out);
  CAPTURE(s.k);
  CAPTURE(s.stride);
  CAPTURE(with_bias);
  CAPTURE(int(input));
  const std::vector<T> x = random_storage<T>(rng, size_t(s.n) * s.h * s.w * in_total, -1.0f, 1.0f, false);
  const std::vector<T> wts = random_storage<T>(rng, s.weight_count(), -1.0f, 1.0f, false);
  std::vector<float> bias(size_t(s.c_out));
  for (float& b : bias) b = rng.uniform(-1.0f, 1.0f);
  const int oh = s.out_h(), ow = s.out_w();
  DeviceArray<T> d_x(device, x), d_w(device, wts), d_out(device, size_t(s.n) * oh * ow * c_total);
  DeviceArray<float> d_bias(device, bias);
  d_out.poison();
  const NhwcView<const T> in{d_x.data() + in_offset, s.n, s.h, s.w, s.c_in, in_total};
  const NhwcView<T> out{d_out.data() + offset, s.n, oh, ow, s.c_out, c_total};
  conv2d_forward_wgmma<T>(s, in, d_w.data(), with_bias ? d_bias.data() : nullptr, out, nullptr, {}, {}, input);
  const std::vector<T> got = d_out.download();
  const double unit = output_unit<T>();
  const std::vector<unsigned char> poison(sizeof(T), 0xFF);
  int wrong = 0, touched = 0;
  std::string first;
  for (int b = 0; b < s.n; ++b)
    for (int oy = 0; oy < oh; ++oy)
      for (int ox = 0; ox < ow; ++ox)
        for (int ch = 0; ch < c_total; ++ch) {
          const size_t at = ((size_t(b) * oh + oy) * ow + ox) * c_total + ch;
          const int o = ch - offset;
          if (o < 0 || o >= s.c_out) {
            touched += std::memcmp(&got[at], poison.data(), sizeof(T)) != 0;
            continue;
          }
          double sum = with_bias ? bias[size_t(o)] : 0.0, size = std::fabs(sum);
          for (int r = 0; r < s.k; ++r)
            for (int c = 0; c < s.k; ++c) {
              const int iy = oy * s.stride - s.pad() + r, ix = ox * s.stride - s.pad() + c;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              for (int i = 0; i < s.c_in; ++i) {
                const double p = operand(x[((size_t(b) * s.h + iy) * s.w + ix) * in_total + in_offset + i]) *
                                 operand(wts[((size_t(o) * s.k + r) * s.k + c) * s.c_in + i]);
                sum += p;
                size += std::fabs(p);
              }
            }
          const double g = to_float(got[at]);
          if (std::fabs(g - sum) <= unit * std::fabs(sum) + 1e-6 * size + 1e-30) continue;
          if (wrong++ == 0)
            first = "out[" + std::to_string(b) + "," + std::to_string(oy) + "," + std::to_string(ox) + "," +
                    std::to_string(o) + "] = " + std::to_string(g) + ", expected " + std::to_string(sum);
        }
  CHECK_MESSAGE(wrong == 0, first);
  CHECK(touched == 0);
}

// grad_in against the FP64 sum of grad_out at the mirrored taps: input pixel iy takes tap r from
// output pixel (iy + pad - r) / stride where that divides.
template <typename T>
void check_backward(Device device, Rng& rng, const Conv2dShape& s, WgmmaInput input = WgmmaInput::Auto) {
  CAPTURE(s.stride);
  CAPTURE(int(input));
  CAPTURE(s.n);
  CAPTURE(s.h);
  CAPTURE(s.w);
  CAPTURE(s.c_in);
  CAPTURE(s.c_out);
  CAPTURE(s.k);
  const int oh = s.out_h(), ow = s.out_w();
  const std::vector<T> dy = random_storage<T>(rng, size_t(s.n) * oh * ow * s.c_out, -1.0f, 1.0f, false);
  const std::vector<T> wts = random_storage<T>(rng, s.weight_count(), -1.0f, 1.0f, false);
  DeviceArray<T> d_dy(device, dy), d_w(device, wts), d_dx(device, size_t(s.n) * s.h * s.w * s.c_in);
  const size_t ws_bytes = conv2d_backward_data_wgmma_workspace_bytes<T>(s);
  DeviceArray<unsigned char> ws(device, std::max<size_t>(ws_bytes, 1));
  d_dx.poison();
  ws.poison();
  conv2d_backward_data_wgmma<T>(s, NhwcView<const T>{d_dy.data(), s.n, oh, ow, s.c_out, s.c_out}, d_w.data(),
                                NhwcView<T>{d_dx.data(), s.n, s.h, s.w, s.c_in, s.c_in}, false, nullptr, ws.data(),
                                ws_bytes, input);
  const std::vector<T> got = d_dx.download();
  const double unit = output_unit<T>();
  int wrong = 0;
  std::string first;
  for (int b = 0; b < s.n; ++b)
    for (int iy = 0; iy < s.h; ++iy)
      for (int ix = 0; ix < s.w; ++ix)
        for (int i = 0; i < s.c_in; ++i) {
          double sum = 0, size = 0;
          for (int r = 0; r < s.k; ++r)
            for (int c = 0; c < s.k; ++c) {
              const int ty = iy + s.pad() - r, tx = ix + s.pad() - c;
              if (ty < 0 || tx < 0 || ty % s.stride != 0 || tx % s.stride != 0) continue;
              const int oy = ty / s.stride, ox = tx / s.stride;
              if (oy >= oh || ox >= ow) continue;
              for (int o = 0; o < s.c_out; ++o) {
                const double p = operand(dy[((size_t(b) * oh + oy) * ow + ox) * s.c_out + o]) *
                                 operand(wts[((size_t(o) * s.k + r) * s.k + c) * s.c_in + i]);
                sum += p;
                size += std::fabs(p);
              }
            }
          const double g = to_float(got[((size_t(b) * s.h + iy) * s.w + ix) * s.c_in + i]);
          if (std::fabs(g - sum) <= unit * std::fabs(sum) + 1e-6 * size + 1e-30) continue;
          if (wrong++ == 0)
            first = "grad_in[" + std::to_string(b) + "," + std::to_string(iy) + "," + std::to_string(ix) + "," +
                    std::to_string(i) + "] = " + std::to_string(g) + ", expected " + std::to_string(sum);
        }
  CHECK_MESSAGE(wrong == 0, first);
}

}  // namespace

TEST_CASE("kernel: conv2d_backward_data_wgmma with grad_out gathered matches the FP64 sum (3x3, 1x1; stride 1 and 2)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  check_backward<Bf16>(device, rng, Conv2dShape{2, 9, 7, 24, 64, 3, 1}, WgmmaInput::Gather);
  check_backward<Fp16>(device, rng, Conv2dShape{1, 6, 5, 136, 128, 3, 1}, WgmmaInput::Gather);
  check_backward<Bf16>(device, rng, Conv2dShape{1, 13, 10, 40, 64, 1, 1}, WgmmaInput::Gather);
  // Stride 2: four parity classes of 4, 2, 2 and 1 taps and unequal rows (odd sizes); a 1x1 kernel
  // leaves three classes without taps, whose pixels must get zeros (the output is poisoned).
  check_backward<Bf16>(device, rng, Conv2dShape{2, 9, 7, 24, 64, 3, 2}, WgmmaInput::Gather);
  check_backward<Fp16>(device, rng, Conv2dShape{1, 7, 8, 16, 64, 1, 2}, WgmmaInput::Gather);
  // TF32: the weights transposed in the workspace (poisoned first), read K-major; both operands
  // truncated. Stride 2 (parity classes); c_in 136 (a partial 32-wide transpose tile and a second
  // 128-wide output tile) with two 32-channel k-tiles a tap.
  check_backward<float>(device, rng, Conv2dShape{2, 9, 7, 24, 64, 3, 2}, WgmmaInput::Gather);
  check_backward<float>(device, rng, Conv2dShape{1, 5, 6, 136, 64, 3, 1}, WgmmaInput::Gather);
}

TEST_CASE("kernel: conv2d_backward_data_wgmma with A by TMA's im2col mode matches the FP64 sum (parity classes)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  const Im2colRan im2col_ran;
  // One map of grad_out per parity class: stride 1 (one class of 9 taps), stride 2 at odd and
  // even sizes (classes of 4, 2, 2 and 1 taps and unequal grids), a 1x1 at stride 2 (three
  // classes without taps: zeros), boxes crossing rows and images.
  const WgmmaInput im2col = WgmmaInput::Im2col;
  check_backward<Bf16>(device, rng, Conv2dShape{2, 9, 7, 24, 64, 3, 1}, im2col);
  check_backward<Fp16>(device, rng, Conv2dShape{2, 9, 7, 40, 128, 3, 2}, im2col);
  check_backward<Bf16>(device, rng, Conv2dShape{3, 8, 10, 16, 64, 3, 2}, im2col);
  check_backward<Bf16>(device, rng, Conv2dShape{2, 7, 8, 16, 64, 1, 2}, im2col);
  check_backward<Bf16>(device, rng, Conv2dShape{1, 13, 10, 40, 64, 1, 1}, im2col);
  check_backward<float>(device, rng, Conv2dShape{2, 9, 7, 24, 64, 3, 2}, im2col);
  check_backward<float>(device, rng, Conv2dShape{1, 5, 6, 136, 128, 3, 1}, im2col);
  im2col_ran.check(true);
  // Strides past 2 keep the gather (one map a class would not fit the kernel's parameters).
  DeviceArray<Bf16> dy(device, 64);
  CHECK_FALSE(conv2d_backward_data_wgmma_im2col_takes<Bf16>(Conv2dShape{1, 9, 9, 16, 64, 3, 3},
                                                             NhwcView<const Bf16>{dy.data(), 1, 3, 3, 64, 64}));
  CHECK(conv2d_backward_data_wgmma_im2col_takes<Bf16>(Conv2dShape{1, 9, 9, 16, 64, 3, 2},
                                                       NhwcView<const Bf16>{dy.data(), 1, 5, 5, 64, 64}));
}

TEST_CASE("kernel: conv2d_forward_wgmma matches the FP64 sum (3x3 stride 1 and 2, 1x1; bf16, fp16, tf32; a slice)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  check_conv<Bf16>(device, rng, Conv2dShape{2, 11, 9, 24, 40, 3, 1}, true, 0, 40);
  check_conv<Fp16>(device, rng, Conv2dShape{1, 13, 12, 16, 136, 3, 2}, false, 8, 152);
  check_conv<Bf16>(device, rng, Conv2dShape{1, 17, 9, 72, 24, 1, 1}, true, 5, 33);
  // TF32: the operands are FP32 words of which wgmma reads the top 19 bits, so the reference
  // truncates them (a kernel or twin that rounded instead would miss it by far more than the
  // bound: random inputs carry low bits in every word). 3x3 stride 1 with K = 216 (not whole
  // 32-wide TF32 k-tiles), 3x3 stride 2 into a slice, 1x1.
  check_conv<float>(device, rng, Conv2dShape{2, 7, 9, 24, 40, 3, 1}, true, 0, 40);
  check_conv<float>(device, rng, Conv2dShape{1, 9, 8, 16, 136, 3, 2}, false, 4, 148);
  check_conv<float>(device, rng, Conv2dShape{1, 11, 5, 40, 24, 1, 1}, true, 0, 24);
}

TEST_CASE("kernel: conv2d_forward_wgmma with A by TMA's im2col mode matches the FP64 sum (strides 1-3, 1x1; a slice)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  const Im2colRan im2col_ran;
  // Boxes crossing rows and images, unequal height and width (the map's corners per dimension),
  // a part-filled last box; c_in of several k-tiles; the input a channel slice of a wider tensor.
  const WgmmaInput im2col = WgmmaInput::Im2col;
  check_conv<Bf16>(device, rng, Conv2dShape{2, 11, 9, 64, 40, 3, 1}, true, 0, 40, im2col);
  // (A slice's data must be 128-byte aligned for the swizzled map: channel 64 of 16-bit pixels.)
  check_conv<Fp16>(device, rng, Conv2dShape{2, 13, 10, 128, 136, 3, 2}, false, 8, 152, im2col, 64, 200);
  check_conv<Bf16>(device, rng, Conv2dShape{1, 14, 9, 64, 24, 3, 3}, true, 0, 24, im2col);
  check_conv<Bf16>(device, rng, Conv2dShape{3, 7, 6, 64, 72, 1, 1}, true, 5, 77, im2col, 64, 136);
  // TF32: boxes of 32 FP32 channels, the same truncation as the gathered operands.
  check_conv<float>(device, rng, Conv2dShape{2, 9, 7, 32, 40, 3, 1}, true, 0, 40, im2col);
  check_conv<float>(device, rng, Conv2dShape{1, 10, 9, 96, 24, 3, 2}, false, 0, 24, im2col, 32, 136);
  im2col_ran.check(true);  // the boxes came by im2col, not by the gather
}

TEST_CASE("kernel: the wgmma forward and backward data walk several tiles a block (persistent blocks)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  // Two blocks on any device, each taking two tiles or more, the ring's k-tile count running on
  // from one to the next: k-tiles a tile that are not a multiple of the 4 stages (3, 7, 9), or
  // differ from tile to tile (the backward data's classes of 4, 2, 2 and 1 taps).
  const WgmmaBlockCap two_blocks(2);
  const Im2colRan im2col_ran;
  const WgmmaInput gather = WgmmaInput::Gather, im2col = WgmmaInput::Im2col;
  check_conv<Bf16>(device, rng, Conv2dShape{1, 19, 17, 16, 136, 3, 1}, true, 0, 136, gather);  // 3 x 2 tiles
  check_conv<float>(device, rng, Conv2dShape{1, 15, 19, 24, 40, 3, 1}, false, 0, 40, gather);  // 3 tiles
  check_conv<Bf16>(device, rng, Conv2dShape{1, 17, 19, 64, 24, 3, 1}, true, 0, 24, im2col);    // 3 tiles
  check_backward<Bf16>(device, rng, Conv2dShape{1, 17, 19, 24, 64, 3, 2}, gather);             // 4 classes
  check_backward<Bf16>(device, rng, Conv2dShape{1, 15, 19, 40, 64, 3, 1}, im2col);             // 3 tiles
  check_backward<Fp16>(device, rng, Conv2dShape{1, 17, 19, 24, 128, 3, 2}, im2col);            // 4 classes
  im2col_ran.check(true);
}

TEST_CASE("kernel: the wgmma convolutions launch a block an SM; YOLO_WGMMA_PERSISTENT=off a block a tile") {
  KERNEL_TEST_DEVICE(device);
  struct RestoreEnvironment {
    ~RestoreEnvironment() { ::unsetenv("YOLO_WGMMA_PERSISTENT"); }
  } restore;
  const long long sms = tc::current_gpu().sms;
  for (const char* on : {"on", "1", ""}) {
    ::setenv("YOLO_WGMMA_PERSISTENT", on, 1);
    CHECK(wgmma_conv_blocks(3 * sms + 1) == unsigned(sms));
    CHECK(wgmma_conv_blocks(sms - 1) == unsigned(sms - 1));
    CHECK(wgmma_conv_blocks(0) == 1u);
  }
  {
    const WgmmaBlockCap two(2);  // the self-check's and tests' cap, restored when it ends
    CHECK(wgmma_conv_blocks(3 * sms + 1) == 2u);
    {
      const WgmmaBlockCap one(1);
      CHECK(wgmma_conv_blocks(3 * sms + 1) == 1u);
    }
    CHECK(wgmma_conv_blocks(3 * sms + 1) == 2u);
  }
  CHECK(wgmma_conv_blocks(3 * sms + 1) == unsigned(sms));
  ::setenv("YOLO_WGMMA_PERSISTENT", "off", 1);
  CHECK(wgmma_conv_blocks(3 * sms + 1) == unsigned(3 * sms + 1));
  ::setenv("YOLO_WGMMA_PERSISTENT", "sometimes", 1);
  CHECK_THROWS_WITH_AS(wgmma_conv_blocks(5), doctest::Contains("YOLO_WGMMA_PERSISTENT=sometimes"), Error);
  if (!current_device_runs_wgmma()) return;
  // A block a tile: the same kernels, each block walking one tile.
  ::setenv("YOLO_WGMMA_PERSISTENT", "off", 1);
  Rng rng;
  CAPTURE(rng.seed());
  check_conv<Bf16>(device, rng, Conv2dShape{1, 17, 19, 64, 24, 3, 1}, true, 0, 24);
  check_backward<Bf16>(device, rng, Conv2dShape{1, 17, 19, 24, 64, 3, 2});
}

TEST_CASE("kernel: conv2d_forward_wgmma chooses its A source: im2col where c_in fits (BatchNorm applied or not), the gather otherwise") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  const Conv2dShape fits{1, 6, 5, 64, 64, 3, 1}, odd_channels{1, 6, 5, 24, 64, 3, 1};
  DeviceArray<Bf16> x(device, 6 * 5 * 64), w(device, fits.weight_count());
  const NhwcView<const Bf16> in{x.data(), 1, 6, 5, 64, 64};
  CHECK(conv2d_forward_wgmma_im2col_takes<Bf16>(fits, in));
  CHECK_FALSE(conv2d_forward_wgmma_im2col_takes<Bf16>(odd_channels, NhwcView<const Bf16>{x.data(), 1, 6, 5, 24, 24}));
  CHECK_FALSE(conv2d_forward_wgmma_im2col_takes<Bf16>(fits, NhwcView<const Bf16>{x.data() + 4, 1, 6, 5, 64, 68}));
  // Channel slices of 128-channel pixels: from channel 64 (128 bytes in) TMA's swizzled map may
  // start there; from channel 8 (16 bytes: aligned for the gather's copies, not for the map's
  // base, tma::swizzled_base_fits) it gathers, and forced im2col is refused. Under the driver's
  // own rule (the GPU check's probe of the hardware) channel 8 would take im2col.
  const Conv2dShape half{1, 3, 5, 64, 64, 3, 1};
  const NhwcView<const Bf16> from64{x.data() + 64, 1, 3, 5, 64, 128}, from8{x.data() + 8, 1, 3, 5, 64, 128};
  CHECK(conv2d_forward_wgmma_im2col_takes<Bf16>(half, from64));
  CHECK_FALSE(conv2d_forward_wgmma_im2col_takes<Bf16>(half, from8));
  {
    const tma::DriverBaseRule driver_rule;
    CHECK(conv2d_forward_wgmma_im2col_takes<Bf16>(half, from8));
  }
  CHECK_FALSE(conv2d_forward_wgmma_im2col_takes<Bf16>(Conv2dShape{1, 40, 40, 64, 64, 3, 9},
                                                      NhwcView<const Bf16>{x.data(), 1, 40, 40, 64, 64}));
  CHECK_FALSE(conv2d_forward_wgmma_im2col_takes<float>(Conv2dShape{1, 6, 5, 48, 64, 3, 1},
                                                       NhwcView<const float>{nullptr, 1, 6, 5, 48, 48}));
  DeviceArray<Bf16> y(device, 6 * 5 * 64);
  const NhwcView<Bf16> out{y.data(), 1, 6, 5, 64, 64};
  CHECK_THROWS_WITH_AS(conv2d_forward_wgmma<Bf16>(odd_channels, NhwcView<const Bf16>{x.data(), 1, 6, 5, 24, 24}, w.data(),
                                                  nullptr, out, nullptr, {}, {}, WgmmaInput::Im2col),
                       doctest::Contains("TMA's im2col mode cannot bring this input"), Error);
#if YOLO_EMULATED_KERNELS
  // Auto: im2col where it fits, with or without BatchNorm applied in the loads; the gather where
  // forced or where c_in does not fit.
  DeviceArray<float> d_table(device, std::vector<float>(4 * 64, 1.0f));
  unsigned long long before = tma::emulated_im2col_loads();
  conv2d_forward_wgmma<Bf16>(fits, in, w.data(), nullptr, out, nullptr);
  CHECK(tma::emulated_im2col_loads() > before);
  before = tma::emulated_im2col_loads();
  conv2d_forward_wgmma<Bf16>(fits, in, w.data(), nullptr, out, nullptr, {},
                             NormalizedInput{d_table.data(), Activation::Linear});
  CHECK(tma::emulated_im2col_loads() > before);
  before = tma::emulated_im2col_loads();
  conv2d_forward_wgmma<Bf16>(fits, in, w.data(), nullptr, out, nullptr, {}, {}, WgmmaInput::Gather);
  conv2d_forward_wgmma<Bf16>(odd_channels, NhwcView<const Bf16>{x.data(), 1, 6, 5, 24, 24}, w.data(), nullptr, out,
                             nullptr);
  CHECK(tma::emulated_im2col_loads() == before);
#endif
}

#if YOLO_EMULATED_KERNELS
TEST_CASE("kernel: YOLO_TMA_IM2COL=off makes Auto gather; a value it does not know is refused") {
  KERNEL_TEST_DEVICE(device);
  struct RestoreEnvironment {
    ~RestoreEnvironment() { ::unsetenv("YOLO_TMA_IM2COL"); }
  } restore;
  const Conv2dShape s{1, 6, 5, 64, 64, 3, 1};
  DeviceArray<Bf16> x(device, 6 * 5 * 64), w(device, s.weight_count()), y(device, 6 * 5 * 64);
  const NhwcView<const Bf16> in{x.data(), 1, 6, 5, 64, 64};
  const NhwcView<Bf16> out{y.data(), 1, 6, 5, 64, 64};
  auto ran_im2col = [&] {
    const Im2colRan ran;
    conv2d_forward_wgmma<Bf16>(s, in, w.data(), nullptr, out, nullptr);
    return tma::emulated_im2col_loads() > ran.before;
  };
  for (const char* off : {"off", "0"}) {
    ::setenv("YOLO_TMA_IM2COL", off, 1);
    CHECK_FALSE(tma_im2col_allowed_by_environment());
    CHECK_FALSE(ran_im2col());
  }
  for (const char* on : {"on", "1", "auto", ""}) {
    ::setenv("YOLO_TMA_IM2COL", on, 1);
    CHECK(ran_im2col());
  }
  ::setenv("YOLO_TMA_IM2COL", "maybe", 1);
  CHECK_THROWS_WITH_AS(conv2d_forward_wgmma<Bf16>(s, in, w.data(), nullptr, out, nullptr),
                       doctest::Contains("YOLO_TMA_IM2COL=maybe"), Error);
  ::setenv("YOLO_TMA_IM2COL", "off", 1);  // forced im2col is not Auto: the switch leaves it alone
  const Im2colRan forced;
  conv2d_forward_wgmma<Bf16>(s, in, w.data(), nullptr, out, nullptr, {}, {}, WgmmaInput::Im2col);
  forced.check(true);
}
#endif

TEST_CASE("kernel: conv2d_forward_wgmma refuses inputs its 16-byte gathers cannot read") {
  KERNEL_TEST_DEVICE(device);
  const Conv2dShape s{1, 4, 4, 12, 8, 3, 1};
  DeviceArray<Bf16> x(device, 4 * 4 * 16), w(device, s.weight_count()), y(device, 4 * 4 * 8);
  const NhwcView<Bf16> out{y.data(), 1, 4, 4, 8, 8};
  if (!current_device_runs_wgmma()) {
    CHECK_THROWS_WITH_AS(conv2d_forward_wgmma<Bf16>(s, NhwcView<const Bf16>{x.data(), 1, 4, 4, 12, 12}, w.data(),
                                                    nullptr, out, nullptr),
                         doctest::Contains("wgmma needs sm_90a code"), Error);
    return;
  }
  CHECK_THROWS_WITH_AS(conv2d_forward_wgmma<Bf16>(s, NhwcView<const Bf16>{x.data(), 1, 4, 4, 12, 12}, w.data(),
                                                  nullptr, out, nullptr),
                       doctest::Contains("must be a multiple of 8"), Error);
}
