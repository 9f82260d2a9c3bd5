// 2-D convolution's fast CPU passes (the three GEMMs of conv.cu's header comment, blocked and
// threaded over fixed work items, the channel loop innermost and contiguous). The reference
// loops and the CUDA implicit GEMMs are in conv.cu.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/conv.h"
#include "kernels/conv_checks.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_parallel.h"

namespace yolo {
namespace {

using conv_detail::check_conv;

// ---- CPU -------------------------------------------------------------------------------------
// All three passes run register-blocked mr x nr output blocks, the micro-kernels of the
// instruction set in use (kernels/cpu_micro.h, cpu_isa.h; nr is the packed panels' width). Work
// items own their outputs and sum in a fixed order: results do not depend on the thread count.

using cpu_micro::kMaxMr;
using cpu_micro::kMaxNr;

// Forward: weights packed as [c_out / nr][tap][ci][nr] (zero-padded channels); outputs in
// blocks of mr pixels of a row x nr channels. Each block's receptive fields are gathered first
// into mr contiguous rows of k*k*c_in (zeros in the padding), so one micro-kernel call reduces
// the whole depth (taps, then input channels, in order), and the rows serve every channel block.
void forward_cpu(const Conv2dShape& s, ConstAct in, const float* weights, const float* bias, Act out) {
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  count_cpu_kernel(CpuKernel::ConvForward, static_cast<CpuIsa>(tiles.variant));
  const int mr = tiles.mr, nr = tiles.nr;
  const int oh = s.out_h(), ow = s.out_w(), pad = s.pad(), k = s.k, c_in = s.c_in;
  const size_t depth = size_t(k) * k * c_in, blocks = size_t(s.c_out + nr - 1) / nr;
  std::vector<float>& packed = cpu_scratch(0, blocks * depth * nr);
  parallel_for(blocks, [&](size_t cb) {
    float* dst = packed.data() + cb * depth * nr;
    for (int j = 0; j < nr; ++j) {
      const size_t co = cb * nr + j;
      const float* src = weights + co * depth;
      for (size_t t = 0; t < depth; ++t) dst[t * nr + j] = co < size_t(s.c_out) ? src[t] : 0.0f;
    }
  });
  const std::vector<float> zeros(depth, 0.0f);
  parallel_for(size_t(s.n) * oh, [&](size_t item) {
    const int b = int(item / oh), oy = int(item % oh);
    thread_local std::vector<float> gathered;
    gathered.resize(size_t(mr) * depth);
    for (int ox0 = 0; ox0 < ow; ox0 += mr) {
      const int pixels = std::min(mr, ow - ox0);
      const float* a[kMaxMr];
      for (int i = 0; i < mr; ++i) {
        if (i >= pixels) {
          a[i] = zeros.data();
          continue;
        }
        float* row = gathered.data() + size_t(i) * depth;
        for (int r = 0; r < k; ++r) {
          const int iy = oy * s.stride - pad + r;
          for (int sx = 0; sx < k; ++sx, row += c_in) {
            const int ix = (ox0 + i) * s.stride - pad + sx;
            if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w)
              std::fill(row, row + c_in, 0.0f);
            else
              std::copy_n(in.data + in.at(b, iy, ix, 0), c_in, row);
          }
        }
        a[i] = gathered.data() + size_t(i) * depth;
      }
      for (size_t cb = 0; cb < blocks; ++cb) {
        const int co0 = int(cb) * nr, couts = std::min(nr, s.c_out - co0);
        float acc[kMaxMr * kMaxNr] = {};
        tiles.block(a, packed.data() + cb * depth * nr, int(depth), acc);
        for (int i = 0; i < pixels; ++i) {
          float* dst = out.data + out.at(b, oy, ox0 + i, co0);
          for (int j = 0; j < couts; ++j) dst[j] = acc[i * nr + j] + (bias ? bias[co0 + j] : 0.0f);
        }
      }
    }
  });
}

// Backward data: weights packed as [c_in / nr][tap][co][nr]; input pixels in blocks of mr
// of one parity (x % stride), which the same taps reach, reduced over taps then output channels.
void backward_data_cpu(const Conv2dShape& s, ConstAct grad_out, const float* weights, Act grad_in, bool accumulate) {
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  count_cpu_kernel(CpuKernel::ConvBackwardData, static_cast<CpuIsa>(tiles.variant));
  const int mr = tiles.mr, nr = tiles.nr;
  const int oh = s.out_h(), ow = s.out_w(), pad = s.pad(), k = s.k, c_in = s.c_in, c_out = s.c_out, S = s.stride;
  const size_t taps = size_t(k) * k, blocks = size_t(c_in + nr - 1) / nr, per_block = taps * c_out * nr;
  std::vector<float>& packed = cpu_scratch(0, blocks * per_block);
  parallel_for(blocks, [&](size_t cb) {
    float* dst = packed.data() + cb * per_block;
    for (int co = 0; co < c_out; ++co)
      for (size_t tap = 0; tap < taps; ++tap) {
        const float* src = weights + (co * taps + tap) * c_in;
        float* d = dst + (tap * c_out + co) * nr;
        for (int j = 0; j < nr; ++j) d[j] = cb * nr + j < size_t(c_in) ? src[cb * nr + j] : 0.0f;
      }
  });
  const std::vector<float> zeros(size_t(c_out), 0.0f);
  parallel_for(size_t(s.n) * s.h, [&](size_t item) {
    const int b = int(item / s.h), iy = int(item % s.h);
    for (size_t cb = 0; cb < blocks; ++cb) {
      const int ci0 = int(cb) * nr, cins = std::min(nr, c_in - ci0);
      const float* wb = packed.data() + cb * per_block;
      for (int px = 0; px < S && px < s.w; ++px)
        for (int x0 = px; x0 < s.w; x0 += mr * S) {
          float acc[kMaxMr * kMaxNr] = {};
          for (int r = 0; r < k; ++r) {
            const int ty = iy + pad - r;  // = oy * S for a tap that reaches this row
            if (ty < 0 || ty % S != 0 || ty / S >= oh) continue;
            for (int sx = 0; sx < k; ++sx) {
              const float* a[kMaxMr];
              bool any = false;
              for (int i = 0; i < mr; ++i) {
                const int ix = x0 + i * S, tx = ix + pad - sx;
                const bool ok = ix < s.w && tx >= 0 && tx % S == 0 && tx / S < ow;
                a[i] = ok ? grad_out.data + grad_out.at(b, ty / S, tx / S, 0) : zeros.data();
                any = any || ok;
              }
              if (any) tiles.block(a, wb + (size_t(r) * k + sx) * c_out * nr, c_out, acc);
            }
          }
          for (int i = 0; i < mr && x0 + i * S < s.w; ++i) {
            float* dst = grad_in.data + grad_in.at(b, iy, x0 + i * S, ci0);
            for (int j = 0; j < cins; ++j) dst[j] = accumulate ? dst[j] + acc[i * nr + j] : acc[i * nr + j];
          }
        }
    }
  });
}

// Copies `count` pixels' first `n` values (pixel pitch `step`) into rows of `width`, zero-padded:
// a partial block made whole for the micro-kernels' outer products.
inline const float* padded_rows(const float* src, size_t step, int count, int n, int width, std::vector<float>& buf) {
  buf.assign(size_t(count) * width, 0.0f);
  for (int p = 0; p < count; ++p) std::copy_n(src + p * step, n, buf.data() + size_t(p) * width);
  return buf.data();
}

// Backward weights: work item = mr output channels x one tap; blocks of nr input channels
// summed over the pixels of each image row, then the rows in order (shorter float sums). Partial
// blocks (fewer channels than mr or nr) are zero-padded copies. Layers with fewer input channels
// than nr (the first: 3) take the weights' whole depth, taps x input channels, as the blocks'
// columns instead (backward_weights_gathered_cpu), so the padding does not multiply the work.
void backward_weights_gathered_cpu(const Conv2dShape& s, ConstAct in, ConstAct grad_out, float* grad_weights,
                                   const cpu_micro::Tiles& tiles);

void backward_weights_cpu(const Conv2dShape& s, ConstAct in, ConstAct grad_out, float* grad_weights, float* grad_bias) {
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  count_cpu_kernel(CpuKernel::ConvBackwardWeights, static_cast<CpuIsa>(tiles.variant));
  const int mr = tiles.mr, nr = tiles.nr;
  const int oh = s.out_h(), ow = s.out_w(), pad = s.pad(), k = s.k, c_in = s.c_in, S = s.stride;
  const size_t taps = size_t(k) * k, co_blocks = size_t(s.c_out + mr - 1) / mr;
  if (c_in < nr) {
    backward_weights_gathered_cpu(s, in, grad_out, grad_weights, tiles);
  } else {
    parallel_for(co_blocks * taps, [&](size_t item) {
      const int co0 = int(item / taps) * mr, couts = std::min(mr, s.c_out - co0);
      const int tap = int(item % taps), r = tap / k, sx = tap % k;
      // Output columns whose input column ox*S - pad + sx lies inside the image.
      const int ox_lo = std::max(0, (pad - sx + S - 1) / S);
      const int last = s.w - 1 + pad - sx, ox_hi = last < 0 ? 0 : std::min(ow, last / S + 1);
      const int count = ox_hi - ox_lo, ci_blocks = (c_in + nr - 1) / nr;
      // Per input-channel block, in order: one image row's sum, added to the running total. The
      // row's pixels stay in cache while every channel block reads them.
      std::vector<float> totals(size_t(ci_blocks) * mr * nr, 0.0f), g_pad, x_pad;
      for (int b = 0; b < s.n && count > 0; ++b)
        for (int oy = 0; oy < oh; ++oy) {
          const int iy = oy * S - pad + r;
          if (iy < 0 || iy >= s.h) continue;
          const float* g = grad_out.data + grad_out.at(b, oy, ox_lo, co0);
          const float* x = in.data + in.at(b, iy, ox_lo * S - pad + sx, 0);
          size_t g_step = size_t(grad_out.stride);
          const size_t x_step = size_t(S) * in.stride;
          if (couts < mr) g = padded_rows(g, g_step, count, couts, mr, g_pad), g_step = size_t(mr);
          for (int cb = 0; cb < ci_blocks; ++cb) {
            const int cins = std::min(nr, c_in - cb * nr);
            float row[kMaxMr * kMaxNr];
            if (cins == nr)
              tiles.outer(g, g_step, x + cb * nr, x_step, count, row);
            else
              tiles.outer(g, g_step, padded_rows(x + cb * nr, x_step, count, cins, nr, x_pad), size_t(nr), count, row);
            float* total = totals.data() + size_t(cb) * mr * nr;
            for (int i = 0; i < couts; ++i)
              for (int j = 0; j < nr; ++j) total[i * nr + j] += row[i * nr + j];
          }
        }
      for (int i = 0; i < couts; ++i)
        for (int ci = 0; ci < c_in; ++ci)
          grad_weights[(size_t(co0 + i) * taps + tap) * c_in + ci] = totals[(size_t(ci / nr) * mr + i) * nr + ci % nr];
    });
  }
  if (!grad_bias) return;
  parallel_for(co_blocks, [&](size_t block) {
    const int co0 = int(block) * mr, couts = std::min(mr, s.c_out - co0);
    float total[kMaxMr] = {};
    for (int b = 0; b < s.n; ++b)
      for (int oy = 0; oy < oh; ++oy) {
        float row[kMaxMr] = {};
        for (int ox = 0; ox < ow; ++ox) {
          const float* g = grad_out.data + grad_out.at(b, oy, ox, co0);
          for (int i = 0; i < couts; ++i) row[i] += g[i];
        }
        for (int i = 0; i < mr; ++i) total[i] += row[i];
      }
    for (int i = 0; i < couts; ++i) grad_bias[co0 + i] = total[i];
  });
}

// The weight gradients as mr output channels x nr of the depth (tap, input channel) together: per
// image row, each output pixel's receptive field gathered (zeros in the padding), the row's sum
// added to the running total, rows in order: every weight still sums its products in pixel order.
void backward_weights_gathered_cpu(const Conv2dShape& s, ConstAct in, ConstAct grad_out, float* grad_weights,
                                   const cpu_micro::Tiles& tiles) {
  const int mr = tiles.mr, nr = tiles.nr;
  const int oh = s.out_h(), ow = s.out_w(), pad = s.pad(), k = s.k, c_in = s.c_in, S = s.stride;
  const int depth = k * k * c_in, t_blocks = (depth + nr - 1) / nr, co_blocks = (s.c_out + mr - 1) / mr;
  parallel_for(size_t(co_blocks) * t_blocks, [&](size_t item) {
    const int co0 = int(item / t_blocks) * mr, couts = std::min(mr, s.c_out - co0);
    const int t0 = int(item % t_blocks) * nr, ts = std::min(nr, depth - t0);
    // Each column's tap row, tap column and input channel.
    int col_r[kMaxNr], col_sx[kMaxNr], col_ci[kMaxNr];
    for (int j = 0; j < ts; ++j) {
      const int tap = (t0 + j) / c_in;
      col_r[j] = tap / k, col_sx[j] = tap % k, col_ci[j] = (t0 + j) % c_in;
    }
    std::vector<float> totals(size_t(mr) * nr, 0.0f), x_rows(size_t(ow) * nr), g_pad;
    for (int b = 0; b < s.n; ++b)
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          float* x = x_rows.data() + size_t(ox) * nr;
          for (int j = 0; j < nr; ++j) {
            const int iy = oy * S - pad + col_r[j < ts ? j : 0], ix = ox * S - pad + col_sx[j < ts ? j : 0];
            x[j] = j < ts && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w ? in.data[in.at(b, iy, ix, col_ci[j])] : 0.0f;
          }
        }
        const float* g = grad_out.data + grad_out.at(b, oy, 0, co0);
        size_t g_step = size_t(grad_out.stride);
        if (couts < mr) g = padded_rows(g, g_step, ow, couts, mr, g_pad), g_step = size_t(mr);
        float row[kMaxMr * kMaxNr];
        tiles.outer(g, g_step, x_rows.data(), size_t(nr), ow, row);
        for (int i = 0; i < couts; ++i)
          for (int j = 0; j < nr; ++j) totals[size_t(i) * nr + j] += row[i * nr + j];
      }
    const size_t taps_c = size_t(depth);
    for (int i = 0; i < couts; ++i)
      for (int j = 0; j < ts; ++j) grad_weights[size_t(co0 + i) * taps_c + t0 + j] = totals[size_t(i) * nr + j];
  });
}

}  // namespace

void conv2d_forward_cpu(const Conv2dShape& s, ConstAct in, const float* weights, const float* bias, Act out, void*,
                        size_t) {
  check_conv("conv2d_forward_cpu", s, in, "in", true, out, "out", weights);
  forward_cpu(s, in, weights, bias, out);
}

void conv2d_backward_data_cpu(const Conv2dShape& s, ConstAct grad_out, const float* weights, Act grad_in,
                              bool accumulate, void*, size_t) {
  check_conv("conv2d_backward_data_cpu", s, grad_out, "grad_out", false, grad_in, "grad_in", weights);
  backward_data_cpu(s, grad_out, weights, grad_in, accumulate);
}

void conv2d_backward_weights_cpu(const Conv2dShape& s, ConstAct in, ConstAct grad_out, float* grad_weights,
                                 float* grad_bias, void*, size_t) {
  check_conv("conv2d_backward_weights_cpu", s, in, "in", true, grad_out, "grad_out", grad_weights, "grad_weights");
  backward_weights_cpu(s, in, grad_out, grad_weights, grad_bias);
}

}  // namespace yolo
