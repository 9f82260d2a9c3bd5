// Dense matrix products on tensor cores (kernels/tc_tiles.cuh's main loop over plain matrix
// operands; tiles, splits and pipelines from kernels/tc_plan.h).
//
// The three operand layouts [connected] layers need, which are also the conv passes' layouts:
//   out = in * W^T         (A K-major, B' = W^T with W stored n x k: K-major; C in T)
//   d_in = d_out * W       (A K-major, B stored k x n: MN-major; C in T)
//   dW = d_out^T * in      (A' = A^T stored k x m: MN-major, B MN-major; C in FP32)
// trans_a with trans_b (A MN-major, B K-major) is refused: no layer multiplies that way.
#include <string>

#include "kernels/gemm.h"
#include "kernels/gemm_tiles.cuh"
#include "kernels/tc_epilogue.cuh"
#include "kernels/tc_tiles.cuh"

namespace yolo {

namespace {

using namespace tc;

template <typename T, typename Out, bool AK, bool BKm, int BM, int BN, bool Async>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(TcPass::Gemm, BM, Async))
    gemm_tc_kernel(GemmShape s, const T* a, const T* b, const float* bias, Out* c, bool accumulate, float* partials,
                   int splits, bool vec_a, bool vec_b) {
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN, split = int(blockIdx.z);
  const KRange k = split_range(s.k, splits, split, Tc<T>::BK);
  MatrixLoader<T, AK, BM> la(a, s.a_pitch(), s.m, s.k, m0, k.k_begin);
  MatrixLoader<T, BKm, BN> lb(b, s.b_pitch(), s.n, s.k, n0, k.k_begin);
  float acc[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4];
  run_mainloop<T, AK, BKm, BM, BN, Async>(la, lb, k, vec_a, vec_b, acc);
  if (splits > 1)  // this split's FP32 partials [m][n]; the second pass adds bias and accumulates
    write_tile<BM, BN>(acc, TileRows<float>{partials + size_t(block_index_anew().z) * s.m * s.n, s.n, s.m, s.n});
  else
    write_tile<BM, BN>(acc, TileRows<Out>{c, s.c_pitch(), s.m, s.n, bias, accumulate});
}

// Which layouts the (T, Out) pair serves: Out = T for the K-major-A products, float for dW.
template <typename T, typename Out>
void check_layout(const GemmShape& s) {
  const char* op = "gemm_tc";
  if (s.trans_a && s.trans_b)
    throw Error(std::string(op) + ": trans_a with trans_b is not supported (no layer multiplies that way)");
  if (s.trans_a != std::is_same_v<Out, float> && !std::is_same_v<T, float>)
    throw Error(std::string(op) + ": with 16-bit inputs, C is FP32 exactly for trans_a (weight gradients)");
}

template <typename T>
bool vec_matrix(const T* p, int pitch, int contiguous) {
  constexpr int V = Tc<T>::V;
  return pitch % V == 0 && contiguous % V == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The plan depends on the shape only (workspace sizes must not depend on pointers): alignment can
// only turn the cp.async pipeline off at launch.
template <typename T>
TcPlan gemm_plan(const GemmShape& s) {
  constexpr int V = Tc<T>::V;
  const bool ak = !s.trans_a, bk = s.trans_b;
  TcProblem problem;
  problem.pass = TcPass::Gemm;
  problem.m = s.m, problem.n = s.n, problem.k = s.k;
  problem.elem = int(sizeof(T));
  problem.precision = tc_precision<T>();
  problem.a_kmajor = ak, problem.b_kmajor = bk;
  problem.vec = s.a_pitch() % V == 0 && (ak ? s.k : s.m) % V == 0 && s.b_pitch() % V == 0 && (bk ? s.k : s.n) % V == 0;
  return choose_plan(problem, current_gpu());
}

}  // namespace

template <typename T, typename Out>
size_t gemm_tc_workspace_bytes(const GemmShape& s) {
  s.validate("gemm_tc");
  const TcPlan plan = gemm_plan<T>(s);
  return plan.splits > 1 ? (size_t(plan.splits) * s.m * s.n * sizeof(float) + 255) / 256 * 256 : 0;
}

template <typename T, typename Out>
void gemm_tc(const GemmShape& s, const T* a, const T* b, const float* bias, Out* c, bool accumulate, void* workspace,
             size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "gemm_tc";
  s.validate(op);
  require_precision(tc_precision<T>(), op);
  check_layout<T, Out>(s);
  if (s.m == 0 || s.n == 0) return;
  if (c == nullptr || (s.k > 0 && (a == nullptr || b == nullptr))) throw Error(std::string(op) + ": null matrix");
  const bool ak = !s.trans_a, bk = s.trans_b;
  const bool vec_a = vec_matrix(a, s.a_pitch(), ak ? s.k : s.m), vec_b = vec_matrix(b, s.b_pitch(), bk ? s.k : s.n);
  TcPlan plan = gemm_plan<T>(s);
  plan.async = plan.async && vec_a && vec_b;
  const size_t need = gemm_tc_workspace_bytes<T, Out>(s);
  if (need > 0 && (workspace == nullptr || workspace_bytes < need || reinterpret_cast<uintptr_t>(workspace) % 16))
    throw Error(std::string(op) + ": needs " + std::to_string(need) + " bytes of 16-byte aligned workspace, got " +
                std::to_string(workspace ? workspace_bytes : 0));
  float* partials = static_cast<float*>(workspace);
  auto launch = [&]<bool AK, bool BKm>() {
    auto run = [&]<int BM, int BN, bool Async>() {
      auto kernel = gemm_tc_kernel<T, Out, AK, BKm, BM, BN, Async>;
      const size_t smem = launch_smem_bytes<T, AK, BKm, BM, BN, Async>();
      allow_shared(kernel, smem);
      LAUNCH(kernel, dim3(ceil_div(size_t(s.m), BM), ceil_div(size_t(s.n), BN), unsigned(plan.splits)),
             dim3(kThreads), smem, stream, s, a, b, bias, c, accumulate, partials, plan.splits, vec_a, vec_b);
    };
    with_plan(plan, run);
  };
  // Only the three layouts of the header (check_layout), and per (T, Out) only those it serves.
  constexpr bool wide = std::is_same_v<T, float>, dw = std::is_same_v<Out, float>;
  if constexpr (wide || dw) {
    if (!ak) launch.template operator()<false, false>();
  }
  if constexpr (wide || !dw) {
    if (ak && bk) launch.template operator()<true, true>();
    else if (ak) launch.template operator()<true, false>();
  }
  if (plan.splits > 1) launch_sum_splits_tc(partials, plan.splits, s.m, s.n, c, s.c_pitch(), accumulate, bias, stream);
}

template size_t gemm_tc_workspace_bytes<float, float>(const GemmShape&);
template size_t gemm_tc_workspace_bytes<Bf16, Bf16>(const GemmShape&);
template size_t gemm_tc_workspace_bytes<Bf16, float>(const GemmShape&);
template size_t gemm_tc_workspace_bytes<Fp16, Fp16>(const GemmShape&);
template size_t gemm_tc_workspace_bytes<Fp16, float>(const GemmShape&);
template void gemm_tc<float, float>(const GemmShape&, const float*, const float*, const float*, float*, bool, void*,
                                    size_t, cudaStream_t);
template void gemm_tc<Bf16, Bf16>(const GemmShape&, const Bf16*, const Bf16*, const float*, Bf16*, bool, void*, size_t,
                                  cudaStream_t);
template void gemm_tc<Bf16, float>(const GemmShape&, const Bf16*, const Bf16*, const float*, float*, bool, void*,
                                   size_t, cudaStream_t);
template void gemm_tc<Fp16, Fp16>(const GemmShape&, const Fp16*, const Fp16*, const float*, Fp16*, bool, void*, size_t,
                                  cudaStream_t);
template void gemm_tc<Fp16, float>(const GemmShape&, const Fp16*, const Fp16*, const float*, float*, bool, void*,
                                   size_t, cudaStream_t);

}  // namespace yolo
