// Synchronized batchnorm (--sync-bn) phases (kernels/batchnorm.h): a batch split into "replicas",
// the all-reduces done as host sums between the phases, gives every replica the whole-batch
// reference training forward and backward; one replica gives the fused ops' results; means far
// from zero keep the variance accurate; bad arguments are reported with the op's name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "runtime/check.h"
#include "tests/batchnorm_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

Device device_for(Impl impl) {
  std::string why;
  return impl == Impl::Cuda ? *kernel_device(&why) : Device::cpu();
}

// ---- the five phases, dispatched to one implementation (workspaces: the _cuda ones') ----

void sums(Impl impl, ConstAct x, float* out, void* workspace, size_t bytes) {
  if (impl == Impl::Reference) batchnorm_sums_reference<float>(x, out);
  else if (impl == Impl::Cpu) batchnorm_sums_cpu(x, out, workspace, bytes);
  else batchnorm_sums_cuda(x, out, workspace, bytes, nullptr);
}

void centered_squares(Impl impl, ConstAct x, const float* s, double total, float* out, void* workspace, size_t bytes) {
  if (impl == Impl::Reference) batchnorm_centered_squares_reference<float>(x, s, total, out);
  else if (impl == Impl::Cpu) batchnorm_centered_squares_cpu(x, s, total, out, workspace, bytes);
  else batchnorm_centered_squares_cuda(x, s, total, out, workspace, bytes, nullptr);
}

void forward_from_sums(Impl impl, Activation act, ConstAct x, const float* gamma, const float* beta, Act y,
                       const float* s, const float* squares, double total, float* mean, float* var, float* rm,
                       float* rv) {
  if (impl == Impl::Reference)
    batchnorm_activation_forward_from_sums_reference<float>(act, x, gamma, beta, y, s, squares, total, mean, var, rm,
                                                            rv);
  else if (impl == Impl::Cpu)
    batchnorm_activation_forward_from_sums_cpu(act, x, gamma, beta, y, s, squares, total, mean, var, rm, rv);
  else
    batchnorm_activation_forward_from_sums_cuda(act, x, gamma, beta, y, s, squares, total, mean, var, rm, rv, nullptr);
}

void backward_sums(Impl impl, Activation act, ConstAct y, ConstAct grad_y, ConstAct x, const float* mean,
                   const float* var, float* grad_gamma, float* grad_beta, float* sums2, void* workspace, size_t bytes) {
  if (impl == Impl::Reference)
    batchnorm_activation_backward_sums_reference<float>(act, y, grad_y, x, mean, var, grad_gamma, grad_beta, sums2);
  else if (impl == Impl::Cpu)
    batchnorm_activation_backward_sums_cpu(act, y, grad_y, x, mean, var, grad_gamma, grad_beta, sums2, workspace,
                                           bytes);
  else
    batchnorm_activation_backward_sums_cuda(act, y, grad_y, x, mean, var, grad_gamma, grad_beta, sums2, workspace,
                                            bytes, nullptr);
}

void backward_apply(Impl impl, Activation act, ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma,
                    const float* mean, const float* var, const float* sums2, double total, Act grad_x) {
  if (impl == Impl::Reference)
    batchnorm_activation_backward_apply_reference<float>(act, y, grad_y, x, gamma, mean, var, sums2, total, grad_x);
  else if (impl == Impl::Cpu)
    batchnorm_activation_backward_apply_cpu(act, y, grad_y, x, gamma, mean, var, sums2, total, grad_x);
  else
    batchnorm_activation_backward_apply_cuda(act, y, grad_y, x, gamma, mean, var, sums2, total, grad_x, nullptr);
}

// ---- data ----

// channel_data whose every channel has a batch standard deviation of at least 0.05. In a nearly
// constant channel (likely enough with 2 pixels) gamma/std amplifies the float rounding of the
// mean, which the float sums passed between the phases carry, beyond the tolerances: an
// ill-conditioned batch for any float implementation, not what these tests are about.
std::vector<float> conditioned_data(Rng& rng, const Slice& l) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::vector<float> x = channel_data(rng, l);
    std::vector<double> xd = gather<double>(x, l);
    bool spread_enough = true;
    for (int ch = 0; ch < l.c; ++ch) {
      double sum = 0, squares = 0;
      for (size_t p = 0; p < l.pixels(); ++p) sum += xd[p * size_t(l.c) + size_t(ch)];
      const double mean = sum / double(l.pixels());
      for (size_t p = 0; p < l.pixels(); ++p) squares += std::pow(xd[p * size_t(l.c) + size_t(ch)] - mean, 2);
      spread_enough = spread_enough && squares / double(l.pixels()) >= 0.05 * 0.05;
    }
    if (spread_enough) return x;
  }
  FAIL("no well-spread batch in 100 draws for " << l);
  return {};
}

// ---- replicas: a batch split by images ----

// A batch (slice l of a wide buffer) and how many images each replica takes.
struct Case {
  Slice l;
  std::vector<int> parts;
};
// Odd sizes, a channel slice (scalar path), a 16-byte-aligned slice (float4 path), several stats
// blocks per replica (scalar and float4), and replicas of one pixel each.
const Case kCases[] = {{{5, 3, 5, 7, 7, 0}, {2, 1, 2}},   {{5, 5, 3, 13, 20, 3}, {2, 1, 2}},
                       {{3, 9, 7, 24, 32, 8}, {1, 2}},     {{3, 23, 25, 5, 5, 0}, {2, 1}},
                       {{4, 33, 33, 8, 8, 0}, {3, 1}},     {{2, 1, 1, 3, 3, 0}, {1, 1}}};

// One replica's part of the batch and its own buffers (what each GPU would hold).
struct Replica {
  int first, images;
  size_t workspace_bytes;
  DeviceArray<unsigned char> workspace;  // exact size: overruns are caught
  DeviceArray<float> sums, squares, mean, var, running_mean, running_var, grad_gamma, grad_beta, sums2;

  Replica(Device device, const Slice& l, int first_image, int image_count)
      : first(first_image),
        images(image_count),
        workspace_bytes(batchnorm_workspace_bytes(image_count, l.h, l.w, l.c)),
        workspace(device, workspace_bytes),
        sums(device, size_t(l.c)),
        squares(device, size_t(l.c)),
        mean(device, size_t(l.c)),
        var(device, size_t(l.c)),
        running_mean(device, size_t(l.c)),
        running_var(device, size_t(l.c)),
        grad_gamma(device, size_t(l.c)),
        grad_beta(device, size_t(l.c)),
        sums2(device, 2 * size_t(l.c)) {}

  // This replica's images of a wide buffer at base, as a view.
  template <typename T>
  NhwcView<T> view(const Slice& l, T* base) const {
    return nhwc(base + l.offset + size_t(first) * size_t(l.h) * size_t(l.w) * size_t(l.stride), images, l.h, l.w, l.c,
                l.stride);
  }
};

std::vector<Replica> make_replicas(Device device, const Case& cs) {
  std::vector<Replica> replicas;
  replicas.reserve(cs.parts.size());
  int first = 0;
  for (int images : cs.parts) {
    replicas.emplace_back(device, cs.l, first, images);
    first += images;
  }
  REQUIRE(first == cs.l.n);
  return replicas;
}

// The float sum over the replicas of one of their arrays, added in replica order.
std::vector<float> sum_over(std::vector<Replica>& replicas, DeviceArray<float> Replica::*array) {
  std::vector<float> total((replicas.front().*array).size(), 0.0f);
  for (Replica& r : replicas) {
    std::vector<float> part = (r.*array).download();
    for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];
  }
  return total;
}

// What the caller's all-reduce does: every replica's array becomes the sum over the replicas.
void all_reduce(std::vector<Replica>& replicas, DeviceArray<float> Replica::*array) {
  std::vector<float> total = sum_over(replicas, array);
  for (Replica& r : replicas) (r.*array).upload(total);
}

// Phases 1 to 3 on every replica, all-reducing between them; x and y wide buffers.
void sync_forward(Impl impl, Activation act, const Slice& l, std::vector<Replica>& replicas, const float* x, float* y,
                  const DeviceArray<float>& gamma, const DeviceArray<float>& beta, const Params& p) {
  const double total = double(l.pixels());
  for (Replica& r : replicas) {
    r.sums.poison();
    sums(impl, r.view(l, x), r.sums.data(), r.workspace.data(), r.workspace_bytes);
  }
  all_reduce(replicas, &Replica::sums);
  for (Replica& r : replicas) {
    r.squares.poison();
    centered_squares(impl, r.view(l, x), r.sums.data(), total, r.squares.data(), r.workspace.data(),
                     r.workspace_bytes);
  }
  all_reduce(replicas, &Replica::squares);
  for (Replica& r : replicas) {
    r.mean.poison(), r.var.poison();
    r.running_mean.upload(p.running_mean), r.running_var.upload(p.running_var);
    forward_from_sums(impl, act, r.view(l, x), gamma.data(), beta.data(), r.view(l, y), r.sums.data(),
                      r.squares.data(), total, r.mean.data(), r.var.data(), r.running_mean.data(),
                      r.running_var.data());
  }
}

// Phases 4 and 5 on every replica, all-reducing sums2 between them. Linear passes no y.
void sync_backward(Impl impl, Activation act, const Slice& l, std::vector<Replica>& replicas, const float* y,
                   const float* grad_y, const float* x, float* grad_x, const DeviceArray<float>& gamma,
                   const DeviceArray<float>& mean, const DeviceArray<float>& var) {
  auto y_view = [&](const Replica& r) { return act == Activation::Linear ? ConstAct{} : r.view(l, y); };
  for (Replica& r : replicas) {
    r.grad_gamma.poison(), r.grad_beta.poison(), r.sums2.poison();
    backward_sums(impl, act, y_view(r), r.view(l, grad_y), r.view(l, x), mean.data(), var.data(), r.grad_gamma.data(),
                  r.grad_beta.data(), r.sums2.data(), r.workspace.data(), r.workspace_bytes);
  }
  all_reduce(replicas, &Replica::sums2);
  for (Replica& r : replicas)
    backward_apply(impl, act, y_view(r), r.view(l, grad_y), r.view(l, x), gamma.data(), mean.data(), var.data(),
                   r.sums2.data(), double(l.pixels()), r.view(l, grad_x));
}

template <typename F>
void for_each_impl_case_kind(F&& f) {
  Rng rng;
  CAPTURE(rng.seed());
  for (Impl impl : impls_here())
    for (const Case& cs : kCases)
      for (Activation act : kAllKinds) {
        const std::string impl_text = impl_name(impl), act_name = activation_name(act);
        CAPTURE(impl_text);
        CAPTURE(act_name);
        CAPTURE(cs.l);
        f(rng, impl, cs, act);
      }
}

}  // namespace

TEST_CASE("batchnorm sync: replicas' forward phases match the whole-batch reference training forward") {
  for_each_impl_case_kind([](Rng& rng, Impl impl, const Case& cs, Activation act) {
    const Slice& l = cs.l;
    const Device device = device_for(impl);
    std::vector<float> x = conditioned_data(rng, l);
    Params p = random_params(rng, l.c);
    ForwardRef ref = reference_training(act, gather<double>(x, l), l, p);

    std::vector<Replica> replicas = make_replicas(device, cs);
    DeviceArray<float> d_x(device, x), d_y(device, l.size()), d_gamma(device, p.gamma), d_beta(device, p.beta);
    d_y.poison();
    sync_forward(impl, act, l, replicas, d_x.data(), d_y.data(), d_gamma, d_beta, p);
    std::vector<float> y = d_y.download();
    CHECK_CLOSE(gather<float>(y, l), ref.y, 1e-5, 1e-4);
    CHECK(written_outside(y, l) == 0);
    for (Replica& r : replicas) {
      CAPTURE(r.first);
      CHECK_CLOSE(r.mean.download(), ref.mean, 1e-5, 1e-5);
      CHECK_CLOSE(r.var.download(), ref.var, 1e-6, 1e-4);
      CHECK_CLOSE(r.running_mean.download(), ref.running_mean, 1e-6, 1e-5);
      CHECK_CLOSE(r.running_var.download(), ref.running_var, 1e-6, 1e-5);
    }
    if (act == Activation::Leaky) {  // in place: y over x
      DeviceArray<float> d_inplace(device, x);
      sync_forward(impl, act, l, replicas, d_inplace.data(), d_inplace.data(), d_gamma, d_beta, p);
      CHECK_CLOSE(gather<float>(d_inplace.download(), l), ref.y, 1e-5, 1e-4);
    }
  });
}

TEST_CASE("batchnorm sync: replicas' backward phases match the whole-batch reference backward") {
  for_each_impl_case_kind([](Rng& rng, Impl impl, const Case& cs, Activation act) {
    const Slice& l = cs.l;
    const Device device = device_for(impl);
    std::vector<float> x = conditioned_data(rng, l), grad_y = rng.floats(l.size());
    Params p = random_params(rng, l.c);
    // The whole batch's forward outputs, as float, as the backward gets them.
    SavedForward fwd = saved_forward(act, x, l, p);
    BackwardRef ref = reference_backward(act, l, x, grad_y, fwd, p.gamma, 0, l.n);

    std::vector<Replica> replicas = make_replicas(device, cs);
    DeviceArray<float> d_x(device, x), d_y(device, fwd.y), d_grad_y(device, grad_y), d_grad_x(device, l.size()),
        d_gamma(device, p.gamma), d_mean(device, fwd.mean), d_var(device, fwd.var);
    d_grad_x.poison();
    sync_backward(impl, act, l, replicas, d_y.data(), d_grad_y.data(), d_x.data(), d_grad_x.data(), d_gamma, d_mean,
                  d_var);
    std::vector<float> grad_x = d_grad_x.download();
    CHECK_CLOSE(gather<float>(grad_x, l), ref.grad_x, 1e-5, 1e-4);
    CHECK(written_outside(grad_x, l) == 0);
    // Each replica's grad_gamma/grad_beta: what the fused backward gives on that replica alone;
    // summed over the replicas: the whole batch's.
    for (Replica& r : replicas) {
      CAPTURE(r.first);
      BackwardRef part = reference_backward(act, l, x, grad_y, fwd, p.gamma, r.first, r.images);
      CHECK_CLOSE(r.grad_gamma.download(), part.grad_gamma, 1e-4, 1e-4);
      CHECK_CLOSE(r.grad_beta.download(), part.grad_beta, 1e-4, 1e-4);
    }
    CHECK_CLOSE(sum_over(replicas, &Replica::grad_gamma), ref.grad_gamma, 1e-4, 1e-4);
    CHECK_CLOSE(sum_over(replicas, &Replica::grad_beta), ref.grad_beta, 1e-4, 1e-4);

    if (act == Activation::Leaky || act == Activation::Linear) {  // in place: grad_x over grad_y
      DeviceArray<float> d_inplace(device, grad_y);
      sync_backward(impl, act, l, replicas, d_y.data(), d_inplace.data(), d_x.data(), d_inplace.data(), d_gamma, d_mean,
                    d_var);
      CHECK_CLOSE(gather<float>(d_inplace.download(), l), ref.grad_x, 1e-5, 1e-4);
    }
  });
}

TEST_CASE("batchnorm sync: phase 4 writes sums2 = [grad_beta | grad_gamma], the same bits") {
  Rng rng;
  CAPTURE(rng.seed());
  const Slice l{3, 5, 7, 9, 12, 2};
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    const Device device = device_for(impl);
    std::vector<float> x = channel_data(rng, l), y = rng.floats(l.size(), 0.01f, 0.99f),
                       grad_y = rng.floats(l.size()), mean = rng.floats(size_t(l.c)),
                       var = rng.floats(size_t(l.c), 0.5f, 2.0f);
    Replica r(device, l, 0, l.n);
    DeviceArray<float> d_x(device, x), d_y(device, y), d_grad_y(device, grad_y), d_mean(device, mean),
        d_var(device, var);
    r.grad_gamma.poison(), r.grad_beta.poison(), r.sums2.poison();
    backward_sums(impl, Activation::Logistic, r.view<const float>(l, d_y.data()),
                  r.view<const float>(l, d_grad_y.data()), r.view<const float>(l, d_x.data()), d_mean.data(),
                  d_var.data(), r.grad_gamma.data(), r.grad_beta.data(), r.sums2.data(), r.workspace.data(),
                  r.workspace_bytes);
    std::vector<float> sums2 = r.sums2.download(), beta = r.grad_beta.download(), gamma = r.grad_gamma.download();
    CHECK(same_bits(std::vector<float>(sums2.begin(), sums2.begin() + l.c), beta));
    CHECK(same_bits(std::vector<float>(sums2.begin() + l.c, sums2.end()), gamma));
    auto finite = [](const std::vector<float>& v) {
      return std::all_of(v.begin(), v.end(), [](float e) { return std::isfinite(e); });
    };
    CHECK(finite(beta));  // written, not left poisoned
    CHECK(finite(gamma));
  }
}

// One replica (M = its pixels, the all-reduce the identity): the phases against the same
// implementation's fused ops. The backward's phases are the fused steps split in two: the
// gradients of gamma and beta are the same bits everywhere, grad_x the same bits on CUDA (the
// same kernels) and within float rounding elsewhere (sums2 is rounded to float between phases).
TEST_CASE("batchnorm sync: one replica matches the fused training ops") {
  Rng rng;
  CAPTURE(rng.seed());
  const Slice kSlices[] = {{3, 7, 5, 13, 16, 1}, {2, 9, 11, 24, 32, 8}, {3, 23, 25, 5, 5, 0}};
  for (Impl impl : impls_here())
    for (const Slice& l : kSlices)
      for (Activation act : kAllKinds) {
        const std::string impl_text = impl_name(impl), act_name = activation_name(act);
        CAPTURE(impl_text);
        CAPTURE(act_name);
        CAPTURE(l);
        const Device device = device_for(impl);
        const size_t c = size_t(l.c);
        std::vector<float> x = channel_data(rng, l), grad_y = rng.floats(l.size());
        Params p = random_params(rng, l.c);
        const Case cs{l, {l.n}};
        std::vector<Replica> replicas = make_replicas(device, cs);
        Replica& r = replicas.front();
        DeviceArray<float> d_x(device, x), d_y(device, l.size()), d_gamma(device, p.gamma), d_beta(device, p.beta),
            d_fused_y(device, l.size()), d_mean(device, c), d_var(device, c), d_rm(device, p.running_mean),
            d_rv(device, p.running_var);
        d_y.poison(), d_fused_y.poison(), d_mean.poison(), d_var.poison();
        sync_forward(impl, act, l, replicas, d_x.data(), d_y.data(), d_gamma, d_beta, p);
        ConstAct in = l.on<const float>(d_x.data());
        Act fused_out = l.on(d_fused_y.data());
        if (impl == Impl::Reference)
          batchnorm_activation_forward_training_reference<float>(act, in, d_gamma.data(), d_beta.data(), fused_out,
                                                                 d_mean.data(), d_var.data(), d_rm.data(), d_rv.data());
        else if (impl == Impl::Cpu)
          batchnorm_activation_forward_training_cpu(act, in, d_gamma.data(), d_beta.data(), fused_out, d_mean.data(),
                                                    d_var.data(), d_rm.data(), d_rv.data(), nullptr, 0);
        else
          batchnorm_activation_forward_training_cuda(act, in, d_gamma.data(), d_beta.data(), fused_out, d_mean.data(),
                                                     d_var.data(), d_rm.data(), d_rv.data(), r.workspace.data(),
                                                     r.workspace_bytes, nullptr);
        std::vector<float> fused_y = d_fused_y.download(), y = d_y.download();
        CHECK_CLOSE(gather<float>(y, l), gather<double>(fused_y, l), 1e-5, 1e-5);
        CHECK_CLOSE(r.mean.download(), to_double(d_mean.download()), 1e-6, 1e-6);
        CHECK_CLOSE(r.var.download(), to_double(d_var.download()), 0, 1e-5);
        CHECK_CLOSE(r.running_mean.download(), to_double(d_rm.download()), 1e-7, 1e-6);
        CHECK_CLOSE(r.running_var.download(), to_double(d_rv.download()), 1e-7, 1e-6);

        // Backward from the fused forward's outputs.
        DeviceArray<float> d_grad_y(device, grad_y), d_grad_x(device, l.size()), d_fused_grad_x(device, l.size()),
            d_grad_gamma(device, c), d_grad_beta(device, c);
        d_grad_x.poison(), d_fused_grad_x.poison(), d_grad_gamma.poison(), d_grad_beta.poison();
        sync_backward(impl, act, l, replicas, d_fused_y.data(), d_grad_y.data(), d_x.data(), d_grad_x.data(), d_gamma,
                      d_mean, d_var);
        ConstAct out = l.on<const float>(d_fused_y.data()), gy = l.on<const float>(d_grad_y.data());
        Act gx = l.on(d_fused_grad_x.data());
        if (impl == Impl::Reference)
          batchnorm_activation_backward_reference<float>(act, out, gy, in, d_gamma.data(), d_mean.data(), d_var.data(),
                                                         gx, d_grad_gamma.data(), d_grad_beta.data());
        else if (impl == Impl::Cpu)
          batchnorm_activation_backward_cpu(act, out, gy, in, d_gamma.data(), d_mean.data(), d_var.data(), gx,
                                            d_grad_gamma.data(), d_grad_beta.data(), nullptr, 0);
        else
          batchnorm_activation_backward_cuda(act, out, gy, in, d_gamma.data(), d_mean.data(), d_var.data(), gx,
                                             d_grad_gamma.data(), d_grad_beta.data(), r.workspace.data(),
                                             r.workspace_bytes, nullptr);
        std::vector<float> grad_x = d_grad_x.download(), fused_grad_x = d_fused_grad_x.download();
        CHECK(same_bits(r.grad_gamma.download(), d_grad_gamma.download()));
        CHECK(same_bits(r.grad_beta.download(), d_grad_beta.download()));
        if (impl == Impl::Cuda) CHECK(same_bits(grad_x, fused_grad_x));
        CHECK_CLOSE(gather<float>(grad_x, l), gather<double>(fused_grad_x, l), 5e-6, 1e-5);
      }
}

// Means near 1000 with spread 1: a one-pass sum of squares in float would lose the variance to
// cancellation; the two passes keep it to 1e-4 relative. The mean comes from float sums near
// 4e5 (rounded per replica, in the all-reduce and as sums/M): a few float ulps of 1000, ~1e-4,
// which times gamma/std (up to 2.6) bounds how close y can be; the variance only sees it squared.
TEST_CASE("batchnorm sync: means far from zero keep the variance accurate") {
  Rng rng;
  CAPTURE(rng.seed());
  const Case cases[] = {{{3, 11, 13, 6, 6, 0}, {3}}, {{3, 11, 13, 6, 6, 0}, {1, 2}}, {{4, 9, 9, 8, 8, 0}, {1, 1, 2}}};
  for (Impl impl : impls_here())
    for (const Case& cs : cases) {
      const Slice& l = cs.l;
      CAPTURE(impl_name(impl));
      CAPTURE(l);
      CAPTURE(cs.parts.size());
      const Device device = device_for(impl);
      std::vector<float> x(l.size());
      for (float& v : x) v = 1000.0f + rng.uniform(-1.0f, 1.0f);
      Params p = random_params(rng, l.c);
      ForwardRef ref = reference_training(Activation::Linear, gather<double>(x, l), l, p);
      std::vector<Replica> replicas = make_replicas(device, cs);
      DeviceArray<float> d_x(device, x), d_y(device, l.size()), d_gamma(device, p.gamma), d_beta(device, p.beta);
      sync_forward(impl, Activation::Linear, l, replicas, d_x.data(), d_y.data(), d_gamma, d_beta, p);
      for (Replica& r : replicas) {
        CHECK_CLOSE(r.var.download(), ref.var, 0, 1e-4);
        CHECK_CLOSE(r.mean.download(), ref.mean, 0, 1e-6);
        CHECK_CLOSE(r.running_var.download(), ref.running_var, 0, 1e-5);
      }
      CHECK_CLOSE(gather<float>(d_y.download(), l), ref.y, 5e-4, 1e-4);
    }
}

TEST_CASE("batchnorm sync: bad arguments are reported with the op's name") {
  std::vector<float> a(64, 1.0f), b(64), s(16, 1.0f), t(16), u(16);
  ConstAct x = nhwc<const float>(a.data(), 1, 2, 2, 8);
  Act y = nhwc(b.data(), 1, 2, 2, 8);
  CHECK_THROWS_WITH_AS(batchnorm_sums_cpu(x, nullptr, nullptr, 0),
                       doctest::Contains("batchnorm_sums_cpu: sums is null"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_sums_reference<float>(nhwc<const float>(a.data(), 0, 2, 2, 8), t.data()),
                       doctest::Contains("batchnorm_sums_reference: batch statistics need at least one pixel"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_centered_squares_cpu(x, s.data(), 3.0, t.data(), nullptr, 0),
                       doctest::Contains("batchnorm_centered_squares_cpu: total_pixels is 3"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_centered_squares_cpu(x, s.data(), 8.5, t.data(), nullptr, 0),
                       doctest::Contains("whole number"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_centered_squares_reference<float>(x, s.data(), NAN, t.data()),
                       doctest::Contains("batchnorm_centered_squares_reference: total_pixels"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_centered_squares_cpu(x, s.data(), 8.0, nullptr, nullptr, 0),
                       doctest::Contains("batchnorm_centered_squares_cpu: squares is null"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_forward_from_sums_cpu(Activation::Leaky, x, s.data(), s.data(), y, s.data(),
                                                                  nullptr, 8.0, t.data(), u.data(), nullptr, nullptr),
                       doctest::Contains("batchnorm_activation_forward_from_sums_cpu: squares is null"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_forward_from_sums_cpu(Activation::Leaky, x, s.data(), s.data(), y, s.data(),
                                                                  s.data(), 8.0, t.data(), u.data(), t.data(), nullptr),
                       doctest::Contains("running_mean and running_var"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_forward_from_sums_reference<float>(
                           Activation::Linear, x, s.data(), s.data(), nhwc(b.data(), 1, 2, 2, 7), s.data(), s.data(),
                           8.0, t.data(), u.data(), nullptr, nullptr),
                       doctest::Contains("batchnorm_activation_forward_from_sums_reference: y is"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_forward_from_sums_cpu(Activation::Linear, x, s.data(), s.data(), y,
                                                                  s.data(), s.data(), 2.0, t.data(), u.data(), nullptr,
                                                                  nullptr),
                       doctest::Contains("total_pixels is 2"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_sums_cpu(Activation::Leaky, ConstAct{}, x, x, s.data(), s.data(),
                                                              t.data(), u.data(), s.data(), nullptr, 0),
                       doctest::Contains("batchnorm_activation_backward_sums_cpu: y"), Error);  // needs y
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_sums_cpu(Activation::Linear, ConstAct{}, x, x, s.data(), s.data(),
                                                              t.data(), u.data(), nullptr, nullptr, 0),
                       doctest::Contains("batchnorm_activation_backward_sums_cpu: sums2 is null"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_sums_reference<float>(Activation::Linear, ConstAct{}, x, x,
                                                                           s.data(), s.data(), nullptr, u.data(),
                                                                           t.data()),
                       doctest::Contains("batchnorm_activation_backward_sums_reference: grad_gamma is null"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_apply_cpu(Activation::Linear, ConstAct{}, x, x, s.data(), s.data(),
                                                               s.data(), s.data(), 3.0, y),
                       doctest::Contains("batchnorm_activation_backward_apply_cpu: total_pixels is 3"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_apply_cpu(Activation::Linear, ConstAct{}, x, x, s.data(), s.data(),
                                                               s.data(), s.data(), 8.0, nhwc(b.data(), 1, 4, 1, 8)),
                       doctest::Contains("batchnorm_activation_backward_apply_cpu: grad_x is"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_apply_reference<float>(Activation::Relu, x, x, x, nullptr,
                                                                            s.data(), s.data(), s.data(), 8.0, y),
                       doctest::Contains("batchnorm_activation_backward_apply_reference: gamma is null"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_apply_cpu(Activation::Relu, x, x, x, s.data(), s.data(), s.data(),
                                                               nullptr, 8.0, y),
                       doctest::Contains("batchnorm_activation_backward_apply_cpu: sums2 is null"), Error);
}

TEST_CASE("batchnorm sync: cuda phases check their arguments and workspace") {
  KERNEL_TEST_DEVICE(device);
  DeviceArray<float> a(device, 64), b(device, 64), s(device, 16), t(device, 16), u(device, 16);
  ConstAct x = nhwc<const float>(a.data(), 1, 2, 2, 8);
  Act y = nhwc(b.data(), 1, 2, 2, 8);
  size_t need = batchnorm_workspace_bytes(1, 2, 2, 8);
  REQUIRE(need > 0);
  DeviceArray<unsigned char> workspace(device, need);
  CHECK_THROWS_WITH_AS(batchnorm_sums_cuda(x, t.data(), workspace.data(), need - 1, nullptr),
                       doctest::Contains("batchnorm_sums_cuda: workspace of"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_centered_squares_cuda(x, s.data(), 8.0, t.data(), nullptr, need, nullptr),
                       doctest::Contains("batchnorm_centered_squares_cuda: workspace is null"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_centered_squares_cuda(x, s.data(), 2.0, t.data(), workspace.data(), need, nullptr),
                       doctest::Contains("batchnorm_centered_squares_cuda: total_pixels"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_forward_from_sums_cuda(Activation::Leaky, x, s.data(), s.data(), y,
                                                                   nullptr, s.data(), 8.0, t.data(), u.data(), nullptr,
                                                                   nullptr, nullptr),
                       doctest::Contains("batchnorm_activation_forward_from_sums_cuda: sums is null"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_sums_cuda(Activation::Linear, ConstAct{}, x, x, s.data(), s.data(),
                                                               t.data(), u.data(), s.data(), workspace.data(), need - 4,
                                                               nullptr),
                       doctest::Contains("batchnorm_activation_backward_sums_cuda: workspace of"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_activation_backward_apply_cuda(Activation::Linear, ConstAct{},
                                                                nhwc<const float>(a.data(), 1, 2, 2, 8, 4), x, s.data(),
                                                                s.data(), s.data(), s.data(), 4.0, y, nullptr),
                       doctest::Contains("batchnorm_activation_backward_apply_cuda: grad_y"), Error);
}
