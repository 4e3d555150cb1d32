// AVX-512 (VNNI) kernels for the 32-weight block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL).
//
// Every (weight row, token) pair is summed in the one order avx2_panel.h describes, with its
// activation panels, traits and the kernels shared with it (rows8_kernel, vec_dot_rows).
//
// Two shapes of lanes:
// - rows in lanes (decode and batches of up to 8 tokens): either 16 weight rows in a 512-bit
//   vector with their unpacked quants transposed once per block, so that a broadcast 4-byte
//   group of a token's activations meets group k of every row (rows16t_kernel), or 8 rows with
//   each row's per-block sums reduced across lanes (rows8_kernel, for one token of Q5_0 and for
//   rows too long to stage their tokens' scales); then scaled and accumulated for all the rows
//   at once;
// - tokens in lanes (prompt processing): the activations of 16 tokens are repacked once per
//   matmul into a panel, block by block, with token t's elements 4k..4k+3 in lane t of chunk k;
//   one vpdpbusd then multiplies a broadcast 4-byte group of one weight row with all 16
//   tokens, and 8 of them give the block's 16 integer sums. The float work per block is one
//   conversion and one FMA for 16 (row, token) pairs.
#pragma once
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define EMBER_HAS_PANELS 1
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/fp16.h"
#include "core/kernels.h"
#include "core/types.h"
#include "quants/x86/avx2_panel.h"
#include "quants/x86/avx2_simd.h"

namespace ember {
namespace EMBER_ISA_NS {

// acc + the dot products of w's unsigned bytes with the 4 signed bytes at g, broadcast to every
// lane: one vpdpbusd with an embedded broadcast (the compiler keeps a separate vpbroadcastd).
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* g) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(g)));
  return acc;
}

// Block b of 16 rows unpacked to unsigned bytes and transposed: w[k] holds group k (elements
// 4k .. 4k + 3) of rows 0 .. 15, row r in lane r. Q4_0, Q4_1 and IQ4_NL transpose their packed
// bytes (packed 4-byte group j holds groups j and j + 4 in its low and high nibbles: half the
// shuffles), rows i, i + 4, i + 8 and i + 12 in one vector, a row per 128-bit quarter, so that
// unpacks within quarters leave the rows in order; IQ4_NL then looks its nibbles up in its table
// (T::values_512). The other types transpose their unpacked
// bytes, rows r and r + 8 side by side: unpacks within quarters leave group k of rows 0 .. 3
// (4 .. 7, 8 .. 11, 12 .. 15) in quarters of two vectors, and one two-source permute per group
// puts the quarters in order.
template <typename T>
inline void unpack_transposed_16(const typename T::BX* const xr[16], int64_t b, __m512i w[8]) {
  using BX = typename T::BX;
  if constexpr (std::is_same_v<BX, block_q4_0> || std::is_same_v<BX, block_q4_1> || std::is_same_v<BX, block_iq4_nl>) {
    auto quarter = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr[r][b].qs)); };
    __m512i p[4];
    for (int i = 0; i < 4; ++i) {
      p[i] = _mm512_castsi128_si512(quarter(i));
      p[i] = _mm512_inserti32x4(p[i], quarter(i + 4), 1);
      p[i] = _mm512_inserti32x4(p[i], quarter(i + 8), 2);
      p[i] = _mm512_inserti32x4(p[i], quarter(i + 12), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(p[0], p[1]), t1 = _mm512_unpackhi_epi32(p[0], p[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(p[2], p[3]), t3 = _mm512_unpackhi_epi32(p[2], p[3]);
    const __m512i q[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                          _mm512_unpackhi_epi64(t1, t3)};
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      w[j] = _mm512_and_si512(q[j], low);
      w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(q[j], 4), low);
    }
    if constexpr (std::is_same_v<BX, block_iq4_nl>)
      for (int k = 0; k < 8; ++k) w[k] = T::values_512(w[k]);
  } else {
    __m512i v[8], t[8], u[8];
    for (int r = 0; r < 8; ++r)
      v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(T::unpack_unsigned(xr[r][b])), T::unpack_unsigned(xr[r + 8][b]), 1);
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int h = 0; h < 2; ++h) {
      u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
      u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
      u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
      u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    const __m512i even_quarters = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i odd_quarters = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int k = 0; k < 4; ++k) {
      w[k] = _mm512_permutex2var_epi64(u[k], even_quarters, u[4 + k]);
      w[k + 4] = _mm512_permutex2var_epi64(u[k], odd_quarters, u[4 + k]);
    }
  }
}

// 16 weight rows (rows past n_rows repeat the last one) x C tokens: the rows' unpacked quants
// are transposed once per block, so that lane r of a vpdpbusd with a broadcast 4-byte group of
// a token's activations accumulates row r, and after the block's 8 groups each lane holds its
// row's exact block sum with no reduction across lanes. The tokens' sums are interleaved (and
// split in two) so that the dependent chains of vpdpbusd overlap. The 16 rows' f16 scales (and
// the offsets of Q4_1 and Q5_1, which follow them) come in one 4-byte load per row.
template <typename T, int C>
inline void rows16t_kernel(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride, int n_rows,
                           const uint8_t* y, size_t y_stride, const TokenScales<C>& ys) {
  const RowsAndTokens<T, 16, C> rows(x, x_stride, n_rows, y, y_stride);
  const auto &xr = rows.x, &yc = rows.y;
  __m512 S[C], O[C];
  for (int c = 0; c < C; ++c) S[c] = O[c] = _mm512_setzero_ps();
  const RowPrefetch prefetch(16, 32, x_stride, nb);  // the 16 rows after the next 16
  auto head = [&](int r, int64_t b) {
    int32_t v;
    std::memcpy(&v, &xr[r][b], 4);  // d, then m (Q4_1, Q5_1) or the block's next 2 bytes
    return v;
  };
  for (int64_t b = 0; b < nb; ++b) {
    prefetch.at(x, b);
    __m512i w[8];
    unpack_transposed_16<T>(xr, b, w);
    __m512i even[C], odd[C];
    for (int c = 0; c < C; ++c) even[c] = odd[c] = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
      for (int c = 0; c < C; ++c) {
        even[c] = dpbusd_bcast(even[c], w[k], yc[c][b].qs + 4 * k);
        odd[c] = dpbusd_bcast(odd[c], w[k + 1], yc[c][b].qs + 4 * k + 4);
      }
    }
    const __m512i heads = _mm512_setr_epi32(head(0, b), head(1, b), head(2, b), head(3, b), head(4, b), head(5, b),
                                            head(6, b), head(7, b), head(8, b), head(9, b), head(10, b), head(11, b),
                                            head(12, b), head(13, b), head(14, b), head(15, b));
    const __m512 dx = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(heads));
    for (int c = 0; c < C; ++c) {
      __m512i isum = _mm512_add_epi32(even[c], odd[c]);
      if constexpr (T::kZeroShift >= 0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(ys.zero[c][b]));
      const __m512 dxdy = _mm512_mul_ps(dx, _mm512_set1_ps(ys.d[c][b]));
      S[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dxdy, S[c]);
    }
    if constexpr (T::kOffset) {
      const __m512 mx = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(heads, 16)));
      for (int c = 0; c < C; ++c) O[c] = _mm512_fmadd_ps(mx, _mm512_set1_ps(ys.s[c][b]), O[c]);
    }
  }
  const __mmask16 lanes = static_cast<__mmask16>((1u << n_rows) - 1);
  for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(out + c * out_stride, lanes, _mm512_add_ps(S[c], O[c]));
}

// n_rows weight rows x C tokens through rows16t_kernel.
template <typename T, int C>
inline void rows16t(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride, int n_rows,
                    const uint8_t* y, size_t y_stride) {
  rows_with_token_scales<T, C, 16>(nb, out, x, x_stride, n_rows, y, y_stride,
                                   [&](float* o, const uint8_t* x16, int rows, const TokenScales<C>& ys) {
                                     rows16t_kernel<T, C>(nb, o, out_stride, x16, x_stride, rows, y, y_stride, ys);
                                   });
}

// The kernel table's gemm_tile: any rows x up to 8 tokens (decode and batched decode), through
// rows16t_kernel (rows of up to kMaxScaleBlocks blocks) or rows8_kernel.
template <typename T>
void gemm_rows(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vy,
               size_t y_stride, int n_rows, int n_cols) {
  const int64_t nb = n / 32;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  // Tokens in groups of 4, 2, then 1 through rows16t_kernel, except one token of Q5_0, where
  // rows8_kernel (each row reduced across lanes) is the faster (benchmarks/RESULTS.md, "Kernel
  // choices"); what is left, and rows longer than kMaxScaleBlocks blocks, through rows8_kernel.
  int c0 = 0;
  auto tokens = [&](auto kernel, int C) {
    for (; c0 + C <= n_cols; c0 += C) kernel(nb, out + c0 * out_stride, out_stride, x, x_stride, n_rows, y + c0 * y_stride, y_stride);
  };
  if (nb <= kMaxScaleBlocks) {
    tokens(rows16t<T, 4>, 4);
    tokens(rows16t<T, 2>, 2);
    if constexpr (!std::is_same_v<typename T::BX, block_q5_0>) tokens(rows16t<T, 1>, 1);
  }
  for (int r = 0; r < n_rows; r += 8) {
    const int rows = std::min(8, n_rows - r);
    float* o = out + r;
    const uint8_t* xr = x + r * x_stride;
    for_each_group<4, 2, 1>(n_cols - c0, [&](auto cols, int i) {
      const int c = c0 + i;
      rows8_kernel<T, decltype(cols)::value>(nb, o + c * out_stride, out_stride, xr, x_stride, rows, y + c * y_stride,
                                             y_stride);
    });
  }
}

// R weight rows x one panel of up to 16 tokens.
template <typename T, int R>
inline void panel_kernel(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride,
                         const PanelBlock* panel, int n_cols) {
  using BX = typename T::BX;
  const BX* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const BX*>(x + r * x_stride);
  __m512 S[R], O[R];
  for (int r = 0; r < R; ++r) S[r] = O[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const PanelBlock& p = panel[b];
    alignas(32) int32_t w[R][8];
    for (int r = 0; r < R; ++r) _mm256_store_si256(reinterpret_cast<__m256i*>(w[r]), T::unpack_unsigned(xr[r][b]));
    // Reload each 4-byte group as a broadcast from memory (a load, no shuffle): without this
    // barrier the compiler extracts and broadcasts them in registers, two shuffles each.
    __asm__ volatile("" : : "r"(w) : "memory");
    __m512i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
    for (int k = 0; k < 8; ++k) {
      const __m512i a = _mm512_load_si512(p.qs[k]);
      for (int r = 0; r < R; ++r) isum[r] = _mm512_dpbusd_epi32(isum[r], _mm512_set1_epi32(w[r][k]), a);
    }
    const __m512 dy = _mm512_load_ps(p.d);
    if constexpr (T::kZeroShift >= 0) {
      const __m512i zero_sums = _mm512_slli_epi32(_mm512_load_si512(p.qsum), T::kZeroShift);
      for (int r = 0; r < R; ++r) isum[r] = _mm512_sub_epi32(isum[r], zero_sums);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 dxdy = _mm512_mul_ps(dy, _mm512_set1_ps(fp16_to_fp32(xr[r][b].d)));
      S[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), dxdy, S[r]);
    }
    if constexpr (T::kOffset) {
      const __m512 sy = _mm512_load_ps(p.s);
      for (int r = 0; r < R; ++r) O[r] = _mm512_fmadd_ps(_mm512_set1_ps(fp16_to_fp32(xr[r][b].m)), sy, O[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(64) float sums[kPanelTokens];
    _mm512_store_ps(sums, _mm512_add_ps(S[r], O[r]));
    for (int c = 0; c < n_cols; ++c) out[c * out_stride + r] = sums[c];
  }
}

// The kernel table's gemm_panel: n_rows weight rows x n_cols tokens, in consecutive panels.
template <typename T>
void gemm_panel(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* panels,
                int n_rows, int n_cols) {
  panels_by_row_groups<8, 4, 1>(n, out, out_stride, vx, x_stride, panels, n_rows, n_cols,
                                [&](auto rows, int64_t nb, float* o, const uint8_t* x, const PanelBlock* p, int cols) {
                                  panel_kernel<T, decltype(rows)::value>(nb, o, out_stride, x, x_stride, p, cols);
                                });
}

#if defined(EMBER_ISA_amx)
template <typename T>
void gemm_panel_amx(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* panels,
                    int n_rows, int n_cols);  // quants/x86/amx_panel.h
#endif

// Points a weight type's kernels at the AVX-512 ones (and, in the amx table, its panels at the
// AMX tiles).
template <typename T>
void use_avx512_kernels(TypeKernels& k) {
  k.vec_dot = vec_dot_rows<T>;
  k.gemm_tile = gemm_rows<T>;
#if defined(EMBER_ISA_amx)
  k.gemm_panel = gemm_panel_amx<T>;
#else
  k.gemm_panel = gemm_panel<T>;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
#if defined(EMBER_ISA_amx)
#include "quants/x86/amx_panel.h"
#endif
#endif
