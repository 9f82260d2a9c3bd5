// The benchmark's run-time loader for cuBLAS (dlopen), the yardstick of the tensor-core rows
// (tools/bench_tc.cu), loaded the way runtime/nccl_loader.h loads NCCL: bench_kernels is never
// linked against cuBLAS (it starts, and prints "-" in the cuBLAS columns, without it), and
// train_yolo never touches it (this file is linked into bench_kernels only).
// cuBLAS's own types come from the toolkit's <cublas_v2.h>; a build without it (or without
// CUDA) reports cuBLAS as unavailable. Calls go through the table returned by cublas().
// Search order: $YOLO_CUBLAS_LIB (the library, or a folder holding libcublas.so.13, .so.12 or
// .so), then libcublas.so.13, libcublas.so.12, libcublas.so on the loader's default paths.
#pragma once
#include <cstdio>
#include <string>

#include "runtime/check.h"

#if YOLO_CUDA && __has_include(<cublas_v2.h>)
#include <cublas_v2.h>
#define YOLO_HAVE_CUBLAS 1
#else
#define YOLO_HAVE_CUBLAS 0
#endif

namespace yolo::bench {

struct CublasStatusInfo {
  bool loaded = false;
  std::string path;     // the library that was loaded
  std::string version;  // e.g. "12.4.5"
  std::string why_not;  // when not loaded: what was tried and what failed
};

class CublasHandle;  // below, where cuBLAS's headers are (a benchmark's handle on its stream)

// Tries to load cuBLAS once; later calls return the same answer. Never throws.
const CublasStatusInfo& cublas_status();

// A row-major product C[m][n] = op(A)[m][k] * op(B)[k][n] (op = transpose when trans_*), every
// matrix dense (leading dimension = its row length), as the column-major call cuBLAS takes.
// A row-major matrix with leading dimension ld is, read column-major, its transpose with the
// same ld; so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, which is
// cublasGemmEx(op_b, op_a, n, m, k, B, ldb, A, lda, C, ldc = n) with each op the same flag as in
// the row-major product:
//   first operand B: row-major [k][n] (ld n) read column-major is n x k, ld n: op N;
//                    row-major [n][k] (ld k, trans_b) is k x n, ld k: op T gives n x k;
//   second operand A: row-major [m][k] (ld k) is k x m, ld k: op N;
//                    row-major [k][m] (ld m, trans_a) is m x k, ld m: op T gives k x m;
//   result: column-major n x m with ld n is row-major C[m][n].
struct RowMajorGemm {
  int m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
};
struct ColumnMajorGemm {
  bool trans_first = false, trans_second = false;  // op of the first (B) and second (A) operand
  int m = 0, n = 0, k = 0;                        // cuBLAS's m, n, k
  int ld_first = 0, ld_second = 0, ldc = 0;       // leading dimensions of B, A, C
};
inline ColumnMajorGemm to_column_major(const RowMajorGemm& g) {
  ColumnMajorGemm c;
  c.trans_first = g.trans_b;
  c.trans_second = g.trans_a;
  c.m = g.n;
  c.n = g.m;
  c.k = g.k;
  c.ld_first = g.trans_b ? g.k : g.n;   // B's row length, row-major
  c.ld_second = g.trans_a ? g.m : g.k;  // A's row length, row-major
  c.ldc = g.n;
  return c;
}

#if YOLO_HAVE_CUBLAS
struct CublasApi {
  cublasStatus_t (*Create)(cublasHandle_t*);
  cublasStatus_t (*Destroy)(cublasHandle_t);
  cublasStatus_t (*SetStream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*SetMathMode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                           const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  cublasStatus_t (*GetProperty)(libraryPropertyType, int*);
  const char* (*GetStatusString)(cublasStatus_t);  // may be null (older libraries)
};

// The loaded API; throws yolo::Error (with cublas_status().why_not) when cuBLAS is unavailable.
const CublasApi& cublas();
#endif

}  // namespace yolo::bench

#if YOLO_HAVE_CUBLAS
namespace yolo {
// CHECKED(call) for cuBLAS calls: a failure throws yolo::Error with the status and its text.
inline void check_result(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    const char* text = bench::cublas_status().loaded && bench::cublas().GetStatusString
                           ? bench::cublas().GetStatusString(status)
                           : "cuBLAS error";
    fail_call(call, file, line, std::string("cuBLAS status ") + std::to_string(int(status)) + ": " + text);
  }
}
}  // namespace yolo
#endif

#if YOLO_HAVE_CUBLAS
namespace yolo::bench {

// One cuBLAS handle on the benchmark's stream, for one run of the entry.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    const CublasApi& api = cublas();
    CHECKED(api.Create(&handle_));
    try {
      CHECKED(api.SetStream(handle_, stream));
      // Tensor cores where the compute type allows them (never TF32 for CUBLAS_COMPUTE_32F), and
      // 16-bit outputs' split-K reductions in FP32, as ours are.
      CHECKED(api.SetMathMode(handle_, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    } catch (...) {
      api.Destroy(handle_);
      throw;
    }
  }
  ~CublasHandle() {
    const cublasStatus_t status = cublas().Destroy(handle_);
    if (status != CUBLAS_STATUS_SUCCESS) std::fprintf(stderr, "cuBLAS: cublasDestroy failed (status %d)\n", int(status));
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace yolo::bench
#endif
