// The K-quant kernels (AVX2 and up) for up to a few activation rows: each super-block's quants
// and scales are unpacked once (the costly part of these formats) and dotted with up to C
// activation blocks. A type plugs in through a Traits struct:
//   BX, BY          weight and activation (Q8_K) block types
//   kMins           whether the type has mins (value = d scale q - dmin min)
//   sums<C, Y>(const BX&, const Y* const y[C], b, __m256i sum[C], __m256i mins[C])
//                   super-block b's integer sums with each y (Y: block_q8_K, or the line copy
//                   below: Q8KLine or the type's Line), as 8 int32 lanes whose totals are
//                   scaled_b and mins_b below (mins untouched without kMins)
//   line(const block_q8_K&, Line&)   optional: the type's own layout of the Q8KLine copy
//   Line            optional: a copy type of its own (Q8KLine's members first, then more)
// (and for the kernels with tokens in lanes and dequantize_row_k, avx512_k_panel.h's members).
//
// Every K-quant kernel of a table sums a (row, token) pair in one order. For each super-block b,
// two exact integer sums,
//   scaled_b = sum_j scale_j sum_i (q_i - z) qy_i     (z: the type's zero point, if any)
//   mins_b   = sum_j min_j sum_i qy_i                  (the types with mins)
// go into partial sums by b mod 8, in order of b:
//   S[b % 8] = fma(float(scaled_b), dy_b d_b, S[b % 8]),  M[b % 8] = fma(float(mins_b), dy_b dmin_b, M[b % 8])
// and the result is D = S - M (lane by lane) summed as ((D0 + D4) + (D2 + D6)) + ((D1 + D5) + (D3 + D7))
// (hsum_f32_8's order). One row's decode kernel (k_tile_cols) keeps the 8 partials in the lanes
// of a vector and reduces 8 super-blocks' integer lanes at once (by unpacks and adds: vphaddd
// costs two shuffles and an add); rows of at most 4 super-blocks share those lanes, several
// rows to a vector (k_short_rows); the prompt kernels with tokens
// in lanes (avx512_k_panel.h) keep them in memory. So a token gets the same bits alone, in a batch or in
// a prompt.
#pragma once
#if defined(__AVX2__)
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/types.h"
#include "quants/x86/avx2_simd.h"

namespace ember {

// All-ones in lanes 0 .. n - 1 (n <= 8), zero in the rest.
inline __m256i first_lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The decode kernels read their weight rows in order, a group of super-blocks at a time, and
// each group also fetches into L2 the bytes kRowPrefetchBytes further on: the hardware
// prefetcher alone leaves two threads' streams (and one thread's long rows) short of the memory
// bandwidth (benchmarks/RESULTS.md, 2026-12-07).
constexpr size_t kRowPrefetchBytes = 12 * 1024;

inline void prefetch_rows(const void* p, size_t bytes) {
  const char* ahead = static_cast<const char*>(p) + kRowPrefetchBytes;
  for (size_t line = 0; line < bytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
}

// A Q8_K block's quants and bsums, 32-byte aligned, so that no 32-byte load of them splits a cache
// line (in a row of block_q8_K, 292 bytes apart, every other one does). gemm_tile_k copies the
// activation rows into these, with the blocks' scales in an array of their own, once per call.
struct alignas(32) Q8KLine {
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};

// The C activation rows of a decode kernel: Q8_K blocks (Y = block_q8_K) or line copies
// (Q8KLine, or a type's own Line) with their scales at d[c][b].
template <int C, typename Y>
struct KActivations {
  const Y* y[C];
  const float* d[C];
  // Block b0 + i's scale in lane i, i < n <= 8 (the rest 0). A short group is a masked load (or,
  // from Q8_K blocks, lanes that repeat the last block, masked): lanes stored one at a time and
  // reloaded as a vector would wait on store forwarding, once per row.
  __m256 scales8(int c, int64_t b0, int n) const {
    if constexpr (!std::is_same_v<Y, block_q8_K>) {  // a line copy: scales at d
      if (n == 8) return _mm256_loadu_ps(d[c] + b0);
      return _mm256_maskload_ps(d[c] + b0, first_lanes(n));
    } else {
      const Y* yb = y[c] + b0;
      if (n == 8) return _mm256_setr_ps(yb[0].d, yb[1].d, yb[2].d, yb[3].d, yb[4].d, yb[5].d, yb[6].d, yb[7].d);
      auto at = [&](int i) { return yb[std::min(i, n - 1)].d; };
      const __m256 v = _mm256_setr_ps(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
      return _mm256_and_ps(v, _mm256_castsi256_ps(first_lanes(n)));
    }
  }
};

// sum[c] += maddubs(q, the 32 activations at `offset` in block b of y[c]) * scale (int16 pairs).
template <int C, typename Y>
inline void add_scaled_dots(__m256i sum[C], __m256i q, __m256i scale, const Y* const y[C], int64_t b, int offset) {
  for (int c = 0; c < C; ++c) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].qs + offset));
    sum[c] = madd_acc_i16(sum[c], _mm256_maddubs_epi16(q, qy), scale);
  }
}

// The 8 partial sums of the K-quant order, combined: ((D0 + D4) + (D2 + D6)) + ((D1 + D5) + (D3 + D7)).
template <typename V>
inline V combine_partials(const V d[8]) {
  return ((d[0] + d[4]) + (d[2] + d[6])) + ((d[1] + d[5]) + (d[3] + d[7]));
}

// The integer sums of 8 super-blocks for C tokens, lane i of sum[c] (mins[c]) holding the
// scaled_b (mins_b) that block_sums(i, s, m) gives (its sums of lane i's super-block, as
// T::sums does, or zeros for an empty lane), reduced across lanes as the blocks come, pair by
// pair (pair_sums_32, _64, _128), so that few vectors stay live.
template <typename T, int C, typename BlockSums>
inline void k_group_sums(BlockSums&& block_sums, __m256i sum[C], __m256i mins[C]) {
  __m256i s4[2][C], m4[2][C];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m256i s2[2][C], m2[2][C];
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {
      __m256i s[2][C], m[2][C];
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) block_sums(4 * h + 2 * p + k, s[k], m[k]);
      for (int c = 0; c < C; ++c) {
        s2[p][c] = pair_sums_32(s[0][c], s[1][c]);
        if constexpr (T::kMins) m2[p][c] = pair_sums_32(m[0][c], m[1][c]);
      }
    }
    for (int c = 0; c < C; ++c) {
      s4[h][c] = pair_sums_64(s2[0][c], s2[1][c]);
      if constexpr (T::kMins) m4[h][c] = pair_sums_64(m2[0][c], m2[1][c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    sum[c] = pair_sums_128(s4[0][c], s4[1][c]);
    if constexpr (T::kMins) mins[c] = pair_sums_128(m4[0][c], m4[1][c]);
  }
}

// Super-block *x with C tokens' block b, or zeros for no x.
template <typename T, int C, typename Y>
inline void k_block_sums(const typename T::BX* x, const Y* const y[C], int64_t b, __m256i s[C], __m256i m[C]) {
  if (x) {
    T::template sums<C>(*x, y, b, s, m);
  } else {
    for (int c = 0; c < C; ++c) s[c] = m[c] = _mm256_setzero_si256();
  }
}

// n_rows weight rows x C tokens, a row at a time: the integer sums of 8 super-blocks at a time
// in the lanes of a vector (lane i: super-block b0 + i), then one FMA per token for the 8.
template <typename T, int C, typename Y>
inline void k_tile_cols(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride, int n_rows,
                        const KActivations<C, Y>& a) {
  for (int r = 0; r < n_rows; ++r) {
    const typename T::BX* xb = reinterpret_cast<const typename T::BX*>(x + r * x_stride);
    __m256 S[C], M[C];
    for (int c = 0; c < C; ++c) S[c] = M[c] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
      const int n = static_cast<int>(std::min<int64_t>(8, nb - b0));
      prefetch_rows(xb + b0, n * sizeof(typename T::BX));
      __m256i sum[C], mins[C];
      if (n == 8) {
        k_group_sums<T, C>([&](int i, __m256i* s, __m256i* m) { T::template sums<C>(xb[b0 + i], a.y, b0 + i, s, m); },
                           sum, mins);
      } else {
        k_group_sums<T, C>(
            [&](int i, __m256i* s, __m256i* m) { k_block_sums<T, C>(i < n ? xb + b0 + i : nullptr, a.y, b0 + i, s, m); },
            sum, mins);
      }
      const __m256 d = f16x8([&](int i) { return xb[b0 + i].d; }, n);
      __m256 dmin = _mm256_setzero_ps();
      if constexpr (T::kMins) dmin = f16x8([&](int i) { return xb[b0 + i].dmin; }, n);
      for (int c = 0; c < C; ++c) {
        const __m256 vdy = a.scales8(c, b0, n);
        S[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[c]), _mm256_mul_ps(vdy, d), S[c]);
        if constexpr (T::kMins) M[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[c]), _mm256_mul_ps(vdy, dmin), M[c]);
      }
    }
    for (int c = 0; c < C; ++c) {
      alignas(32) float D[8];
      _mm256_store_ps(D, _mm256_sub_ps(S[c], M[c]));
      out[c * out_stride + r] = combine_partials(D);
    }
  }
}

// Rows of at most 4 super-blocks (nb <= 4) x C tokens, several rows to a vector: row j of a group
// in lanes L j .. L j + nb - 1 (L = 4 lanes a row for nb = 3, 4; 2 for nb = 2; 1 for nb = 1), so
// the reductions and the float work are shared by 8 / L rows. A row's lanes hold what
// k_tile_cols's single group would (the other lanes there are +0, and D, a difference of
// non-negative-zero sums, is never -0, so leaving them out of its sum changes no bit):
// nb = 4: (D0 + D2) + (D1 + D3); nb = 3: (D0 + D2) + D1; nb = 2: D0 + D1; nb = 1: D0.
template <typename T, int C, int L, typename Y>
inline void k_short_rows(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride, int n_rows,
                         const KActivations<C, Y>& a) {
  using BX = typename T::BX;
  constexpr int R = 8 / L;
  alignas(32) static constexpr int32_t block_of[8] = {0 % L, 1 % L, 2 % L, 3 % L, 4 % L, 5 % L, 6 % L, 7 % L};
  const __m256i block_lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(block_of));
  __m256 vdy[C];  // lane i: token c's scale of block i % L (0 for a block past nb)
  for (int c = 0; c < C; ++c) vdy[c] = _mm256_permutevar8x32_ps(a.scales8(c, 0, static_cast<int>(nb)), block_lanes);
  const __m256 zero = _mm256_setzero_ps();
  // The rows' groups, every lane present (kFull: R whole rows of L blocks) or not.
  auto group = [&](auto full, int r, int rows) {
    constexpr bool kFull = decltype(full)::value;
    prefetch_rows(x + r * x_stride, rows * x_stride);
    const BX* lane[8];  // lane i's super-block, or null for an empty lane
    for (int i = 0; i < 8; ++i)
      lane[i] = kFull || (block_of[i] < nb && i / L < rows)
                    ? reinterpret_cast<const BX*>(x + (r + i / L) * x_stride) + block_of[i]
                    : nullptr;
    __m256i sum[C], mins[C];
    k_group_sums<T, C>(
        [&](int i, __m256i* s, __m256i* m) {
          if constexpr (kFull) T::template sums<C>(*lane[i], a.y, block_of[i], s, m);
          else k_block_sums<T, C>(lane[i], a.y, block_of[i], s, m);
        },
        sum, mins);
    // Empty lanes: a 0 scale (their sums are 0 too).
    const __m256 d = f16x8([&](int i) { return kFull || lane[i] ? lane[i]->d : uint16_t{0}; }, 8);
    __m256 dmin = zero;
    if constexpr (T::kMins) dmin = f16x8([&](int i) { return kFull || lane[i] ? lane[i]->dmin : uint16_t{0}; }, 8);
    for (int c = 0; c < C; ++c) {
      __m256 D = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[c]), _mm256_mul_ps(vdy[c], d), zero);
      if constexpr (T::kMins) D = _mm256_sub_ps(D, _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[c]), _mm256_mul_ps(vdy[c], dmin), zero));
      alignas(32) float v[8];
      _mm256_store_ps(v, D);
      for (int j = 0; j < rows; ++j) {
        const float* p = v + L * j;
        out[c * out_stride + r + j] = nb == 4 ? (p[0] + p[2]) + (p[1] + p[3])
                                      : nb == 3 ? (p[0] + p[2]) + p[1]
                                      : nb == 2 ? p[0] + p[1]
                                                : p[0];
      }
    }
  };
  int r = 0;
  if (nb == L)
    for (; r + R <= n_rows; r += R) group(std::true_type{}, r, R);
  for (; r < n_rows; r += R) group(std::false_type{}, r, std::min(R, n_rows - r));
}

// Rows x tokens through k_tile_cols or k_short_rows, with the tokens in groups of 4, then 1. With
// more than one group, the rows go in chunks of 8 rows or of as many 8s as fit 16 KiB, each
// multiplied by every group while it is in cache.
template <typename T, typename Y>
inline void k_tile_rows(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride, const Y* y,
                        size_t y_stride, const float* d, size_t d_stride, int n_rows, int n_cols) {
  auto rows = [&](auto cols, int c0, int r0, int rows) {
    constexpr int C = decltype(cols)::value;
    KActivations<C, Y> a;
    for (int c = 0; c < C; ++c) {
      a.y[c] = reinterpret_cast<const Y*>(reinterpret_cast<const uint8_t*>(y) + (c0 + c) * y_stride);
      a.d[c] = d ? d + (c0 + c) * d_stride : nullptr;
    }
    float* o = out + c0 * out_stride + r0;
    const uint8_t* xr = x + r0 * x_stride;
    if (nb == 1) k_short_rows<T, C, 1>(nb, o, out_stride, xr, x_stride, rows, a);
    else if (nb == 2) k_short_rows<T, C, 2>(nb, o, out_stride, xr, x_stride, rows, a);
    else if (nb <= 4) k_short_rows<T, C, 4>(nb, o, out_stride, xr, x_stride, rows, a);
    else k_tile_cols<T, C>(nb, o, out_stride, xr, x_stride, rows, a);
  };
  const int chunk = n_cols == 1 || n_cols == 4 ? n_rows : static_cast<int>(8 * std::max<size_t>(1, 16384 / (8 * x_stride)));
  for (int r0 = 0; r0 < n_rows; r0 += chunk)
    for_each_group<4, 1>(n_cols, [&](auto cols, int c0) { rows(cols, c0, r0, std::min(chunk, n_rows - r0)); });
}

// Whether a type's Traits lay out the Q8KLine copy themselves (static void line(const block_q8_K&,
// Line&): the quants and bsums in an order of their own), rather than as the Q8_K block has them.
template <typename T, typename = void>
struct HasLineOrder : std::false_type {};
template <typename T>
struct HasLineOrder<T, std::void_t<decltype(&T::line)>> : std::true_type {};

// The type of a type's activation copies: its Traits' Line, or Q8KLine.
template <typename T, typename = void>
struct LineOf {
  using type = Q8KLine;
};
template <typename T>
struct LineOf<T, std::void_t<typename T::Line>> {
  using type = typename T::Line;
};

// The activation rows copied into line blocks when they fit this many bytes (on the stack).
constexpr size_t kLineBufferBytes = 64 * 1024;

template <typename T>
void gemm_tile_k(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vy,
                 size_t y_stride, int n_rows, int n_cols) {
  using Line = typename LineOf<T>::type;
  const int64_t nb = n / QK_K;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  if (static_cast<size_t>(n_cols * nb) * (sizeof(Line) + sizeof(float)) > kLineBufferBytes) {
    return k_tile_rows<T>(nb, out, out_stride, x, x_stride, reinterpret_cast<const block_q8_K*>(y), y_stride,
                          nullptr, 0, n_rows, n_cols);
  }
  alignas(64) uint8_t buffer[kLineBufferBytes];
  Line* lines = reinterpret_cast<Line*>(buffer);
  float* d = reinterpret_cast<float*>(buffer + n_cols * nb * sizeof(Line));
  for (int c = 0; c < n_cols; ++c) {
    const block_q8_K* row = reinterpret_cast<const block_q8_K*>(y + c * y_stride);
    for (int64_t b = 0; b < nb; ++b) {
      if constexpr (HasLineOrder<T>::value) {
        T::line(row[b], lines[c * nb + b]);
      } else {
        std::memcpy(lines[c * nb + b].qs, row[b].qs, sizeof(row[b].qs));
        std::memcpy(lines[c * nb + b].bsums, row[b].bsums, sizeof(row[b].bsums));
      }
      d[c * nb + b] = row[b].d;
    }
  }
  k_tile_rows<T>(nb, out, out_stride, x, x_stride, lines, nb * sizeof(Line), d, nb, n_rows, n_cols);
}

template <typename T>
void vec_dot_k_tile(int64_t n, float* out, const void* vx, const void* vy) {
  KActivations<1, block_q8_K> a;
  a.y[0] = static_cast<const block_q8_K*>(vy);
  a.d[0] = nullptr;
  k_tile_cols<T, 1>(n / QK_K, out, 0, static_cast<const uint8_t*>(vx), 0, 1, a);
}

// Dequantization through the unpacking the kernels use (avx512_k_panel.h's quants, scales, d, dmin,
// kSub, kZeroShift): value = (d scale_j) (q - z) - dmin min_j.
template <typename T>
void dequantize_row_k(const void* src, float* dst, int64_t n) {
  const typename T::BX* x = static_cast<const typename T::BX*>(src);
  const __m256i zero_point = _mm256_set1_epi8(T::kZeroShift >= 0 ? static_cast<char>(1 << T::kZeroShift) : 0);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    __m256i q[8];
    int32_t sc[16], mn[16] = {};
    T::quants(x[b], q);
    T::scales(x[b], sc, mn);
    const float d = T::d(x[b]), dmin = T::dmin(x[b]);
    float* out = dst + b * QK_K;
    for (int v = 0; v < 8; ++v) {  // values 32 v .. 32 v + 31
      const __m256i signed_q = _mm256_sub_epi8(q[v], zero_point);
      const __m128i halves[2] = {_mm256_castsi256_si128(signed_q), _mm256_extracti128_si256(signed_q, 1)};
      for (int h = 0; h < 2; ++h) {
        const int j = (32 * v + 16 * h) / T::kSub;
        store_f32_16(halves[h], _mm256_set1_ps(d * sc[j]), _mm256_set1_ps(-(dmin * mn[j])), out + 32 * v + 16 * h);
      }
    }
  }
}

}  // namespace ember
#endif
