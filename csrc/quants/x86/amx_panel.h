// AMX int8 tiles for prompt processing (the amx kernel table): the panel kernels' products,
// 16 weight rows x 16 tokens x one block (or K-quant sub-block) per tile instruction.
//
// A block of a 16-token panel (avx512_panel.h) is already the layout AMX wants for its second operand:
// B holds K/4 rows of N 4-byte groups, and chunk k of a panel block holds group k of each
// token's activations, so the block is a tile as it stands (8 rows of 64 bytes, loaded from the
// panel in place). The first operand, A, is 16 weight rows' quants (T::unpack_unsigned), 32 bytes
// per row, unpacked once per call for all the panels; for the types with a zero point z, as the
// signed qx - z, so that tdpbssd gives C[r][t] = sum (qx - z) qy, the integer the avx512 table forms
// as sum qx qy - z sum qy (tdpbusd, A unsigned, for the offset types). The sums are then scaled and
// accumulated in the avx512 table's order. So the amx table gives a prompt's tokens the bits the
// avx512 table gives them, alone or batched.
//
// Each block's sums leave the tile for the float accumulation (the scales change from block to
// block, so the tile cannot carry integer sums across blocks): one panel at a time, its 16 rows'
// float sums in registers over all the blocks, and the next block's tile product issued before
// the current one's sums are accumulated, so that the tiles and the vector units overlap.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/amx_tiles.h"
#include "core/fp16.h"
#include "core/kernels.h"
#include "quants/x86/avx512_k_panel.h"
#include "quants/x86/avx512_panel.h"

namespace ember {
namespace EMBER_ISA_NS {

// Pointers to 16 weight rows; rows past n_rows repeat the last one (their sums are dropped).
template <typename BX>
struct SixteenRows {
  const BX* row[16];
  const BX* operator[](int r) const { return row[r]; }
};
template <typename BX>
inline SixteenRows<BX> sixteen_rows(const uint8_t* x, size_t x_stride, int n_rows) {
  SixteenRows<BX> rows;
  for (int r = 0; r < 16; ++r) rows.row[r] = reinterpret_cast<const BX*>(x + std::min(r, n_rows - 1) * x_stride);
  return rows;
}

// C += A . B with A's bytes signed (tdpbssd) or unsigned (tdpbusd); B's bytes signed.
template <bool kSigned, int C, int A, int B>
inline void tile_dp() {
  if constexpr (kSigned) tile_dpbssd<C, A, B>();
  else tile_dpbusd<C, A, B>();
}

// 16 weight rows unpacked once for all the panels: block b's quants as tile rows (signed,
// zero point subtracted, for the types that have one), its scales and offsets as floats.
template <typename T>
struct UnpackedRows {
  static constexpr bool kSigned = T::kZeroShift >= 0;
  int8_t (*q)[16][32];
  float (*d)[16];
  float (*m)[16];

  UnpackedRows(const SixteenRows<typename T::BX>& xr, int64_t nb) {
    thread_local std::vector<uint8_t> storage;
    const size_t bytes = nb * (16 * 32 + 2 * 16 * sizeof(float));
    if (storage.size() < bytes + 64) storage.resize(bytes + 64);
    uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t(63));
    q = reinterpret_cast<int8_t(*)[16][32]>(base);
    d = reinterpret_cast<float(*)[16]>(base + nb * 16 * 32);
    m = d + nb;
    const __m256i zero_point = _mm256_set1_epi8(kSigned ? static_cast<char>(1 << T::kZeroShift) : 0);
    for (int64_t b = 0; b < nb; ++b)
      for (int r = 0; r < 16; ++r) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(q[b][r]), _mm256_sub_epi8(T::unpack_unsigned(xr[r][b]), zero_point));
        d[b][r] = fp16_to_fp32(xr[r][b].d);
        if constexpr (T::kOffset) m[b][r] = fp16_to_fp32(xr[r][b].m);
      }
  }
};

template <typename T>
void gemm_panel_amx(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vpanels,
                    int n_rows, int n_cols) {
  using BX = typename T::BX;
  constexpr bool kSigned = UnpackedRows<T>::kSigned;
  const int64_t nb = n / 32;
  const int n_panels = (n_cols + kPanelTokens - 1) / kPanelTokens;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  auto panel = [&](int p) { return reinterpret_cast<const PanelBlock*>(panel_at(vpanels, n, p)); };

  // Tile 0: 16 weight rows x 32 quants; tile 1 a panel block (8 chunks x 16 tokens x 4 bytes);
  // tiles 2 and 3, in turn, a block's sums (16 rows x 16 tokens of int32).
  TileConfig cfg;
  cfg.set(0, 16, 32).set(1, 8, 4 * kPanelTokens).set(2, 16, 4 * kPanelTokens).set(3, 16, 4 * kPanelTokens);
  tile_load_config(cfg);
  alignas(64) int32_t c[2][16][kPanelTokens];
  // Block b's products with one panel into tile C (tdpbssd gives sum (qx - z) qy, the integer
  // sum the avx512 table forms as sum qx qy - z sum qy).
  auto start_block = [&](const UnpackedRows<T>& w, const PanelBlock& pb, int64_t b, auto tile) {
    constexpr int C = decltype(tile)::value;
    tile_load<0>(w.q[b], 32);
    tile_load<1>(pb.qs, 4 * kPanelTokens);
    tile_zero<C>();
    tile_dp<kSigned, C, 0, 1>();
  };
  for (int r0 = 0; r0 < n_rows; r0 += 16) {
    const int rows = std::min(16, n_rows - r0);
    const UnpackedRows<T> w(sixteen_rows<BX>(x + r0 * x_stride, x_stride, rows), nb);
    for (int p = 0; p < n_panels; ++p) {
      const PanelBlock* pb = panel(p);
      // S and O of the 16 rows stay in registers over the blocks, summed as panel_kernel sums them.
      __m512 S[16], O[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) S[r] = O[r] = _mm512_setzero_ps();
      // Software-pipelined: block b + 1's tile product runs while block b's sums are accumulated.
      start_block(w, pb[0], 0, std::integral_constant<int, 2>());
      for (int64_t b = 0; b < nb; ++b) {
        const int k = b & 1;
        if (k == 0) tile_store<2>(c[0], 4 * kPanelTokens);
        else tile_store<3>(c[1], 4 * kPanelTokens);
        if (b + 1 < nb) {
          if (k == 0) start_block(w, pb[b + 1], b + 1, std::integral_constant<int, 3>());
          else start_block(w, pb[b + 1], b + 1, std::integral_constant<int, 2>());
        }
        const __m512 dy = _mm512_load_ps(pb[b].d);
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) {
          const __m512 dxdy = _mm512_mul_ps(dy, _mm512_set1_ps(w.d[b][r]));
          S[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[k][r])), dxdy, S[r]);
        }
      }
      if constexpr (T::kOffset) {
        for (int64_t b = 0; b < nb; ++b) {
          const __m512 sy = _mm512_load_ps(pb[b].s);
#pragma GCC unroll 16
          for (int r = 0; r < 16; ++r) O[r] = _mm512_fmadd_ps(_mm512_set1_ps(w.m[b][r]), sy, O[r]);
        }
      }
      const int token0 = p * kPanelTokens, tokens = std::min(kPanelTokens, n_cols - token0);
      alignas(64) float sums[16][kPanelTokens];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) _mm512_store_ps(sums[r], _mm512_add_ps(S[r], O[r]));
      for (int t = 0; t < tokens; ++t)
        for (int r = 0; r < rows; ++r) out[(token0 + t) * out_stride + r0 + r] = sums[r][t];
    }
  }
  tile_release();
}

// The K-quants (avx512_k_panel.h) on the tiles: sub-block j of 16 rows' unpacked quants (UnpackedK,
// unpacked once per call for all the panels, loaded in place at its stride; signed, zero point
// subtracted, for the types that have one) times the same sub-block of a K panel (kSub / 4 chunks of
// 16 tokens), one tile product per sub-block and panel; each sub-block's integer sums times its
// scale into the rows' scaled sums (in registers), the mins times the tokens' sub-block sums, then
// avx512_k_panel.h's add_super_block, in avx2_k_tile.h's order (the integer sums are exact, so
// their order does not change them).
template <typename T>
void gemm_panel_k_amx(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vpanels,
                      int n_rows, int n_cols) {
  using BX = typename T::BX;
  constexpr bool kSigned = T::kZeroShift >= 0;
  constexpr int kChunks = T::kSub / 4, kSubBlocks = QK_K / T::kSub;
  const int64_t nb = n / QK_K;
  const int n_panels = (n_cols + kPanelTokens - 1) / kPanelTokens;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  auto panel = [&](int p) { return reinterpret_cast<const PanelKBlock*>(panel_at(vpanels, n, p)); };

  // Tile 0: 16 rows' quants of one sub-block; tile 1 the panel's; tiles 2 and 3, in turn, the sums.
  TileConfig cfg;
  cfg.set(0, 16, T::kSub).set(1, kChunks, 4 * kPanelTokens);
  cfg.set(2, 16, 4 * kPanelTokens).set(3, 16, 4 * kPanelTokens);
  tile_load_config(cfg);
  thread_local std::vector<UnpackedK<T>> unpacked;
  if (unpacked.size() < static_cast<size_t>(16 * nb)) unpacked.resize(16 * nb);
  UnpackedK<T>* w = unpacked.data();  // w[16 b + r]: row r's super-block b
  alignas(64) int32_t c[2][16][kPanelTokens];
  PanelPartials partials[16];
  // Sub-block i (of all the super-blocks in order) of the rows with panel pb into tile C.
  auto start_sub_block = [&](const PanelKBlock* pb, int64_t i, auto tile) {
    constexpr int C = decltype(tile)::value;
    const int64_t b = i / kSubBlocks;
    const int j = static_cast<int>(i % kSubBlocks);
    tile_load<0>(w[16 * b].q + j * kChunks, sizeof(UnpackedK<T>));
    tile_load<1>(pb[b].qs[j * kChunks], 4 * kPanelTokens);
    tile_zero<C>();
    tile_dp<kSigned, C, 0, 1>();
  };
  for (int r0 = 0; r0 < n_rows; r0 += 16) {
    const int rows = std::min(16, n_rows - r0);
    const auto xr = sixteen_rows<BX>(x + r0 * x_stride, x_stride, rows);
    const __m256i zero_point = _mm256_set1_epi8(kSigned ? static_cast<char>(1 << T::kZeroShift) : 0);
    for (int64_t b = 0; b < nb; ++b)
      for (int r = 0; r < 16; ++r) {
        UnpackedK<T>& u = w[16 * b + r];
        u.set(xr[r][b]);
        for (int k = 0; k < QK_K / 4; k += 8) {
          __m256i* q = reinterpret_cast<__m256i*>(u.q + k);
          _mm256_store_si256(q, _mm256_sub_epi8(_mm256_load_si256(q), zero_point));
        }
      }
    const int64_t n_sub = nb * kSubBlocks;
    for (int p = 0; p < n_panels; ++p) {
      const PanelKBlock* pb = panel(p);
      for (PanelPartials& pp : partials) pp.clear();
      __m512i scaled[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) scaled[r] = _mm512_setzero_si512();
      // Software-pipelined: sub-block i + 1's tile product runs while sub-block i's sums are added.
      start_sub_block(pb, 0, std::integral_constant<int, 2>());
      for (int64_t i = 0; i < n_sub; ++i) {
        const int k = i & 1;
        if (k == 0) tile_store<2>(c[0], 4 * kPanelTokens);
        else tile_store<3>(c[1], 4 * kPanelTokens);
        if (i + 1 < n_sub) {
          if (k == 0) start_sub_block(pb, i + 1, std::integral_constant<int, 3>());
          else start_sub_block(pb, i + 1, std::integral_constant<int, 2>());
        }
        const int64_t b = i / kSubBlocks;
        const int j = static_cast<int>(i % kSubBlocks);
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r)
          scaled[r] = _mm512_add_epi32(scaled[r], _mm512_mullo_epi32(_mm512_load_si512(c[k][r]), _mm512_set1_epi32(w[16 * b + r].sc[j])));
        if (j == kSubBlocks - 1) {
          const __m512 dy = _mm512_load_ps(pb[b].d);
#pragma GCC unroll 16
          for (int r = 0; r < 16; ++r) {
            const UnpackedK<T>& u = w[16 * b + r];
            __m512i mins = _mm512_setzero_si512();
            if constexpr (T::kMins)
              for (int jj = 0; jj < kSubBlocks; ++jj)
                mins = _mm512_add_epi32(mins, _mm512_mullo_epi32(sub_block_sums<T>(pb[b], jj), _mm512_set1_epi32(u.mn[jj])));
            add_super_block<T>(scaled[r], mins, dy, u.d, u.dmin, partials[r], b);
            scaled[r] = _mm512_setzero_si512();
          }
        }
      }
      const int token0 = p * kPanelTokens, tokens = std::min(kPanelTokens, n_cols - token0);
      for (int r = 0; r < rows; ++r) partials[r].store(out + token0 * out_stride + r0 + r, out_stride, tokens);
    }
  }
  tile_release();
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
