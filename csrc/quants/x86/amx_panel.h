// AMX int8 tiles for prompt processing (the amx kernel table): the panel kernels' products,
// 16 weight rows x 16 tokens x one block (or K-quant sub-block) per tile instruction.
//
// A block of a 16-token panel (avx512_panel.h) is already the layout AMX wants for its second operand:
// B holds K/4 rows of N 4-byte groups, and chunk k of a panel block holds group k of each
// token's activations, so the block is a tile as it stands (8 rows of 64 bytes, loaded from the
// panel in place). The first operand, A, is 16 weight rows' unsigned quants (T::unpack_unsigned),
// 32 bytes per row. tdpbusd (A unsigned, B signed) gives C[r][t] = the block's integer sum of
// weight row r with token t: the sums panel_kernel's vpdpbusd's give, zero point subtracted
// after the same way, then scaled and accumulated in the same order. So the amx table gives a
// prompt's tokens the bits the avx512 table gives them, alone or batched.
//
// Each block's sums leave the tile for the float accumulation (the scales change from block to
// block, so the tile cannot carry integer sums across blocks). The unpacked weight block stays
// in its tile for kGroup panels. Written and tested without an AMX CPU at hand (through the
// emulator: amx_emulator.h), so not yet tuned on one.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

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

// The integer sums of the weight block in tile 0 with one panel block: its activations into tile
// B, the products into tile C (zeroed first); stored by the caller once it has started the next.
template <int B, int C>
inline void start_block_sums(const PanelBlock& pb) {
  tile_load<B>(pb.qs, 4 * kPanelTokens);
  tile_zero<C>();
  tile_dpbusd<C, 0, B>();
}

template <typename T>
void gemm_panel_amx(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vpanels,
                    int n_rows, int n_cols) {
  using BX = typename T::BX;
  constexpr int kGroup = 4;  // panels multiplied with each unpacked block of weights
  const int64_t nb = n / 32;
  const int n_panels = (n_cols + kPanelTokens - 1) / kPanelTokens;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  auto panel = [&](int p) { return reinterpret_cast<const PanelBlock*>(panel_at(vpanels, n, p)); };

  // Tile 0: 16 weight rows x 32 unsigned quants. Two panels at a time, so that one's products
  // overlap the other's: tiles 1 and 3 take a panel block (8 chunks x 16 tokens x 4 bytes),
  // tiles 2 and 4 the sums (16 rows x 16 tokens of int32).
  TileConfig cfg;
  cfg.set(0, 16, 32).set(1, 8, 4 * kPanelTokens).set(2, 16, 4 * kPanelTokens);
  cfg.set(3, 8, 4 * kPanelTokens).set(4, 16, 4 * kPanelTokens);
  tile_load_config(cfg);
  alignas(64) uint8_t a[16][32];
  alignas(64) int32_t c[2][16][kPanelTokens];
  alignas(64) float S[kGroup][16][kPanelTokens], O[kGroup][16][kPanelTokens];
  float dx[16], mx[16];
  // S and O of panel p += block b's sums in c, as panel_kernel adds them.
  auto accumulate = [&](int p, const PanelBlock& pb, const int32_t (&sums)[16][kPanelTokens]) {
    const __m512 dy = _mm512_load_ps(pb.d);
    __m512i zero_sums = _mm512_setzero_si512();
    if constexpr (T::kZeroShift >= 0) zero_sums = _mm512_slli_epi32(_mm512_load_si512(pb.qsum), T::kZeroShift);
    for (int r = 0; r < 16; ++r) {
      __m512i isum = _mm512_load_si512(sums[r]);
      if constexpr (T::kZeroShift >= 0) isum = _mm512_sub_epi32(isum, zero_sums);
      const __m512 dxdy = _mm512_mul_ps(dy, _mm512_set1_ps(dx[r]));
      _mm512_store_ps(S[p][r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dxdy, _mm512_load_ps(S[p][r])));
    }
    if constexpr (T::kOffset) {
      const __m512 sy = _mm512_load_ps(pb.s);
      for (int r = 0; r < 16; ++r)
        _mm512_store_ps(O[p][r], _mm512_fmadd_ps(_mm512_set1_ps(mx[r]), sy, _mm512_load_ps(O[p][r])));
    }
  };
  for (int r0 = 0; r0 < n_rows; r0 += 16) {
    const int rows = std::min(16, n_rows - r0);
    const auto xr = sixteen_rows<BX>(x + r0 * x_stride, x_stride, rows);
    for (int p0 = 0; p0 < n_panels; p0 += kGroup) {
      const int group = std::min(kGroup, n_panels - p0);
      std::memset(S, 0, sizeof S);
      std::memset(O, 0, sizeof O);
      for (int64_t b = 0; b < nb; ++b) {
        for (int r = 0; r < 16; ++r) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(a[r]), T::unpack_unsigned(xr[r][b]));
          dx[r] = fp16_to_fp32(xr[r][b].d);
          if constexpr (T::kOffset) mx[r] = fp16_to_fp32(xr[r][b].m);
        }
        tile_load<0>(a, 32);
        for (int p = 0; p < group; p += 2) {
          const PanelBlock& first = panel(p0 + p)[b];
          const bool pair = p + 1 < group;
          start_block_sums<1, 2>(first);
          if (pair) start_block_sums<3, 4>(panel(p0 + p + 1)[b]);
          tile_store<2>(c[0], 4 * kPanelTokens);
          accumulate(p, first, c[0]);
          if (pair) {
            tile_store<4>(c[1], 4 * kPanelTokens);
            accumulate(p + 1, panel(p0 + p + 1)[b], c[1]);
          }
        }
      }
      for (int p = 0; p < group; ++p) {
        const int token0 = (p0 + p) * kPanelTokens, tokens = std::min(kPanelTokens, n_cols - token0);
        for (int r = 0; r < rows; ++r) {
          alignas(64) float sums[kPanelTokens];
          _mm512_store_ps(sums, _mm512_add_ps(_mm512_load_ps(S[p][r]), _mm512_load_ps(O[p][r])));
          for (int t = 0; t < tokens; ++t) out[(token0 + t) * out_stride + r0 + r] = sums[t];
        }
      }
    }
  }
  tile_release();
}

// The K-quants (avx512_k_panel.h) on the tiles: sub-block j of 16 rows' unpacked quants (UnpackedK,
// loaded in place at its stride) times the same sub-block of a K panel (kSub / 4 chunks of 16
// tokens), one tdpbusd per sub-block and panel; then the integer sums go through avx512_k_panel.h's
// add_sub_block and add_super_block, in avx2_k_tile.h's order. Two sub-blocks at a time: tiles 0 and 5
// hold their quants, 1 and 3 the panel's, 2 and 4 the sums.
template <int A, int B, int C>
inline void start_sub_block_sums(const void* quants, size_t quant_stride, const PanelKBlock& pb, int chunk) {
  tile_load<A>(quants, quant_stride);
  tile_load<B>(pb.qs[chunk], 4 * kPanelTokens);
  tile_zero<C>();
  tile_dpbusd<C, A, B>();
}

template <typename T>
void gemm_panel_k_amx(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vpanels,
                      int n_rows, int n_cols) {
  using BX = typename T::BX;
  constexpr int kGroup = 2, kChunks = T::kSub / 4;  // 2 panels: their partial sums fill 32 KiB
  const int64_t nb = n / QK_K;
  const int n_panels = (n_cols + kPanelTokens - 1) / kPanelTokens;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  auto panel = [&](int p) { return reinterpret_cast<const PanelKBlock*>(panel_at(vpanels, n, p)); };

  TileConfig cfg;
  cfg.set(0, 16, T::kSub).set(5, 16, T::kSub);
  cfg.set(1, kChunks, 4 * kPanelTokens).set(3, kChunks, 4 * kPanelTokens);
  cfg.set(2, 16, 4 * kPanelTokens).set(4, 16, 4 * kPanelTokens);
  tile_load_config(cfg);
  UnpackedK<T> w[16];
  alignas(64) int32_t c[2][16][kPanelTokens];
  alignas(64) int32_t scaled[kGroup][16][kPanelTokens], mins[kGroup][16][kPanelTokens];
  PanelPartials partials[kGroup][16];
  // The sums in c of sub-block j with panel p, into its rows' scaled and mins sums.
  auto accumulate = [&](int p, int j, const PanelKBlock& pb, const int32_t (&sums)[16][kPanelTokens]) {
    const __m512i ysum = sub_block_sums<T>(pb, j);
    for (int r = 0; r < 16; ++r) {
      __m512i sc = _mm512_load_si512(scaled[p][r]), mn = _mm512_load_si512(mins[p][r]);
      add_sub_block<T>(_mm512_load_si512(sums[r]), ysum, w[r].sc[j], w[r].mn[j], sc, mn);
      _mm512_store_si512(scaled[p][r], sc);
      _mm512_store_si512(mins[p][r], mn);
    }
  };
  for (int r0 = 0; r0 < n_rows; r0 += 16) {
    const int rows = std::min(16, n_rows - r0);
    const auto xr = sixteen_rows<BX>(x + r0 * x_stride, x_stride, rows);
    for (int p0 = 0; p0 < n_panels; p0 += kGroup) {
      const int group = std::min(kGroup, n_panels - p0);
      for (auto& panel_partials : partials)
        for (PanelPartials& p : panel_partials) p.clear();
      for (int64_t b = 0; b < nb; ++b) {
        for (int r = 0; r < 16; ++r) w[r].set(xr[r][b]);
        std::memset(scaled, 0, sizeof scaled);
        std::memset(mins, 0, sizeof mins);
        for (int j = 0; j < QK_K / T::kSub; j += 2) {
          for (int p = 0; p < group; ++p) {
            const PanelKBlock& pb = panel(p0 + p)[b];
            start_sub_block_sums<0, 1, 2>(w[0].q + j * kChunks, sizeof(UnpackedK<T>), pb, j * kChunks);
            start_sub_block_sums<5, 3, 4>(w[0].q + (j + 1) * kChunks, sizeof(UnpackedK<T>), pb, (j + 1) * kChunks);
            tile_store<2>(c[0], 4 * kPanelTokens);
            accumulate(p, j, pb, c[0]);
            tile_store<4>(c[1], 4 * kPanelTokens);
            accumulate(p, j + 1, pb, c[1]);
          }
        }
        for (int p = 0; p < group; ++p) {
          const __m512 dy = _mm512_load_ps(panel(p0 + p)[b].d);
          for (int r = 0; r < 16; ++r)
            add_super_block<T>(_mm512_load_si512(scaled[p][r]), _mm512_load_si512(mins[p][r]), dy, w[r].d, w[r].dmin,
                               partials[p][r], b);
        }
      }
      for (int p = 0; p < group; ++p) {
        const int token0 = (p0 + p) * kPanelTokens, tokens = std::min(kPanelTokens, n_cols - token0);
        for (int r = 0; r < rows; ++r) partials[p][r].store(out + token0 * out_stride + r0 + r, out_stride, tokens);
      }
    }
  }
  tile_release();
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
