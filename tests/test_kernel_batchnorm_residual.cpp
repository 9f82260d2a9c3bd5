// A shortcut folded into BatchNorm's apply (batchnorm.h, `residual`): the CUDA forwards (training,
// --sync-bn's from sums, inference) write act(BN(x)) + residual in one pass. The oracle is the
// unfused pair, the apply then shortcut_forward: in FP32 the same bits; with 16-bit tensors the
// FP32 fused result rounded once (the unfused pair rounds twice). Channel slices at vector and odd
// offsets (the residual at another offset than x and y), dense tensors, a 1-pixel batch; the
// statistics are the unfused op's bits, and nothing outside y's slice is written.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/ops.h"
#include "kernels/shortcut.h"
#include "runtime/stream.h"
#include "tests/batchnorm_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

const Slice kSlices[] = {{2, 5, 7, 12, 16, 4}, {3, 7, 5, 13, 16, 1}, {2, 9, 11, 24, 24, 0}, {1, 1, 1, 5, 7, 2}};

enum class Variant { Training, FromSums, Inference };
const char* variant_name(Variant v) {
  return v == Variant::Training ? "training" : v == Variant::FromSums ? "from sums" : "inference";
}

struct Inputs {
  Slice l, r;  // x and y's slice; the residual's (the same shape at another offset)
  Activation act;
  Variant variant;
  std::vector<float> x, residual;
  Params p;
};

// The forward in T over the inputs: y (wide, as floats) and the saved statistics. fold: the residual
// added in the apply; otherwise the apply, then shortcut_forward_cuda into y.
struct Output {
  std::vector<float> y, mean, var;
};
template <typename T>
Output run_forward(Device device, const Inputs& in, bool fold) {
  const Slice& l = in.l;
  const size_t c = size_t(l.c), workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  auto as_t = [](const std::vector<float>& v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return stored<T>(v);
  };
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<T> d_x(device, as_t(in.x)), d_r(device, as_t(in.residual)), d_y(device, l.size());
  DeviceArray<float> gamma(device, in.p.gamma), beta(device, in.p.beta), mean(device, in.p.running_mean),
      var(device, in.p.running_var), sums(device, c), squares(device, c);
  d_y.poison();
  const NhwcView<const T> x = l.on<const T>(d_x.data()), r = in.r.on<const T>(d_r.data());
  const NhwcView<const T> residual = fold ? r : NhwcView<const T>{};
  const NhwcView<T> y = l.on<T>(d_y.data());
  switch (in.variant) {
    case Variant::Training:
      batchnorm_activation_forward_training_cuda<T>(in.act, x, gamma.data(), beta.data(), y, mean.data(), var.data(),
                                                    nullptr, nullptr, workspace.data(), workspace_bytes, nullptr,
                                                    residual);
      break;
    case Variant::FromSums: {
      const double total = double(l.pixels());
      batchnorm_sums_cuda<T>(x, sums.data(), workspace.data(), workspace_bytes, nullptr);
      batchnorm_centered_squares_cuda<T>(x, sums.data(), total, squares.data(), workspace.data(), workspace_bytes,
                                         nullptr);
      batchnorm_activation_forward_from_sums_cuda<T>(in.act, x, gamma.data(), beta.data(), y, sums.data(),
                                                     squares.data(), total, mean.data(), var.data(), nullptr, nullptr,
                                                     nullptr, residual);
      break;
    }
    case Variant::Inference:  // from the running statistics in mean and var
      batchnorm_activation_forward_inference_cuda<T>(in.act, x, gamma.data(), beta.data(), mean.data(), var.data(), y,
                                                     nullptr, residual);
      break;
  }
  if (!fold) shortcut_forward_cuda<T>(as_const(y), r, y, nullptr);
  Output out{{}, mean.download(), var.download()};
  for (const T& v : d_y.download()) {
    if constexpr (std::is_same_v<T, float>) out.y.push_back(v);
    else out.y.push_back(to_float(v));
  }
  return out;
}

// y's slice as T, and a CHECK that the rest of the wide buffer still holds the poison.
template <typename T>
std::vector<T> slice_values(const std::vector<float>& wide, const std::vector<float>& poison_of, const Slice& l) {
  std::vector<T> out;
  for (size_t i = 0; i < wide.size(); ++i) {
    const int ch = int(i % size_t(l.stride));
    if (ch >= l.offset && ch < l.offset + l.c) out.push_back(from_float<T>(wide[i]));
    else CHECK(same_bits(std::vector<float>{wide[i]}, std::vector<float>{poison_of[i]}));
  }
  return out;
}

void check_case(Device device, const Inputs& in) {
  const Output unfused = run_forward<float>(device, in, false), fused = run_forward<float>(device, in, true);
  CHECK(same_bits(fused.y, unfused.y));  // poison outside the slice included
  CHECK(same_bits(fused.mean, unfused.mean));
  CHECK(same_bits(fused.var, unfused.var));
  const std::vector<float> fp32 = slice_values<float>(fused.y, unfused.y, in.l);
  const Output bf16 = run_forward<Bf16>(device, in, true), fp16 = run_forward<Fp16>(device, in, true);
  check_rounded_once(slice_values<Bf16>(bf16.y, bf16.y, in.l), fp32, 0, 1.0);
  check_rounded_once(slice_values<Fp16>(fp16.y, fp16.y, in.l), fp32, 0, 1.0);
  CHECK(same_bits(bf16.mean, fused.mean));
  CHECK(same_bits(fp16.var, fused.var));
}

}  // namespace

TEST_CASE("batchnorm: a shortcut folded into the apply equals apply then shortcut (FP32 bits; 16-bit rounded once)") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  for (const Slice& l : kSlices)
    for (Activation act : kAllKinds)
      for (Variant variant : {Variant::Training, Variant::FromSums, Variant::Inference}) {
        const std::string act_name = activation_name(act), variant_text = variant_name(variant);
        CAPTURE(act_name);
        CAPTURE(variant_text);
        CAPTURE(l);
        Slice r = l;
        r.stride = l.c + 3, r.offset = 3;  // the residual in another layout than x and y
        Inputs in{l, r, act, variant, exact_in_16_bits(channel_data(rng, l)),
                  exact_in_16_bits(rng.floats(r.size(), -2.0f, 2.0f)), random_params(rng, l.c)};
        check_case(device, in);
      }
}

TEST_CASE("batchnorm: a residual of another shape is refused by name; the CPU backend folds none") {
  KERNEL_TEST_DEVICE(device);
  const Slice l{1, 2, 3, 4, 4, 0};
  const size_t workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<float> x(device, l.size()), y(device, l.size()), r(device, 2 * l.size()), a(device, 4), b(device, 4);
  CHECK_THROWS_WITH(batchnorm_activation_forward_inference_cuda<float>(
                        Activation::Leaky, l.on<const float>(x.data()), a.data(), b.data(), a.data(), b.data(),
                        l.on(y.data()), nullptr, nhwc<const float>(r.data(), 1, 2, 3, 8)),
                    doctest::Contains("batchnorm_activation_forward_inference_cuda: residual"));
  const std::vector<float> host(l.size(), 1.0f), params(4, 1.0f);
  std::vector<float> out(l.size());
  Stream stream(Device::cpu(), StreamPriority::Normal, "cpu");
  const OpContext cpu{&stream};
  CHECK_THROWS_WITH(batchnorm_activation_forward_inference(cpu, Activation::Leaky, l.on<const float>(host.data()),
                                                           params.data(), params.data(), params.data(), params.data(),
                                                           l.on(out.data()), l.on<const float>(host.data())),
                    doctest::Contains("the CPU backend adds no residual"));
}
