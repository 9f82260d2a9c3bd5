// 2-D convolution's fast CPU passes (the three GEMMs of conv.cu's header comment, blocked and
// threaded over fixed work items, the channel loop innermost and contiguous); their views of the
// input are in conv_cpu_fields.h. The reference loops and the CUDA implicit GEMMs are in conv.cu.
#include <algorithm>
#include <vector>

#include "kernels/conv.h"
#include "kernels/conv_checks.h"
#include "kernels/conv_cpu_fields.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_parallel.h"

namespace yolo {
namespace {

using conv_detail::check_conv;

// ---- CPU -------------------------------------------------------------------------------------
// All three passes run register-blocked mr x nr output blocks, the micro-kernels of the
// instruction set in use (kernels/cpu_micro.h, cpu_isa.h; nr is the packed panels' width). Work
// items own their outputs and sum in a fixed order: results do not depend on the thread count.

using conv_cpu_fields::copy_floats;
using conv_cpu_fields::ImageFields;
using conv_cpu_fields::padded_rows;
using conv_cpu_fields::RowFields;
using cpu_micro::kMaxMr;
using cpu_micro::kMaxNr;

// Small stride-1 layers run over whole images (forward_images, backward_data_images, the weight
// gradient's ImageFields path): output rows under 32 pixels, and one padded image of either side
// within 16 MB per thread (a tall, narrow input would otherwise hold a huge buffer per thread).
bool over_whole_images(const Conv2dShape& s) {
  const size_t padded = size_t(s.h + 2 * s.pad()) * size_t(s.w + 2 * s.pad()) * size_t(std::max(s.c_in, s.c_out));
  return s.stride == 1 && s.out_w() < 32 && padded * sizeof(float) <= (size_t(16) << 20);
}

// The whole-image passes' work items are one image x a group of channel blocks: as many groups as
// keep each group's packed weights within 1 MB (L2), and at least two items per thread.
int channel_groups(int blocks, size_t block_bytes, int images) {
  const int by_cache = int(std::max<size_t>(1, (size_t(1) << 20) / block_bytes));  // blocks in 1 MB
  const int for_threads = (2 * std::max(cpu_pool_threads(), 1) + std::max(images, 1) - 1) / std::max(images, 1);
  return std::min(blocks, std::max((blocks + by_cache - 1) / by_cache, for_threads));
}

// The forward of a small stride-1 layer (output rows under 32 pixels), over whole images. Row by
// row, a 13-pixel row ran one block of mr pixels and one of a single pixel, and every row read all
// the packed weights again (18.9 MB at 13x13 512->1024, from memory). Here a work item is one image
// x a group of output channel blocks whose weights stay in L2, and the image's output pixels run
// in blocks of mr consecutive pixels of the padded image (ImageFields), across the ends of rows:
// pixel q = oy * wp + ox reads kernel row r's span at padded pixel q + r * wp, so each block is one
// taps call over the k rows. The pixels in the padding columns (ox >= ow) are computed and
// dropped. Kernel rows in the padding add products with zeros where the row path skips them: the
// same sums, except that a -0 may come out +0.
void forward_images(const Conv2dShape& s, ConstAct in, const float* packed, const float* bias_rows, Act out,
                    const cpu_micro::Tiles& tiles) {
  const int mr = tiles.mr, nr = tiles.nr, oh = s.out_h(), ow = s.out_w();
  const size_t span = size_t(s.k) * s.c_in, depth = span * s.k;
  const int blocks = (s.c_out + nr - 1) / nr, groups = channel_groups(blocks, depth * nr * sizeof(float), s.n);
  parallel_for(size_t(s.n) * groups, [&](size_t item) {
    const int b = int(item / size_t(groups)), group = int(item % size_t(groups));
    ImageFields fields(in, s.pad());
    fields.load(b);
    const int wp = fields.padded_w(), count = (oh - 1) * wp + ow;  // row 0's pixel 0 to the last row's pixel ow - 1
    const float* pixel0 = fields.at(0, 0);
    for (int cb = blocks * group / groups; cb < blocks * (group + 1) / groups; ++cb) {
      const int co0 = cb * nr, couts = std::min(nr, s.c_out - co0);
      for (int q0 = 0; q0 < count; q0 += mr) {
        float acc[kMaxMr * kMaxNr];  // starts at the bias: the sums add onto it
        const float* a[kMaxMr];
        for (int i = 0; i < mr; ++i) {
          copy_floats(bias_rows + size_t(cb) * nr, nr, acc + i * nr);
          a[i] = pixel0 + size_t(std::min(q0 + i, count - 1)) * s.c_in;  // past the last pixel: it again
        }
        tiles.taps(a, ptrdiff_t(wp) * s.c_in, s.k, 0, 1, packed + size_t(cb) * depth * nr, int(span), acc);
        for (int i = 0; i < mr && q0 + i < count; ++i) {
          const int oy = (q0 + i) / wp, ox = (q0 + i) % wp;
          if (ox < ow) copy_floats(acc + i * nr, couts, out.data + out.at(b, oy, ox, co0));
        }
      }
    }
  });
}

// Forward: weights packed as [c_out / nr][tap][ci][nr] (zero-padded channels); outputs in
// blocks of mr pixels of a row x nr channels. A pixel's receptive field is k spans of k*c_in
// floats, one in each of the k input rows RowFields holds padded; so each block is k micro-kernel
// calls, one per kernel row over its k*c_in weights, the sums carried from one to the next: the
// depth reduced in order (taps, then input channels) with nothing gathered. A kernel row outside
// the image adds nothing and is skipped. Small stride-1 layers go over whole images (forward_images).
void forward_cpu(const Conv2dShape& s, ConstAct in, const float* weights, const float* bias, Act out) {
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  count_cpu_kernel(CpuKernel::ConvForward, static_cast<CpuIsa>(tiles.variant));
  const int mr = tiles.mr, nr = tiles.nr;
  const int oh = s.out_h(), ow = s.out_w();
  const size_t depth = size_t(s.k) * s.k * s.c_in, span = size_t(s.k) * s.c_in;
  const size_t blocks = size_t(s.c_out + nr - 1) / nr;
  std::vector<float>& packed = cpu_scratch(0, blocks * depth * nr);
  parallel_for(blocks, [&](size_t cb) {
    float* dst = packed.data() + cb * depth * nr;
    for (int j = 0; j < nr; ++j) {
      const size_t co = cb * nr + j;
      const float* src = weights + co * depth;
      for (size_t t = 0; t < depth; ++t) dst[t * nr + j] = co < size_t(s.c_out) ? src[t] : 0.0f;
    }
  });
  std::vector<float> bias_rows(blocks * nr, 0.0f);
  if (bias) std::copy_n(bias, s.c_out, bias_rows.begin());
  if (over_whole_images(s)) return forward_images(s, in, packed.data(), bias_rows.data(), out, tiles);
  parallel_for(size_t(s.n) * oh, [&](size_t item) {
    const int b = int(item / oh), oy = int(item % oh);
    RowFields fields(s, in);
    fields.load(b, oy);
    int r0 = 0, rows = 0;          // the kernel rows inside the image: r0 .. r0 + rows - 1 (a run: those outside are
    for (int r = 0; r < s.k; ++r)  // above or below it, and add nothing)
      if (fields.inside(r)) {
        if (rows == 0) r0 = r;
        ++rows;
      }
    for (int ox0 = 0; ox0 < ow; ox0 += mr) {
      const int pixels = std::min(mr, ow - ox0);
      for (size_t cb = 0; cb < blocks; ++cb) {
        const int co0 = int(cb) * nr, couts = std::min(nr, s.c_out - co0);
        float acc[kMaxMr * kMaxNr];  // starts at the bias: the sums add onto it
        for (int i = 0; i < mr; ++i) copy_floats(bias_rows.data() + cb * nr, nr, acc + i * nr);
        if (rows > 0) {  // the rows inside, in one call (the pixels past the row's end repeat its last)
          const float* a[kMaxMr];
          for (int i = 0; i < mr; ++i) a[i] = fields.span(r0, ox0 + std::min(i, pixels - 1));
          tiles.taps(a, fields.row_step(), rows, 0, 1, packed.data() + (cb * depth + size_t(r0) * span) * nr, int(span),
                     acc);
        }
        for (int i = 0; i < pixels; ++i) copy_floats(acc + i * nr, couts, out.data + out.at(b, oy, ox0 + i, co0));
      }
    }
  });
}

// The backward data of a small stride-1 layer (rows under 32 pixels), over whole images as the
// forward's (forward_images): at stride 1 it is a convolution of grad_out with the flipped kernel.
// In grad_out padded by pad (ImageFields), input pixel (iy, ix) reads tap (r, sx) at padded pixel
// (iy + 2 pad - r, ix + 2 pad - sx); so with q = iy * wp + ix, a block of mr consecutive q is one
// taps call whose rows and columns step backwards. Work items: one image x a group of input
// channel blocks. Taps in the padding add products with zeros where the row path skips them.
void backward_data_images(const Conv2dShape& s, ConstAct grad_out, const float* packed, Act grad_in, bool accumulate,
                          const cpu_micro::Tiles& tiles) {
  const int mr = tiles.mr, nr = tiles.nr, pad = s.pad(), c_out = s.c_out;
  const size_t per_block = size_t(s.k) * s.k * c_out * nr;
  const int blocks = (s.c_in + nr - 1) / nr, groups = channel_groups(blocks, per_block * sizeof(float), s.n);
  parallel_for(size_t(s.n) * groups, [&](size_t item) {
    const int b = int(item / size_t(groups)), group = int(item % size_t(groups));
    ImageFields fields(grad_out, pad);
    fields.load(b);
    const int wp = fields.padded_w(), count = (s.h - 1) * wp + s.w;  // row 0's pixel 0 to the last row's pixel w - 1
    const float* tap0 = fields.at(2 * pad, 2 * pad);                  // pixel q's tap (0, 0) is q pixels on
    for (int cb = blocks * group / groups; cb < blocks * (group + 1) / groups; ++cb) {
      const int ci0 = cb * nr, cins = std::min(nr, s.c_in - ci0);
      for (int q0 = 0; q0 < count; q0 += mr) {
        float acc[kMaxMr * kMaxNr] = {};
        const float* a[kMaxMr];
        for (int i = 0; i < mr; ++i) a[i] = tap0 + size_t(std::min(q0 + i, count - 1)) * c_out;
        tiles.taps(a, -ptrdiff_t(wp) * c_out, s.k, -ptrdiff_t(c_out), s.k, packed + size_t(cb) * per_block, c_out, acc);
        for (int i = 0; i < mr && q0 + i < count; ++i) {
          const int iy = (q0 + i) / wp, ix = (q0 + i) % wp;
          if (ix >= s.w) continue;
          float* dst = grad_in.data + grad_in.at(b, iy, ix, ci0);
          for (int j = 0; j < cins; ++j) dst[j] = accumulate ? dst[j] + acc[i * nr + j] : acc[i * nr + j];
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
  if (over_whole_images(s)) return backward_data_images(s, grad_out, packed.data(), grad_in, accumulate, tiles);
  const std::vector<float> zeros(size_t(c_out), 0.0f);
  const size_t g_pixel = size_t(grad_out.stride);
  parallel_for(size_t(s.n) * s.h, [&](size_t item) {
    const int b = int(item / s.h), iy = int(item % s.h);
    for (size_t cb = 0; cb < blocks; ++cb) {
      const int ci0 = int(cb) * nr, cins = std::min(nr, c_in - ci0);
      const float* wb = packed.data() + cb * per_block;
      for (int px = 0; px < S && px < s.w; ++px)
        for (int x0 = px; x0 < s.w; x0 += mr * S) {
          float acc[kMaxMr * kMaxNr] = {};
          // Stride 1, every pixel's every tap inside the row (most blocks): the rows that reach this
          // one, all k x k taps in one call: tap (r, sx) reads output (iy + pad - r, x0 + i + pad - sx).
          if (S == 1 && x0 + mr <= s.w && x0 + pad - (k - 1) >= 0 && x0 + pad + mr <= ow) {
            const int r_first = std::max(0, iy + pad - (oh - 1)), r_end = std::min(k, iy + pad + 1);
            if (r_first < r_end) {
              const float* a[kMaxMr];
              const float* g_row = grad_out.data + grad_out.at(b, iy + pad - r_first, 0, 0);
              for (int i = 0; i < mr; ++i) a[i] = g_row + size_t(x0 + i + pad) * g_pixel;
              tiles.taps(a, -ptrdiff_t(ow) * ptrdiff_t(g_pixel), r_end - r_first, -ptrdiff_t(g_pixel), k,
                         wb + size_t(r_first) * k * c_out * nr, c_out, acc);
            }
          } else {
            for (int r = 0; r < k; ++r) {
              const int ty = iy + pad - r;  // = oy * S for a tap that reaches this row
              if (ty < 0 || ty % S != 0 || ty / S >= oh) continue;
              const float* g_row = grad_out.data + grad_out.at(b, ty / S, 0, 0);
              for (int sx = 0; sx < k; ++sx) {
                const float* a[kMaxMr];
                bool any = false;
                const int ox0 = x0 + pad - sx;  // stride 1: pixel i reads output ox0 + i
                if (S == 1 && x0 + mr <= s.w && ox0 >= 0 && ox0 + mr <= ow) {
                  // Every pixel's tap inside (most blocks): one multiply-add each. Computing each
                  // pointer with its checks and at() took a quarter of 80x80 16->32's pass.
                  for (int i = 0; i < mr; ++i) a[i] = g_row + size_t(ox0 + i) * g_pixel;
                  any = true;
                } else {
                  for (int i = 0; i < mr; ++i) {
                    const int ix = x0 + i * S, tx = ix + pad - sx;
                    const int ox = S == 1 ? tx : tx / S;  // stride 1 skips the divisions
                    const bool ok = ix < s.w && tx >= 0 && (S == 1 || tx % S == 0) && ox < ow;
                    a[i] = ok ? g_row + size_t(ox) * g_pixel : zeros.data();
                    any = any || ok;
                  }
                }
                if (any) tiles.block(a, wb + (size_t(r) * k + sx) * c_out * nr, c_out, acc);
              }
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

// Backward weights, dW^T[depth x c_out] = fields^T[depth x P] * grad_out[P x c_out] (depth = k*k*c_in,
// taps then input channels; P = output pixels), in blocks of mr taps x nr output channels. A block's
// mr taps lie in one kernel row's span (RowFields), so its outer products read the fields where
// they are, one pixel every stride*c_in floats: nothing is gathered (the gather was 8% of a demo
// step, repeated by every group of output channels). Blocks are numbered by kernel row, then by
// the span's tap blocks (the last one partly past the span's end: those rows are dropped), then by
// output channel block. The rows are split into a fixed number of chunks (a function of the shape)
// and the blocks into groups: a work item is one chunk x one group, and the chunks' sums are added
// in order afterwards. Every element sums its products over the pixels in order; only the chunks
// fix that order, so the groups may follow the thread count.
struct WeightGradPlan {
  int span_blocks, co_blocks;  // tap blocks per kernel row's span (k*c_in taps), output channel blocks
  int units;                   // blocks: k x span_blocks x co_blocks
  size_t rows, chunks;         // output rows, and the chunks they are summed in
  int groups;                  // block groups (work items: chunks x groups)
  size_t per_chunk;            // one chunk's sums: [unit][mr][nr]
};

WeightGradPlan weight_grad_plan(const Conv2dShape& s, int mr, int nr) {
  WeightGradPlan p;
  const int span = s.k * s.c_in;
  p.span_blocks = (span + mr - 1) / mr;
  p.co_blocks = (s.c_out + nr - 1) / nr;
  p.units = s.k * p.span_blocks * p.co_blocks;
  p.rows = size_t(s.n) * s.out_h();
  p.per_chunk = size_t(p.units) * mr * nr;
  // Chunks of at least 512 pixels (the final sum over chunks then costs under 1% of the work),
  // at most 32 of them and 64 MB of partial sums.
  const size_t pixels = p.rows * s.out_w();
  size_t chunks = std::min<size_t>({pixels / 512, 32, (size_t(64) << 20) / (p.per_chunk * sizeof(float))});
  p.chunks = std::min(std::max<size_t>(chunks, 1), std::max<size_t>(p.rows, 1));
  // Groups do not change any sum (a block's sums stay in one item), so they may follow the threads:
  // two items per thread; fewer groups reload each row's fields fewer times.
  const size_t items = size_t(2) * std::max(cpu_pool_threads(), 1);
  p.groups = int(std::min<size_t>(size_t(p.units), (items + p.chunks - 1) / p.chunks));
  return p;
}

void backward_weights_cpu(const Conv2dShape& s, ConstAct in, ConstAct grad_out, float* grad_weights, float* grad_bias) {
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  count_cpu_kernel(CpuKernel::ConvBackwardWeights, static_cast<CpuIsa>(tiles.variant));
  const int mr = tiles.mr, nr = tiles.nr, oh = s.out_h(), ow = s.out_w(), span = s.k * s.c_in;
  const int depth = s.k * span;
  const WeightGradPlan p = weight_grad_plan(s, mr, nr);
  const int last_couts = s.c_out - (p.co_blocks - 1) * nr;  // channels in the last output channel block
  const size_t field_step = size_t(s.stride) * s.c_in;
  std::vector<float> partial(p.chunks * p.per_chunk, 0.0f);
  // Small stride-1 layers: whole images at once (ImageFields).
  const bool whole_images = over_whole_images(s);
  parallel_for(p.chunks * size_t(p.groups), [&](size_t item) {
    const size_t chunk = item / size_t(p.groups);
    const int group = int(item % size_t(p.groups));
    const int u_begin = p.units * group / p.groups, u_end = p.units * (group + 1) / p.groups;
    float* totals = partial.data() + chunk * p.per_chunk;
    const size_t row_begin = p.rows * chunk / p.chunks, row_end = p.rows * (chunk + 1) / p.chunks;
    if (whole_images) {
      ImageFields fields(in, s.pad());
      const int wp = fields.padded_w();
      thread_local std::vector<float> g_img;          // [co block][pixel of the run, padding columns included][nr]
      for (size_t row = row_begin; row < row_end;) {  // runs of rows within one image
        const int b = int(row / oh), oy0 = int(row % oh);
        const int rows = int(std::min(row_end - row, size_t(oh - oy0)));
        const int count = rows * wp - (wp - ow);  // from the first row's pixel 0 to the last row's pixel ow - 1
        fields.load(b);
        g_img.assign(size_t(p.co_blocks) * rows * wp * nr, 0.0f);
        for (int cb = 0; cb < p.co_blocks; ++cb)
          for (int y = 0; y < rows; ++y)
            for (int ox = 0; ox < ow; ++ox)
              std::copy_n(grad_out.data + grad_out.at(b, oy0 + y, ox, cb * nr), cb == p.co_blocks - 1 ? last_couts : nr,
                          g_img.data() + ((size_t(cb) * rows + y) * wp + ox) * nr);
        // With several channel blocks, each (kernel row, tap block)'s fields are packed once for
        // them, [pixel][mr]: read in place they are mr floats every c_in (2 KB apart at 512
        // channels, a new page every other pixel); packed, one dense run in L1.
        thread_local std::vector<float> taps_packed;
        int packed_for = -1;  // u / co_blocks of what taps_packed holds
        for (int u = u_begin; u < u_end; ++u) {
          const int cb = u % p.co_blocks, tb = u / p.co_blocks % p.span_blocks, r = u / p.co_blocks / p.span_blocks;
          const float* taps = fields.at(oy0 + r, 0) + size_t(tb) * mr;
          size_t taps_step = size_t(s.c_in);
          if (p.co_blocks >= 4) {
            if (u / p.co_blocks != packed_for)
              packed_for = u / p.co_blocks, padded_rows(taps, taps_step, count, mr, mr, taps_packed);
            taps = taps_packed.data(), taps_step = size_t(mr);
          }
          tiles.outer(taps, taps_step, g_img.data() + size_t(cb) * rows * wp * nr, size_t(nr), count,
                      totals + size_t(u) * mr * nr);
        }
        row += size_t(rows);
      }
      return;
    }
    RowFields fields(s, in);
    thread_local std::vector<float> g_pad;
    for (size_t row = row_begin; row < row_end; ++row) {
      const int b = int(row / oh), oy = int(row % oh);
      fields.load(b, oy);
      bool padded = false;  // the last block's grad_out row, padded to nr channels (made once per row)
      for (int u = u_begin; u < u_end; ++u) {
        const int cb = u % p.co_blocks, tb = u / p.co_blocks % p.span_blocks, r = u / p.co_blocks / p.span_blocks;
        if (!fields.inside(r)) continue;  // a row of zeros adds nothing
        const float* g = grad_out.data + grad_out.at(b, oy, 0, cb * nr);
        size_t g_step = size_t(grad_out.stride);
        if (cb == p.co_blocks - 1 && last_couts < nr) {
          if (!padded) padded_rows(g, g_step, ow, last_couts, nr, g_pad), padded = true;
          g = g_pad.data(), g_step = size_t(nr);
        }
        tiles.outer(fields.span(r, 0) + size_t(tb) * mr, field_step, g, g_step, ow, totals + size_t(u) * mr * nr);
      }
    }
  });
  // Per block, the chunks' sums added in chunk order (every element as before: 0 + chunk 0 + chunk 1
  // ...; one chunk is read as it is), then its taps inside the span and its channels below c_out
  // written out, channel by channel: a channel's taps are contiguous in KRSC. (Element by element
  // through the layout's index arithmetic this took 4% of a demo step; tap by tap, 16 channels
  // apart, 15% of 13x13 512->1024's pass.)
  parallel_for(size_t(p.units), [&](size_t u) {
    const size_t block = size_t(mr) * nr;
    float summed[kMaxMr * kMaxNr];
    const float* total = partial.data() + u * block;
    if (p.chunks > 1) {
      std::fill_n(summed, block, 0.0f);
      for (size_t chunk = 0; chunk < p.chunks; ++chunk) {
        const float* part = partial.data() + chunk * p.per_chunk + u * block;
        for (size_t e = 0; e < block; ++e) summed[e] += part[e];
      }
      total = summed;
    }
    const int cb = int(u) % p.co_blocks, tb = int(u) / p.co_blocks % p.span_blocks;
    const int r = int(u) / p.co_blocks / p.span_blocks;
    const int taps = std::min(mr, span - tb * mr), couts = std::min(nr, s.c_out - cb * nr);
    float* w = grad_weights + size_t(cb) * nr * depth + size_t(r) * span + size_t(tb) * mr;
    for (int j = 0; j < couts; ++j, w += depth)
      for (int i = 0; i < taps; ++i) w[i] = total[i * nr + j];
  });
  if (!grad_bias) return;
  parallel_for(size_t(s.c_out + mr - 1) / mr, [&](size_t block) {
    const int co0 = int(block) * mr, couts = std::min(mr, s.c_out - co0);
    float total[kMaxMr] = {};
    for (int b = 0; b < s.n; ++b)
      for (int oy = 0; oy < oh; ++oy) {
        float row[kMaxMr] = {};
        for (int ox = 0; ox < ow; ++ox) {
          const float* g = grad_out.data + grad_out.at(b, oy, ox, co0);
          for (int i = 0; i < couts; ++i) row[i] += g[i];
        }
        for (int i = 0; i < couts; ++i) total[i] += row[i];
      }
    for (int i = 0; i < couts; ++i) grad_bias[co0 + i] = total[i];
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
