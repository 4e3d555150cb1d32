// Register-blocked tile kernel for the 32-element block formats (AVX2 and up): R weight rows x
// C activation rows per pass, so each unpacked weight block is reused C times and each
// activation block R times. A type plugs in through a Traits struct:
//   BX, BY            weight and activation block types
//   unpack(const BX&) -> __m256i   the weight's 32 quants as bytes
//   dot(qx, qy)       -> __m256    per-lane partial sums of qx * qy as floats
//   dx(const BX&), dy(const BY&)   block scales
//   kOffset, offset(const BX&, const BY&)  an extra scalar term per block pair (Q4_1's m * s)
#pragma once
#if defined(__AVX2__)
#include <cstddef>
#include <cstdint>

#include "core/fp16.h"
#include "quants/simd.h"

namespace ember {

template <typename T, int R, int C>
inline void tile_kernel(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride,
                        const uint8_t* y, size_t y_stride) {
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
  for (int64_t b = 0; b < nb; ++b) {
    __m256i qy[C];
    float dy[C];
    for (int c = 0; c < C; ++c) {
      qy[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yc[c][b].qs));
      dy[c] = T::dy(yc[c][b]);
    }
    for (int r = 0; r < R; ++r) {
      const BX& xb = xr[r][b];
      const __m256i qx = T::unpack(xb);
      const float dx = T::dx(xb);
      for (int c = 0; c < C; ++c) {
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy[c]), T::dot(qx, qy[c]), acc[r][c]);
        if (T::kOffset) offsets[r][c] += T::offset(xb, yc[c][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[c * out_stride + r] = hsum_f32_8(acc[r][c]) + offsets[r][c];
}

// Rows in groups of R (R x C accumulators stay in registers), then the remainder one by one.
template <typename T, int R, int C>
inline void tile_rows(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride,
                      const uint8_t* y, size_t y_stride, int n_rows) {
  int r = 0;
  for (; r + R <= n_rows; r += R)
    tile_kernel<T, R, C>(nb, out + r, out_stride, x + r * x_stride, x_stride, y, y_stride);
  for (; r < n_rows; ++r) tile_kernel<T, 1, C>(nb, out + r, out_stride, x + r * x_stride, x_stride, y, y_stride);
}

template <typename T>
void gemm_tile(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vy,
               size_t y_stride, int n_rows, int n_cols) {
  const int64_t nb = n / 32;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  int c = 0;
  for (; c + 4 <= n_cols; c += 4)
    tile_rows<T, 2, 4>(nb, out + c * out_stride, out_stride, x, x_stride, y + c * y_stride, y_stride, n_rows);
  for (; c + 2 <= n_cols; c += 2)
    tile_rows<T, 4, 2>(nb, out + c * out_stride, out_stride, x, x_stride, y + c * y_stride, y_stride, n_rows);
  for (; c < n_cols; ++c)
    tile_rows<T, 4, 1>(nb, out + c * out_stride, out_stride, x, x_stride, y + c * y_stride, y_stride, n_rows);
}

}  // namespace ember
#endif
