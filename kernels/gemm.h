// Dense matrix product (row-major, FP32): C = A' * B' (+ bias on every row) (+ C), where A' is A
// or A^T and B' is B or B^T. What [connected] layers run (forward out = in * W^T + b, backward
// d_in = d_out * W, dW = d_out^T * in) and 1x1 convolutions.
#pragma once
#include <cstddef>

#include "kernels/precision.h"
#include "kernels/tensor.h"

namespace yolo {

// C is m x n (row pitch ldc); A' is m x k, B' is k x n. As stored, A is m x k (k x m when
// trans_a) and B is k x n (n x k when trans_b); the pitches are those stored rows' lengths in
// elements, 0 meaning packed.
struct GemmShape {
  int m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int lda = 0, ldb = 0, ldc = 0;

  YOLO_HOST_DEVICE int a_pitch() const { return lda ? lda : (trans_a ? m : k); }
  YOLO_HOST_DEVICE int b_pitch() const { return ldb ? ldb : (trans_b ? k : n); }
  YOLO_HOST_DEVICE int c_pitch() const { return ldc ? ldc : n; }
  // Throws yolo::Error (naming `op`) for negative sizes or pitches shorter than a row.
  void validate(const char* op) const;
};

// c[i][j] = (accumulate ? c[i][j] : 0) + sum_k A'[i][k] * B'[k][j] + (bias ? bias[j] : 0).
// bias may be null; a and b may be null only when nothing is read from them (m*n*k == 0).
// The CUDA version may split K (partial products in the workspace, summed in a fixed order by
// a second pass: deterministic) and needs gemm_workspace_bytes(shape) bytes of device
// workspace, 16-byte aligned (0 for many shapes; then workspace may be null). The sizes are
// for the current device (they depend on its SM count). The others ignore the workspace.
size_t gemm_workspace_bytes(const GemmShape& shape);
template <typename T>
void gemm_reference(const GemmShape& shape, const T* a, const T* b, const T* bias, T* c, bool accumulate,
                    void* workspace, size_t workspace_bytes);
void gemm_cpu(const GemmShape& shape, const float* a, const float* b, const float* bias, float* c, bool accumulate,
              void* workspace, size_t workspace_bytes);
void gemm_cuda(const GemmShape& shape, const float* a, const float* b, const float* bias, float* c, bool accumulate,
               void* workspace, size_t workspace_bytes, cudaStream_t stream);

// The CUDA gemm and conv kernels share one tiled main loop (kernels/gemm_tiles.cuh): 256
// threads compute a BM x BN output tile (128x128, 128x64, 64x128 or 64x64), chosen per call
// from the problem and the GPU's SM count, and every pass with a workspace may split the
// reduction (K) into chunks reduced in a second, fixed-order pass. For tests: force a tile
// (0..3 in that order; -1 = automatic) and a split count (0 = automatic; chunks may come out
// empty). Process-wide; not for use while another thread launches.
void set_gemm_tiling_for_tests(int tile, int splits);

// ---- tensor cores (kernels/gemm_tc.cu) ------------------------------------------------------------
// The same product on mma.sync in the precision of T (precision.h; float = TF32): a and b are T,
// bias FP32, C is Out (T, or float for weight gradients); FP32 accumulation, deterministic
// split-K. The layouts are those of [connected] layers: A * B^T and A * B (Out = T), A^T * B
// (Out = float, or T = float); others throw yolo::Error, as does a device that cannot run the
// precision.
template <typename T, typename Out>
size_t gemm_tc_workspace_bytes(const GemmShape& shape);
template <typename T, typename Out>
void gemm_tc(const GemmShape& shape, const T* a, const T* b, const float* bias, Out* c, bool accumulate,
             void* workspace, size_t workspace_bytes, cudaStream_t stream);
// For tests: force the tensor-core tile (0: 128x128, 1: 64x64; -1 automatic), the split count
// (0 automatic) and the pipeline (0 automatic, 1 register-staged, 2 cp.async where the device
// has it, 3 the wgmma kernels where the device and the shape allow them, else automatic).
// Forcing a tile, splits or pipeline 1 or 2 rules wgmma out. Process-wide, like
// set_gemm_tiling_for_tests.
void set_tc_tiling_for_tests(int tile, int splits, int pipeline);

}  // namespace yolo
