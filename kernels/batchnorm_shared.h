// What batchnorm's CPU (batchnorm_cpu.cpp) and CUDA (batchnorm.cu) halves share: the argument
// checks every entry point runs (T: the tensors' element type; P: the per-channel arrays', float
// on the CUDA paths whatever T is), Chan's merge of partial statistics, and the synchronized phases'
// mean. Internal to the batchnorm family.
#pragma once
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "kernels/batchnorm.h"
#include "runtime/check.h"

namespace yolo::batchnorm_detail {

// Chan's merge of (n, mean, m2) with (nb, mean_b, m2_b).
template <typename T>
YOLO_HOST_DEVICE inline void chan_merge(T& n, T& mean, T& m2, T nb, T mean_b, T m2_b) {
  if (nb == T(0)) return;
  if (n == T(0)) {
    n = nb, mean = mean_b, m2 = m2_b;
    return;
  }
  T total = n + nb, delta = mean_b - mean, frac = nb / total;
  mean += delta * frac;
  m2 += m2_b + delta * delta * n * frac;
  n = total;
}

inline void check_array(const char* op, const char* name, const void* p, int c) {
  if (c > 0 && p == nullptr) throw Error(std::string(op) + ": " + name + " is null");
}

// The synchronized phases' mean: the all-reduced sum over the total pixel count, one formula
// on host and device so every phase and implementation agrees on it.
YOLO_HOST_DEVICE inline float mean_of(float sum, double total_pixels) {
  return float(double(sum) / total_pixels);
}

template <typename T>
inline void check_training_input(const char* op, const NhwcView<const T>& x) {
  check_view_arg(x, op, "x");
  if (x.c > 0 && x.pixels() == 0)
    throw Error(std::string(op) + ": batch statistics need at least one pixel (x is " + std::to_string(x.n) + "x" +
                std::to_string(x.h) + "x" + std::to_string(x.w) + ")");
}

template <typename T, typename P>
inline void check_forward_training(const char* op, NhwcView<const T> x, const P* gamma, const P* beta, NhwcView<T> y,
                                   const P* saved_mean, const P* saved_var, const P* running_mean,
                                   const P* running_var, bool y_optional = false) {
  check_training_input(op, x);
  if (!(y_optional && y.data == nullptr)) {
    check_view_arg(y, op, "y");
    check_same_view_shape(y, x, op, "y", "x");
  }
  check_array(op, "gamma", gamma, x.c);
  check_array(op, "beta", beta, x.c);
  check_array(op, "saved_mean", saved_mean, x.c);
  check_array(op, "saved_var", saved_var, x.c);
  if ((running_mean == nullptr) != (running_var == nullptr))
    throw Error(std::string(op) + ": running_mean and running_var must both be set or both be null");
}

// A residual (a shortcut folded into the apply, batchnorm.h): none, or a view of x's shape.
template <typename T>
inline void check_residual(const char* op, NhwcView<const T> x, NhwcView<const T> residual) {
  if (!residual.data) return;
  check_view_arg(residual, op, "residual");
  check_same_view_shape(residual, x, op, "residual", "x");
}

template <typename T, typename P>
inline void check_forward_inference(const char* op, NhwcView<const T> x, const P* gamma, const P* beta,
                                    const P* running_mean, const P* running_var, NhwcView<T> y) {
  check_view_arg(x, op, "x");
  check_view_arg(y, op, "y");
  check_same_view_shape(y, x, op, "y", "x");
  check_array(op, "gamma", gamma, x.c);
  check_array(op, "beta", beta, x.c);
  check_array(op, "running_mean", running_mean, x.c);
  check_array(op, "running_var", running_var, x.c);
}

// Where a backward gets act's output: y, or (recompute set) x with the forward's gamma and beta.
template <typename T, typename P>
inline void check_output_source(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> x,
                                BatchNormAffine<P> recompute) {
  if (recompute.gamma || recompute.beta) {
    check_array(op, "recompute.gamma", recompute.gamma, x.c);
    check_array(op, "recompute.beta", recompute.beta, x.c);
    if (y.data) throw Error(std::string(op) + ": y and recompute are both given (an empty y asks for the recompute)");
    return;
  }
  if (act != Activation::Linear) {
    check_view_arg(y, op, "y");
    check_same_view_shape(y, x, op, "y", "x");
  }
}

template <typename T, typename P>
inline void check_backward(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                           NhwcView<const T> x, const P* gamma, const P* saved_mean, const P* saved_var,
                           NhwcView<T> grad_x, const P* grad_gamma, const P* grad_beta,
                           BatchNormAffine<P> recompute = {}) {
  check_training_input(op, x);
  check_view_arg(grad_y, op, "grad_y");
  check_view_arg(grad_x, op, "grad_x");
  check_same_view_shape(grad_y, x, op, "grad_y", "x");
  check_same_view_shape(grad_x, x, op, "grad_x", "x");
  check_output_source(op, act, y, x, recompute);
  check_array(op, "gamma", gamma, x.c);
  check_array(op, "saved_mean", saved_mean, x.c);
  check_array(op, "saved_var", saved_var, x.c);
  check_array(op, "grad_gamma", grad_gamma, x.c);
  check_array(op, "grad_beta", grad_beta, x.c);
}

// ---- the synchronized phases' checks ----

inline void check_total_pixels(const char* op, double total_pixels, size_t pixels) {
  if (std::isfinite(total_pixels) && total_pixels >= double(pixels) && total_pixels == std::floor(total_pixels))
    return;
  std::ostringstream text;
  text.precision(17);
  text << op << ": total_pixels is " << total_pixels << "; it must be the pixel count n*h*w summed over all "
       << "replicas, a whole number at least this replica's " << pixels;
  throw Error(text.str());
}

template <typename T, typename P>
inline void check_sums(const char* op, NhwcView<const T> x, const P* sums) {
  check_training_input(op, x);
  check_array(op, "sums", sums, x.c);
}

template <typename T, typename P>
inline void check_centered_squares(const char* op, NhwcView<const T> x, const P* sums, double total_pixels,
                                   const P* squares) {
  check_sums(op, x, sums);
  check_total_pixels(op, total_pixels, x.pixels());
  check_array(op, "squares", squares, x.c);
}

template <typename T, typename P>
inline void check_forward_from_sums(const char* op, NhwcView<const T> x, const P* gamma, const P* beta, NhwcView<T> y,
                                    const P* sums, const P* squares, double total_pixels, const P* saved_mean,
                                    const P* saved_var, const P* running_mean, const P* running_var,
                                    bool y_optional = false) {
  check_forward_training(op, x, gamma, beta, y, saved_mean, saved_var, running_mean, running_var, y_optional);
  check_array(op, "sums", sums, x.c);
  check_array(op, "squares", squares, x.c);
  check_total_pixels(op, total_pixels, x.pixels());
}

// What both backward phases read: x, grad_y, y (unless linear), the saved statistics and sums2.
template <typename T, typename P>
inline void check_sync_backward_inputs(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                       NhwcView<const T> x, const P* saved_mean, const P* saved_var, const P* sums2,
                                       BatchNormAffine<P> recompute) {
  check_training_input(op, x);
  check_view_arg(grad_y, op, "grad_y");
  check_same_view_shape(grad_y, x, op, "grad_y", "x");
  check_output_source(op, act, y, x, recompute);
  check_array(op, "saved_mean", saved_mean, x.c);
  check_array(op, "saved_var", saved_var, x.c);
  check_array(op, "sums2", sums2, x.c);
}

template <typename T, typename P>
inline void check_backward_sums(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                NhwcView<const T> x, const P* saved_mean, const P* saved_var, const P* grad_gamma,
                                const P* grad_beta, const P* sums2, BatchNormAffine<P> recompute = {}) {
  check_sync_backward_inputs(op, act, y, grad_y, x, saved_mean, saved_var, sums2, recompute);
  check_array(op, "grad_gamma", grad_gamma, x.c);
  check_array(op, "grad_beta", grad_beta, x.c);
}

template <typename T, typename P>
inline void check_backward_apply(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                 NhwcView<const T> x, const P* gamma, const P* saved_mean, const P* saved_var,
                                 const P* sums2, double total_pixels, NhwcView<T> grad_x,
                                 BatchNormAffine<P> recompute = {}) {
  check_sync_backward_inputs(op, act, y, grad_y, x, saved_mean, saved_var, sums2, recompute);
  check_view_arg(grad_x, op, "grad_x");
  check_same_view_shape(grad_x, x, op, "grad_x", "x");
  check_array(op, "gamma", gamma, x.c);
  check_total_pixels(op, total_pixels, x.pixels());
}

template <typename T>
inline void check_workspace(const char* op, const NhwcView<const T>& x, const void* workspace, size_t workspace_bytes) {
  size_t need = batchnorm_workspace_bytes(x.n, x.h, x.w, x.c);
  if (workspace_bytes < need)
    throw Error(std::string(op) + ": workspace of " + std::to_string(workspace_bytes) + " bytes, needs " +
                std::to_string(need) + " (batchnorm_workspace_bytes)");
  if (need > 0 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % alignof(float) != 0))
    throw Error(std::string(op) + ": workspace is null or not float-aligned");
}

}  // namespace yolo::batchnorm_detail
