// Max pooling's fast CPU version: one work item per output (forward) or input (backward) row.
// The reference and the CUDA kernels are in maxpool.cu.
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

}  // namespace

void maxpool_forward_cpu(ConstAct in, Act out, int* argmax, int size, int stride) {
  check_shapes(in, out, size, stride, "maxpool_forward", "in", "out");
  parallel_for(size_t(out.n) * out.h, [&](size_t row) {
    int b = int(row / out.h), oy = int(row % out.h);
    Span rows = window_rows(oy, size, stride, in.h);
    std::vector<int> scratch(argmax ? 0 : size_t(out.c));
    for (int ox = 0; ox < out.w; ++ox) {
      Span cols = window_rows(ox, size, stride, in.w);
      float* __restrict__ best = out.data + out.at(b, oy, ox, 0);
      int* __restrict__ index = argmax ? argmax + ((size_t(b) * out.h + oy) * out.w + ox) * out.c : scratch.data();
      // Channels innermost (contiguous); cells in row-major window order, strict > keeps the first.
      const float* first = in.data + in.at(b, rows.first, cols.first, 0);
      for (int ch = 0; ch < out.c; ++ch) best[ch] = first[ch], index[ch] = rows.first * in.w + cols.first;
      for (int y = rows.first; y < rows.last; ++y)
        for (int x = cols.first; x < cols.last; ++x) {
          if (y == rows.first && x == cols.first) continue;
          const float* __restrict__ cell = in.data + in.at(b, y, x, 0);
          int cell_index = y * in.w + x;
          for (int ch = 0; ch < out.c; ++ch) {
            uint32_t take = mask(cell[ch] > best[ch]);
            best[ch] = pick(take, cell[ch], best[ch]);
            index[ch] = int((uint32_t(cell_index) & take) | (uint32_t(index[ch]) & ~take));
          }
        }
    }
  });
}

void maxpool_backward_cpu(ConstAct grad_out, const int* argmax, Act grad_in, int size, int stride, bool accumulate) {
  check_shapes(grad_in, grad_out, size, stride, "maxpool_backward", "grad_in", "grad_out");
  if (!argmax && grad_out.elements() > 0) throw Error("maxpool_backward: argmax is a null pointer");
  parallel_for(size_t(grad_in.n) * grad_in.h, [&](size_t row) {
    int b = int(row / grad_in.h), iy = int(row % grad_in.h);
    Span rows = covering_outputs(iy, size, stride, grad_out.h);
    std::vector<float> sums(size_t(grad_in.c));
    for (int ix = 0; ix < grad_in.w; ++ix) {
      Span cols = covering_outputs(ix, size, stride, grad_out.w);
      int self = iy * grad_in.w + ix;
      std::fill(sums.begin(), sums.end(), 0.0f);
      for (int oy = rows.first; oy < rows.last; ++oy)  // the kernel's order: outputs row-major
        for (int ox = cols.first; ox < cols.last; ++ox) {
          const int* chosen = argmax + ((size_t(b) * grad_out.h + oy) * grad_out.w + ox) * grad_out.c;
          const float* g = grad_out.data + grad_out.at(b, oy, ox, 0);
          for (int ch = 0; ch < grad_in.c; ++ch)  // adding +0 where not chosen: the same bits
            sums[size_t(ch)] += pick(mask(chosen[ch] == self), g[ch], 0.0f);
        }
      float* target = grad_in.data + grad_in.at(b, iy, ix, 0);
      for (int ch = 0; ch < grad_in.c; ++ch) target[ch] = accumulate ? target[ch] + sums[size_t(ch)] : sums[size_t(ch)];
    }
  });
}

}  // namespace yolo
