// What max pooling's CPU (maxpool_cpu.cpp) and CUDA (maxpool.cu) halves share: the argument
// checks, and darknet's window arithmetic. Internal to the maxpool family.
#pragma once
#include <climits>
#include <string>

#include "kernels/maxpool.h"
#include "runtime/check.h"

namespace yolo::maxpool_detail {

// big: the pooled op's input side (in or grad_in), small: its output side.
template <typename B, typename S>
void check_shapes(const NhwcView<B>& big, const NhwcView<S>& small, int size, int stride, const char* op,
                  const char* big_name, const char* small_name) {
  check_row_view_arg(big, op, big_name);
  check_row_view_arg(small, op, small_name);
  if (size < 1 || stride < 1)
    throw Error(std::string(op) + ": size " + std::to_string(size) + " and stride " + std::to_string(stride) +
                " must be at least 1");
  if (long(big.h) * big.w > INT_MAX)
    throw Error(std::string(op) + ": " + big_name + " plane too large for int32 argmax");
  int oh = maxpool_output_size(big.h, size, stride), ow = maxpool_output_size(big.w, size, stride);
  if (small.n != big.n || small.c != big.c || small.h != oh || small.w != ow)
    throw Error(std::string(op) + ": " + small_name + " is " + view_dims(small) + " but " + big_name + " " +
                view_dims(big) + " pooled by size " + std::to_string(size) + " stride " + std::to_string(stride) +
                " gives " + std::to_string(big.n) + "x" + std::to_string(oh) + "x" + std::to_string(ow) + "x" +
                std::to_string(big.c));
}

// Darknet's window offset: -pad/2 with pad = size - 1 (0 for size 2).
YOLO_HOST_DEVICE inline int window_offset(int size) { return (size - 1) / 2; }

// Rows [first, last) of the input inside output row o's window (the same for columns).
struct Span {
  int first, last;
};
YOLO_HOST_DEVICE inline Span window_rows(int o, int size, int stride, int extent) {
  int start = o * stride - window_offset(size);
  return {start < 0 ? 0 : start, start + size < extent ? start + size : extent};
}
// Output rows [first, last) whose windows contain input row i.
YOLO_HOST_DEVICE inline Span covering_outputs(int i, int size, int stride, int out_extent) {
  int low = i + window_offset(size) - size + 1, high = (i + window_offset(size)) / stride + 1;
  return {low <= 0 ? 0 : (low + stride - 1) / stride, high < out_extent ? high : out_extent};
}

}  // namespace yolo::maxpool_detail
