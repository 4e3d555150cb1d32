// Register-blocked tile kernel for the 32-element block formats (AVX2 and up): R weight rows x
// C activation rows per pass, so each unpacked weight block is reused C times and each
// activation block R times. A type plugs in through a Traits struct:
//   BX, BY            weight and activation block types (scale d in both; for kOffset types
//                     also the weight's offset m and the activation's s = d * sum(q))
//   unpack(const BX&) -> __m256i   the weight's 32 quants as bytes
//   y_sums(qy)        -> __m256i   per-activation-block work shared by all weight rows (the
//                                  zero-point term of the unsigned-quant types), or anything
//   dot(qx, qy, ys)   -> __m256    per-lane partial sums of qx * qy as floats
//   kOffset           whether a block pair adds m * s (Q4_1, Q5_1)
// The f16 scales are converted 8 blocks at a time (one vcvtph2ps per row instead of one
// conversion per block pair), so the inner loop is the integer dot products, one FMA and (for
// the offset types) one scalar add per block pair. The order of the sums for one (row, token)
// pair does not depend on R, C or the position in the tile: a batch gives the same bits as
// single rows. The offsets are summed one block after the other, as the scalar kernels do:
// summed in vector lanes instead, SmolLM2's last layers (whose activations carry outliers of
// several hundred) turned the different rounding into a visibly worse logit at one position of
// the reference text (cosine 0.981 instead of 0.994 against the float model).
#pragma once
#if defined(__AVX2__)
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "quants/x86/avx2_simd.h"

namespace ember {

// The f16 values h(0) .. h(n - 1), 1 <= n <= 8, as 8 floats (lanes from n on are 0). Inserted
// lane by lane: a store-and-reload of a small array would stall on store forwarding.
template <typename F>
inline __m256 f16x8(F&& h, int n) {
  __m128i v = _mm_cvtsi32_si128(h(0));
  switch (n) {
    case 8: v = _mm_insert_epi16(v, h(7), 7); [[fallthrough]];
    case 7: v = _mm_insert_epi16(v, h(6), 6); [[fallthrough]];
    case 6: v = _mm_insert_epi16(v, h(5), 5); [[fallthrough]];
    case 5: v = _mm_insert_epi16(v, h(4), 4); [[fallthrough]];
    case 4: v = _mm_insert_epi16(v, h(3), 3); [[fallthrough]];
    case 3: v = _mm_insert_epi16(v, h(2), 2); [[fallthrough]];
    case 2: v = _mm_insert_epi16(v, h(1), 1); [[fallthrough]];
    default: break;
  }
  return _mm256_cvtph_ps(v);
}

// The activation rows' f16 scales (d, and s for the offset types) as floats, converted once per
// gemm_tile call and shared by every weight row. Rows of more than kMaxBlocks blocks convert
// them as they go (the same floats: the conversion is exact).
struct ActScales {
  static constexpr int kMaxCols = 8, kMaxBlocks = 512;
  alignas(32) float d[kMaxCols][kMaxBlocks + 8];
  alignas(32) float s[kMaxCols][kMaxBlocks + 8];
  bool ready = false;

  template <typename BY, bool kOffset>
  void convert(const uint8_t* y, size_t y_stride, int n_cols, int64_t nb) {
    ready = n_cols <= kMaxCols && nb <= kMaxBlocks;
    if (!ready) return;
    for (int c = 0; c < n_cols; ++c) {
      const BY* row = reinterpret_cast<const BY*>(y + c * y_stride);
      for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int n = static_cast<int>(std::min<int64_t>(8, nb - b0));
        _mm256_store_ps(d[c] + b0, f16x8([&](int i) { return row[b0 + i].d; }, n));
        if constexpr (kOffset) _mm256_store_ps(s[c] + b0, f16x8([&](int i) { return row[b0 + i].s; }, n));
      }
    }
  }
};

template <typename T, int R, int C>
inline void tile_kernel(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride,
                        const uint8_t* y, size_t y_stride, const ActScales* ys = nullptr, int col = 0) {
  using BX = typename T::BX;
  using BY = typename T::BY;
  __m256 acc[R][C];
  float offsets[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps(), offsets[r][c] = 0.0f;
  const BX* xr[R];
  const BY* yc[C];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const BX*>(x + r * x_stride);
  for (int c = 0; c < C; ++c) yc[c] = reinterpret_cast<const BY*>(y + c * y_stride);
  alignas(32) float d[R][C][8], ms[R][C][T::kOffset ? 8 : 1];
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, nb - b0));
    __m256 dy[C];
    for (int c = 0; c < C; ++c)
      dy[c] = ys ? _mm256_load_ps(ys->d[col + c] + b0) : f16x8([&](int i) { return yc[c][b0 + i].d; }, n);
    for (int r = 0; r < R; ++r) {
      const __m256 dx = f16x8([&](int i) { return xr[r][b0 + i].d; }, n);
      for (int c = 0; c < C; ++c) _mm256_store_ps(d[r][c], _mm256_mul_ps(dx, dy[c]));
    }
    if constexpr (T::kOffset) {
      __m256 sy[C];
      for (int c = 0; c < C; ++c)
        sy[c] = ys ? _mm256_load_ps(ys->s[col + c] + b0) : f16x8([&](int i) { return yc[c][b0 + i].s; }, n);
      for (int r = 0; r < R; ++r) {
        const __m256 mx = f16x8([&](int i) { return xr[r][b0 + i].m; }, n);
        for (int c = 0; c < C; ++c) _mm256_store_ps(ms[r][c], _mm256_mul_ps(mx, sy[c]));
      }
    }
    for (int i = 0; i < n; ++i) {
      const int64_t b = b0 + i;
      __m256i qy[C], yz[C];
      for (int c = 0; c < C; ++c) {
        qy[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yc[c][b].qs));
        yz[c] = T::y_sums(qy[c]);
      }
      for (int r = 0; r < R; ++r) {
        const __m256i qx = T::unpack(xr[r][b]);
        for (int c = 0; c < C; ++c) {
          acc[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[r][c][i]), T::dot(qx, qy[c], yz[c]), acc[r][c]);
          if constexpr (T::kOffset) offsets[r][c] += ms[r][c][i];
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[c * out_stride + r] = hsum_f32_8(acc[r][c]) + offsets[r][c];
}

// Rows in groups of R (R x C accumulators stay in registers), then the remainder one by one.
template <typename T, int R, int C>
inline void tile_rows(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride,
                      const uint8_t* y, size_t y_stride, int n_rows, const ActScales* ys, int col) {
  for_each_group<R, 1>(n_rows, [&](auto rows, int r) {
    tile_kernel<T, decltype(rows)::value, C>(nb, out + r, out_stride, x + r * x_stride, x_stride, y, y_stride, ys, col);
  });
}

template <typename T>
void gemm_tile(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vy,
               size_t y_stride, int n_rows, int n_cols) {
  const int64_t nb = n / 32;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  ActScales scales;
  scales.convert<typename T::BY, T::kOffset>(y, y_stride, n_cols, nb);
  const ActScales* ys = scales.ready ? &scales : nullptr;
  // Rows per group: 2 with 4 tokens, 4 with 2, 1 with 1 (8 accumulators at most).
  for_each_group<4, 2, 1>(n_cols, [&](auto cols, int c) {
    constexpr int C = decltype(cols)::value;
    tile_rows<T, C == 1 ? 1 : 8 / C, C>(nb, out + c * out_stride, out_stride, x, x_stride, y + c * y_stride, y_stride,
                                        n_rows, ys, c);
  });
}

// One row times one activation row, for the vec_dot slot of the kernel table.
template <typename T>
void vec_dot_tile(int64_t n, float* out, const void* vx, const void* vy) {
  tile_kernel<T, 1, 1>(n / 32, out, 0, static_cast<const uint8_t*>(vx), 0, static_cast<const uint8_t*>(vy), 0);
}

}  // namespace ember
#endif
