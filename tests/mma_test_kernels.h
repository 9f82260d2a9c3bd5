// Kernels that test the tensor-core building blocks of kernels/mma.cuh one instruction at a time
// (tests/test_kernel_mma.cpp), emulated and natively. Each launcher runs one kernel on device
// pointers and returns when it is queued on the default stream; launchers that need sm_80 (TF32
// and BF16 MMA, cp.async) or sm_75 (FP16 MMA, ldmatrix) throw yolo::Error on an older device.
#pragma once
#include <cstdint>

namespace yolo::testing {

// ---- mma.sync ------------------------------------------------------------------------------------
enum class MmaKind { Tf32M16n8k8, Bf16M16n8k16, F16M16n8k16, F16M16n8k8 };
constexpr int mma_k(MmaKind kind) { return kind == MmaKind::Bf16M16n8k16 || kind == MmaKind::F16M16n8k16 ? 16 : 8; }
constexpr int mma_a_registers(MmaKind kind) { return kind == MmaKind::F16M16n8k8 ? 2 : 4; }
constexpr int mma_b_registers(MmaKind kind) { return kind == MmaKind::F16M16n8k8 ? 1 : 2; }
const char* mma_kind_name(MmaKind kind);

// `permute` of launch_mma: kMmaExact loads the fragments as the PTX ISA's layout figures say;
// every other code breaks the mapping on purpose (tests assert that each one gives wrong results).
enum MmaPermute : int {
  kMmaExact = 0,
  kMmaSwapA01,       // A registers 0 and 1 exchanged (rows g and g + 8)
  kMmaSwapA02,       // A registers 0 and 2 exchanged (k and k + 4, or k + 8); 4-register A only
  kMmaSwapAHalves,   // the two 16-bit halves of A register 0 exchanged; 16-bit kinds only
  kMmaRotateALanes,  // each lane takes its A registers from lane + 4 (the next row group)
  kMmaRotateBLanes,  // each lane takes its B registers from lane + 1
  kMmaSwapB01,       // B registers 0 and 1 exchanged; 2-register B only
  kMmaSwapBHalves,   // the two 16-bit halves of B register 0 exchanged; 16-bit kinds only
  kMmaSwapC01,       // C registers 0 and 1 exchanged as C is loaded
  kMmaSwapD02,       // D registers 0 and 2 exchanged as D is stored
  kMmaPermuteCount
};
// Whether `permute` applies to `kind` (the register it names exists).
bool mma_permute_applies(MmaKind kind, int permute);

// One warp per tile t < tiles computes D = A*B + C for a 16x8xK MMA of `kind` (K = mma_k):
// A is 16xK and B is Kx8, both row-major, C and D 16x8 row-major FP32; tile t's operands start
// at element t*16*K of a, t*K*8 of b and t*128 of c and d. a and b hold float for TF32 (rounded
// with to_tf32 in the kernel) and the 16-bit patterns (uint16_t) of Bf16 or Fp16 otherwise.
// d_in_place (may be null) receives the same MMA computed in place (D aliasing C).
void launch_mma(MmaKind kind, const void* a, const void* b, const float* c, float* d, float* d_in_place,
                int tiles, int permute);

// ---- ldmatrix ------------------------------------------------------------------------------------
// Shared tile of 16-bit elements that launch_ldmatrix loads from global memory first.
constexpr int kLdmatrixTileElements = 1024;
// One warp copies tile[0..kLdmatrixTileElements) to shared memory; lane l then passes the
// address of shared element lane_offsets[l] to ldmatrix<matrices, trans> and writes its
// registers to out[4*l + j] for j < matrices (the rest are not written).
void launch_ldmatrix(int matrices, bool trans, const uint16_t* tile, const int* lane_offsets, uint32_t* out);

// ---- cp.async ------------------------------------------------------------------------------------
// A block of `threads` (a multiple of 32) writes a marker (kCpAsyncMarker words) over `chunks`
// 16-byte chunks of shared memory, then copies them from src, chunk i by thread i % threads with
// cp_async_16(fill = fill[i] != 0); one commit, wait<0>, __syncthreads, then every chunk is
// written to out (4 words per chunk): src's bytes where fill, zeros elsewhere.
constexpr uint32_t kCpAsyncMarker = 0xA5A5A5A5u;
void launch_cp_async_fill(const uint32_t* src, const int* fill, uint32_t* out, int chunks, int threads);
// Thread t of one block of `threads` writes the marker over its three shared chunks (3t,
// 3t+1, 3t+2); after a __syncthreads it copies chunk 3t+j from src in committed group j.
// out holds four stages of `3*threads` chunks (4 words each):
//   stage 0: the thread's own chunks before any wait (written only when observe_in_flight),
//   stage 1: after wait<2> (group 0 complete),  stage 2: after wait<1> (groups 0 and 1),
//   stage 3: after wait<0> and __syncthreads, the chunks of thread (t + 1) % threads.
// Stages 1 and 2 read chunks whose groups may still be in flight only when observe_in_flight
// (emulation tests: on a GPU those reads race with the copy); otherwise they read the completed
// groups' chunks and leave the others unwritten.
void launch_cp_async_groups(const uint32_t* src, uint32_t* out, int threads, bool observe_in_flight);

// ---- conversions on the device -------------------------------------------------------------------
void launch_to_tf32(const float* in, uint32_t* out, int n);            // out[i] = to_tf32(in[i])
// out[i] = to_tf32 of the float whose bits are first + i*step (modulo 2^32), i < n.
void launch_to_tf32_patterns(uint32_t first, uint32_t step, uint32_t* out, int n);
void launch_pack_bf16x2(const float* in, uint32_t* out, int pairs);    // out[i] = pack_bf16x2(in[2i], in[2i+1])
void launch_pack_f16x2(const float* in, uint32_t* out, int pairs);     // out[i] = pack_f16x2(in[2i], in[2i+1])

// ---- emulation only (throw yolo::Error in a CUDA build) --------------------------------------------
// One warp whose lane `exited_lane` (-1: none) returns at once; the others call
// mma_bf16_m16n8k16 (or, with ldmatrix set, ldmatrix x4) on zeros. The emulation must throw.
void launch_warp_op_with_exited_lane(int exited_lane, bool ldmatrix);

}  // namespace yolo::testing
