// The CPU ops' register-blocked micro-kernels, in one variant per instruction set: baseline
// x86-64 (SSE2), AVX2 with FMA, AVX-512. The conv and gemm passes (conv.cu, gemm.cu) pack their
// panels `nr` wide and call the variant in use (kernels/cpu_isa.h) through this table.
//
// The AVX variants live in their own .cpp files compiled with -mavx2/-mavx512f (Makefile), which
// include only this header and <immintrin.h>: no inline or template code is shared with baseline
// units, or the linker could keep an AVX copy of it for everyone, and the program would die of
// SIGILL on an older CPU. Hence plain declarations here, and no standard library there.
#pragma once
#include <cstddef>

namespace yolo::cpu_micro {

constexpr int kMaxMr = 12, kMaxNr = 16;  // the largest block of any variant (scratch sizes)
constexpr int kPeakChains = 12;          // Tiles::peak's independent multiply-add chains

// Batchnorm's (+ activation's) loops over `pixels` pixels of c channels each (pixel pitch
// `*_stride`), per channel and in pixel order; `leaky`: darknet's leaky, else linear
// (cpu_micro_channels.inc has the definitions, kernels/batchnorm_cpu.cpp the callers).
struct ChannelLoops {
  // sum[ch] += x - shift[ch] and squares[ch] += (x - shift[ch])^2, in double.
  void (*moments)(const float* x, size_t stride, size_t pixels, int c, const float* shift, double* sum,
                  double* squares);
  // y = act((x - mean) * scale + beta); y may be x.
  void (*normalize)(const float* x, size_t x_stride, float* y, size_t y_stride, size_t pixels, int c, const float* mean,
                    const float* scale, const float* beta, bool leaky);
  // g = grad_y * act'(y) in float; sum_g[ch] += g and sum_gx[ch] += g * (x - mean), in double.
  void (*grad_sums)(const float* y, size_t y_stride, const float* grad_y, size_t g_stride, const float* x,
                    size_t x_stride, size_t pixels, int c, const float* mean, bool leaky, double* sum_g,
                    double* sum_gx);
  // grad_x = a (g - g_mean - kx (x - mean)); grad_x may be grad_y.
  void (*grad_apply)(const float* y, size_t y_stride, const float* grad_y, size_t g_stride, const float* x,
                     size_t x_stride, float* grad_x, size_t gx_stride, size_t pixels, int c, const float* mean,
                     const float* a, const float* g_mean, const float* kx, bool leaky);
};

// Max pooling's loops over one pixel's c channels (cpu_micro_pool.inc has the definitions,
// kernels/maxpool_cpu.cpp the callers).
struct PoolLoops {
  // best[ch] = max over q < count of cells[q][ch] (the first on ties), index[ch] = its cell_index[q].
  void (*window_max)(const float* const* cells, const int* cell_index, int count, int c, float* best, int* index);
  // target[ch] (= or +=) the sum over q < count, in order, of grads[q][ch] where chosen[q][ch] == self.
  void (*chosen_gradient)(const float* const* grads, const int* const* chosen, int count, int self, int c,
                          bool accumulate, float* target);
};

struct Tiles {
  int variant;  // which one this is: CpuIsa's value (kernels/cpu_isa.h), set by the variant itself
  int mr, nr;   // a block of mr rows x nr columns of the output in registers (nr: a multiple of 4)
  // acc[i * nr + j] += sum over t < depth, in order, of a[i][t] * b[t * nr + j] (i < mr; b: nr-wide
  // packed rows).
  void (*block)(const float* const* a, const float* b, int depth, float* acc);
  // block over a grid of taps in one call: for tap q = r * cols + s (r < rows, s < cols, in that
  // order), block(a + r * row_step + s * col_step, b + q * depth * nr, depth, acc), the sums kept
  // in registers from one tap to the next. A convolution's block reads its k rows (forward) or
  // k x k taps (backward data) so: one call instead of k or k * k, each loading and storing acc
  // (with depths of 27 to 48, that and the calls' setup were a fifth of a pass). The steps are
  // block's, in the same order, so the sums are bit for bit those of the separate calls.
  void (*taps)(const float* const* a, ptrdiff_t row_step, int rows, ptrdiff_t col_step, int cols, const float* b,
               int depth, float* acc);
  // acc[i * nr + j] += sum over p < count, in order, of g[p * g_step + i] * x[p * x_step + j] (a
  // full mr x nr block: the weight gradients' outer products).
  void (*outer)(const float* g, size_t g_step, const float* x, size_t x_step, int count, float* acc);
  ChannelLoops channels;
  PoolLoops pool;
  // The variant's multiply-add ceiling loop, for benchmarks (cpu_micro_peak.inc): `steps` steps of
  // kPeakChains chains, each `peak_lanes` floats wide; returns the sum of their lanes. A step is
  // 2 * kPeakChains * peak_lanes flops.
  float (*peak)(long steps, float seed);
  int peak_lanes;
};

// The variants (cpu_micro_baseline.cpp, cpu_micro_avx2.cpp, cpu_micro_avx512.cpp). The AVX ones
// may only be called where the CPU has those instructions (kernels/cpu_isa.h decides).
Tiles baseline_tiles();
Tiles avx2_tiles();
Tiles avx512_tiles();

}  // namespace yolo::cpu_micro
