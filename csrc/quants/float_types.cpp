// F32, F16 and BF16 weights: activations are converted to the weight's own type and the dot
// products run in float SIMD.
#include <cstring>

#include "core/fp16.h"
#include "core/kernels.h"
#if defined(__AVX2__)
#include "quants/x86/avx2_simd.h"
#endif

namespace ember {
namespace EMBER_ISA_NS {

namespace {

void dequantize_row_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(src);
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
  for (; i < n; ++i) dst[i] = fp16_to_fp32(x[i]);
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(x[i]);
}

void quantize_row_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

void quantize_row_f16(const float* src, void* dst, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(src[i]);
}

void quantize_row_bf16(const float* src, void* dst, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(src[i]);
}

void vec_dot_f32(int64_t n, float* out, const void* vx, const void* vy) {
  const float *x = static_cast<const float*>(vx), *y = static_cast<const float*>(vy);
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
  }
  sum = hsum_f32_8(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += x[i] * y[i];
  *out = sum;
}

#if defined(__AVX2__)
// One R x C block of F32 dot products, each in vec_dot_f32's order (so a token gets the same
// bits in any tile): per row and token, 8-lane partial sums of the even and odd 8-element groups
// of every 16 (AVX-512: the two halves of one 16-lane sum), added, hsum_f32_8, the tail in order.
template <int R, int C>
void f32_block(int64_t n, float* out, size_t out_stride, const float* x, size_t x_stride, const float* y,
               size_t y_stride) {
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m512 yv[C];
    for (int c = 0; c < C; ++c) yv[c] = _mm512_loadu_ps(y + c * y_stride + i);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * x_stride + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, yv[c], acc[r][c]);
    }
  }
  auto halves = [&](int r, int c) {
    return _mm256_add_ps(_mm512_castps512_ps256(acc[r][c]),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][c]), 1)));
  };
#else
  __m256 acc[R][C][2];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m256 yv[C][2];
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < 2; ++h) yv[c][h] = _mm256_loadu_ps(y + c * y_stride + i + 8 * h);
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h) {
        const __m256 xv = _mm256_loadu_ps(x + r * x_stride + i + 8 * h);
        for (int c = 0; c < C; ++c) acc[r][c][h] = _mm256_fmadd_ps(xv, yv[c][h], acc[r][c][h]);
      }
  }
  auto halves = [&](int r, int c) { return _mm256_add_ps(acc[r][c][0], acc[r][c][1]); };
#endif
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float sum = hsum_f32_8(halves(r, c));
      for (int64_t j = i; j < n; ++j) sum += x[r * x_stride + j] * y[c * y_stride + j];
      out[c * out_stride + r] = sum;
    }
}

// gemm_tile for F32 weights (and for dequantized rows under float activations): blocks of
// kRows x kCols, the edge rows and tokens in smaller blocks, all in vec_dot_f32's order.
void gemm_tile_f32(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* vy,
                   size_t y_stride, int n_rows, int n_cols) {
#if defined(__AVX512F__)
  constexpr int kRows = 4, kCols = 4;
#else
  constexpr int kRows = 2, kCols = 2;
#endif
  const float *x = static_cast<const float*>(vx), *y = static_cast<const float*>(vy);
  const size_t xs = x_stride / sizeof(float), ys = y_stride / sizeof(float);
  for_each_group<kRows, 1>(n_rows, [&](auto rows, int r) {
    for_each_group<kCols, 1>(n_cols, [&](auto cols, int c) {
      f32_block<decltype(rows)::value, decltype(cols)::value>(n, out + c * out_stride + r, out_stride, x + r * xs, xs,
                                                               y + c * ys, ys);
    });
  });
}
#endif

template <float (*ToF32)(uint16_t)>
float dot_halfs_scalar(const uint16_t* x, const uint16_t* y, int64_t begin, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = begin; i < n; ++i) sum += ToF32(x[i]) * ToF32(y[i]);
  return sum;
}

void vec_dot_f16(int64_t n, float* out, const void* vx, const void* vy) {
  const uint16_t *x = static_cast<const uint16_t*>(vx), *y = static_cast<const uint16_t*>(vy);
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))),
                          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i))), acc);
  sum = hsum_f32_8(acc);
#endif
  *out = sum + dot_halfs_scalar<fp16_to_fp32>(x, y, i, n);
}

void vec_dot_bf16(int64_t n, float* out, const void* vx, const void* vy) {
  const uint16_t *x = static_cast<const uint16_t*>(vx), *y = static_cast<const uint16_t*>(vy);
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256i xi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))), 16);
    const __m256i yi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i))), 16);
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(xi), _mm256_castsi256_ps(yi), acc);
  }
  sum = hsum_f32_8(acc);
#endif
  *out = sum + dot_halfs_scalar<bf16_to_fp32>(x, y, i, n);
}

}  // namespace

void register_float_types(KernelTable& t) {
  TypeKernels& f32 = t.types[static_cast<int>(GGMLType::F32)];
  f32 = {GGMLType::F32, dequantize_row_f32, quantize_row_f32, vec_dot_f32};
#if defined(__AVX2__)
  f32.gemm_tile = gemm_tile_f32;
#endif
  TypeKernels& f16 = t.types[static_cast<int>(GGMLType::F16)];
  f16 = {GGMLType::F16, dequantize_row_f16, quantize_row_f16, vec_dot_f16};
  TypeKernels& bf16 = t.types[static_cast<int>(GGMLType::BF16)];
  bf16 = {GGMLType::BF16, dequantize_row_bf16, quantize_row_bf16, vec_dot_bf16};
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
