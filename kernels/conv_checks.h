// The argument checks every conv2d entry point runs (kernels/conv.cu, conv_cpu.cpp): shapes of
// the views against the Conv2dShape, strides, null pointers. Each throws yolo::Error naming the op.
#pragma once
#include <string>

#include "kernels/conv.h"
#include "runtime/check.h"

namespace yolo::conv_detail {

template <typename V>
inline void check_view(const char* op, const char* name, const V& v, int n, int h, int w, int c) {
  auto dims = [](int a, int b, int cc, int d) {
    return std::to_string(a) + "x" + std::to_string(b) + "x" + std::to_string(cc) + "x" + std::to_string(d);
  };
  if (v.n != n || v.h != h || v.w != w || v.c != c)
    throw Error(std::string(op) + ": " + name + " is " + dims(v.n, v.h, v.w, v.c) + ", expected " + dims(n, h, w, c));
  if (v.stride < v.c)
    throw Error(std::string(op) + ": " + name + " stride " + std::to_string(v.stride) + " < channels " +
                std::to_string(v.c));
  if (v.elements() > 0 && v.data == nullptr) throw Error(std::string(op) + ": " + name + " is null");
}

template <typename In, typename Out>
inline void check_conv(const char* op, const Conv2dShape& s, const In& in, const char* in_name, bool in_is_input,
                       const Out& out, const char* out_name, const void* weights,
                       const char* weights_name = "weights") {
  s.validate();
  const int oh = s.out_h(), ow = s.out_w();
  if (in_is_input) {
    check_view(op, in_name, in, s.n, s.h, s.w, s.c_in);
    check_view(op, out_name, out, s.n, oh, ow, s.c_out);
  } else {  // backward data: in is grad_out, out is grad_in
    check_view(op, in_name, in, s.n, oh, ow, s.c_out);
    check_view(op, out_name, out, s.n, s.h, s.w, s.c_in);
  }
  if (weights == nullptr) throw Error(std::string(op) + ": " + weights_name + " is null");
}

}  // namespace yolo::conv_detail
