// Shared-memory bank conflicts of the tensor-core main loop's stages (kernels/tc_layout.h), by the
// bank model: 32 banks of 4 bytes; a warp's access is served in phases, 8 lanes at a time for
// 16-byte accesses (cp.async, and the register-staged pipeline's stores), one 8x8 matrix (its 8
// lanes' row addresses) at a time for ldmatrix (16-bit operands, and K-major TF32 ones), all 32
// lanes at once for 4-byte loads (MN-major TF32 operands); a phase
// takes as many wavefronts as the most distinct 4-byte words one bank must deliver (one word is
// broadcast). Every stage store and fragment load, for every operand layout, tile side and element
// size, must take one wavefront per phase. The layout before (a 16-byte pad per K-major row, no
// swizzle; 36% excess shared wavefronts in ncu's report of the forward kernel on the H200) is kept
// here as the control the model must catch: its K-major stores take 2 wavefronts a phase.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/tc_layout.h"

using namespace yolo::tc;

namespace {

using Offset = int (*)(int elem, bool kmajor, int rows, int row, int k);

// The layout before 2026-12-04: K-major rows of BK + 16 bytes, chunks in order.
int padded_offset(int elem, bool kmajor, int rows, int row, int k) {
  if (kmajor) return row * (tc_bk(elem) + 16 / elem) + k;
  return tc_offset(elem, kmajor, rows, row, k);
}

// Wavefronts of one phase: each lane reads or writes `bytes` at its byte address.
int wavefronts(const std::vector<int>& addresses, int bytes) {
  std::map<int, std::set<int>> words_of_bank;
  for (int address : addresses)
    for (int b = 0; b < bytes; b += 4) {
      const int word = (address + b) / 4;
      words_of_bank[word % 32].insert(word);
    }
  size_t most = 0;
  for (const auto& [bank, words] : words_of_bank) most = std::max(most, words.size());
  return int(most);
}

struct Layout {
  int elem;
  bool kmajor;
  int rows;  // the tile's side: 64 or 128
  std::string name() const {
    return std::string(elem == 4 ? "tf32 " : "16-bit ") + (kmajor ? "K-major " : "MN-major ") + std::to_string(rows);
  }
};

// The worst phase of every warp's stage stores (16-byte chunks).
int worst_store_phase(const Layout& l, Offset offset) {
  int worst = 0;
  for (int warp = 0; warp < kTcThreads / 32; ++warp)
    for (int i = 0; i < l.rows / 64; ++i)
      for (int phase = 0; phase < 4; ++phase) {
        std::vector<int> addresses;
        for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
          const TcAt ch = tc_chunk_of(l.elem, l.kmajor, l.rows, warp * 32 + lane + i * kTcThreads);
          addresses.push_back(offset(l.elem, l.kmajor, l.rows, ch.row, ch.k) * l.elem);
        }
        worst = std::max(worst, wavefronts(addresses, 16));
      }
  return worst;
}

// The worst phase of every warp's fragment loads, with the stage as operand A (its rows split
// 2 ways over the warps) or B (4 ways).
int worst_load_phase(const Layout& l, bool as_a, Offset offset) {
  const int k_step = l.elem == 4 ? 8 : 16;
  const int sub_tiles = as_a ? l.rows / 2 / 16 : l.rows / 4 / 16;  // 16 rows a load (B: two n8 tiles)
  int worst = 0;
  for (int warp = 0; warp < kTcThreads / 32; ++warp)
    for (int kk = 0; kk < tc_bk(l.elem); kk += k_step)
      for (int sub = 0; sub < sub_tiles; ++sub) {
        const int row0 = (as_a ? tc_warp_row0(warp, l.rows) : tc_warp_col0(warp, l.rows)) + 16 * sub;
        auto address = [&](TcAt f) { return offset(l.elem, l.kmajor, l.rows, row0 + f.row, kk + f.k) * l.elem; };
        if (l.elem == 2 || l.kmajor) {  // ldmatrix.x4 (MN-major TF32 loads element by element)
          for (int matrix = 0; matrix < 4; ++matrix) {
            std::vector<int> addresses;
            for (int lane = 8 * matrix; lane < 8 * matrix + 8; ++lane)
              addresses.push_back(
                  address(as_a ? ldmatrix_a_at(lane, l.kmajor, l.elem) : ldmatrix_b_at(lane, l.kmajor, l.elem)));
            worst = std::max(worst, wavefronts(addresses, 16));
          }
        } else {
          for (int half = 0; half < 2; ++half)  // B's 16 columns are two n8 tiles
            for (int reg = 0; reg < (as_a ? 4 : 2); ++reg) {
              if (as_a && half == 1) continue;
              std::vector<int> addresses;
              for (int lane = 0; lane < 32; ++lane) {
                TcAt f = as_a ? tf32_a_at(lane, reg) : tf32_b_at(lane, reg);
                f.row += 8 * half;
                addresses.push_back(address(f));
              }
              worst = std::max(worst, wavefronts(addresses, 4));
            }
        }
      }
  return worst;
}

std::vector<Layout> layouts() {
  std::vector<Layout> all;
  for (int elem : {4, 2})
    for (bool kmajor : {true, false})
      for (int rows : {64, 128}) all.push_back({elem, kmajor, rows});
  return all;
}

}  // namespace

TEST_CASE("tc banks: every stage store and fragment load of every layout takes one wavefront per phase") {
  for (const Layout& l : layouts()) {
    CAPTURE(l.name());
    CHECK(worst_store_phase(l, tc_offset) == 1);
    CHECK(worst_load_phase(l, true, tc_offset) == 1);
    CHECK(worst_load_phase(l, false, tc_offset) == 1);
  }
}

TEST_CASE("tc banks: the model catches the padded layout's K-major store conflicts (2 wavefronts a phase)") {
  for (const Layout& l : layouts()) {
    CAPTURE(l.name());
    CHECK(worst_store_phase(l, padded_offset) == (l.kmajor ? 2 : 1));
    CHECK(worst_load_phase(l, true, padded_offset) == 1);  // its loads were conflict-free
    CHECK(worst_load_phase(l, false, padded_offset) == 1);
  }
}

TEST_CASE("tc banks: the swizzle keeps every element of a stage in its own place, the same 16 rows on") {
  for (const Layout& l : layouts()) {
    CAPTURE(l.name());
    std::set<int> seen;
    const int rows = l.rows, bk = tc_bk(l.elem);
    for (int row = 0; row < rows; ++row)
      for (int k = 0; k < bk; ++k) {
        const int at = tc_offset(l.elem, l.kmajor, rows, row, k);
        CHECK(at >= 0);
        CHECK(at < tc_operand_elements(l.elem, l.kmajor, rows));
        CHECK(seen.insert(at).second);
      }
    // The kernels add 16 rows' step for each later 16-row sub-tile (FragmentOffsets in tc_tiles.cuh).
    const int row_step = l.kmajor ? tc_pitch(l.elem, true, rows) : 1;
    for (int row = 0; row + 16 < rows; ++row)
      for (int k = 0; k < bk; ++k)
        CHECK(tc_offset(l.elem, l.kmajor, rows, row + 16, k) == tc_offset(l.elem, l.kmajor, rows, row, k) + 16 * row_step);
    // Chunks stay whole: a chunk's V elements are consecutive in shared memory.
    const int v = tc_chunk_elements(l.elem);
    for (int c = 0; c < rows * bk / v; ++c) {
      const TcAt ch = tc_chunk_of(l.elem, l.kmajor, rows, c);
      const int first = tc_offset(l.elem, l.kmajor, rows, ch.row, ch.k);
      CHECK(first % v == 0);
      for (int e = 1; e < v; ++e)
        CHECK(tc_offset(l.elem, l.kmajor, rows, ch.row + (l.kmajor ? 0 : e), ch.k + (l.kmajor ? e : 0)) == first + e);
    }
  }
}

// ---- the epilogue's staging (tc_out_offset): float2 fragment stores, 16-byte chunk loads ----------

namespace {

using OutOffset = int (*)(int wn, int row, int col);
using First = int (*)(int wn, int row);

// No swizzle, first chunk first: the control the model must catch.
int plain_out_offset(int wn, int row, int col) { return row * wn + col; }
int plain_first(int, int) { return 0; }

// The worst phase of a warp's fragment stores into its [16][wn] slice: 8-byte stores, 16 lanes a phase.
int worst_out_store_phase(int wn, OutOffset offset) {
  int worst = 0;
  for (int j = 0; j < wn / 8; ++j)
    for (int h = 0; h < 2; ++h)
      for (int phase = 0; phase < 2; ++phase) {
        std::vector<int> addresses;
        for (int lane = 16 * phase; lane < 16 * phase + 16; ++lane) {
          const TcAt at = tc_acc_at(lane, j, h);
          addresses.push_back(offset(wn, at.row, at.k) * 4);
        }
        worst = std::max(worst, wavefronts(addresses, 8));
      }
  return worst;
}

// The worst phase of the chunk loads: n = 4 (FP32 output, one chunk a lane) or 8 (16-bit output,
// two chunks, `first` of them loaded first); 16-byte loads, 8 lanes a phase.
int worst_out_load_phase(int wn, int n, OutOffset offset, First first) {
  int worst = 0;
  for (int step = 0; step < 16 * (wn / n) / 32; ++step)
    for (int load = 0; load < n / 4; ++load)
      for (int phase = 0; phase < 4; ++phase) {
        std::vector<int> addresses;
        for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
          const TcAt at = tc_out_chunk_at(wn, n, lane, step);
          const int which = n == 4 ? 0 : (first(wn, at.row) + load) % 2;
          addresses.push_back(offset(wn, at.row, at.k + 4 * which) * 4);
        }
        worst = std::max(worst, wavefronts(addresses, 16));
      }
  return worst;
}

}  // namespace

TEST_CASE("tc banks: the epilogue's staging takes one wavefront per phase; without its swizzle, more") {
  for (int wn : {16, 32}) {
    CAPTURE(wn);
    CHECK(worst_out_store_phase(wn, tc_out_offset) == 1);
    CHECK(worst_out_store_phase(wn, plain_out_offset) == wn / 8);  // a phase's 4 rows: wn / 8 of them share banks
    for (int n : {4, 8}) {
      CAPTURE(n);
      CHECK(worst_out_load_phase(wn, n, tc_out_offset, tc_out_first) == 1);
      CHECK(worst_out_load_phase(wn, n, plain_out_offset, plain_first) == (n == 8 ? 2 : 1));
      CHECK(worst_out_load_phase(wn, n, tc_out_offset, plain_first) == (n == 8 ? 2 : 1));
    }
    // Every value of the slice in its own place, chunks whole; the lanes' chunks cover the slice once.
    std::set<int> seen;
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < wn; ++col) {
        const int at = tc_out_offset(wn, row, col);
        CHECK(at >= 0);
        CHECK(at < 16 * wn);
        CHECK(seen.insert(at).second);
        CHECK(at % 4 == col % 4);
      }
    for (int n : {4, 8}) {
      std::set<std::pair<int, int>> chunks;
      for (int step = 0; step < 16 * (wn / n) / 32; ++step)
        for (int lane = 0; lane < 32; ++lane) {
          const TcAt at = tc_out_chunk_at(wn, n, lane, step);
          CHECK(at.row < 16);
          CHECK(at.k % n == 0);
          CHECK(chunks.insert({at.row, at.k}).second);
        }
      CHECK(chunks.size() == size_t(16 * wn / n));
    }
  }
  CHECK(tc_out_stage_bytes(128) <= tc_launch_smem_bytes(2, true, true, 128, 128, 2));
}
