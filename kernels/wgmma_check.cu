// wgmma_self_check and the devices' verdicts (kernels/wgmma_check.h).
#include "kernels/wgmma_check.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/conv.h"
#include "kernels/conv_wgmma.h"
#include "kernels/device_verdicts.h"
#include "kernels/half_types.h"
#include "runtime/fault.h"
#include "runtime/memory.h"

namespace yolo {

namespace {

// The current device as the runtime names it (emulated: the emulated device a test made current).
Device current_device() {
#if YOLO_CUDA
  int index = 0;
  CHECKED(cudaGetDevice(&index));
  return Device::cuda(index);
#else
  // None current: the emulated default GPU, whose memory is emulated device 0's (as the kernel
  // tests use it).
  return Device::emu(std::max(0, emu::current_device_index()));
#endif
}

// What the process cannot recover from: the check stops there, and so does the run.
struct Unrecoverable : Error {
  using Error::Error;
};

// Until the kernels queued so far on the legacy stream finish; a hang becomes an error. An error
// the kernels left is thrown as yolo::Error.
void wait_for_kernels(const std::string& what) {
#if YOLO_CUDA
  struct Done {
    cudaEvent_t event = nullptr;
    ~Done() {
      if (event) (void)cudaEventDestroy(event);  // where it fails, the error is the one already thrown
    }
  } done;
  CHECKED(cudaEventCreateWithFlags(&done.event, cudaEventDisableTiming));
  CHECKED(cudaEventRecord(done.event, nullptr));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  cudaError_t state;
  while ((state = cudaEventQuery(done.event)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > give_up)
      throw Unrecoverable("the wgmma self-check's " + what + " did not finish within 20 s on this GPU: its wgmma "
                          "kernels hang here. Run with YOLO_WGMMA=off (every convolution on mma.sync) and please "
                          "report it");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECKED(state);
#else
  (void)what;
#endif
}

// Deterministic values in [-1, 1).
std::vector<float> pattern(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = float(seed >> 8) / float(1u << 23) - 1.0f;
  }
  return v;
}

// An operand as stored in T, and its value as the tensor cores read it (TF32: the FP32 word's
// low 13 bits ignored).
template <typename T>
T stored(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return from_float<T>(v);
}
template <typename T>
double read_value(T v) {
  if constexpr (std::is_same_v<T, float>) return double(truncate_to_tf32(v));
  else return double(to_float(v));
}
template <typename T>
double stored_value(T v) {
  if constexpr (std::is_same_v<T, float>) return double(v);
  else return double(to_float(v));
}

// A tensor: its storage on the host and the device, the values the tensor cores read, and their
// magnitudes (for the error bound).
template <typename T>
struct Operand {
  std::vector<T> host;
  DeviceMemory device;
  std::vector<double> value, magnitude;
  Operand(Device d, size_t n, uint32_t seed) : host(n), device(d, n * sizeof(T)), value(n), magnitude(n) {
    const std::vector<float> v = pattern(n, seed);
    for (size_t i = 0; i < n; ++i) {
      host[i] = stored<T>(v[i]);
      value[i] = read_value(host[i]);
      magnitude[i] = std::fabs(value[i]);
    }
    copy_bytes(device.data(), host.data(), n * sizeof(T));
  }
  T* data() const { return static_cast<T*>(device.data()); }
};

template <typename T>
NhwcView<T> view(T* data, int n, int h, int w, int c) {
  return NhwcView<T>{data, n, h, w, c, c};
}

// got (as stored) against ref within (3u + K 2^-23) |A||B| (mag), u the precision's unit: the
// 16-bit output's rounding, or TF32's products of truncated operands summed in FP32. "" or why.
template <typename Out>
std::string compare(const std::vector<Out>& got, const std::vector<double>& ref,
                    const std::vector<double>& mag, long long k, double u) {
  const double factor = 3 * u + double(k) * 0x1p-23;
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(stored_value(got[i]) - ref[i]), allowed = factor * mag[i] + 1e-30;
    if (!(err <= allowed) && !(err / allowed <= worst)) worst = err / allowed, worst_at = i;
  }
  if (worst == 0) return "";
  return "element " + std::to_string(worst_at) + " is " + std::to_string(stored_value(got[worst_at])) +
         ", expected " + std::to_string(ref[worst_at]) + " (" + std::to_string(worst) + "x the bound)";
}

template <typename T>
std::vector<T> download(const DeviceMemory& m, size_t n) {
  std::vector<T> out(n);
  copy_bytes(out.data(), m.data(), n * sizeof(T));
  return out;
}

template <typename T>
constexpr double unit_of() {
  return std::is_same_v<T, float> ? 0x1p-16 : 0x1p-8;
}

// The forward of `s` in T, A brought as `input` says, against the FP64 reference of the same
// operands. doubled: the input read through a BatchNorm table that doubles it (mean 0, scale 2,
// shift 0, linear: exact), so the producers' transform of what landed is part of the check.
// "" when they agree.
template <typename T>
std::string check_forward(const Operand<T>& x, const Operand<T>& w, Device d, const Conv2dShape& s,
                          const std::string& name, WgmmaInput input, bool doubled = false) {
  const int oh = s.out_h(), ow = s.out_w();
  const size_t out_n = size_t(s.n) * oh * ow * s.c_out;
  DeviceMemory y(d, out_n * sizeof(T)), table(d, 4 * size_t(s.c_in) * sizeof(float));
  std::vector<float> doubling(4 * size_t(s.c_in), 0.0f);
  for (size_t c = 0; c < size_t(s.c_in); ++c) doubling[4 * c + 1] = 2.0f;
  copy_bytes(table.data(), doubling.data(), doubling.size() * sizeof(float));
  const NormalizedInput norm = doubled ? NormalizedInput{static_cast<const float*>(table.data()), Activation::Linear}
                                       : NormalizedInput{};
  conv2d_forward_wgmma<T>(s, view<const T>(x.data(), s.n, s.h, s.w, s.c_in), w.data(), nullptr,
                          view<T>(static_cast<T*>(y.data()), s.n, oh, ow, s.c_out), nullptr, {}, norm, input);
  wait_for_kernels(name + " forward");
  std::vector<double> ref(out_n, 0), mag(out_n, 0);
  conv2d_forward_reference<double>(s, view<const double>(x.value.data(), s.n, s.h, s.w, s.c_in), w.value.data(),
                                   nullptr, view<double>(ref.data(), s.n, oh, ow, s.c_out), nullptr, 0);
  conv2d_forward_reference<double>(s, view<const double>(x.magnitude.data(), s.n, s.h, s.w, s.c_in),
                                   w.magnitude.data(), nullptr, view<double>(mag.data(), s.n, oh, ow, s.c_out),
                                   nullptr, 0);
  if (doubled)
    for (size_t i = 0; i < out_n; ++i) ref[i] *= 2, mag[i] *= 2;
  return compare(download<T>(y, out_n), ref, mag, (long long)s.k * s.k * s.c_in, unit_of<T>());
}

// The weight gradient of `s` in 16-bit T (FP32 out), its input's im2col rows brought as `input`
// says, against the FP64 reference of the same operands. "" when they agree.
template <typename T>
std::string check_weight_gradient(const Operand<T>& x, const Operand<T>& dy, Device d, const Conv2dShape& s,
                                  const std::string& name, WgmmaInput input) {
  const int oh = s.out_h(), ow = s.out_w();
  DeviceMemory dw(d, s.weight_count() * sizeof(float)), wws(d, conv2d_backward_weights_wgmma_workspace_bytes(s) + 16);
  conv2d_backward_weights_wgmma<T>(s, view<const T>(x.data(), s.n, s.h, s.w, s.c_in),
                                   view<const T>(dy.data(), s.n, oh, ow, s.c_out), static_cast<float*>(dw.data()),
                                   wws.data(), wws.size(), nullptr, {}, input);
  wait_for_kernels(name + " weight gradient");
  std::vector<double> ref(s.weight_count(), 0), mag(s.weight_count(), 0);
  conv2d_backward_weights_reference<double>(s, view<const double>(x.value.data(), s.n, s.h, s.w, s.c_in),
                                            view<const double>(dy.value.data(), s.n, oh, ow, s.c_out), ref.data(),
                                            nullptr, nullptr, 0);
  conv2d_backward_weights_reference<double>(s, view<const double>(x.magnitude.data(), s.n, s.h, s.w, s.c_in),
                                            view<const double>(dy.magnitude.data(), s.n, oh, ow, s.c_out), mag.data(),
                                            nullptr, nullptr, 0);
  return compare(download<float>(dw, s.weight_count()), ref, mag,
                 (long long)s.n * oh * ow, 0x1p-16);
}

// Backward data of `s` in T, grad_out brought as `input` says, against the FP64 reference of the
// same operands. "" when they agree.
template <typename T>
std::string check_backward_data(const Operand<T>& dy, const Operand<T>& w, Device d, const Conv2dShape& s,
                                const std::string& name, WgmmaInput input) {
  const int oh = s.out_h(), ow = s.out_w();
  const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in;
  DeviceMemory dx(d, in_n * sizeof(T)), ws(d, conv2d_backward_data_wgmma_workspace_bytes<T>(s) + 16);
  conv2d_backward_data_wgmma<T>(s, view<const T>(dy.data(), s.n, oh, ow, s.c_out), w.data(),
                                view<T>(static_cast<T*>(dx.data()), s.n, s.h, s.w, s.c_in), false, nullptr, ws.data(),
                                ws.size(), input);
  wait_for_kernels(name + " backward data");
  std::vector<double> ref(in_n, 0), mag(in_n, 0);
  conv2d_backward_data_reference<double>(s, view<const double>(dy.value.data(), s.n, oh, ow, s.c_out), w.value.data(),
                                         view<double>(ref.data(), s.n, s.h, s.w, s.c_in), false, nullptr, 0);
  conv2d_backward_data_reference<double>(s, view<const double>(dy.magnitude.data(), s.n, oh, ow, s.c_out),
                                         w.magnitude.data(), view<double>(mag.data(), s.n, s.h, s.w, s.c_in), false,
                                         nullptr, 0);
  return compare(download<T>(dx, in_n), ref, mag, (long long)s.k * s.k * s.c_out,
                 unit_of<T>());
}

// What a case threw, where the device can go on: a CUDA error that sticks (an illegal address, say)
// leaves the context unusable, which no later case, and no training, can get past; so does a
// kernel of the case's still running after 20 s.
void require_usable_device(const std::string& what) {
#if YOLO_CUDA
  (void)cudaGetLastError();  // an error that does not stick (a launch's configuration) is cleared
  try {
    wait_for_kernels(what);
  } catch (const Unrecoverable&) {
    throw;
  } catch (const std::exception& e) {
    throw Unrecoverable("the wgmma self-check's " + what + " left this GPU's context unusable (" + e.what() +
                        "). Run with YOLO_WGMMA=off (every convolution on mma.sync) and please report it");
  }
#else
  (void)what;
#endif
}

// Runs one case and records it: its failure ("" where it passed), or what it threw. Only what the
// process cannot recover from stops the check.
template <class Check>
void run_case(WgmmaVerdicts& v, WgmmaCheckCase c, const Check& check) {
  try {
    c.failure = check();
  } catch (const Unrecoverable&) {
    throw;
  } catch (const std::exception& e) {
    c.failure = std::string("threw: ") + e.what();
    require_usable_device(c.name());
  }
  v.cases.push_back(std::move(c));
}

// The cases of T at one shape through `source`: the forward (with `doubled`, again through a
// doubling BatchNorm table, which the producers apply to what TMA landed), backward data, and in
// 16 bits the weight gradient, each against the FP64 reference of the same operands.
template <typename T>
void check_shape(WgmmaVerdicts& v, Device d, const Conv2dShape& s, const std::string& shape, WgmmaSource source,
                 uint32_t seed, bool doubled) {
  const Precision p = tc_precision<T>();
  const WgmmaInput input = source == WgmmaSource::Gather ? WgmmaInput::Gather : WgmmaInput::Im2col;
  const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
  const Operand<T> x(d, in_n, seed), w(d, s.weight_count(), seed + 1), dy(d, out_n, seed + 2);
  const std::string label = std::string(precision_name(p)) + " " + wgmma_source_name(source) + " " + shape;
  auto add = [&](tc::TcPass pass, const std::string& name, const auto& check) {
    run_case(v, WgmmaCheckCase{p, pass, source, name, ""}, check);
  };
  add(tc::TcPass::Forward, shape, [&] { return check_forward(x, w, d, s, label, input); });
  if (doubled)
    add(tc::TcPass::Forward, shape + " doubled", [&] { return check_forward(x, w, d, s, label, input, true); });
  add(tc::TcPass::BackwardData, shape, [&] { return check_backward_data(dy, w, d, s, label, input); });
  if constexpr (sizeof(T) == 2)  // TF32 has no wgmma weight gradient
    add(tc::TcPass::BackwardWeights, shape, [&] { return check_weight_gradient(x, dy, d, s, label, input); });
}

// Through `source`: every precision at the first two shapes (3x3 at strides 1 and 2), bf16 at the
// third, whose tiles one block walks (the code is the other precisions' too, and CI runs this
// emulated); with im2col, bf16's forward again through a BatchNorm table.
void check_source(WgmmaVerdicts& v, Device d, WgmmaSource source, const Conv2dShape (&shapes)[3], uint32_t seed) {
  const bool doubled = source == WgmmaSource::Im2col;
  for (int i = 0; i < 2; ++i) {
    const std::string name = i == 0 ? "3x3 s1" : "3x3 s2";
    check_shape<Bf16>(v, d, shapes[i], name, source, seed, doubled);
    check_shape<Fp16>(v, d, shapes[i], name, source, seed + 10, false);
    check_shape<float>(v, d, shapes[i], name, source, seed + 20, false);
  }
  check_shape<Bf16>(v, d, shapes[2], "3x3 s2 tiles", source, seed + 30, false);
}

}  // namespace

const char* wgmma_source_name(WgmmaSource source) { return source == WgmmaSource::Gather ? "gathered" : "im2col"; }

std::string WgmmaCheckCase::name() const {
  return std::string(precision_name(precision)) + " " + tc::pass_name(pass) + ", " + wgmma_source_name(source) + ", " +
         shape;
}

bool WgmmaVerdicts::trusts(Precision precision, tc::TcPass pass, WgmmaSource source) const {
  bool any = false;
  for (const WgmmaCheckCase& c : cases)
    if (c.precision == precision && c.pass == pass && c.source == source) {
      if (!c.failure.empty()) return false;
      any = true;
    }
  return any;
}

unsigned WgmmaVerdicts::gathered_passes() const {
  unsigned mask = 0;
  for (Precision p : {Precision::Tf32, Precision::Bf16, Precision::Fp16})
    for (tc::TcPass pass : {tc::TcPass::Forward, tc::TcPass::BackwardData, tc::TcPass::BackwardWeights})
      if (trusts(p, pass, WgmmaSource::Gather)) mask |= tc::wgmma_pass_bit(p, pass);
  return mask;
}

std::vector<std::string> WgmmaVerdicts::failed_keys() const {
  std::vector<std::string> lines;
  std::vector<const WgmmaCheckCase*> reported;  // the first failed case of each key
  for (const WgmmaCheckCase& c : cases) {
    if (c.failure.empty()) continue;
    auto same_key = [&](const WgmmaCheckCase* r) {
      return r->precision == c.precision && r->pass == c.pass && r->source == c.source;
    };
    if (std::any_of(reported.begin(), reported.end(), same_key)) continue;
    reported.push_back(&c);
    int failed = 0, of = 0;
    for (const WgmmaCheckCase& o : cases)
      if (same_key(&o)) ++of, failed += !o.failure.empty();
    lines.push_back(std::string(precision_name(c.precision)) + " " + tc::pass_name(c.pass) + ", " +
                    wgmma_source_name(c.source) + ": " + std::to_string(failed) + " of " + std::to_string(of) +
                    " cases failed (" + c.shape + ": " + c.failure + "); it runs " +
                    (c.source == WgmmaSource::Gather ? "on mma.sync" : "on its gather") + " instead");
  }
  return lines;
}

WgmmaVerdicts wgmma_self_check() {
  const Device d = current_device();
  const WgmmaBlockCap one_block(1);
  WgmmaVerdicts v;
  // The gathers: 3x3 at stride 1 (taps outside the image, K not whole k-tiles) and 2 (parity
  // classes of 4, 2, 2 and 1 taps), c_in of 24 (a part-filled tile), c_out 64 (one k-tile a tap
  // in 16 bits). One block walks every tile (the persistent blocks' ring running on from tile to
  // tile): the third shape's forward has two column tiles, its backward data four classes of 12,
  // 6, 6 and 3 k-tiles.
  check_source(v, d, WgmmaSource::Gather, {{1, 6, 5, 24, 64, 3, 1}, {1, 7, 6, 24, 64, 3, 2}, {1, 9, 7, 40, 192, 3, 2}},
               1);
  // TMA's im2col mode: two images (the traversal crosses from one to the next within a box),
  // height and width unequal (the map's corners per dimension), the last box part-filled; c_in
  // two k-tiles; bf16's forward also through a BatchNorm table. The third shape walks tiles.
  check_source(v, d, WgmmaSource::Im2col,
               {{2, 7, 9, 128, 64, 3, 1}, {2, 10, 7, 128, 64, 3, 2}, {1, 9, 7, 64, 192, 3, 2}}, 41);
  return v;
}

double wgmma_tf32_probe() {
  const Device d = current_device();
  const Conv2dShape s{1, 1, 1, 32, 8, 1, 1};
  const float x = 1.0f + 3.0f * 0x1p-12f;
  DeviceMemory in(d, 32 * sizeof(float)), w(d, s.weight_count() * sizeof(float)), y(d, 8 * sizeof(float));
  const std::vector<float> xs(32, x), ws(s.weight_count(), 1.0f);
  copy_bytes(in.data(), xs.data(), xs.size() * sizeof(float));
  copy_bytes(w.data(), ws.data(), ws.size() * sizeof(float));
  conv2d_forward_wgmma<float>(s, view<const float>(static_cast<const float*>(in.data()), 1, 1, 1, 32),
                              static_cast<const float*>(w.data()), nullptr,
                              view<float>(static_cast<float*>(y.data()), 1, 1, 1, 8), nullptr, {}, {},
                              WgmmaInput::Gather);
  wait_for_kernels("tf32 probe");
  return double(download<float>(y, 8)[0]);
}

namespace {

#if YOLO_CUDA
// The self-check's verdicts, run on each device at its first question (kernels/device_verdicts.h);
// a failed key prints one warning line.
DeviceVerdicts<WgmmaVerdicts> g_devices("Run with YOLO_WGMMA=off (every convolution on mma.sync)");

WgmmaVerdicts checked_here(int index) {
  WgmmaVerdicts v;
  try {
    v = wgmma_self_check();
  } catch (const Unrecoverable&) {
    throw;
  } catch (const std::exception& e) {  // outside the cases (an allocation, say): nothing is trusted
    std::fprintf(stderr, "warning: gpu:%d: the wgmma self-check could not run (%s); every convolution there runs on "
                 "mma.sync. Please report it.\n", index, e.what());
    return WgmmaVerdicts{};
  }
  for (const std::string& line : v.failed_keys())
    std::fprintf(stderr, "warning: gpu:%d: the wgmma self-check's %s. Please report it (YOLO_WGMMA=off skips the "
                 "check).\n", index, line.c_str());
  return v;
}

const WgmmaVerdicts* device_verdicts() {
  int index = 0;
  CHECKED(cudaGetDevice(&index));
  return g_devices.get(index, [index] { return checked_here(index); });
}
#else
std::atomic<const WgmmaVerdicts*> g_emulated{nullptr};  // EmulatedWgmmaVerdicts's; null: trust every key
#endif

}  // namespace

bool current_device_trusts_wgmma(Precision precision, tc::TcPass pass, WgmmaSource source) {
#if YOLO_CUDA
  const WgmmaVerdicts* v = device_verdicts();
#else
  const WgmmaVerdicts* v = g_emulated.load();
  if (v == nullptr) return true;
#endif
  return v != nullptr && v->trusts(precision, pass, source);
}

unsigned current_device_wgmma_passes() {
#if YOLO_CUDA
  const WgmmaVerdicts* v = device_verdicts();
  return v ? v->gathered_passes() : 0u;
#else
  const WgmmaVerdicts* v = g_emulated.load();
  return v ? v->gathered_passes() : ~0u;
#endif
}

#if !YOLO_CUDA
EmulatedWgmmaVerdicts::EmulatedWgmmaVerdicts(WgmmaVerdicts verdicts)
    : verdicts_(std::move(verdicts)), previous_(g_emulated.exchange(&verdicts_)) {}
EmulatedWgmmaVerdicts::~EmulatedWgmmaVerdicts() { g_emulated.store(previous_); }
#endif

}  // namespace yolo
