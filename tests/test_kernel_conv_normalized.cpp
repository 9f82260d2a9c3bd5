// A convolution reading its input through BatchNorm's apply (kernels/conv.h, NormalizedInput;
// kernels/normalized_input.cuh) against the unfused pair: the apply writing y
// (batchnorm_activation_forward_inference_cuda, the same expression as the training apply), then
// the convolution reading y. The forward's output and the weight gradient must have the same
// bits: the loaders compute what the apply stores, and the rest of the kernel is unchanged. On
// fresh random inputs of odd sizes, statistics far from (0, 1) so that a normalized zero is not
// zero (a transformed padding shows at every border), leaky and linear, every tensor-core
// precision, both mma.sync loaders (16-byte chunks and gathered elements, the cp.async pipeline
// asked for), wgmma forced (its input gathered, and by TMA's im2col mode where c_in allows: the
// producers then normalize what TMA landed), stride 2, 1x1, an input slice.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/tc_check.h"
#include "tests/tc_tiling.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

struct NormCase {
  Conv2dShape s;
  Activation act = Activation::Leaky;
  int in_stride = 0, in_offset = 0;
  int pipeline = 0;     // 0: the planner's; 2: cp.async asked for; 3: wgmma forced
  int splits = 0;       // forced split-K (mma.sync)
  bool wgmma = false;   // with pipeline 3: the passes that must run on wgmma (forward; the weight
                        // gradient too in 16 bits)
  bool im2col = false;  // and take their input by TMA's im2col mode (emulated: counted)
};

std::string describe(const NormCase& c) {
  const Conv2dShape& s = c.s;
  return std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) + " " + std::to_string(s.c_in) +
         "->" + std::to_string(s.c_out) + " k" + std::to_string(s.k) + " s" + std::to_string(s.stride) + " " +
         activation_name(c.act) + " in_stride " + std::to_string(c.in_stride) + "+" + std::to_string(c.in_offset) +
         " pipeline " + std::to_string(c.pipeline) + " splits " + std::to_string(c.splits);
}

template <typename T>
void check_normalized(Device device, const NormCase& c) {
  CAPTURE(describe(c));
  CAPTURE(precision_name(tc_precision<T>()));
  const Conv2dShape& s = c.s;
  const int oh = s.out_h(), ow = s.out_w();
  Rng rng;
  CAPTURE(rng.seed());
  TcTiling tiling(-1, c.splits, c.pipeline);

  const NhwcBuffer<T> x = random_buffer<T>(rng, s.n, s.h, s.w, s.c_in, c.in_stride, c.in_offset);
  NhwcBuffer<T> y = poisoned_buffer<T>(s.n, s.h, s.w, s.c_in, c.in_stride, c.in_offset);  // x's layout
  const NhwcBuffer<T> grad_out = random_buffer<T>(rng, s.n, oh, ow, s.c_out, 0, 0);
  const std::vector<T> weights = stored<T>(rng.floats(s.weight_count(), -0.5f, 0.5f));
  const size_t C = size_t(s.c_in);
  DeviceArray<float> mean(device, rng.floats(C, -0.8f, 0.8f)), var(device, rng.floats(C, 0.05f, 3.0f));
  DeviceArray<float> gamma(device, rng.floats(C, 0.3f, 2.0f)), beta(device, rng.floats(C, -1.0f, 1.0f));
  DeviceArray<float> table(device, 4 * C);
  table.poison();
  DeviceArray<T> d_x(device, x.data), d_y(device, y.data), d_g(device, grad_out.data), d_w(device, weights);
  batchnorm_input_table_cuda(s.c_in, mean.data(), var.data(), gamma.data(), beta.data(), table.data(), nullptr);
  batchnorm_activation_forward_inference_cuda<T>(c.act, x.cview(d_x.data()), gamma.data(), beta.data(), mean.data(),
                                                 var.data(), y.view(d_y.data()), nullptr);
  const NormalizedInput norm{table.data(), c.act};
  const bool wgrad_wgmma = c.wgmma && sizeof(T) == 2;

  {
    INFO("forward");
    const size_t ws_bytes = conv2d_forward_tc_workspace_bytes<T>(s);
    DeviceArray<unsigned char> ws(device, ws_bytes + 16);
    DeviceArray<T> d_out(device, size_t(s.n) * oh * ow * s.c_out);
    auto run = [&](const T* in, NormalizedInput n) {
      d_out.poison();
      conv2d_forward_tc<T>(s, x.cview(in), d_w.data(), nullptr, nhwc(d_out.data(), s.n, oh, ow, s.c_out),
                           ws_bytes ? ws.data() : nullptr, ws_bytes, nullptr, {}, n);
      return d_out.download();
    };
    const std::vector<T> unfused = run(d_y.data(), {});
    const WgmmaRan ran;
    const Im2colRan im2col;
    const std::vector<T> fused = run(d_x.data(), norm);
    if (c.pipeline == 3) ran.check(c.wgmma), im2col.check(c.im2col);
    CHECK(same_bits(fused, unfused));
  }
  {
    INFO("weight gradient");
    const size_t ws_bytes = conv2d_backward_weights_tc_workspace_bytes<T>(s);
    DeviceArray<unsigned char> ws(device, ws_bytes + 16);
    DeviceArray<float> d_gw(device, s.weight_count());
    auto run = [&](const T* in, NormalizedInput n) {
      d_gw.poison();
      conv2d_backward_weights_tc<T>(s, x.cview(in), grad_out.cview(d_g.data()), d_gw.data(), nullptr,
                                    ws_bytes ? ws.data() : nullptr, ws_bytes, nullptr, n);
      return d_gw.download();
    };
    const std::vector<float> unfused = run(d_y.data(), {});
    const WgmmaRan ran;
    const Im2colRan im2col;
    const std::vector<float> fused = run(d_x.data(), norm);
    if (c.pipeline == 3) ran.check(wgrad_wgmma), im2col.check(wgrad_wgmma && c.im2col);
    CHECK(same_bits(fused, unfused));
  }
}

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> cases;
  auto add = [&](Conv2dShape s, auto... tweak) {
    NormCase c;
    c.s = s;
    (tweak(c), ...);
    cases.push_back(c);
  };
  add(Conv2dShape{2, 9, 11, 13, 21, 3, 1});                                                  // gathered elements
  add(Conv2dShape{2, 7, 9, 32, 24, 3, 1}, [](NormCase& c) { c.pipeline = 2; });             // chunks; not cp.async
  add(Conv2dShape{1, 11, 10, 16, 40, 3, 2}, [](NormCase& c) { c.act = Activation::Linear; });
  add(Conv2dShape{2, 8, 7, 24, 16, 1, 1});
  add(Conv2dShape{1, 7, 9, 40, 24, 3, 1}, [](NormCase& c) { c.splits = 3; });  // split-K: each split normalizes
  add(Conv2dShape{1, 6, 5, 16, 24, 3, 1}, [](NormCase& c) { c.in_stride = 27, c.in_offset = 5; });
  add(Conv2dShape{2, 9, 7, 16, 64, 3, 1}, [](NormCase& c) { c.pipeline = 3, c.wgmma = true; });
  add(Conv2dShape{1, 11, 9, 24, 40, 3, 2}, [](NormCase& c) { c.pipeline = 3, c.wgmma = true; });
  add(Conv2dShape{2, 7, 6, 8, 64, 1, 1}, [](NormCase& c) {
    c.pipeline = 3, c.wgmma = true, c.act = Activation::Linear;
  });
  // TMA's im2col mode (c_in a multiple of 64): the producers normalize the rows TMA landed, the
  // padding's zeros left alone; stride 2 and a slice of a wider tensor.
  add(Conv2dShape{2, 9, 7, 64, 40, 3, 1}, [](NormCase& c) { c.pipeline = 3, c.wgmma = true, c.im2col = true; });
  add(Conv2dShape{1, 10, 9, 128, 24, 3, 2}, [](NormCase& c) {
    c.pipeline = 3, c.wgmma = true, c.im2col = true, c.act = Activation::Linear;
  });
  add(Conv2dShape{2, 6, 7, 64, 16, 3, 1}, [](NormCase& c) {
    c.pipeline = 3, c.wgmma = true, c.im2col = true, c.in_stride = 136, c.in_offset = 64;
  });
  // A slice whose data is only 16-byte aligned: TMA's swizzled maps want 128, so it is gathered.
  add(Conv2dShape{2, 6, 7, 64, 16, 3, 1}, [](NormCase& c) {
    c.pipeline = 3, c.wgmma = true, c.in_stride = 72, c.in_offset = 8;
  });
  // Persistent blocks: 5 tiles of 128 pixels, more than the kernel tests' emulated GPU has SMs
  // (4), so a block normalizes the stages of a second tile (the ring's count running on).
  add(Conv2dShape{1, 25, 25, 16, 24, 3, 1}, [](NormCase& c) { c.pipeline = 3, c.wgmma = true; });
  add(Conv2dShape{1, 25, 25, 64, 24, 3, 1}, [](NormCase& c) { c.pipeline = 3, c.wgmma = true, c.im2col = true; });
  return cases;
}

template <typename T>
void check_all(Device device) {
  for (const NormCase& c : norm_cases()) check_normalized<T>(device, c);
}

}  // namespace

TEST_CASE("kernel: conv2d reading its input through BatchNorm's apply has the unfused pair's bits, TF32") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) SKIP_TEST("TF32 needs sm_80");
  check_all<float>(device);
}

TEST_CASE("kernel: conv2d reading its input through BatchNorm's apply has the unfused pair's bits, BF16") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) SKIP_TEST("BF16 needs sm_80");
  check_all<Bf16>(device);
}

TEST_CASE("kernel: conv2d reading its input through BatchNorm's apply has the unfused pair's bits, FP16") {
  KERNEL_TEST_DEVICE(device);
  check_all<Fp16>(device);
}

TEST_CASE("kernel: a BatchNorm-normalized conv input is refused where the kernels cannot read it") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 75) SKIP_TEST("needs tensor cores");
  const Conv2dShape s{1, 4, 4, 3, 8, 3, 1};  // 3 channels: the small-channel kernels
  DeviceArray<Fp16> x(device, 48), w(device, s.weight_count()), y(device, 128);
  DeviceArray<float> table(device, 16);
  const NormalizedInput norm{table.data(), Activation::Leaky};
  CHECK_THROWS_WITH_AS(conv2d_forward_tc<Fp16>(s, nhwc<const Fp16>(x.data(), 1, 4, 4, 3), w.data(), nullptr,
                                               nhwc(y.data(), 1, 4, 4, 8), nullptr, 0, nullptr, {}, norm),
                       doctest::Contains("conv2d_forward_tc: a BatchNorm-normalized input needs more than 3 input "
                                         "channels"),
                       Error);
  const NormalizedInput unaligned{table.data() + 1, Activation::Leaky};
  const Conv2dShape s8{1, 4, 4, 8, 8, 3, 1};
  DeviceArray<float> gw(device, s8.weight_count());
  const size_t ws_bytes = conv2d_backward_weights_tc_workspace_bytes<Fp16>(s8);
  DeviceArray<unsigned char> ws(device, ws_bytes + 16);
  CHECK_THROWS_WITH_AS(conv2d_backward_weights_tc<Fp16>(s8, nhwc<const Fp16>(y.data(), 1, 4, 4, 8),
                                                        nhwc<const Fp16>(y.data(), 1, 4, 4, 8), gw.data(), nullptr,
                                                        ws.data(), ws_bytes, nullptr, unaligned),
                       doctest::Contains("conv2d_backward_weights_tc: the normalized input's table is not 16-byte "
                                         "aligned"),
                       Error);
}

TEST_CASE("kernel: the BatchNorm training forward with an empty y computes the statistics alone") {
  KERNEL_TEST_DEVICE(device);
  const int n = 2, h = 5, w = 7, c = 12;
  const size_t C = size_t(c), count = size_t(n) * h * w * C;
  Rng rng;
  CAPTURE(rng.seed());
  DeviceArray<float> x(device, rng.floats(count, -3.0f, 5.0f)), y(device, count);
  DeviceArray<float> gamma(device, rng.floats(C, 0.5f, 1.5f)), beta(device, rng.floats(C));
  const std::vector<float> running = rng.floats(2 * C, 0.1f, 1.0f);
  const size_t ws_bytes = batchnorm_workspace_bytes(n, h, w, c);
  DeviceArray<unsigned char> ws(device, ws_bytes + 16);
  auto run = [&](NhwcView<float> out, NhwcView<const float> residual = {}) {
    DeviceArray<float> saved(device, 2 * C), stats(device, running);
    saved.poison();
    batchnorm_activation_forward_training_cuda<float>(Activation::Leaky, nhwc<const float>(x.data(), n, h, w, c),
                                                      gamma.data(), beta.data(), out, saved.data(),
                                                      saved.data() + c, stats.data(), stats.data() + c, ws.data(),
                                                      ws_bytes, nullptr, residual);
    return std::make_pair(saved.download(), stats.download());
  };
  y.poison();
  const auto with_y = run(nhwc(y.data(), n, h, w, c));
  y.poison();
  const auto alone = run({});
  CHECK(same_bits(alone.first, with_y.first));    // the batch statistics
  CHECK(same_bits(alone.second, with_y.second));  // the running ones
  const std::vector<float> untouched = y.download();
  size_t written = 0;
  for (float v : untouched) written += !poisoned(v);
  CHECK(written == 0);
  CHECK_THROWS_WITH_AS(run({}, nhwc<const float>(x.data(), n, h, w, c)),
                       doctest::Contains("a residual needs y (an empty y computes the statistics only)"), Error);
}
