// The conv CPU passes' views of their input (kernels/conv_cpu.cpp): the receptive fields of one
// output row or of a whole padded image, laid out so that the micro-kernels read them in place,
// and the small copies around the blocks. Baseline x86-64 code: included by conv_cpu.cpp only
// (see cpu_micro.h on why nothing here may be shared with the ISA variants' files).
#pragma once
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/conv.h"
#include "kernels/cpu_micro.h"

namespace yolo::conv_cpu_fields {

using cpu_micro::kMaxMr;

// One output row's receptive fields: the k input rows it reads, each copied once with `pad` zero
// pixels either side (a row outside the image: none, it reads as zeros), so that any pixel's field
// is k contiguous spans of k*c_in floats (taps, then input channels), one per row, and pixel ox's
// span starts ox * stride * c_in floats after pixel 0's. The rows live in a per-thread buffer
// reused across work items: only the edges are zeroed. kMaxMr zero floats follow the last row:
// the weight gradient's blocks of mr taps may read up to mr - 1 past a span's end.
class RowFields {
 public:
  RowFields(const Conv2dShape& s, ConstAct in) : s_(s), in_(in), rows_(buffer()) {
    padded_w_ = size_t(s.w + 2 * s.pad());
    const size_t floats = size_t(s.k) * padded_w_ * s.c_in;
    rows_.resize(floats + kMaxMr);
    std::fill_n(rows_.data() + floats, kMaxMr, 0.0f);
    inside_.assign(size_t(s.k), false);
  }
  // Reads output row oy of image b.
  void load(int b, int oy) {
    const int c_in = s_.c_in;
    const size_t edge = size_t(s_.pad()) * c_in;
    for (int r = 0; r < s_.k; ++r) {
      const int iy = oy * s_.stride - s_.pad() + r;
      inside_[size_t(r)] = iy >= 0 && iy < s_.h;
      if (!inside_[size_t(r)]) continue;
      float* row = rows_.data() + size_t(r) * padded_w_ * c_in;
      std::fill_n(row, edge, 0.0f);
      std::fill_n(row + edge + size_t(s_.w) * c_in, edge, 0.0f);
      float* dst = row + edge;
      const float* src = in_.data + in_.at(b, iy, 0, 0);
      if (in_.stride == c_in)
        std::copy_n(src, size_t(s_.w) * c_in, dst);
      else
        for (int x = 0; x < s_.w; ++x) std::copy_n(src + size_t(x) * in_.stride, c_in, dst + size_t(x) * c_in);
    }
  }
  // Whether kernel row r reads a row inside the image (else it reads zeros), and output pixel
  // ox's span of that row: k*c_in floats (valid while the rows stay loaded).
  bool inside(int r) const { return inside_[size_t(r)]; }
  const float* span(int r, int ox) const {
    return rows_.data() + size_t(r) * padded_w_ * s_.c_in + size_t(ox) * s_.stride * s_.c_in;
  }
  // From a span to the same pixel's span in the next row, in floats.
  ptrdiff_t row_step() const { return ptrdiff_t(padded_w_) * s_.c_in; }

 private:
  static std::vector<float>& buffer() {
    thread_local std::vector<float> rows;
    return rows;
  }
  const Conv2dShape& s_;
  ConstAct in_;
  size_t padded_w_;
  std::vector<float>& rows_;
  std::vector<bool> inside_;
};

// One image of a view, padded: (h + 2 pad) rows of (w + 2 pad) pixels of its c channels, zeros
// around, and kMaxMr zero floats of slack after (as RowFields). At stride 1, output pixel (oy, ox)'s
// span in kernel row r starts at at(oy + r, ox), and the next pixel's c floats later, also across
// the end of a row into the next (the padding columns in between read as pixels): so small layers
// run their blocks over whole runs of rows, the padding columns' results dropped (forward, backward
// data) or given zero gradient (weight gradient). At 5x5, calls over one row of 5 pixels spent
// more on loading and storing their sums than on their products.
class ImageFields {
 public:
  ImageFields(ConstAct view, int pad) : view_(view), pad_(pad), data_(buffer()) {
    padded_w_ = view.w + 2 * pad;
    data_.assign(size_t(view.h + 2 * pad) * padded_w_ * view.c + kMaxMr, 0.0f);  // the padding stays zero
  }
  void load(int b) {
    for (int y = 0; y < view_.h; ++y)
      for (int x = 0; x < view_.w; ++x)
        std::copy_n(view_.data + view_.at(b, y, x, 0), view_.c,
                    data_.data() + (size_t(y + pad_) * padded_w_ + x + pad_) * view_.c);
  }
  int padded_w() const { return padded_w_; }
  // Padded row py, pixel px.
  const float* at(int py, int px) const { return data_.data() + (size_t(py) * padded_w_ + px) * view_.c; }

 private:
  static std::vector<float>& buffer() {
    thread_local std::vector<float> data;
    return data;
  }
  ConstAct view_;
  int pad_, padded_w_;
  std::vector<float>& data_;
};

// n floats; the micro-kernels' widths (8, 16) as fixed-size copies the compiler inlines: as
// calls to memmove (std::copy_n), the forward's bias rows and outputs took 2% of a demo step.
inline void copy_floats(const float* src, int n, float* dst) {
  if (n == 16)
    std::memcpy(dst, src, 16 * sizeof(float));
  else if (n == 8)
    std::memcpy(dst, src, 8 * sizeof(float));
  else
    std::copy_n(src, n, dst);
}

// Copies `count` pixels' first `n` values (pixel pitch `step`) into rows of `width`, zero-padded:
// a partial block made whole for the micro-kernels' outer products, or (n = width) a tap block's
// fields packed dense. Each row is written once (zeroing the whole buffer first, and a memmove
// call per row, cost the weight gradient 2-3% at 13x13 512->1024).
inline const float* padded_rows(const float* src, size_t step, int count, int n, int width, std::vector<float>& buf) {
  buf.resize(size_t(count) * width);
  for (int p = 0; p < count; ++p) {
    const float* from = src + size_t(p) * step;
    float* row = buf.data() + size_t(p) * width;
    for (int i = 0; i < width; ++i) row[i] = i < n ? from[i] : 0.0f;
  }
  return buf.data();
}

}  // namespace yolo::conv_cpu_fields
