// wgmma_self_check and current_device_wgmma_verified (kernels/wgmma_check.h).
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
#include "kernels/half_types.h"
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

// Until the kernels queued so far on the legacy stream finish; a hang becomes an error.
void wait_for_kernels(const std::string& what) {
#if YOLO_CUDA
  cudaEvent_t done;
  CHECKED(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CHECKED(cudaEventRecord(done, nullptr));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  cudaError_t state;
  while ((state = cudaEventQuery(done)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > give_up)
      throw Error("the wgmma self-check's " + what + " did not finish within 20 s on this GPU: its wgmma kernels hang "
                  "here. Run with YOLO_WGMMA=off (every convolution on mma.sync) and please report it");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECKED(state);
  CHECKED(cudaEventDestroy(done));
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
std::string compare(const std::string& what, const std::vector<Out>& got, const std::vector<double>& ref,
                    const std::vector<double>& mag, long long k, double u) {
  const double factor = 3 * u + double(k) * 0x1p-23;
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(stored_value(got[i]) - ref[i]), allowed = factor * mag[i] + 1e-30;
    if (!(err <= allowed) && !(err / allowed <= worst)) worst = err / allowed, worst_at = i;
  }
  if (worst == 0) return "";
  return what + ": element " + std::to_string(worst_at) + " is " + std::to_string(stored_value(got[worst_at])) +
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
  return compare(name + " forward", download<T>(y, out_n), ref, mag, (long long)s.k * s.k * s.c_in, unit_of<T>());
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
  return compare(name + " weight gradient", download<float>(dw, s.weight_count()), ref, mag,
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
  return compare(name + " backward data", download<T>(dx, in_n), ref, mag, (long long)s.k * s.k * s.c_out,
                 unit_of<T>());
}

// Forward, backward data (both gathered) and, for 16-bit T, the weight gradient of `s` in T
// against the FP64 reference of the same operands. "" when all agree.
template <typename T>
std::string check_shape(Device d, const Conv2dShape& s, const std::string& name) {
  const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
  const Operand<T> x(d, in_n, 1), w(d, s.weight_count(), 2), dy(d, out_n, 3);
  std::string why = check_forward(x, w, d, s, name, WgmmaInput::Gather);
  if (why.empty()) why = check_backward_data(dy, w, d, s, name, WgmmaInput::Gather);
  if constexpr (std::is_same_v<T, float>) {
    return why;  // TF32 has no wgmma weight gradient
  } else {
    if (!why.empty()) return why;
    return check_weight_gradient(x, dy, d, s, name, WgmmaInput::Gather);
  }
}

}  // namespace

constexpr const char* kWalk = "3x3 s2 tiles";  // the shapes whose tiles one block walks

std::string wgmma_self_check() {
  const Device d = current_device();
  // 3x3 at stride 1 (taps outside the image, K not whole k-tiles) and 2 (parity classes of 4, 2,
  // 2 and 1 taps), c_in of 24 (a part-filled tile), c_out 64 (one k-tile a tap in 16 bits). One
  // block walks every tile (the persistent blocks' ring running on from tile to tile): the
  // third shape's forward has two column tiles, its backward data four classes of 12, 6, 6 and
  // 3 k-tiles.
  const WgmmaBlockCap one_block(1);
  const Conv2dShape stride1{1, 6, 5, 24, 64, 3, 1}, stride2{1, 7, 6, 24, 64, 3, 2}, walk{1, 9, 7, 40, 192, 3, 2};
  for (const auto& [shape, name] :
       {std::pair{stride1, "3x3 s1"}, std::pair{stride2, "3x3 s2"}, std::pair{walk, kWalk}}) {
    std::string why = check_shape<Bf16>(d, shape, std::string("bf16 ") + name);
    const bool walking = std::strcmp(name, kWalk) == 0;  // tf32's code too: bf16 alone (CI's emulated time)
    if (why.empty() && !walking) why = check_shape<float>(d, shape, std::string("tf32 ") + name);
    if (!why.empty()) return why;
  }
  return "";
}

std::string tma_im2col_self_check() {
  const Device d = current_device();
  // Two images (the traversal crosses from one to the next within a box), height and width
  // unequal (the map's corners per dimension), the last box part-filled; c_in two k-tiles. One
  // block walks every tile: the third shape's forward has two column tiles, its backward data
  // four classes.
  const WgmmaBlockCap one_block(1);
  const Conv2dShape stride1{2, 7, 9, 128, 64, 3, 1}, stride2{2, 10, 7, 128, 64, 3, 2}, walk{1, 9, 7, 64, 192, 3, 2};
  for (const auto& [shape, name] :
       {std::pair{stride1, "3x3 s1"}, std::pair{stride2, "3x3 s2"}, std::pair{walk, kWalk}}) {
    const size_t in_n = size_t(shape.n) * shape.h * shape.w * shape.c_in;
    const size_t out_n = size_t(shape.n) * shape.out_h() * shape.out_w() * shape.c_out;
    const Operand<Bf16> x16(d, in_n, 4), w16(d, shape.weight_count(), 5), dy16(d, out_n, 8);
    const std::string bf16 = std::string("im2col bf16 ") + name, tf32 = std::string("im2col tf32 ") + name;
    std::string why = check_forward(x16, w16, d, shape, bf16, WgmmaInput::Im2col);
    if (why.empty())
      why = check_forward(x16, w16, d, shape, std::string("im2col bf16 doubled ") + name, WgmmaInput::Im2col, true);
    if (why.empty()) why = check_backward_data(dy16, w16, d, shape, bf16, WgmmaInput::Im2col);
    if (why.empty()) why = check_weight_gradient(x16, dy16, d, shape, bf16, WgmmaInput::Im2col);
    if (!why.empty()) return why;
    if (std::strcmp(name, kWalk) == 0) continue;  // tf32's code too: bf16 alone (CI's emulated time)
    const Operand<float> x32(d, in_n, 6), w32(d, shape.weight_count(), 7), dy32(d, out_n, 9);
    why = check_forward(x32, w32, d, shape, tf32, WgmmaInput::Im2col);
    if (why.empty()) why = check_backward_data(dy32, w32, d, shape, tf32, WgmmaInput::Im2col);
    if (!why.empty()) return why;
  }
  return "";
}

namespace {

#if YOLO_CUDA
// A device check's verdict, per device: 0 not checked, 1 failed, 2 passed, 3 being checked. The
// check's own launches may ask the planner about the device: on the checking thread the answer
// is "not verified" meanwhile; another thread waits for the verdict (so its plans match the
// ones that follow). A failure prints `failure` (with the device and the reason) once.
struct Verdicts {
  std::atomic<int> verdict[64] = {};
};
bool cached_verdict(Verdicts& v, bool& checking_here, std::string (*check)(), const char* failure) {
  int index = 0;
  CHECKED(cudaGetDevice(&index));
  if (index < 0 || index >= 64) return false;
  std::atomic<int>& verdict = v.verdict[index];
  int expected = verdict.load(std::memory_order_acquire);  // asked at every launch: read first
  if (expected == 2 || expected == 1) return expected == 2;
  if (!verdict.compare_exchange_strong(expected, 3)) {
    while (expected == 3 && !checking_here) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      expected = verdict.load();
    }
    return expected == 2;
  }
  std::string why;
  checking_here = true;
  try {
    why = check();
  } catch (...) {
    checking_here = false;
    verdict.store(1);
    throw;
  }
  checking_here = false;
  if (!why.empty()) std::fprintf(stderr, failure, index, why.c_str());
  verdict.store(why.empty() ? 2 : 1);
  return why.empty();
}
#endif

}  // namespace

bool current_device_wgmma_verified() {
#if YOLO_CUDA
  static Verdicts verdicts;
  thread_local bool checking_here = false;
  return cached_verdict(verdicts, checking_here, wgmma_self_check,
                        "warning: gpu:%d: Hopper's wgmma convolutions failed their self-check (%s); every convolution "
                        "there runs on mma.sync instead. Please report it (YOLO_WGMMA=off skips the check).\n");
#else
  return true;
#endif
}

bool current_device_tma_im2col_verified() {
#if YOLO_CUDA
  static Verdicts verdicts;
  thread_local bool checking_here = false;
  if (!current_device_wgmma_verified()) return false;
  return cached_verdict(verdicts, checking_here, tma_im2col_self_check,
                        "warning: gpu:%d: TMA's im2col loads failed their self-check (%s); the wgmma forward "
                        "convolutions there gather their input instead. Please report it.\n");
#else
  return true;
#endif
}

}  // namespace yolo
