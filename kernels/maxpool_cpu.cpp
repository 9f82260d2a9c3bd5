// Max pooling's fast CPU version: one work item per output (forward) or input (backward) row.
// The reference and the CUDA kernels are in maxpool.cu.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu_parallel.h"
#include "kernels/maxpool.h"
#include "kernels/maxpool_shared.h"

namespace yolo {
namespace {

using namespace maxpool_detail;

// Branch-free selection for the CPU loops: the baseline x86-64 target turns a float ?: into a
// branch, which random data mispredicts about half the time.
inline uint32_t mask(bool take) { return 0u - uint32_t(take); }
inline float pick(uint32_t take, float a, float b) {
  uint32_t ia, ib;
  std::memcpy(&ia, &a, sizeof ia);
  std::memcpy(&ib, &b, sizeof ib);
  uint32_t r = (ia & take) | (ib & ~take);
  float out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

// Channels innermost (contiguous), 4 at a time in SSE registers through GCC's vector extension
// (baseline x86-64); the loop over c channels, reading and writing the outputs, stayed scalar.
typedef float Float4 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));

template <typename V, typename T>
V load4(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V, typename T>
void store4(V v, T* p) {
  std::memcpy(p, &v, sizeof v);
}

// One output pixel's maximum over its window's `count` cells (row-major window order; strict >
// keeps the first, as window_max does) per channel, and the cell it came from.
void window_max_channels(const float* const* cells, const int* cell_index, int count, int c, float* best, int* index) {
  int ch = 0;
  for (; ch + 4 <= c; ch += 4) {
    Float4 m = load4<Float4>(cells[0] + ch);
    Int4 at = Int4{} + cell_index[0];
    for (int q = 1; q < count; ++q) {
      const Float4 v = load4<Float4>(cells[q] + ch);
      const Int4 take = v > m;  // all ones where v wins
      at = take ? Int4{} + cell_index[q] : at;
      m = take ? v : m;
    }
    store4(m, best + ch), store4(at, index + ch);
  }
  for (; ch < c; ++ch) {
    float m = cells[0][ch];
    int at = cell_index[0];
    for (int q = 1; q < count; ++q) {
      const uint32_t take = mask(cells[q][ch] > m);
      m = pick(take, cells[q][ch], m);
      at = int((uint32_t(cell_index[q]) & take) | (uint32_t(at) & ~take));
    }
    best[ch] = m, index[ch] = at;
  }
}

// One input pixel's gradient: the sum of grad_out over the `count` outputs (row-major) whose
// argmax chose it (`self`), per channel, added into target or written.
void chosen_gradient_channels(const float* const* grads, const int* const* chosen, int count, int self, int c,
                              bool accumulate, float* target) {
  int ch = 0;
  for (; ch + 4 <= c; ch += 4) {
    Float4 sum = {};
    for (int q = 0; q < count; ++q)  // adding +0 where not chosen: the same bits
      sum += load4<Int4>(chosen[q] + ch) == self ? load4<Float4>(grads[q] + ch) : Float4{};
    store4(accumulate ? load4<Float4>(target + ch) + sum : sum, target + ch);
  }
  for (; ch < c; ++ch) {
    float sum = 0.0f;
    for (int q = 0; q < count; ++q) sum += pick(mask(chosen[q][ch] == self), grads[q][ch], 0.0f);
    target[ch] = accumulate ? target[ch] + sum : sum;
  }
}

}  // namespace

void maxpool_forward_cpu(ConstAct in, Act out, int* argmax, int size, int stride) {
  check_shapes(in, out, size, stride, "maxpool_forward", "in", "out");
  parallel_for(size_t(out.n) * out.h, [&](size_t row) {
    int b = int(row / out.h), oy = int(row % out.h);
    Span rows = window_rows(oy, size, stride, in.h);
    std::vector<int> scratch(argmax ? 0 : size_t(out.c));
    std::vector<const float*> cells(size_t(size) * size);
    std::vector<int> cell_index(size_t(size) * size);
    for (int ox = 0; ox < out.w; ++ox) {
      Span cols = window_rows(ox, size, stride, in.w);
      int count = 0;
      for (int y = rows.first; y < rows.last; ++y)
        for (int x = cols.first; x < cols.last; ++x, ++count)
          cells[size_t(count)] = in.data + in.at(b, y, x, 0), cell_index[size_t(count)] = y * in.w + x;
      int* index = argmax ? argmax + ((size_t(b) * out.h + oy) * out.w + ox) * out.c : scratch.data();
      window_max_channels(cells.data(), cell_index.data(), count, out.c, out.data + out.at(b, oy, ox, 0), index);
    }
  });
}

void maxpool_backward_cpu(ConstAct grad_out, const int* argmax, Act grad_in, int size, int stride, bool accumulate) {
  check_shapes(grad_in, grad_out, size, stride, "maxpool_backward", "grad_in", "grad_out");
  if (!argmax && grad_out.elements() > 0) throw Error("maxpool_backward: argmax is a null pointer");
  parallel_for(size_t(grad_in.n) * grad_in.h, [&](size_t row) {
    int b = int(row / grad_in.h), iy = int(row % grad_in.h);
    Span rows = covering_outputs(iy, size, stride, grad_out.h);
    // The outputs covering one pixel, at most (none for a pixel between windows).
    const size_t most = size_t(std::max(rows.last - rows.first, 0)) * size_t(size);
    std::vector<const float*> grads(most);
    std::vector<const int*> chosen(most);
    for (int ix = 0; ix < grad_in.w; ++ix) {
      Span cols = covering_outputs(ix, size, stride, grad_out.w);
      int count = 0;
      for (int oy = rows.first; oy < rows.last; ++oy)  // the kernel's order: outputs row-major
        for (int ox = cols.first; ox < cols.last; ++ox, ++count) {
          chosen[size_t(count)] = argmax + ((size_t(b) * grad_out.h + oy) * grad_out.w + ox) * grad_out.c;
          grads[size_t(count)] = grad_out.data + grad_out.at(b, oy, ox, 0);
        }
      chosen_gradient_channels(grads.data(), chosen.data(), count, iy * grad_in.w + ix, grad_in.c, accumulate,
                               grad_in.data + grad_in.at(b, iy, ix, 0));
    }
  });
}

}  // namespace yolo
