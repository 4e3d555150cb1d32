// Several activation rows against one weight row, for the 256-element K-quant formats (AVX2 and
// up): each super-block's quants and scales are unpacked once (the costly part of these formats)
// and dotted with up to kCols activation blocks. A type plugs in through a Traits struct:
//   BX, BY                       weight and activation (Q8_K) block types
//   Acc                          one (row, token) pair's running sums; init() starts them
//   dot<C>(const BX&, const BY* const y[C], b, Acc acc[C])   adds super-block b of each y
//   finish(const Acc&) -> float
// vec_dot is the one-column case, and the sums of one (row, token) pair are the same for any C,
// so a batch gives the same bits as single rows.
#pragma once
#if defined(__AVX2__)
#include <cstddef>
#include <cstdint>

#include "core/types.h"
#include "quants/simd.h"

namespace ember {

// Traits whose running sums are 8 float lanes, summed at the end.
struct LaneSums {
  using Acc = __m256;
  static Acc init() { return _mm256_setzero_ps(); }
  static float finish(const Acc& acc) { return hsum_f32_8(acc); }
};

// sum[c] += maddubs(q, the 32 activations at `offset` in block b of y[c]) * scale (int16 pairs).
template <int C>
inline void add_scaled_dots(__m256i sum[C], __m256i q, __m256i scale, const block_q8_K* const y[C], int64_t b,
                            int offset) {
  for (int c = 0; c < C; ++c) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].qs + offset));
    sum[c] = madd_acc_i16(sum[c], _mm256_maddubs_epi16(q, qy), scale);
  }
}

// acc[c] += dy_c xd sum[c], in float.
template <int C>
inline void add_block_sums(__m256 acc[C], const __m256i sum[C], float xd, const block_q8_K* const y[C], int64_t b) {
  for (int c = 0; c < C; ++c)
    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(y[c][b].d * xd), _mm256_cvtepi32_ps(sum[c]), acc[c]);
}

template <typename T, int C>
inline void k_tile_cols(int64_t nb, float* out, size_t out_stride, const uint8_t* x, const uint8_t* y,
                        size_t y_stride) {
  const typename T::BX* xb = reinterpret_cast<const typename T::BX*>(x);
  const typename T::BY* yc[C];
  typename T::Acc acc[C];
  for (int c = 0; c < C; ++c) {
    yc[c] = reinterpret_cast<const typename T::BY*>(y + c * y_stride);
    acc[c] = T::init();
  }
  for (int64_t b = 0; b < nb; ++b) T::template dot<C>(xb[b], yc, b, acc);
  for (int c = 0; c < C; ++c) out[c * out_stride] = T::finish(acc[c]);
}

template <typename T>
void gemm_tile_k(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vy,
                 size_t y_stride, int n_rows, int n_cols) {
  constexpr int kCols = 4;
  const int64_t nb = n / QK_K;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* row = x + r * x_stride;
    int c = 0;
    for (; c + kCols <= n_cols; c += kCols)
      k_tile_cols<T, kCols>(nb, out + c * out_stride + r, out_stride, row, y + c * y_stride, y_stride);
    for (; c < n_cols; ++c) k_tile_cols<T, 1>(nb, out + c * out_stride + r, out_stride, row, y + c * y_stride, y_stride);
  }
}

template <typename T>
void vec_dot_k_tile(int64_t n, float* out, const void* vx, const void* vy) {
  k_tile_cols<T, 1>(n / QK_K, out, 0, static_cast<const uint8_t*>(vx), static_cast<const uint8_t*>(vy), 0);
}

}  // namespace ember
#endif
