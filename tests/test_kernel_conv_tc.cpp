// conv2d on tensor cores (kernels/conv_tc.cu), every pass in TF32, BF16 and FP16, against the
// FP64 reference of the inputs as stored (16-bit inputs rounded first; TF32 inputs as FP32):
//   - every element within (c*u + K*2^-23) * (|A|*|B|)_ij of the reference, with c = 3 and u the
//     unit roundoff of the input precision (2^-11 TF32 and FP16, 2^-8 BF16), K the reduction
//     length: the MMA's input rounding (TF32: both operands), the output's rounding to 16 bits
//     and FP32 accumulation, measured against sums of magnitudes, so a single wrong element
//     fails and cancellation cannot hide one; NaN never passes;
//   - the relative norm ||out - ref|| / ||ref|| at most 1e-3 (TF32) or 1e-2 (BF16, FP16);
//   - nothing written outside an output's channel slice; the same bits on a second run;
// on fresh random inputs with odd sizes, the 3-channel first layer, stride 2, 1x1 kernels,
// channel slices at unaligned offsets, every tile, split counts and both pipelines; inputs of up
// to 4 channels take kernels/conv_small_c.cu (CUDA cores) through the same entry points. Precisions
// a device cannot run are refused (BF16/TF32 on sm_75).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/conv.h"
#include "kernels/gemm.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/tc_check.h"
#include "tests/tc_tiling.h"
#include "tests/test_support.h"

#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#include "tests/emu_fixtures.h"
#endif

using namespace yolo;
using namespace yolo::testing;

namespace {

struct TcConvCase {
  Conv2dShape s;
  int in_stride = 0, in_offset = 0;    // the input view inside a wider buffer (0: dense)
  int out_stride = 0, out_offset = 0;  // the output view (forward out, backward grad_in)
  bool bias = true, accumulate = false;
  int tile = -1, splits = 0, pipeline = 0;
  // With pipeline 3 (wgmma forced), which passes must run on wgmma in 16 bits (checked under
  // emulation): forward, backward data, weight gradient; the others fall back to mma.sync.
  bool wgmma[3] = {false, false, false};
};

std::string describe(const TcConvCase& c) {
  const Conv2dShape& s = c.s;
  return std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) + " " + std::to_string(s.c_in) +
         "->" + std::to_string(s.c_out) + " k" + std::to_string(s.k) + " s" + std::to_string(s.stride) +
         " in_stride " + std::to_string(c.in_stride) + "+" + std::to_string(c.in_offset) + " out_stride " +
         std::to_string(c.out_stride) + "+" + std::to_string(c.out_offset) + " tile " + std::to_string(c.tile) +
         " splits " + std::to_string(c.splits) + " pipeline " + std::to_string(c.pipeline);
}

// Whether a TF32 pass reads its operands truncated: the planner chose wgmma for it and the views
// let it run there (as conv2d_*_tc dispatch; 16-byte copies of 4 floats). The forward gathers
// the input (perhaps a slice), backward data the dense grad_out; the weights need c_in % 4.
bool tf32_on_wgmma(const TcConvCase& c, tc::TcPass pass) {
  const tc::TcPlan plan = tc::choose_plan(conv2d_tc_problem(c.s, pass, Precision::Tf32), tc::current_gpu());
  if (pass == tc::TcPass::BackwardData) return plan.wgmma && c.s.c_out % 4 == 0 && c.s.c_in % 4 == 0;
  const int stride = c.in_stride ? c.in_stride : c.s.c_in;
  return plan.wgmma && stride % 4 == 0 && c.in_offset % 4 == 0;
}

// A case that forces its tiling: the planner's choice between wgmma and mma.sync is not its own.
bool forced(const TcConvCase& c) { return c.tile >= 0 || c.splits > 0 || c.pipeline > 0; }

template <typename T>
void check_conv_tc(Device device, const TcConvCase& c) {
  CAPTURE(describe(c));
  CAPTURE(precision_name(tc_precision<T>()));
  const Conv2dShape& s = c.s;
  const int oh = s.out_h(), ow = s.out_w();
  Rng rng;
  CAPTURE(rng.seed());
  TcTiling tiling(c.tile, c.splits, c.pipeline);

  // Inputs as stored (T), and their exact values in double.
  const NhwcBuffer<T> in = random_buffer<T>(rng, s.n, s.h, s.w, s.c_in, c.in_stride, c.in_offset);
  const NhwcBuffer<T> grad_out = random_buffer<T>(rng, s.n, oh, ow, s.c_out, 0, 0);
  const std::vector<T> weights = stored<T>(rng.floats(s.weight_count(), -0.5f, 0.5f));
  const std::vector<float> bias = rng.floats(size_t(s.c_out));
  const std::vector<double> w64 = exact(weights), b64(bias.begin(), bias.end());
  const std::vector<double> in64 = in.dense_values(), g64 = grad_out.dense_values();
  const NhwcView<const double> in_ref = nhwc<const double>(in64.data(), s.n, s.h, s.w, s.c_in);
  const NhwcView<const double> g_ref = nhwc<const double>(g64.data(), s.n, oh, ow, s.c_out);
  const std::vector<double> in_abs = absolute(in64), g_abs = absolute(g64), w_abs = absolute(w64);
  const NhwcView<const double> in_mag = nhwc<const double>(in_abs.data(), s.n, s.h, s.w, s.c_in);
  const NhwcView<const double> g_mag = nhwc<const double>(g_abs.data(), s.n, oh, ow, s.c_out);

  DeviceArray<T> d_in(device, in.data), d_grad_out(device, grad_out.data), d_w(device, weights);
  DeviceArray<float> d_bias(device, bias);
  const float* bias_ptr = c.bias ? d_bias.data() : nullptr;

  // ---- forward ----
  {
    NhwcBuffer<T> out = poisoned_buffer<T>(s.n, oh, ow, s.c_out, c.out_stride, c.out_offset);
    DeviceArray<T> d_out(device, out.data);
    const size_t ws_bytes = conv2d_forward_tc_workspace_bytes<T>(s);
    DeviceArray<unsigned char> ws(device, ws_bytes + 16);
    auto run = [&] {
      d_out.poison();
      conv2d_forward_tc<T>(s, in.cview(d_in.data()), d_w.data(), bias_ptr, out.view(d_out.data()),
                           ws_bytes ? ws.data() : nullptr, ws_bytes, nullptr);
      return d_out.download();
    };
    const WgmmaRan ran;
    const std::vector<T> got = run();
    // TF32 on wgmma reads its operands truncated, mma.sync rounds them: the reference takes the
    // operands the family that ran reads (and under emulation, that family is checked).
    const bool truncated = std::is_same_v<T, float> && tf32_on_wgmma(c, tc::TcPass::Forward);
    if (forced(c)) ran.check(c.wgmma[0]);
    if (std::is_same_v<T, float>) ran.check(truncated);
    const std::vector<double> in_t = truncated ? tf32_truncated(in64) : in64;
    const std::vector<double> w_t = truncated ? tf32_truncated(w64) : w64;
    std::vector<double> ref(out.dense_count()), mag(out.dense_count());
    conv2d_forward_reference<double>(s, nhwc<const double>(in_t.data(), s.n, s.h, s.w, s.c_in), w_t.data(),
                                     c.bias ? b64.data() : nullptr, nhwc(ref.data(), s.n, oh, ow, s.c_out), nullptr,
                                     0);
    const std::vector<double> b_abs = absolute(b64);
    conv2d_forward_reference<double>(s, in_mag, w_abs.data(), c.bias ? b_abs.data() : nullptr,
                                     nhwc(mag.data(), s.n, oh, ow, s.c_out), nullptr, 0);
    INFO("forward");
    check_tc_output<T>(out.elements_of(got), ref, mag, s.k * s.k * s.c_in);
    CHECK(out.gap_writes(got) == 0);
    CHECK(same_bits(got, run()));
  }

  // ---- backward data (accumulate: onto random values already there) ----
  {
    NhwcBuffer<T> start = c.accumulate ? random_buffer<T>(rng, s.n, s.h, s.w, s.c_in, c.out_stride, c.out_offset)
                                       : poisoned_buffer<T>(s.n, s.h, s.w, s.c_in, c.out_stride, c.out_offset);
    DeviceArray<T> d_grad_in(device, start.data);
    const size_t ws_bytes = conv2d_backward_data_tc_workspace_bytes<T>(s);
    DeviceArray<unsigned char> ws(device, ws_bytes + 16);
    auto run = [&] {
      d_grad_in.upload(start.data);
      conv2d_backward_data_tc<T>(s, grad_out.cview(d_grad_out.data()), d_w.data(),
                                 start.view(d_grad_in.data()), c.accumulate, ws_bytes ? ws.data() : nullptr,
                                 ws_bytes, nullptr);
      return d_grad_in.download();
    };
    const WgmmaRan ran;
    const std::vector<T> got = run();
    // As the forward: TF32 on wgmma reads grad_out and the weights truncated.
    const bool truncated = std::is_same_v<T, float> && tf32_on_wgmma(c, tc::TcPass::BackwardData);
    if (forced(c)) ran.check(c.wgmma[1]);
    if (std::is_same_v<T, float>) ran.check(truncated);
    const std::vector<double> g_t = truncated ? tf32_truncated(g64) : g64;
    const std::vector<double> w_t = truncated ? tf32_truncated(w64) : w64;
    std::vector<double> ref = c.accumulate ? start.dense_values() : std::vector<double>(start.dense_count(), 0.0);
    // With accumulate the start's rounding into the 16-bit sum counts too: |start| joins the magnitudes.
    std::vector<double> mag = absolute(ref);
    conv2d_backward_data_reference<double>(s, nhwc<const double>(g_t.data(), s.n, oh, ow, s.c_out), w_t.data(),
                                           nhwc(ref.data(), s.n, s.h, s.w, s.c_in), c.accumulate, nullptr, 0);
    conv2d_backward_data_reference<double>(s, g_mag, w_abs.data(), nhwc(mag.data(), s.n, s.h, s.w, s.c_in),
                                           c.accumulate, nullptr, 0);
    INFO("backward data");
    check_tc_output<T>(start.elements_of(got), ref, mag, s.k * s.k * s.c_out);
    CHECK(start.gap_writes(got) == 0);
    CHECK(same_bits(got, run()));
  }

  // ---- backward weights (FP32 gradients) ----
  {
    DeviceArray<float> d_gw(device, s.weight_count()), d_gb(device, size_t(s.c_out));
    const size_t ws_bytes = conv2d_backward_weights_tc_workspace_bytes<T>(s);
    DeviceArray<unsigned char> ws(device, ws_bytes + 16);
    auto run = [&] {
      d_gw.poison();
      d_gb.poison();
      conv2d_backward_weights_tc<T>(s, in.cview(d_in.data()), grad_out.cview(d_grad_out.data()),
                                    d_gw.data(), c.bias ? d_gb.data() : nullptr, ws_bytes ? ws.data() : nullptr,
                                    ws_bytes, nullptr);
      return std::make_pair(d_gw.download(), d_gb.download());
    };
    const WgmmaRan ran;
    const auto got = run();
    if (forced(c)) ran.check(sizeof(T) == 2 && c.wgmma[2]);
    std::vector<double> ref(s.weight_count()), mag(s.weight_count()), ref_b(size_t(s.c_out)), mag_b(size_t(s.c_out));
    conv2d_backward_weights_reference<double>(s, in_ref, g_ref, ref.data(), ref_b.data(), nullptr, 0);
    conv2d_backward_weights_reference<double>(s, in_mag, g_mag, mag.data(), mag_b.data(), nullptr, 0);
    INFO("backward weights");
    check_tc_output<float, T>(got.first, ref, mag, s.n * oh * ow);
    if (c.bias) check_tc_output<float, T>(got.second, ref_b, mag_b, s.n * oh * ow);
    const auto again = run();
    CHECK(same_bits(got.first, again.first));
    CHECK(same_bits(got.second, again.second));
  }
}

template <typename T>
void check_cases(Device device, const std::vector<TcConvCase>& cases) {
  for (const TcConvCase& c : cases) check_conv_tc<T>(device, c);
}

// Odd sizes on both gather paths, the first layer's 3 channels, stride 2, 1x1, channel slices
// at unaligned offsets, accumulate, forced tiles, splits and pipelines, and the small-channel path.
std::vector<TcConvCase> conv_cases() {
  std::vector<TcConvCase> cases;
  auto add = [&](Conv2dShape s, auto... tweak) {
    TcConvCase c;
    c.s = s;
    (tweak(c), ...);
    cases.push_back(c);
  };
  add(Conv2dShape{2, 9, 11, 13, 21, 3, 1});                                           // gathered (13 channels)
  add(Conv2dShape{1, 13, 10, 3, 16, 3, 2}, [](TcConvCase& c) { c.accumulate = true; });  // first layer, stride 2
  add(Conv2dShape{2, 7, 9, 32, 24, 3, 1}, [](TcConvCase& c) { c.splits = 3; });         // 16-byte chunks, split K
  add(Conv2dShape{2, 8, 7, 16, 40, 1, 1}, [](TcConvCase& c) { c.tile = 0; c.bias = false; });
  add(Conv2dShape{1, 11, 11, 24, 8, 3, 2}, [](TcConvCase& c) { c.pipeline = 1; c.accumulate = true; });
  add(Conv2dShape{1, 6, 5, 16, 24, 3, 1}, [](TcConvCase& c) {  // slices at odd offsets
    c.in_stride = 27, c.in_offset = 5, c.out_stride = 31, c.out_offset = 3, c.accumulate = true;
  });
  add(Conv2dShape{1, 9, 7, 64, 72, 3, 1}, [](TcConvCase& c) { c.tile = 1; c.splits = 2; c.pipeline = 2; });
  add(Conv2dShape{2, 5, 5, 40, 8, 5, 1});
  // wgmma forced (pipeline 3; TF32 takes the forward and backward data): every pass on it, grad_in accumulated
  // into an aligned slice; an input
  // slice its 16-byte copies cannot read (forward and weight gradient fall back to mma.sync,
  // backward data reads only grad_out); stride 2 with 40 output channels (backward data on
  // mma.sync: a k-tile of 64 would straddle taps); stride 2 with 64, every pass on wgmma (backward
  // data by parity classes), accumulated into a slice.
  add(Conv2dShape{2, 9, 11, 16, 64, 3, 1}, [](TcConvCase& c) {
    c.pipeline = 3, c.accumulate = true, c.out_stride = 88, c.out_offset = 8;
    c.wgmma[0] = c.wgmma[1] = c.wgmma[2] = true;
  });
  add(Conv2dShape{1, 7, 6, 24, 64, 1, 1}, [](TcConvCase& c) {
    c.pipeline = 3, c.in_stride = 35, c.in_offset = 5, c.bias = false;
    c.wgmma[1] = true;
  });
  add(Conv2dShape{1, 11, 9, 8, 40, 3, 2}, [](TcConvCase& c) {
    c.pipeline = 3;
    c.wgmma[0] = c.wgmma[2] = true;
  });
  add(Conv2dShape{2, 7, 9, 16, 64, 3, 2}, [](TcConvCase& c) {
    c.pipeline = 3, c.accumulate = true, c.out_stride = 80, c.out_offset = 8;
    c.wgmma[0] = c.wgmma[1] = c.wgmma[2] = true;
  });
  // Few input channels: the forward and weight gradient on CUDA cores (kernels/conv_small_c.cu,
  // chosen by conv2d_tc_small_channels), c_in 1 to 4, odd output channels, 1x1 to 5x5, the image
  // as a 3-channel view of a wider buffer, an output slice, and enough pixels for several slices
  // of several 256-pixel chunks.
  add(Conv2dShape{3, 9, 7, 1, 13, 3, 2});
  add(Conv2dShape{1, 8, 9, 4, 50, 1, 1}, [](TcConvCase& c) { c.bias = false; });
  add(Conv2dShape{1, 7, 6, 1, 24, 5, 1}, [](TcConvCase& c) { c.out_stride = 31, c.out_offset = 5; });
  add(Conv2dShape{2, 48, 50, 3, 32, 3, 1}, [](TcConvCase& c) { c.in_stride = 8, c.in_offset = 0; });
  return cases;
}

// An Inf reaches exactly the outputs that read it: every other output keeps the bits it had with
// a 0 in its place, and each output that reads it is not finite. Catches a loader that reads real
// pixels where the reduction is padded past its end (3 x 3 x 8 = 72 and 3 x 3 x 16 = 144 are not
// whole 32-element stages: the padding's positions name the row below a receptive field), which
// zero-padded weights hide from finite inputs.
template <typename T>
void check_inf_reach(Device device) {
  const Conv2dShape s{1, 9, 9, 8, 16, 3, 1};
  Rng rng;
  CAPTURE(rng.seed());
  CAPTURE(precision_name(tc_precision<T>()));
  const T inf = from_float<T>(std::numeric_limits<float>::infinity());
  NhwcBuffer<T> in = random_buffer<T>(rng, s.n, s.h, s.w, s.c_in, 0, 0);
  NhwcBuffer<T> grad_out = random_buffer<T>(rng, s.n, s.h, s.w, s.c_out, 0, 0);
  const std::vector<T> weights = stored<T>(rng.floats(s.weight_count(), -0.5f, 0.5f));
  DeviceArray<T> d_in(device, in.data), d_grad(device, grad_out.data), d_w(device, weights);
  const int y0 = 6, x0 = 4;  // the Inf's pixel: an input pixel (forward), an output pixel (backward data)
  // A pixel (y, x) of the result reads the Inf's pixel when it lies within the 3 x 3 window.
  auto reads = [&](size_t i, int channels) {
    const int pixel = int(i / size_t(channels)), y = pixel / s.w, x = pixel % s.w;
    return std::abs(y - y0) <= 1 && std::abs(x - x0) <= 1;
  };
  auto compare = [&](const std::vector<T>& finite, const std::vector<T>& with_inf, int channels) {
    size_t kept = 0, reached = 0, reading = 0;
    for (size_t i = 0; i < finite.size(); ++i) {
      if (reads(i, channels)) {
        ++reading;
        reached += !std::isfinite(to_float(with_inf[i]));
      } else {
        kept += finite[i].bits == with_inf[i].bits;
      }
    }
    CHECK(kept == finite.size() - reading);
    CHECK(reached == reading);
  };
  {
    INFO("forward");
    DeviceArray<T> d_out(device, size_t(s.n) * s.h * s.w * s.c_out);
    auto run = [&](T value) {
      in.data[(size_t(y0) * s.w + x0) * s.c_in + 2] = value;
      d_in.upload(in.data);
      conv2d_forward_tc<T>(s, in.cview(d_in.data()), d_w.data(), nullptr, nhwc(d_out.data(), s.n, s.h, s.w, s.c_out),
                           nullptr, 0, nullptr);
      return d_out.download();
    };
    REQUIRE(conv2d_forward_tc_workspace_bytes<T>(s) == 0);
    const std::vector<T> finite = run(from_float<T>(0.0f)), with_inf = run(inf);
    compare(finite, with_inf, s.c_out);
  }
  {
    INFO("backward data");
    DeviceArray<T> d_grad_in(device, size_t(s.n) * s.h * s.w * s.c_in);
    auto run = [&](T value) {
      grad_out.data[(size_t(y0) * s.w + x0) * s.c_out + 3] = value;
      d_grad.upload(grad_out.data);
      conv2d_backward_data_tc<T>(s, grad_out.cview(d_grad.data()), d_w.data(),
                                 nhwc(d_grad_in.data(), s.n, s.h, s.w, s.c_in), false, nullptr, 0, nullptr);
      return d_grad_in.download();
    };
    REQUIRE(conv2d_backward_data_tc_workspace_bytes<T>(s) == 0);
    const std::vector<T> finite = run(from_float<T>(0.0f)), with_inf = run(inf);
    compare(finite, with_inf, s.c_in);
  }
}

}  // namespace

TEST_CASE("kernel: conv2d on tensor cores, TF32, every pass against the FP64 reference") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) SKIP_TEST("TF32 needs sm_80");
  check_cases<float>(device, conv_cases());
}

TEST_CASE("kernel: conv2d on tensor cores, BF16, every pass against the FP64 reference") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) SKIP_TEST("BF16 needs sm_80");
  check_cases<Bf16>(device, conv_cases());
}

TEST_CASE("kernel: conv2d on tensor cores, FP16, every pass against the FP64 reference") {
  KERNEL_TEST_DEVICE(device);
  check_cases<Fp16>(device, conv_cases());
}

TEST_CASE("kernel: conv2d on tensor cores: an Inf reaches exactly the outputs that read it (padded reductions)") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() >= 80) check_inf_reach<Bf16>(device);
  check_inf_reach<Fp16>(device);
}

#if YOLO_EMULATED_KERNELS
TEST_CASE("kernel: conv2d on tensor cores on an emulated sm_75: FP16 runs register-staged, BF16 and TF32 are refused") {
  KERNEL_TEST_DEVICE(device);
  (void)device;  // emu:1 below, configured as a T4
  EmulatedDevicesReset reset;
  emu::configure_device(1, emu::preset_for(75));
  emu::set_current_device(1);
  const std::vector<TcConvCase> cases = {TcConvCase{Conv2dShape{1, 7, 9, 32, 24, 3, 1}},
                                         TcConvCase{Conv2dShape{2, 5, 6, 3, 16, 3, 2}}};
  check_cases<Fp16>(Device::emu(1), cases);
  const Conv2dShape s{1, 4, 4, 8, 8, 3, 1};
  DeviceArray<Bf16> x(Device::emu(1), 128), w(Device::emu(1), s.weight_count()), y(Device::emu(1), 128);
  CHECK_THROWS_WITH_AS(conv2d_forward_tc<Bf16>(s, nhwc<const Bf16>(x.data(), 1, 4, 4, 8), w.data(), nullptr,
                                               nhwc(y.data(), 1, 4, 4, 8), nullptr, 0, nullptr),
                       doctest::Contains("precision bf16 needs tensor cores of sm_80 or newer; this device is sm_75"),
                       Error);
  DeviceArray<float> xf(Device::emu(1), 128), wf(Device::emu(1), s.weight_count());
  CHECK_THROWS_WITH_AS(conv2d_backward_weights_tc<float>(s, nhwc<const float>(xf.data(), 1, 4, 4, 8),
                                                         nhwc<const float>(xf.data(), 1, 4, 4, 8), wf.data(), nullptr,
                                                         nullptr, 0, nullptr),
                       doctest::Contains("precision tf32 needs tensor cores of sm_80"), Error);
}
#endif

#if YOLO_EMULATED_KERNELS
TEST_CASE("kernel: conv2d on tensor cores on an emulated sm_120 (the PTX's sm_80 path, 99 KB a block): every pass") {
  KERNEL_TEST_DEVICE(device);
  (void)device;  // emu:1 below, configured as an RTX 5090
  EmulatedDevicesReset reset;
  emu::DeviceProps rtx = emu::preset_for(120);
  rtx.multiprocessors = 4;  // few SMs: the small cases still use several blocks
  emu::configure_device(1, rtx);
  emu::set_current_device(1);
  CHECK_FALSE(tc::current_gpu().wgmma);
  CHECK(tc::current_gpu().smem_per_block == 99 * 1024);
  const unsigned long long wgmma_before = emu::wgmma_ops_run();
  const std::vector<TcConvCase> cases = {TcConvCase{Conv2dShape{1, 7, 9, 64, 72, 3, 1}},
                                         TcConvCase{Conv2dShape{2, 5, 6, 16, 24, 1, 1}}};
  check_cases<Bf16>(Device::emu(1), cases);
  check_cases<float>(Device::emu(1), cases);
  CHECK(emu::wgmma_ops_run() == wgmma_before);  // mma.sync alone
}
#endif

TEST_CASE("kernel: conv2d on tensor cores rejects bad arguments with the op's name") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 75) SKIP_TEST("needs tensor cores");
  const Conv2dShape s{1, 4, 4, 8, 8, 3, 1};
  DeviceArray<Fp16> x(device, 128), w(device, s.weight_count()), y(device, 128);
  CHECK_THROWS_WITH_AS(conv2d_forward_tc<Fp16>(s, nhwc<const Fp16>(x.data(), 1, 4, 5, 8), w.data(), nullptr,
                                               nhwc(y.data(), 1, 4, 4, 8), nullptr, 0, nullptr),
                       doctest::Contains("conv2d_forward_tc: in is 1x4x5x8, expected 1x4x4x8"), Error);
  CHECK_THROWS_WITH_AS(conv2d_backward_data_tc<Fp16>(s, nhwc<const Fp16>(x.data(), 1, 4, 4, 8), nullptr,
                                                     nhwc(y.data(), 1, 4, 4, 8), false, nullptr, 0, nullptr),
                       doctest::Contains("conv2d_backward_data_tc: weights is null"), Error);
  const Conv2dShape big{16, 52, 52, 128, 256, 3, 1};
  if (conv2d_forward_tc_workspace_bytes<Fp16>(big) > 0) {
    DeviceArray<Fp16> bx(device, 1), bw(device, 1), by(device, 1);
    CHECK_THROWS_WITH_AS(conv2d_forward_tc<Fp16>(big, nhwc<const Fp16>(bx.data(), 16, 52, 52, 128), bw.data(),
                                                 nullptr, nhwc(by.data(), 16, 52, 52, 256), nullptr, 0, nullptr),
                         doctest::Contains("bytes of workspace"), Error);
  }
}
