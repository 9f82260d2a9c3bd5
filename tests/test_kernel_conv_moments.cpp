// BatchNorm statistics from the convolution's epilogue (conv.h ConvMoments, kernels/channel_moments.cuh)
// and the training forward from them (batchnorm.h ..._from_moments): for every conv shape of the op
// tests, on the FP32 CUDA path and on tensor cores (TF32, BF16), automatic tiling, forced
// split-K and (BF16) forced wgmma, with plain inputs and with |mean| >> std (inputs 40 +- 1, positive weights): the output
// keeps its bits; the counts cover every pixel; the saved mean and variance equal the FP64
// statistics of the stored output, as closely as the separate statistics pass does (within FP32
// rounding of its own error), and y equals the separate pass's y; --sync-bn's sums and centered
// squares from the moments likewise against the phases that read x. Many blocks (the merge before
// the finalize) against FP64 on synthetic moments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/conv_wgmma.h"
#include "kernels/gemm.h"
#include "kernels/half_types.h"
#include "kernels/hopper.h"
#include "kernels/precision.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/tc_check.h"
#include "tests/test_support.h"

#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

using namespace yolo;
using namespace yolo::testing;

namespace {

// The shapes of the conv op tests (test_kernel_conv.cpp, test_kernel_conv_tc.cpp).
const std::vector<Conv2dShape>& shapes() {
  static const std::vector<Conv2dShape> s = {
      {3, 7, 5, 3, 7, 3, 1},    {3, 7, 5, 13, 17, 3, 2},    {3, 7, 5, 13, 1, 1, 1},   {2, 7, 5, 3, 17, 5, 2},
      {3, 5, 7, 16, 20, 3, 1},  {3, 7, 5, 8, 12, 1, 2},     {1, 9, 11, 12, 36, 3, 2}, {3, 7, 5, 13, 7, 5, 1},
      {3, 11, 9, 13, 70, 3, 1}, {2, 13, 11, 16, 132, 3, 2}, {2, 9, 11, 13, 21, 3, 1}, {1, 13, 10, 3, 16, 3, 2},
      {2, 7, 9, 32, 24, 3, 1},  {2, 8, 7, 16, 40, 1, 1},    {1, 9, 7, 64, 72, 3, 1},  {2, 5, 5, 40, 8, 5, 1},
  };
  return s;
}

// How a case tiles: the planner's choice, split-K in 3 (the moments come from the split pass), or
// the wgmma kernels (16-bit, sm_90a, shapes they take: the moments from their epilogue).
enum class Mode { Automatic, Split, Wgmma };
// Restores automatic tiling when a case ends (also on failure).
struct Tiling {
  Tiling(Mode mode) {
    if (mode == Mode::Split) set_gemm_tiling_for_tests(-1, 3), set_tc_tiling_for_tests(-1, 3, 0);
    if (mode == Mode::Wgmma) set_tc_tiling_for_tests(-1, 0, 3);
  }
  ~Tiling() { set_gemm_tiling_for_tests(-1, 0), set_tc_tiling_for_tests(-1, 0, 0); }
};

struct Stats {
  std::vector<double> mean, var;
};
// FP64 per-channel mean and biased variance of a dense NHWC buffer.
Stats exact_stats(const std::vector<double>& x, int c) {
  Stats s;
  s.mean.assign(size_t(c), 0.0);
  s.var.assign(size_t(c), 0.0);
  const size_t pixels = x.size() / size_t(c);
  for (size_t p = 0; p < pixels; ++p)
    for (int ch = 0; ch < c; ++ch) s.mean[size_t(ch)] += x[p * size_t(c) + size_t(ch)];
  for (double& m : s.mean) m /= double(pixels);
  for (size_t p = 0; p < pixels; ++p)
    for (int ch = 0; ch < c; ++ch) {
      const double d = x[p * size_t(c) + size_t(ch)] - s.mean[size_t(ch)];
      s.var[size_t(ch)] += d * d;
    }
  for (double& v : s.var) v /= double(pixels);
  return s;
}

// One shape in storage type T (tensor_cores: conv2d_forward_tc, else the FP32 CUDA conv).
template <typename T>
void check_shape(Device device, const Conv2dShape& s, bool tensor_cores, bool offset, Mode mode, Rng& rng) {
  Tiling tiling(mode);
  const int oh = s.out_h(), ow = s.out_w();
  const size_t in_count = size_t(s.n) * s.h * s.w * s.c_in, out_count = size_t(s.n) * oh * ow * s.c_out;
  // |mean| >> std: every input 40 +- 1 and every weight positive, so each output channel's mean is
  // hundreds of times its spread.
  const std::vector<float> in = offset ? rng.floats(in_count, 39.0f, 41.0f) : rng.floats(in_count, -1.0f, 1.0f);
  const std::vector<float> weights = offset ? rng.floats(s.weight_count(), 0.0f, 0.1f) : rng.floats(s.weight_count());
  const std::vector<float> bias = rng.floats(size_t(s.c_out));
  DeviceArray<T> d_in(device, stored<T>(in)), d_w(device, stored<T>(weights)), plain(device, out_count),
      with(device, out_count), y_sep(device, out_count), y_mom(device, out_count);
  DeviceArray<float> d_bias(device, bias);
  const int blocks = tensor_cores ? conv2d_forward_tc_moment_blocks<T>(s) : conv2d_forward_moment_blocks(s);
  REQUIRE(blocks >= 1);
  DeviceArray<float> partials(device, size_t(blocks) * s.c_out * 2), counts(device, size_t(blocks));
  const size_t conv_ws = tensor_cores ? conv2d_forward_tc_workspace_bytes<T>(s) : conv2d_forward_workspace_bytes(s);
  const size_t bn_ws = std::max(batchnorm_workspace_bytes(s.n, oh, ow, s.c_out),
                                batchnorm_from_moments_workspace_bytes(blocks, s.c_out));
  DeviceArray<unsigned char> ws(device, std::max<size_t>({conv_ws, bn_ws, 1}));
  plain.poison(), with.poison(), partials.poison(), counts.poison(), y_sep.poison(), y_mom.poison();
  auto view = [&](DeviceArray<T>& a) { return NhwcView<T>{a.data(), s.n, oh, ow, s.c_out, s.c_out}; };
  auto cview = [&](DeviceArray<T>& a) { return NhwcView<const T>{a.data(), s.n, oh, ow, s.c_out, s.c_out}; };
  const NhwcView<const T> in_view{d_in.data(), s.n, s.h, s.w, s.c_in, s.c_in};
  auto conv = [&](DeviceArray<T>& out, ConvMoments moments) {
    if constexpr (std::is_same_v<T, float>) {
      if (!tensor_cores)
        return conv2d_forward_cuda(s, in_view, d_w.data(), d_bias.data(), view(out), ws.data(), ws.size(), nullptr,
                                   moments);
    }
    conv2d_forward_tc<T>(s, in_view, d_w.data(), d_bias.data(), view(out), ws.data(), ws.size(), nullptr, moments);
  };
  conv(plain, {});
#if YOLO_EMULATED_KERNELS
  const unsigned long long wgmma_before = emu::wgmma_ops_run();
#endif
  conv(with, ConvMoments{partials.data(), counts.data()});
#if YOLO_EMULATED_KERNELS
  // Forced wgmma runs it wherever its forward takes the shape (16-byte gathers: c_in % 8 == 0).
  if (mode == Mode::Wgmma) CHECK((emu::wgmma_ops_run() > wgmma_before) == (s.c_in % 8 == 0));
#endif
  const std::vector<T> out = with.download();
  CHECK(same_bits(out, plain.download()));  // the moments change nothing in the output
  const std::vector<float> cnt = counts.download();
  double covered = 0;
  for (float v : cnt) covered += v;
  CHECK(covered == double(size_t(s.n) * oh * ow));

  const Stats want = exact_stats(exact(out), s.c_out);
  DeviceArray<float> gamma(device, rng.floats(size_t(s.c_out), 0.5f, 1.5f)), beta(device, rng.floats(size_t(s.c_out)));
  DeviceArray<float> mean_sep(device, size_t(s.c_out)), var_sep(device, size_t(s.c_out)),
      mean_mom(device, size_t(s.c_out)), var_mom(device, size_t(s.c_out));
  batchnorm_activation_forward_training_cuda<T>(Activation::Leaky, cview(plain), gamma.data(), beta.data(), view(y_sep),
                                                mean_sep.data(), var_sep.data(), nullptr, nullptr, ws.data(), ws.size(),
                                                nullptr);
  batchnorm_activation_forward_from_moments_cuda<T>(
      Activation::Leaky, cview(with), gamma.data(), beta.data(), view(y_mom), partials.data(), counts.data(), blocks,
      mean_mom.data(), var_mom.data(), nullptr, nullptr, ws.data(), ws.size(), nullptr);
  const std::vector<float> ms = mean_sep.download(), vs = var_sep.download(), mm = mean_mom.download(),
                           vm = var_mom.download();
  for (int ch = 0; ch < s.c_out; ++ch) {
    CAPTURE(ch);
    const size_t c = size_t(ch);
    const double scale = std::fabs(want.mean[c]) + std::sqrt(want.var[c]);
    // FP32 rounding of the mean (|mean| + std) and of the variance (relative), plus the error the
    // separate pass itself makes.
    const double mean_tol = 4 * std::fabs(ms[c] - want.mean[c]) + 1e-6 * scale;
    // The variance's rounding grows with |mean| / std (the deviations are |mean| / std times
    // smaller than the values they are taken from).
    const double spread = 1 + std::fabs(want.mean[c]) / std::sqrt(want.var[c] + 1e-30);
    const double var_tol =
        4 * std::fabs(vs[c] - want.var[c]) + 1e-6 * spread * want.var[c] + 1e-5 * want.var[c] + 1e-12;
    CHECK(std::fabs(mm[c] - want.mean[c]) <= mean_tol);
    CHECK(std::fabs(vm[c] - want.var[c]) <= var_tol);
  }
  // --sync-bn's phases 1 and 2 from the moments against the same phases reading x.
  const double total = double(size_t(s.n) * oh * ow);
  DeviceArray<float> sums_x(device, size_t(s.c_out)), sums_m(device, size_t(s.c_out)),
      squares_x(device, size_t(s.c_out)), squares_m(device, size_t(s.c_out));
  batchnorm_sums_cuda<T>(cview(plain), sums_x.data(), ws.data(), ws.size(), nullptr);
  batchnorm_sums_from_moments_cuda(s.c_out, partials.data(), counts.data(), blocks, sums_m.data(), ws.data(), ws.size(),
                                   nullptr);
  batchnorm_centered_squares_cuda<T>(cview(plain), sums_x.data(), total, squares_x.data(), ws.data(), ws.size(),
                                     nullptr);
  batchnorm_centered_squares_from_moments_cuda(s.c_out, partials.data(), counts.data(), blocks, sums_x.data(), total,
                                               squares_m.data(), ws.data(), ws.size(), nullptr);
  const std::vector<float> sx = sums_x.download(), sm = sums_m.download(), qx = squares_x.download(),
                           qm = squares_m.download();
  for (int ch = 0; ch < s.c_out; ++ch) {
    CAPTURE(ch);
    const size_t c = size_t(ch);
    // The squares are taken about sums_x / total, which is not quite the exact mean.
    const double center = double(sx[c]) / total, sum = want.mean[c] * total;
    const double squares = (want.var[c] + (want.mean[c] - center) * (want.mean[c] - center)) * total;
    const double scale = (std::fabs(want.mean[c]) + std::sqrt(want.var[c])) * total;
    CHECK(std::fabs(sm[c] - sum) <= 4 * std::fabs(sx[c] - sum) + 1e-6 * scale);
    CHECK(std::fabs(qm[c] - squares) <= 4 * std::fabs(qx[c] - squares) + 2e-5 * squares + 1e-12);
  }
  const std::vector<double> ya = exact(y_mom.download()), yb = exact(y_sep.download());
  const double unit = std::is_same_v<T, float> ? 1e-4 : 2e-2;  // about one 16-bit rounding
  double worst = 0;
  for (size_t i = 0; i < ya.size(); ++i) worst = std::max(worst, std::fabs(ya[i] - yb[i]) / (1 + std::fabs(yb[i])));
  CHECK(worst <= unit);
}

// every: all shapes, else every fourth (TF32: the code is BF16's with T = float; CI time).
template <typename T>
void check_all(Device device, bool tensor_cores, bool every = true) {
  Rng rng;
  CAPTURE(rng.seed());
  for (size_t i = 0; i < shapes().size(); i += every ? 1 : 4) {
    const Conv2dShape& s = shapes()[i];
    for (bool offset : {false, true})
      for (Mode mode : {Mode::Automatic, Mode::Split, Mode::Wgmma}) {
        // wgmma (16-bit, and TF32's forward): |mean| >> std only (the emulated 128x128 tiles cost
        // CI time).
        if (mode == Mode::Wgmma && (!tensor_cores || !offset)) continue;
        const std::string shape = std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) + " " +
                                  std::to_string(s.c_in) + "->" + std::to_string(s.c_out) + " k" + std::to_string(s.k) +
                                  " s" + std::to_string(s.stride);
        CAPTURE(shape);
        CAPTURE(offset);
        CAPTURE(int(mode));
        check_shape<T>(device, s, tensor_cores, offset, mode, rng);
      }
  }
}

}  // namespace

TEST_CASE("conv moments (FP32 CUDA conv): BatchNorm's statistics from the epilogue equal the separate pass") {
  KERNEL_TEST_DEVICE(device);
  check_all<float>(device, false);
}

TEST_CASE(
    "conv moments (tensor cores, TF32 and BF16): BatchNorm's statistics from the epilogue equal the separate "
    "pass") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) {
    MESSAGE("skipped: the kernel device has no BF16/TF32 tensor cores");
    return;
  }
  check_all<float>(device, true, false);
  check_all<Bf16>(device, true);
}

TEST_CASE("conv moments (wgmma): persistent blocks take the statistics of every tile they walk") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  // 22 tiles (11 of 128 pixels by 2 of 128 channels) on 3 blocks (on any device): each block
  // stores and reads back seven or eight, its math warpgroups meeting at a named barrier while
  // the producers fill the next tile's stages; 3 k-tiles a tile (not a multiple of the 4 stages).
  const WgmmaBlockCap three_blocks(3);
  check_shape<Bf16>(device, Conv2dShape{2, 23, 29, 16, 136, 3, 1}, true, true, Mode::Wgmma, rng);
}

TEST_CASE("batchnorm from moments: many blocks are merged in groups first, and agree with FP64") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const int c = 5, blocks = 2500, per = 3;  // > 1024 blocks: the merge pass runs
  const int pixels = blocks * per;
  std::vector<float> x = rng.floats(size_t(pixels) * c, 99.0f, 101.0f);  // |mean| >> std
  std::vector<float> partials(size_t(blocks) * c * 2), counts(static_cast<size_t>(blocks), static_cast<float>(per));
  for (int b = 0; b < blocks; ++b)
    for (int ch = 0; ch < c; ++ch) {
      double mean = 0, m2 = 0;
      for (int p = 0; p < per; ++p) mean += x[(size_t(b) * per + p) * c + ch];
      mean /= per;
      for (int p = 0; p < per; ++p) m2 += std::pow(x[(size_t(b) * per + p) * c + ch] - mean, 2);
      partials[(size_t(b) * c + ch) * 2] = float(mean);
      partials[(size_t(b) * c + ch) * 2 + 1] = float(m2);
    }
  std::vector<double> xd(x.begin(), x.end());
  const Stats want = exact_stats(xd, c);
  DeviceArray<float> d_x(device, x), y(device, x.size()), d_partials(device, partials), d_counts(device, counts);
  DeviceArray<float> gamma(device, std::vector<float>(size_t(c), 1.0f)),
      beta(device, std::vector<float>(size_t(c), 0.0f));
  DeviceArray<float> mean(device, size_t(c)), var(device, size_t(c)),
      run_mean(device, std::vector<float>(size_t(c), 0.0f)), run_var(device, std::vector<float>(size_t(c), 1.0f));
  const size_t bytes = batchnorm_from_moments_workspace_bytes(blocks, c);
  CHECK(bytes > 0);
  CHECK(batchnorm_from_moments_workspace_bytes(1024, c) == 0);
  DeviceArray<unsigned char> ws(device, bytes);
  const NhwcView<const float> xv{d_x.data(), 1, 1, pixels, c, c};
  const NhwcView<float> yv{y.data(), 1, 1, pixels, c, c};
  CHECK_THROWS_WITH_AS(batchnorm_activation_forward_from_moments_cuda<float>(
                           Activation::Linear, xv, gamma.data(), beta.data(), yv, d_partials.data(), d_counts.data(),
                           blocks, mean.data(), var.data(), nullptr, nullptr, ws.data(), bytes - 1, nullptr),
                       doctest::Contains("needed (batchnorm_from_moments_workspace_bytes)"), Error);
  std::vector<float> first_mean, first_var;
  for (int run = 0; run < 2; ++run) {
    batchnorm_activation_forward_from_moments_cuda<float>(
        Activation::Linear, xv, gamma.data(), beta.data(), yv, d_partials.data(), d_counts.data(), blocks, mean.data(),
        var.data(), run_mean.data(), run_var.data(), ws.data(), bytes, nullptr);
    if (run == 0) first_mean = mean.download(), first_var = var.download();
  }
  CHECK(same_bits(mean.download(), first_mean));  // deterministic
  CHECK(same_bits(var.download(), first_var));
  for (int ch = 0; ch < c; ++ch) {
    CAPTURE(ch);
    CHECK(std::fabs(first_mean[size_t(ch)] - want.mean[size_t(ch)]) <= 2e-5);  // a few ulps of 100
    CHECK(std::fabs(first_var[size_t(ch)] - want.var[size_t(ch)]) <= 1e-4 * want.var[size_t(ch)]);
  }
  // Twice from running 0 / 1: 0.99^2 of the start plus the two updates.
  const std::vector<float> rm = run_mean.download();
  CHECK(std::fabs(rm[0] - (1 - 0.99 * 0.99) * want.mean[0]) <= 1e-4);
}
