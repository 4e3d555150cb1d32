// F32, F16 and BF16 weights: activations are converted to the weight's own type and the dot
// products run in float SIMD.
#include <cstring>

#include "core/fp16.h"
#include "core/kernels.h"
#if defined(__AVX2__)
#include "quants/simd.h"
#endif

namespace ember {
namespace EMBER_ISA_NS {

namespace {

void dequantize_row_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(x[i]);
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
  TypeKernels& f16 = t.types[static_cast<int>(GGMLType::F16)];
  f16 = {GGMLType::F16, dequantize_row_f16, quantize_row_f16, vec_dot_f16};
  TypeKernels& bf16 = t.types[static_cast<int>(GGMLType::BF16)];
  bf16 = {GGMLType::BF16, dequantize_row_bf16, quantize_row_bf16, vec_dot_bf16};
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
