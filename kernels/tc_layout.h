// Where the tensor-core main loop (kernels/tc_tiles.cuh) puts things in shared memory and where
// each lane reads them: plain functions of integers, for the kernels, the planner's shared-memory
// sizes (kernels/tc_plan.h) and the bank-conflict test (tests/test_kernel_tc_banks.cpp), so the
// three cannot drift apart.
//
// A stage holds BK of the reduction (64 bytes of each operand row) for one operand's R rows (the
// tile's M rows of A' or N columns of B'), as 16-byte chunks of V elements, in one of two layouts:
//   K-major  [R][BK]: row r's 4 chunks, chunk j stored at position j ^ ((r / 2) % 4), so that the
//            8 rows a fragment load reads at one k, and the 2 rows x 4 chunks that 8 threads
//            store at once, fall in 8 distinct 16-byte groups of banks;
//   MN-major [BK][R + 8]: a row per k, R + 8 elements apart, so 8 rows at one position are 16
//            bytes of banks apart, and stores run along a row.
// Thread t of the block's 256 fills chunks t, t + 256, ... (R / 64 of them), consecutive threads
// along a row first: a warp's 32 chunks are 8 whole K-major rows, or 32 consecutive MN-major chunks.
#pragma once
#include "kernels/tensor.h"

namespace yolo::tc {

constexpr int kTcThreads = 256;
constexpr int kTcAsyncStages = 3;

// K per stage (64 bytes of a row) and elements per 16-byte chunk, by element size.
YOLO_HOST_DEVICE constexpr int tc_bk(int elem) { return elem == 4 ? 16 : 32; }
YOLO_HOST_DEVICE constexpr int tc_chunk_elements(int elem) { return 16 / elem; }

// Elements between consecutive rows of a stage, and a stage's elements, for one operand.
YOLO_HOST_DEVICE constexpr int tc_pitch(int elem, bool kmajor, int rows) { return kmajor ? tc_bk(elem) : rows + 8; }
YOLO_HOST_DEVICE constexpr int tc_operand_elements(int elem, bool kmajor, int rows) {
  return (kmajor ? rows : tc_bk(elem)) * tc_pitch(elem, kmajor, rows);
}
constexpr int tc_stage_bytes(int elem, bool a_kmajor, bool b_kmajor, int bm, int bn) {
  return (tc_operand_elements(elem, a_kmajor, bm) + tc_operand_elements(elem, b_kmajor, bn)) * elem;
}

// Element (row, k) of a stage, as an offset in elements from the stage's start.
YOLO_HOST_DEVICE constexpr int tc_offset(int elem, bool kmajor, int rows, int row, int k) {
  const int v = tc_chunk_elements(elem);
  if (kmajor) return row * tc_pitch(elem, true, rows) + ((k / v) ^ ((row >> 1) & 3)) * v + k % v;
  return k * tc_pitch(elem, false, rows) + row;
}

// Chunk c of a stage (c = thread + i * 256): its first element's (row, k). K-major chunks hold
// k..k+V-1 of a row; MN-major chunks rows row..row+V-1 at one k.
struct TcAt {
  int row, k;
};
YOLO_HOST_DEVICE constexpr TcAt tc_chunk_of(int elem, bool kmajor, int rows, int c) {
  const int v = tc_chunk_elements(elem), per_row = tc_bk(elem) / v;
  if (kmajor) return {c / per_row, (c % per_row) * v};
  return {(c % (rows / v)) * v, c / (rows / v)};
}

// The warps' 2 x 4 arrangement over a BM x BN block tile: warp w's sub-tile origin.
YOLO_HOST_DEVICE constexpr int tc_warp_row0(int warp, int bm) { return (warp / 4) * (bm / 2); }
YOLO_HOST_DEVICE constexpr int tc_warp_col0(int warp, int bn) { return (warp % 4) * (bn / 4); }

// Where lane `lane` points its fragment loads for one MMA k-step, relative to (the sub-tile's
// first row, the k-step's first k). ldmatrix.x4 row addresses (each lane names one 16-byte row of
// one of 4 8x8 matrices of 16-bit elements): A 16 rows x one k-step, B 16 columns (two n8 tiles)
// x one k-step; K-major without .trans, MN-major (16-bit only) with. With TF32 elements a K-major
// 16-byte row holds 4 of them, and ldmatrix hands lane l the 32 bits at row l/4, element l%4: the
// PTX ISA's m16n8k8 TF32 fragments, so K-major TF32 operands load this way too. MN-major TF32
// operands load element by element: register `reg` of a[reg] = A[g + 8 (reg % 2)][t + 4 (reg / 2)],
// b[reg] = B[t + 4 reg][g] (g = lane / 4, t = lane % 4).
YOLO_HOST_DEVICE constexpr TcAt ldmatrix_a_at(int lane, bool kmajor, int elem) {
  if (kmajor) return {lane % 16, (lane / 16) * tc_chunk_elements(elem)};
  return {((lane / 8) % 2) * 8, lane % 8 + (lane / 16) * 8};
}
YOLO_HOST_DEVICE constexpr TcAt ldmatrix_b_at(int lane, bool kmajor, int elem) {
  if (kmajor) return {(lane / 16) * 8 + lane % 8, ((lane / 8) % 2) * tc_chunk_elements(elem)};
  return {(lane / 16) * 8, lane % 8 + ((lane / 8) % 2) * 8};
}
YOLO_HOST_DEVICE constexpr TcAt tf32_a_at(int lane, int reg) { return {lane / 4 + 8 * (reg % 2), lane % 4 + 4 * (reg / 2)}; }
YOLO_HOST_DEVICE constexpr TcAt tf32_b_at(int lane, int reg) { return {lane / 4, lane % 4 + 4 * reg}; }

// The epilogue's staging (write_tile in kernels/tc_tiles.cuh). After the main loop each warp
// stores its accumulators as FP32, 16 rows of its WN-column sub-tile at a time (WN = 32 or 16),
// in its own [16][WN] slice of the freed stage memory, and reads them back as whole 16-byte
// chunks of rows, so that global stores are 16 bytes (4 FP32 or 8 16-bit values) and fill whole
// sectors. Float chunk c of row r sits at position c ^ tc_out_key(wn, r), so the fragment stores
// (float2; the 16 lanes of a phase write rows 0-3, 2 chunks each) and the chunk loads (8 lanes a
// phase) fall in distinct banks. A 16-bit output takes two float chunks per lane; the one it loads
// first is tc_out_first(wn, r), so the 8 lanes of a phase load both parities of chunk at once.
YOLO_HOST_DEVICE constexpr int tc_out_rows_per_line(int wn) { return 32 / wn; }  // rows per 128 bytes
YOLO_HOST_DEVICE constexpr int tc_out_key(int wn, int row) {
  return 2 * ((row / tc_out_rows_per_line(wn)) % (wn / 8));
}
YOLO_HOST_DEVICE constexpr int tc_out_first(int wn, int row) { return (row / tc_out_rows_per_line(wn)) % 2; }
YOLO_HOST_DEVICE constexpr int tc_out_offset(int wn, int row, int col) {
  return row * wn + (((col / 4) ^ tc_out_key(wn, row)) * 4) + col % 4;
}
// Lane `lane`'s accumulators of n8 tile j, half h: row g + 8h, columns 2t and 2t + 1 (g = lane / 4,
// t = lane % 4: the mma's C fragment), as (row, column) in the warp's 16 x WN block.
YOLO_HOST_DEVICE constexpr TcAt tc_acc_at(int lane, int j, int h) { return {lane / 4 + 8 * h, j * 8 + 2 * (lane % 4)}; }
// The output chunk of n values lane `lane` writes at step `step`: (row, first column).
YOLO_HOST_DEVICE constexpr TcAt tc_out_chunk_at(int wn, int n, int lane, int step) {
  const int per_row = wn / n, q = lane + 32 * step;
  return {q / per_row, (q % per_row) * n};
}
// Bytes of the staging for a tile BN columns wide: 8 warps x 16 rows x BN / 4 floats.
constexpr int tc_out_stage_bytes(int bn) { return kTcThreads / 32 * 16 * (bn / 4) * 4; }
// Dynamic shared memory of a launch: its pipeline's stages, or the staging if that is larger.
constexpr int tc_launch_smem_bytes(int elem, bool a_kmajor, bool b_kmajor, int bm, int bn, int stages) {
  const int pipeline = tc_stage_bytes(elem, a_kmajor, b_kmajor, bm, bn) * stages;
  return pipeline > tc_out_stage_bytes(bn) ? pipeline : tc_out_stage_bytes(bn);
}

}  // namespace yolo::tc
