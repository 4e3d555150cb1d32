// Kernels for the 32-weight block types that every table with panels shares, and the AVX2
// table's own (Q4_0, Q4_1, Q5_0 and Q5_1, whose products it sums in 16-bit lanes).
//
// Every (weight row, token) pair is summed in one order, whichever kernel computes it:
//   S = 0; for each block b in order:  S = fma(float(isum_b), dx_b * dy_b, S)
//   O = 0; for each block b in order:  O = fma(mx_b, sy_b, O)       (offset types only)
//   result = S + O
// where isum_b is the block's exact integer dot product, zero point included:
// sum (qx - z) qy = sum qx qy - z sum qy. So a token gets the same bits alone, in a batched
// decode step or inside a prompt, and the server's batched decode equals single decoding.
// Every multiply-add is an explicit FMA: nothing is left for the compiler to contract or not.
//
// A type plugs in through a traits struct:
//   BX, BY                                  weight and activation block types
//   kOffset                                 whether a block pair adds m * s (Q4_1, Q5_1)
//   unpack_unsigned(const BX&) -> __m256i   the 32 quants as unsigned bytes (Q8_0: q + 128)
//   kZeroShift                              log2 of the zero point z, or -1 for none
//   unpack(const BX&) -> __m256i            the 32 values as signed bytes (the SignedDot types)
//
// The AVX2 kernels (no vpdpbusd) multiply unsigned quants with signed activation bytes in
// vpmaddubsw and add the products in 16-bit lanes, never more than fit below 2^15, so nothing
// saturates and the block sums are exact: in a panel, a lane sums a block's 16 products of 4-bit
// quants (Q4_0, Q4_1: at most 15 * 128 each), or 8 products of 5-bit quants (Q5_0, Q5_1: at most
// 31 * 128 each, two sums per block); with rows in lanes, vpmaddubsw's pair sums go straight to
// 32 bits. Q8_0 and IQ4_NL, whose 8-bit values these sums do not hold, go through SignedDot (below).
// - rows in lanes (decode and batches of up to 15 tokens): 8 weight rows transposed once per
//   block, so that a broadcast 4-byte group of a token's activations meets group k of every row
//   (rows8t_kernel); rows too long to stage their tokens' scales go through rows8_kernel;
// - tokens in lanes (prompts of 16 tokens and more): the activations of 16 tokens repacked once
//   per matmul into a panel, block by block, with token t's elements 4k..4k+3 in lane t of
//   chunk k (pack_panel), so that a broadcast 4-byte group of one weight row meets all of them,
//   two vectors of 8 tokens (panel_kernel_i16). The 5-bit types decode through rows8_kernel
//   (their unpacked bytes are not transposed).
// The types with signed 8-bit values (Q8_0, IQ4_NL's table values) go through SignedDot<T>:
// vpmaddubsw multiplies each value's magnitude with the activation carrying the value's sign
// (|q| <= 128, |qy| <= 127: the pair sums fit an int16), and every 4-product sum goes to 32 bits
// before the next is added (rows8_kernel's lanes, panel_kernel_s8's groups).
#pragma once
#if defined(__AVX2__)
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
#include "quants/x86/avx2_simd.h"

namespace ember {
namespace EMBER_ISA_NS {

// One block of a 16-token activation panel (see kernels.h: kPanelTokens, kPanelBlockBytes).
struct PanelBlock {
  int8_t qs[8][kPanelTokens][4];  // chunk k: token t's elements 4k .. 4k + 3
  float d[kPanelTokens];          // the token's block scale
  int32_t qsum[kPanelTokens];     // sum of the token's 32 quants (for the zero point)
  float s[kPanelTokens];          // Q8_1: the block's s = d * sum(q), as stored (f16 -> f32)
};
static_assert(sizeof(PanelBlock) == kPanelBlockBytes, "PanelBlock");

// Whether a type's unsigned quants are 4-bit (Q4_0, Q4_1); the others (Q5_0, Q5_1) are 5-bit.
template <typename T>
constexpr bool kNibbleQuants = std::is_same_v<typename T::BX, block_q4_0> || std::is_same_v<typename T::BX, block_q4_1>;
// Whether a type packs its 32 nibbles as Q4_0 does (the types of kNibbleQuants, and IQ4_NL's
// indices into its table).
template <typename T>
constexpr bool kPackedNibbles = kNibbleQuants<T> || std::is_same_v<typename T::BX, block_iq4_nl>;

// A traits type (unpack: the block's 32 values as signed bytes) taken through the
// signed dot products: no zero point.
template <typename T>
struct SignedDot : T {
  static constexpr bool kSigned = true;
  static constexpr int kZeroShift = -1;
};

// Whether a traits type is a SignedDot.
template <typename T, typename = void>
struct IsSignedDot : std::false_type {};
template <typename T>
struct IsSignedDot<T, std::void_t<decltype(T::kSigned)>> : std::bool_constant<T::kSigned> {};

// A block's 32 values as the first operand of dot_u8_i8_i32: unsigned quants as they are, signed
// ones as magnitudes (then block_dot moves their signs onto the activations).
template <typename T>
inline __m256i block_factors(const typename T::BX& x, __m256i& values) {
  if constexpr (IsSignedDot<T>::value) {
    values = T::unpack(x);
    return _mm256_sign_epi8(values, values);
  } else {
    return values = T::unpack_unsigned(x);
  }
}

// The 8 sums of 4 adjacent products of a block's values with activations qy (block_factors's).
template <typename T>
inline __m256i block_dot(__m256i factors, __m256i values, __m256i qy) {
  if constexpr (IsSignedDot<T>::value) return dot_u8_i8_i32(factors, _mm256_sign_epi8(qy, values));
  else return dot_u8_i8_i32(factors, qy);
}

// The sum of a block's 32 activation quants.
inline int block_sum(const int8_t* qs) {
  return hsum_i32_8(dot_u8_i8_i32(_mm256_set1_epi8(1), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs))));
}

// The zero-point term z sum(q) of an activation block.
template <typename T>
inline int zero_point_sum(const int8_t* qs) {
  if constexpr (T::kZeroShift < 0) return 0;
  else return block_sum(qs) << T::kZeroShift;
}

// Rows advancing together block by block are a pattern the hardware prefetcher does not follow:
// at each block step, fetch (into L2) a share of the rows `ahead` rows on, which follow in memory.
struct RowPrefetch {
  size_t from, step;
  RowPrefetch(int rows, int ahead, size_t x_stride, int64_t nb)
      : from(ahead * x_stride), step((rows * x_stride / nb + 63) & ~size_t(63)) {}
  void at(const uint8_t* x, int64_t b) const {
    for (size_t line = b * step; line < (b + 1) * step; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(x) + from + line, _MM_HINT_T1);
  }
};

// Packs n_cols (<= 16) activation rows of Q8_0 or Q8_1 blocks into one panel; the lanes of
// missing tokens are zero.
template <typename BY>
void pack_panel(int64_t n, const void* vy, size_t y_stride, int n_cols, void* vpanel) {
  const int64_t nb = n / 32;
  PanelBlock* panel = static_cast<PanelBlock*>(vpanel);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  for (int64_t b = 0; b < nb; ++b) {
    PanelBlock& p = panel[b];
    std::memset(&p, 0, sizeof(p));
    for (int t = 0; t < n_cols; ++t) {
      const BY& yb = reinterpret_cast<const BY*>(y + t * y_stride)[b];
      for (int k = 0; k < 8; ++k) std::memcpy(p.qs[k][t], yb.qs + 4 * k, 4);
      p.d[t] = fp16_to_fp32(yb.d);
      p.qsum[t] = block_sum(yb.qs);
      if constexpr (std::is_same_v<BY, block_q8_1>) p.s[t] = fp16_to_fp32(yb.s);
    }
  }
}

// The R weight rows (rows past n_rows repeat the last one) and C activation rows of a kernel
// with rows in lanes.
template <typename T, int R, int C>
struct RowsAndTokens {
  const typename T::BX* x[R];
  const typename T::BY* y[C];
  RowsAndTokens(const uint8_t* vx, size_t x_stride, int n_rows, const uint8_t* vy, size_t y_stride) {
    for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const typename T::BX*>(vx + std::min(r, n_rows - 1) * x_stride);
    for (int c = 0; c < C; ++c) y[c] = reinterpret_cast<const typename T::BY*>(vy + c * y_stride);
  }
};

// 8 weight rows (rows past n_rows repeat the last one; their sums are dropped) x C tokens, each
// row's per-block sums reduced across lanes.
template <typename T, int C>
inline void rows8_kernel(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride, int n_rows,
                         const uint8_t* y, size_t y_stride) {
  const RowsAndTokens<T, 8, C> rows(x, x_stride, n_rows, y, y_stride);
  const auto &xr = rows.x, &yc = rows.y;
  __m256 S[C], O[C];
  for (int c = 0; c < C; ++c) S[c] = O[c] = _mm256_setzero_ps();
  const RowPrefetch prefetch(8, 16, x_stride, nb);  // the 8 rows after the next 8
  for (int64_t b = 0; b < nb; ++b) {
    prefetch.at(x, b);
    __m256i qx[8], vx[8];
    for (int r = 0; r < 8; ++r) qx[r] = block_factors<T>(xr[r][b], vx[r]);
    const __m256 dx = f16x8([&](int i) { return xr[i][b].d; }, 8);
    for (int c = 0; c < C; ++c) {  // one token at a time: 8 products in registers, not 8 C
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yc[c][b].qs));
      __m256i p[8];
      for (int r = 0; r < 8; ++r) p[r] = block_dot<T>(qx[r], vx[r], qy);
      const __m256i isum = _mm256_sub_epi32(sum_lanes_8x8(p), _mm256_set1_epi32(zero_point_sum<T>(yc[c][b].qs)));
      const __m256 dxdy = _mm256_mul_ps(dx, _mm256_set1_ps(fp16_to_fp32(yc[c][b].d)));
      S[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dxdy, S[c]);
    }
    if constexpr (T::kOffset) {
      const __m256 mx = f16x8([&](int i) { return xr[i][b].m; }, 8);
      for (int c = 0; c < C; ++c) O[c] = _mm256_fmadd_ps(mx, _mm256_set1_ps(fp16_to_fp32(yc[c][b].s)), O[c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    alignas(32) float sums[8];
    _mm256_store_ps(sums, _mm256_add_ps(S[c], O[c]));
    for (int r = 0; r < n_rows; ++r) out[c * out_stride + r] = sums[r];
  }
}

// The activation scales of C tokens, block by block, for the broadcasts of the kernels with
// transposed rows (rows8t_kernel here, rows16t_kernel in avx512_panel.h).
constexpr int64_t kMaxScaleBlocks = 640;  // rows of up to 20480 weights (30 KiB for 4 tokens)

// The magnitudes of C tokens' quants, which the SignedDot types' rows8t_kernel meets with the
// weights' values carrying the activations' signs; nothing for the other types.
template <int C, bool kMagnitudes>
struct TokenMagnitudes {};
template <int C>
struct TokenMagnitudes<C, true> {
  alignas(32) uint8_t mag[C][kMaxScaleBlocks * 32];
};

template <int C, bool kMagnitudes = false>
struct TokenScales : TokenMagnitudes<C, kMagnitudes> {
  float d[C][kMaxScaleBlocks];
  float s[C][kMaxScaleBlocks];       // Q8_1's s
  int32_t zero[C][kMaxScaleBlocks];  // z sum(q)

  template <typename T>
  void fill(int64_t nb, const uint8_t* y, size_t y_stride) {
    using BY = typename T::BY;
    for (int c = 0; c < C; ++c) {
      const BY* row = reinterpret_cast<const BY*>(y + c * y_stride);
      for (int64_t b = 0; b < nb; ++b) {
        d[c][b] = fp16_to_fp32(row[b].d);
        zero[c][b] = zero_point_sum<T>(row[b].qs);
        if constexpr (T::kOffset) s[c][b] = fp16_to_fp32(row[b].s);
        if constexpr (kMagnitudes)
          _mm256_store_si256(reinterpret_cast<__m256i*>(this->mag[c] + 32 * b),
                             _mm256_abs_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[b].qs))));
      }
    }
  }
};

// n_rows weight rows x C tokens, kRows at a time, through a kernel with transposed rows that
// reads the tokens' scales staged once: kernel(out + r, x + r * x_stride, rows, scales).
template <typename T, int C, int kRows, typename Kernel>
inline void rows_with_token_scales(int64_t nb, float* out, const uint8_t* x, size_t x_stride, int n_rows,
                                   const uint8_t* y, size_t y_stride, Kernel&& kernel) {
  TokenScales<C, IsSignedDot<T>::value> ys;
  ys.template fill<T>(nb, y, y_stride);
  for (int r = 0; r < n_rows; r += kRows) kernel(out + r, x + r * x_stride, std::min(kRows, n_rows - r), ys);
}

// n_rows weight rows x n_cols tokens in consecutive panels, the rows in groups of Sizes through
// kernel(std::integral_constant<int, R>, nb, out, x, panel, tokens); the rows (16 at most in a
// matmul's call) stay in cache from one panel to the next.
template <int... Sizes, typename Kernel>
inline void panels_by_row_groups(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride,
                                 const void* panels, int n_rows, int n_cols, Kernel&& kernel) {
  const int64_t nb = n / 32;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  for_each_panel(n, panels, n_cols, [&](const uint8_t* panel, int c0, int cols) {
    const PanelBlock* p = reinterpret_cast<const PanelBlock*>(panel);
    float* o = out + c0 * out_stride;
    for_each_group<Sizes...>(n_rows, [&](auto rows, int r) { kernel(rows, nb, o + r, x + r * x_stride, p, cols); });
  });
}

// One row times one activation row, in the same order (the lanes of rows8_kernel, one at a time).
template <typename T>
void vec_dot_rows(int64_t n, float* out, const void* vx, const void* vy) {
  const auto* x = static_cast<const typename T::BX*>(vx);
  const auto* y = static_cast<const typename T::BY*>(vy);
  float S = 0.0f, O = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs));
    __m256i values;
    const __m256i factors = block_factors<T>(x[b], values);
    const int isum = hsum_i32_8(block_dot<T>(factors, values, qy)) - zero_point_sum<T>(y[b].qs);
    S = std::fma(static_cast<float>(isum), fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d), S);
    if constexpr (T::kOffset) O = std::fma(fp16_to_fp32(x[b].m), fp16_to_fp32(y[b].s), O);
  }
  *out = S + O;
}


// 4 bytes at g in every 32-bit lane (a load, no shuffle).
inline __m256i broadcast_group(const int8_t* g) {
  int32_t v;
  std::memcpy(&v, g, 4);
  return _mm256_set1_epi32(v);
}

// Block b of 8 rows of a nibble type unpacked and transposed: w[k] holds group k (elements
// 4k .. 4k + 3) of rows 0 .. 7, row r in lane r. Packed 4-byte group j holds groups j and j + 4
// in its low and high nibbles, so the packed bytes are transposed (rows i and i + 4 in the two
// halves of one vector: unpacks within halves leave the rows in order) and then split.
template <typename T>
inline void unpack_transposed_8(const typename T::BX* const xr[8], int64_t b, __m256i w[8]) {
  static_assert(kPackedNibbles<T>, "unpack_transposed_8 transposes packed nibbles");
  auto half = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr[r][b].qs)); };
  __m256i p[4];
  for (int i = 0; i < 4; ++i) p[i] = _mm256_set_m128i(half(i + 4), half(i));
  const __m256i t0 = _mm256_unpacklo_epi32(p[0], p[1]), t1 = _mm256_unpackhi_epi32(p[0], p[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(p[2], p[3]), t3 = _mm256_unpackhi_epi32(p[2], p[3]);
  const __m256i q[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                        _mm256_unpackhi_epi64(t1, t3)};
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    w[j] = _mm256_and_si256(q[j], low);
    w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(q[j], 4), low);
  }
}

// 8 weight rows of a nibble type (rows past n_rows repeat the last one; their sums are dropped)
// x C tokens: the rows' quants transposed once per block, then per token 8 vpmaddubsw with its
// broadcast groups give the 8 rows' block sums in the lanes, with no reduction across lanes.
// A SignedDot type (IQ4_NL) looks its transposed nibbles up (T::values: signed bytes), which
// meet the magnitudes of the tokens' quants (TokenScales::mag) with the quants' signs (|q| <= 128,
// |value| <= 127: the pair sums fit an int16), and each group's pair sums go to 32 bits before the
// next group's are added.
template <typename T, int C>
inline void rows8t_kernel(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride, int n_rows,
                          const uint8_t* y, size_t y_stride, const TokenScales<C, IsSignedDot<T>::value>& ys) {
  const RowsAndTokens<T, 8, C> rows(x, x_stride, n_rows, y, y_stride);
  const auto &xr = rows.x, &yc = rows.y;
  __m256 S[C], O[C];
  for (int c = 0; c < C; ++c) S[c] = O[c] = _mm256_setzero_ps();
  const RowPrefetch prefetch(8, 16, x_stride, nb);  // the 8 rows after the next 8
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    prefetch.at(x, b);
    __m256i w[8];
    unpack_transposed_8<T>(xr, b, w);
    const __m256 dx = f16x8([&](int i) { return xr[i][b].d; }, 8);
    if constexpr (IsSignedDot<T>::value)
      for (int k = 0; k < 8; ++k) w[k] = T::values(w[k]);
    for (int c = 0; c < C; ++c) {
      const int8_t* g = yc[c][b].qs;
      __m256i isum;
      if constexpr (IsSignedDot<T>::value) {
        const int8_t* m = reinterpret_cast<const int8_t*>(ys.mag[c] + 32 * b);
        isum = dot_u8_i8_i32(broadcast_group(m), _mm256_sign_epi8(w[0], broadcast_group(g)));
        for (int k = 1; k < 8; ++k)
          isum = dot_u8_i8_acc(isum, broadcast_group(m + 4 * k), _mm256_sign_epi8(w[k], broadcast_group(g + 4 * k)));
      } else {
        __m256i sums = _mm256_maddubs_epi16(w[0], broadcast_group(g));
        for (int k = 1; k < 8; ++k) sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(w[k], broadcast_group(g + 4 * k)));
        isum = _mm256_madd_epi16(sums, ones);
      }
      if constexpr (T::kZeroShift >= 0) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(ys.zero[c][b]));
      const __m256 dxdy = _mm256_mul_ps(dx, _mm256_set1_ps(ys.d[c][b]));
      S[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dxdy, S[c]);
    }
    if constexpr (T::kOffset) {
      const __m256 mx = f16x8([&](int i) { return xr[i][b].m; }, 8);
      for (int c = 0; c < C; ++c) O[c] = _mm256_fmadd_ps(mx, _mm256_set1_ps(ys.s[c][b]), O[c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    alignas(32) float sums[8];
    _mm256_store_ps(sums, _mm256_add_ps(S[c], O[c]));
    for (int r = 0; r < n_rows; ++r) out[c * out_stride + r] = sums[r];
  }
}

// The AVX2 table's gemm_tile: any rows x up to 8 tokens, through rows8t_kernel (the nibble
// types' rows of up to kMaxScaleBlocks blocks) or rows8_kernel.
template <typename T>
void gemm_rows_i16(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vy,
                   size_t y_stride, int n_rows, int n_cols) {
  const int64_t nb = n / 32;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  for_each_group<4, 2, 1>(n_cols, [&](auto cols, int c) {
    constexpr int C = decltype(cols)::value;
    float* o = out + c * out_stride;
    const uint8_t* yc = y + c * y_stride;
    if constexpr (kPackedNibbles<T>)
      if (nb <= kMaxScaleBlocks)
        return rows_with_token_scales<T, C, 8>(nb, o, x, x_stride, n_rows, yc, y_stride, [&](float* o8, const uint8_t* x8,
                                                                                             int rows, const auto& ys) {
          rows8t_kernel<T, C>(nb, o8, out_stride, x8, x_stride, rows, yc, y_stride, ys);
        });
    for (int r = 0; r < n_rows; r += 8)
      rows8_kernel<T, C>(nb, o + r, out_stride, x + r * x_stride, x_stride, std::min(8, n_rows - r), yc, y_stride);
  });
}

// R weight rows x one panel of up to 16 tokens, in two vectors of 8. Each (row, 8 tokens) keeps
// a block's products in 16-bit sums: one for the 8 groups of 4-bit quants, two (groups 0-3 and
// 4-7) for 5-bit quants.
template <typename T, int R>
inline void panel_kernel_i16(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride,
                             const PanelBlock* panel, int n_cols) {
  using BX = typename T::BX;
  constexpr int kGroupsPerSum = kNibbleQuants<T> ? 8 : 4;
  const BX* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const BX*>(x + r * x_stride);
  __m256 S[R][2], O[R][2];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) S[r][h] = O[r][h] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const PanelBlock& p = panel[b];
    alignas(32) int8_t w[R][32];
    for (int r = 0; r < R; ++r) _mm256_store_si256(reinterpret_cast<__m256i*>(w[r]), T::unpack_unsigned(xr[r][b]));
    // Reload each 4-byte group as a broadcast from memory (a load, no shuffle).
    __asm__ volatile("" : : "r"(w) : "memory");
    __m256i sums16[8 / kGroupsPerSum][R][2];
    for (int k = 0; k < 8; ++k) {
      const __m256i a[2] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(p.qs[k][0])),
                            _mm256_load_si256(reinterpret_cast<const __m256i*>(p.qs[k][8]))};
      const int j = k / kGroupsPerSum;
      for (int r = 0; r < R; ++r) {
        const __m256i group = broadcast_group(w[r] + 4 * k);
        for (int h = 0; h < 2; ++h) {
          const __m256i products = _mm256_maddubs_epi16(group, a[h]);
          sums16[j][r][h] = k % kGroupsPerSum == 0 ? products : _mm256_add_epi16(sums16[j][r][h], products);
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 dy = _mm256_load_ps(p.d + 8 * h);
      __m256i zero_sums = _mm256_setzero_si256();
      if constexpr (T::kZeroShift >= 0)
        zero_sums = _mm256_slli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(p.qsum + 8 * h)), T::kZeroShift);
      for (int r = 0; r < R; ++r) {
        __m256i isum = _mm256_madd_epi16(sums16[0][r][h], ones);
        if constexpr (!kNibbleQuants<T>) isum = madd_acc_i16(isum, sums16[1][r][h], ones);
        isum = _mm256_sub_epi32(isum, zero_sums);
        const __m256 dxdy = _mm256_mul_ps(dy, _mm256_set1_ps(fp16_to_fp32(xr[r][b].d)));
        S[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dxdy, S[r][h]);
      }
      if constexpr (T::kOffset) {
        const __m256 sy = _mm256_load_ps(p.s + 8 * h);
        for (int r = 0; r < R; ++r) O[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(xr[r][b].m)), sy, O[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float sums[kPanelTokens];
    for (int h = 0; h < 2; ++h) _mm256_store_ps(sums + 8 * h, _mm256_add_ps(S[r][h], O[r][h]));
    for (int c = 0; c < n_cols; ++c) out[c * out_stride + r] = sums[c];
  }
}

// R weight rows of signed values (T: a SignedDot) x one panel of up to 16 tokens, in two vectors
// of 8: per 4-byte group of a row, its magnitudes meet the activations with the group's signs
// (vpsignb), and each vpmaddubsw's pair sums go to 32 bits (vpmaddwd) before they are added.
template <typename T, int R>
inline void panel_kernel_s8(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride,
                            const PanelBlock* panel, int n_cols) {
  using BX = typename T::BX;
  const BX* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const BX*>(x + r * x_stride);
  __m256 S[R][2];
  for (int r = 0; r < R; ++r) S[r][0] = S[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const PanelBlock& p = panel[b];
    alignas(32) int8_t values[R][32], factors[R][32];
    for (int r = 0; r < R; ++r) {
      __m256i v;
      _mm256_store_si256(reinterpret_cast<__m256i*>(factors[r]), block_factors<T>(xr[r][b], v));
      _mm256_store_si256(reinterpret_cast<__m256i*>(values[r]), v);
    }
    // Reload each 4-byte group as a broadcast from memory (a load, no shuffle).
    __asm__ volatile("" : : "r"(values), "r"(factors) : "memory");
    __m256i isum[R][2];
    for (int r = 0; r < R; ++r) isum[r][0] = isum[r][1] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i a[2] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(p.qs[k][0])),
                            _mm256_load_si256(reinterpret_cast<const __m256i*>(p.qs[k][8]))};
      for (int r = 0; r < R; ++r) {
        const __m256i v = broadcast_group(values[r] + 4 * k), f = broadcast_group(factors[r] + 4 * k);
        for (int h = 0; h < 2; ++h) isum[r][h] = dot_u8_i8_acc(isum[r][h], f, _mm256_sign_epi8(a[h], v));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 dy = _mm256_load_ps(p.d + 8 * h);
      for (int r = 0; r < R; ++r) {
        const __m256 dxdy = _mm256_mul_ps(dy, _mm256_set1_ps(fp16_to_fp32(xr[r][b].d)));
        S[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][h]), dxdy, S[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float sums[kPanelTokens];
    for (int h = 0; h < 2; ++h) _mm256_store_ps(sums + 8 * h, _mm256_add_ps(S[r][h], _mm256_setzero_ps()));
    for (int c = 0; c < n_cols; ++c) out[c * out_stride + r] = sums[c];
  }
}

// The AVX2 table's gemm_panel: n_rows weight rows x n_cols tokens, in panels (panel_kernel_i16,
// or panel_kernel_s8 for a SignedDot type).
template <typename T>
void gemm_panel_i16(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* panels,
                    int n_rows, int n_cols) {
  auto kernel = [&](auto rows, int64_t nb, float* o, const uint8_t* x, const PanelBlock* p, int cols) {
    constexpr int R = decltype(rows)::value;
    if constexpr (IsSignedDot<T>::value) panel_kernel_s8<T, R>(nb, o, out_stride, x, x_stride, p, cols);
    else panel_kernel_i16<T, R>(nb, o, out_stride, x, x_stride, p, cols);
  };
  if constexpr (IsSignedDot<T>::value)
    panels_by_row_groups<4, 2, 1>(n, out, out_stride, vx, x_stride, panels, n_rows, n_cols, kernel);
  else panels_by_row_groups<2, 1>(n, out, out_stride, vx, x_stride, panels, n_rows, n_cols, kernel);
}

// Points a type's kernels in the AVX2 table at the ones above: a 4- or 5-bit type's traits, or
// SignedDot of a type with signed 8-bit values (Q8_0, IQ4_NL).
template <typename T>
void use_avx2_kernels(TypeKernels& k) {
  k.vec_dot = vec_dot_rows<T>;
  k.gemm_tile = gemm_rows_i16<T>;
  k.gemm_panel = gemm_panel_i16<T>;
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
#endif
