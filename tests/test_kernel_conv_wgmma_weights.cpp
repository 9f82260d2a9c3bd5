// conv2d_backward_weights_wgmma (kernels/conv_wgmma_weights.cu, declared in conv_wgmma.h): the
// FP32 weight gradient against the FP64 sum over the batch's pixels of the same 16-bit inputs,
// 3x3 at stride 1 and 2 and 1x1, BF16 and FP16, with the pixels split among 2-5 blocks (the
// partial sums' order is fixed), outputs and workspace poisoned first; the input's im2col rows
// gathered and by TMA's im2col mode. Emulated in tests_emu;
// natively where sm_90a code runs.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/conv_wgmma.h"
#include "kernels/hopper.h"
#include "kernels/tma.h"
#include "tests/kernel_harness.h"
#include "tests/tc_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// grad_weights (FP32) against the FP64 sum over the batch's pixels. The input: channels
// in_offset.. of in_total a pixel (0: c_in, dense), its im2col rows brought as `input` says.
template <typename T>
void check_weights(Device device, Rng& rng, const Conv2dShape& s, WgmmaInput input = WgmmaInput::Auto,
                   int in_offset = 0, int in_total = 0) {
  if (in_total == 0) in_total = s.c_in;
  CAPTURE(s.n);
  CAPTURE(s.h);
  CAPTURE(s.w);
  CAPTURE(s.c_in);
  CAPTURE(s.c_out);
  CAPTURE(s.k);
  CAPTURE(s.stride);
  CAPTURE(int(input));
  const int oh = s.out_h(), ow = s.out_w();
  const std::vector<T> x = random_storage<T>(rng, size_t(s.n) * s.h * s.w * in_total, -1.0f, 1.0f, false);
  const std::vector<T> dy = random_storage<T>(rng, size_t(s.n) * oh * ow * s.c_out, -1.0f, 1.0f, false);
  const size_t workspace = conv2d_backward_weights_wgmma_workspace_bytes(s);
  CAPTURE(workspace);
  DeviceArray<T> d_x(device, x), d_dy(device, dy);
  DeviceArray<float> d_dw(device, s.weight_count()), d_ws(device, workspace / sizeof(float));
  d_dw.poison();
  d_ws.poison();
  conv2d_backward_weights_wgmma<T>(s, NhwcView<const T>{d_x.data() + in_offset, s.n, s.h, s.w, s.c_in, in_total},
                                   NhwcView<const T>{d_dy.data(), s.n, oh, ow, s.c_out, s.c_out}, d_dw.data(),
                                   d_ws.data(), workspace, nullptr, {}, input);
  const std::vector<float> got = d_dw.download();
  int wrong = 0;
  std::string first;
  for (int o = 0; o < s.c_out; ++o)
    for (int r = 0; r < s.k; ++r)
      for (int c = 0; c < s.k; ++c)
        for (int i = 0; i < s.c_in; ++i) {
          double sum = 0, size = 0;
          for (int b = 0; b < s.n; ++b)
            for (int oy = 0; oy < oh; ++oy)
              for (int ox = 0; ox < ow; ++ox) {
                const int iy = oy * s.stride - s.pad() + r, ix = ox * s.stride - s.pad() + c;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                const double p = double(to_float(dy[((size_t(b) * oh + oy) * ow + ox) * s.c_out + o])) *
                                 double(to_float(x[((size_t(b) * s.h + iy) * s.w + ix) * in_total + in_offset + i]));
                sum += p;
                size += std::fabs(p);
              }
          const size_t at = ((size_t(o) * s.k + r) * s.k + c) * s.c_in + i;
          if (std::fabs(double(got[at]) - sum) <= 1e-5 * size + 1e-30) continue;
          if (wrong++ == 0)
            first = "grad_weights[" + std::to_string(o) + "," + std::to_string(r) + "," + std::to_string(c) + "," +
                    std::to_string(i) + "] = " + std::to_string(got[at]) + ", expected " + std::to_string(sum);
        }
  CHECK_MESSAGE(wrong == 0, first);
}

}  // namespace

TEST_CASE("kernel: conv2d_backward_weights_wgmma matches the FP64 sum (3x3 stride 1 and 2, 1x1; split pixels)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  check_weights<Bf16>(device, rng, Conv2dShape{2, 9, 7, 16, 24, 3, 1});
  check_weights<Fp16>(device, rng, Conv2dShape{1, 13, 12, 8, 136, 3, 2});
  check_weights<Bf16>(device, rng, Conv2dShape{1, 20, 15, 40, 16, 1, 1});
}

TEST_CASE("kernel: conv2d_backward_weights_wgmma with B by TMA's im2col mode matches the FP64 sum (strides 1-3, 1x1)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  const Im2colRan im2col_ran;
  // 9 taps of 64 channels: the last column tile's second half lies past the taps (zeros); pixels
  // not a whole number of 64-pixel k-tiles; boxes crossing rows and images; a channel slice.
  const WgmmaInput im2col = WgmmaInput::Im2col;
  check_weights<Bf16>(device, rng, Conv2dShape{2, 9, 7, 64, 24, 3, 1}, im2col);
  // (A slice's data must be 128-byte aligned for the swizzled map: channel 64 of 16-bit pixels.)
  check_weights<Fp16>(device, rng, Conv2dShape{2, 11, 10, 128, 40, 3, 2}, im2col, 64, 200);
  check_weights<Bf16>(device, rng, Conv2dShape{1, 14, 9, 64, 16, 3, 3}, im2col);
  check_weights<Bf16>(device, rng, Conv2dShape{3, 7, 6, 192, 8, 1, 1}, im2col, 64, 264);
  im2col_ran.check(true);
}

TEST_CASE("kernel: conv2d_backward_weights_wgmma's blocks walk several tiles and pixel splits") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  // Two blocks on any device: 2 column tiles by 3 pixel splits (of 2, 2 and 1 k-tiles on the
  // kernel tests' 4 emulated SMs), gathered; 5 column tiles of 2 k-tiles by im2col.
  const WgmmaBlockCap two_blocks(2);
  check_weights<Bf16>(device, rng, Conv2dShape{2, 12, 11, 16, 24, 3, 1}, WgmmaInput::Gather);
  check_weights<Bf16>(device, rng, Conv2dShape{2, 9, 7, 64, 24, 3, 1}, WgmmaInput::Im2col);
}

TEST_CASE("kernel: conv2d_backward_weights_wgmma chooses its B source: im2col where it can, the gather otherwise") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  const Conv2dShape fits{1, 6, 5, 64, 16, 3, 1}, narrow{1, 6, 5, 32, 16, 3, 1};
  DeviceArray<Bf16> x(device, 6 * 5 * 64), dy(device, 6 * 5 * 16);
  const NhwcView<const Bf16> in{x.data(), 1, 6, 5, 64, 64}, narrow_in{x.data(), 1, 6, 5, 32, 32};
  const NhwcView<const Bf16> grad_out{dy.data(), 1, 6, 5, 16, 16};
  CHECK(conv2d_backward_weights_wgmma_im2col_takes<Bf16>(fits, in));
  CHECK_FALSE(conv2d_backward_weights_wgmma_im2col_takes<Bf16>(narrow, narrow_in));
  const size_t workspace = conv2d_backward_weights_wgmma_workspace_bytes(fits);
  DeviceArray<float> dw(device, fits.weight_count()), ws(device, workspace / sizeof(float));
  CHECK_THROWS_WITH_AS(conv2d_backward_weights_wgmma<Bf16>(narrow, narrow_in, grad_out, dw.data(), ws.data(), workspace,
                                                           nullptr, {}, WgmmaInput::Im2col),
                       doctest::Contains("TMA's im2col mode cannot bring this input"), Error);
#if YOLO_EMULATED_KERNELS
  unsigned long long before = tma::emulated_im2col_loads();
  conv2d_backward_weights_wgmma<Bf16>(fits, in, grad_out, dw.data(), ws.data(), workspace, nullptr);
  CHECK(tma::emulated_im2col_loads() > before);
  before = tma::emulated_im2col_loads();
  conv2d_backward_weights_wgmma<Bf16>(fits, in, grad_out, dw.data(), ws.data(), workspace, nullptr, {},
                                      WgmmaInput::Gather);
  CHECK(tma::emulated_im2col_loads() == before);
#endif
}
