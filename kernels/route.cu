// Route (channel concatenation): reference, fast CPU version and CUDA kernel (see route.h).
// Both directions are the same operation: copy (or add) up to four (source, destination)
// pairs of equal shape, where one side of each pair is a channel slice of the wide view.
#include "kernels/route.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"
#include "kernels/storage.cuh"

namespace yolo {
namespace {

// Up to four (src, dst) pairs of the same shape; the kernel takes it by value. T: the storage
// type (float; Bf16 or Fp16 on the GPU).
template <typename T>
struct CopyPairs {
  NhwcView<const T> src[kRouteMaxInputs];
  NhwcView<T> dst[kRouteMaxInputs];
  int count = 0;
};

// Checks the parts against the wide view and pairs each part with its slice of the wide view.
// forward: parts are sources, wide is the destination; backward: the other way round.
template <typename Part, typename Wide>
void pair_up(std::span<const NhwcView<Part>> parts, NhwcView<Wide> wide, const char* op, const char* part_name,
             const char* wide_name, const std::function<void(NhwcView<Part>, NhwcView<Wide>)>& add_pair) {
  if (parts.size() < 1 || parts.size() > size_t(kRouteMaxInputs))
    throw Error(std::string(op) + ": takes 1 to " + std::to_string(kRouteMaxInputs) + " inputs, got " +
                std::to_string(parts.size()));
  check_row_view_arg(wide, op, wide_name);
  int offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const NhwcView<Part>& part = parts[i];
    std::string name = std::string(part_name) + "[" + std::to_string(i) + "]";
    check_row_view_arg(part, op, name);
    if (part.n != wide.n || part.h != wide.h || part.w != wide.w)
      throw Error(std::string(op) + ": " + name + " is " + view_dims(part) + " but " + wide_name + " is " +
                  view_dims(wide) + " (same batch and spatial size required)");
    NhwcView<Wide> slice = wide;
    slice.data = wide.data ? wide.data + offset : nullptr;
    slice.c = part.c;
    add_pair(part, slice);
    offset += part.c;
  }
  if (offset != wide.c)
    throw Error(std::string(op) + ": the inputs have " + std::to_string(offset) + " channels in all but " +
                wide_name + " has " + std::to_string(wide.c));
}

template <typename T>
CopyPairs<T> forward_pairs(std::span<const NhwcView<const T>> inputs, NhwcView<T> out) {
  CopyPairs<T> pairs;
  pair_up<const T, T>(inputs, out, "route_forward", "inputs", "out", [&](NhwcView<const T> part, NhwcView<T> slice) {
    pairs.src[pairs.count] = part;
    pairs.dst[pairs.count++] = slice;
  });
  return pairs;
}

template <typename T>
CopyPairs<T> backward_pairs(NhwcView<const T> grad_out, std::span<const NhwcView<T>> grad_inputs) {
  CopyPairs<T> pairs;
  pair_up<T, const T>(grad_inputs, grad_out, "route_backward", "grad_inputs", "grad_out",
                      [&](NhwcView<T> part, NhwcView<const T> slice) {
                        pairs.src[pairs.count] = slice;
                        pairs.dst[pairs.count++] = part;
                      });
  return pairs;
}

// A pair whose source already is its destination needs no copy (a producer that wrote straight
// into its slice); with accumulate it would double, so only plain copies are skipped.
template <typename T>
YOLO_HOST_DEVICE inline bool in_place(const NhwcView<const T>& src, const NhwcView<T>& dst, bool accumulate) {
  return !accumulate && src.data == dst.data && src.stride == dst.stride;
}

void copy_pairs_cpu(const CopyPairs<float>& pairs, bool accumulate) {
  if (pairs.count == 0) return;
  const ConstAct& any = pairs.src[0];
  parallel_for(size_t(any.n) * any.h, [&](size_t row) {
    int b = int(row / any.h), y = int(row % any.h);
    for (int i = 0; i < pairs.count; ++i) {
      const ConstAct& src = pairs.src[i];
      const Act& dst = pairs.dst[i];
      if (in_place(src, dst, accumulate)) continue;
      for (int x = 0; x < src.w; ++x) {
        const float* s = src.data + src.at(b, y, x, 0);
        float* d = dst.data + dst.at(b, y, x, 0);
        if (accumulate)
          for (int ch = 0; ch < src.c; ++ch) d[ch] += s[ch];
        else
          std::memcpy(d, s, sizeof(float) * src.c);
      }
    }
  });
}

// ---- CUDA (on the row grid of common.cuh; grid z picks the pair) --------------------------
template <typename T, int V>
__global__ void copy_pairs_kernel(CopyPairs<T> pairs, bool accumulate) {
  NhwcView<const T> src = pairs.src[blockIdx.z];
  NhwcView<T> dst = pairs.dst[blockIdx.z];
  if (in_place(src, dst, accumulate)) return;
  for_each_row_pack<V>(src.n * src.h, src.w, src.c, [&](int row, int x, int ch) {
    size_t pixel = size_t(row) * src.w + x;
    Pack<T, V> value = load_pack_of<T, V>(src.data + pixel * src.stride + ch);
    T* target = dst.data + pixel * dst.stride + ch;
    store_pack_of<T, V>(target, accumulate ? add_packs(load_pack_of<T, V>(target), value) : value);
  });
}

template <typename T>
void copy_pairs_cuda(const CopyPairs<T>& pairs, bool accumulate, cudaStream_t stream) {
  constexpr int V = kVector<T>;
  bool vec = true;
  int widest = 0;
  for (int i = 0; i < pairs.count; ++i) {
    vec = vec && vector_view(pairs.src[i]) && vector_view(pairs.dst[i]);
    widest = pairs.src[i].c > widest ? pairs.src[i].c : widest;
  }
  const NhwcView<const T>& any = pairs.src[0];
  size_t rows = size_t(any.n) * any.h, per_row = size_t(any.w) * (vec ? widest / V : widest);
  if (rows == 0 || per_row == 0) return;
  RowLaunch shape = row_launch(rows, per_row, unsigned(pairs.count));
  if (vec)
    LAUNCH((copy_pairs_kernel<T, V>), shape.grid, shape.block, 0, stream, pairs, accumulate);
  else
    LAUNCH((copy_pairs_kernel<T, 1>), shape.grid, shape.block, 0, stream, pairs, accumulate);
}

}  // namespace

// ---- reference --------------------------------------------------------------------------
template <typename T>
void route_forward_reference(std::span<const NhwcView<const T>> inputs, NhwcView<T> out) {
  std::vector<std::pair<NhwcView<const T>, NhwcView<T>>> pairs;
  pair_up<const T, T>(inputs, out, "route_forward", "inputs", "out",
                      [&](NhwcView<const T> part, NhwcView<T> slice) { pairs.emplace_back(part, slice); });
  for (auto& [src, dst] : pairs)
    for (int b = 0; b < src.n; ++b)
      for (int y = 0; y < src.h; ++y)
        for (int x = 0; x < src.w; ++x)
          for (int ch = 0; ch < src.c; ++ch) dst.data[dst.at(b, y, x, ch)] = src.data[src.at(b, y, x, ch)];
}

template <typename T>
void route_backward_reference(NhwcView<const T> grad_out, std::span<const NhwcView<T>> grad_inputs, bool accumulate) {
  std::vector<std::pair<NhwcView<const T>, NhwcView<T>>> pairs;
  pair_up<T, const T>(grad_inputs, grad_out, "route_backward", "grad_inputs", "grad_out",
                      [&](NhwcView<T> part, NhwcView<const T> slice) { pairs.emplace_back(slice, part); });
  for (auto& [src, dst] : pairs)
    for (int b = 0; b < src.n; ++b)
      for (int y = 0; y < src.h; ++y)
        for (int x = 0; x < src.w; ++x)
          for (int ch = 0; ch < src.c; ++ch) {
            T& target = dst.data[dst.at(b, y, x, ch)];
            T value = src.data[src.at(b, y, x, ch)];
            target = accumulate ? target + value : value;
          }
}

template void route_forward_reference<float>(std::span<const NhwcView<const float>>, NhwcView<float>);
template void route_forward_reference<double>(std::span<const NhwcView<const double>>, NhwcView<double>);
template void route_backward_reference<float>(NhwcView<const float>, std::span<const NhwcView<float>>, bool);
template void route_backward_reference<double>(NhwcView<const double>, std::span<const NhwcView<double>>, bool);

// ---- fast CPU and CUDA ------------------------------------------------------------------
void route_forward_cpu(std::span<const ConstAct> inputs, Act out) {
  copy_pairs_cpu(forward_pairs<float>(inputs, out), false);
}

void route_backward_cpu(ConstAct grad_out, std::span<const Act> grad_inputs, bool accumulate) {
  copy_pairs_cpu(backward_pairs<float>(grad_out, grad_inputs), accumulate);
}

#define YOLO_ROUTE_CUDA(T)                                                                                        \
  void route_forward_cuda(std::span<const NhwcView<const T>> inputs, NhwcView<T> out, cudaStream_t stream) {      \
    copy_pairs_cuda(forward_pairs<T>(inputs, out), false, stream);                                               \
  }                                                                                                               \
  void route_backward_cuda(NhwcView<const T> grad_out, std::span<const NhwcView<T>> grad_inputs, bool accumulate, \
                           cudaStream_t stream) {                                                                 \
    copy_pairs_cuda(backward_pairs<T>(grad_out, grad_inputs), accumulate, stream);                               \
  }
YOLO_ROUTE_CUDA(float)
YOLO_ROUTE_CUDA(Bf16)
YOLO_ROUTE_CUDA(Fp16)
#undef YOLO_ROUTE_CUDA

}  // namespace yolo
