// C[m][n] = A[m][k] * B[n][k]^T on Hopper's wgmma: the first kernel of the tensor-core stage 2
// (issue 36), to be timed beside cuBLAS and the mma.sync kernels before the convolutions follow
// its main loop. It is the forward pass of a 1x1, stride-1 convolution: A the NHWC activations as
// [pixels][c_in], B the weights as [c_out][c_in], C the output as [pixels][c_out].
//   T = Bf16 or Fp16, FP32 accumulation, C rounded to T (nearest even).
//   Needs current_device_runs_wgmma() (kernels/hopper.h; throws yolo::Error otherwise), k a
//   positive multiple of 8 and A, B 16-byte aligned (TMA's rules for their rows); any m and n.
// The layout of the work: blocks of 128x128 outputs; one producer warpgroup (one thread issuing
// TMA boxes of 64 k into a ring of 4 stages in the 128-byte swizzle, its registers given back
// with setmaxnreg) and two math warpgroups of 64 rows each (m64n128k16 wgmma, one batch in
// flight while the previous stage is released).
#pragma once
#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

template <typename T>
void gemm_nt_wgmma(const T* a, const T* b, T* c, int m, int n, int k, cudaStream_t stream);

// C[m][n] = A[m][k] * B[k][n], B row-major (n contiguous: wgmma reads it MN-major): the backward
// data pass of a 1x1, stride-1 convolution (A the output gradient [pixels][c_out], B the
// weights [c_out][c_in]). The same main loop; B arrives as two 64-column TMA boxes a stage.
// Needs n and k multiples of 8 (B's and A's rows are 16-byte multiples), any m.
template <typename T>
void gemm_nn_wgmma(const T* a, const T* b, T* c, int m, int n, int k, cudaStream_t stream);

// The references: the same products in FP64 over the same 16-bit inputs, rounded to T once.
template <typename T>
void gemm_nt_reference(const T* a, const T* b, T* c, int m, int n, int k);
template <typename T>
void gemm_nn_reference(const T* a, const T* b, T* c, int m, int n, int k);

}  // namespace yolo
