// Q8_0 (weights and activations) and Q8_1 (activations for the *_1 types).
// Q8_0 block: d (f16), 32 x int8; value = d * q.  Q8_1 adds s = d * sum(q).
#include <cmath>

#include "core/fp16.h"
#include "core/kernels.h"
#include "quants/x86/avx2_panel.h"
#include "quants/x86/avx512_panel.h"
#include "quants/x86/avx2_simd.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const block_q8_0* x = static_cast<const block_q8_0*>(src);
  for (int64_t b = 0; b < n / QK8_0; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK8_0; ++j) dst[b * QK8_0 + j] = d * x[b].qs[j];
  }
}

// d = max|x| / 127, q = round(x / d): the reference quantizer (ggml's quantize_row_q8_0_ref).
void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  block_q8_0* y = static_cast<block_q8_0*>(dst);
  for (int64_t b = 0; b < n / QK8_0; ++b) {
    const float* x = src + b * QK8_0;
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) y[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
  block_q8_1* y = static_cast<block_q8_1*>(dst);
  for (int64_t b = 0; b < n / QK8_1; ++b) {
    const float* x = src + b * QK8_1;
    float amax = 0.0f;
    for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) {
      const int q = static_cast<int>(std::round(x[j] * id));
      y[b].qs[j] = static_cast<int8_t>(q);
      sum += q;
    }
    y[b].d = fp32_to_fp16(d);
    y[b].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

void dequantize_row_q8_1(const void* src, float* dst, int64_t n) {
  const block_q8_1* x = static_cast<const block_q8_1*>(src);
  for (int64_t b = 0; b < n / QK8_1; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK8_1; ++j) dst[b * QK8_1 + j] = d * x[b].qs[j];
  }
}

void vec_dot_q8_0_q8_0(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q8_0* x = static_cast<const block_q8_0*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  const int64_t nb = n / QK8_0;
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < QK8_0; ++j) isum += x[b].qs[j] * y[b].qs[j];
    sum += isum * fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d);
  }
  *out = sum;
}

#if defined(__AVX2__)
// round(t) as std::round does it (halves away from zero), exactly: the truncation, plus the sign
// where the dropped fraction (exact in float) is at least a half.
inline __m256i round_half_away_epi32(__m256 t) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 whole = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 fraction = _mm256_andnot_ps(sign, _mm256_sub_ps(t, whole));
  const __m256 up = _mm256_cmp_ps(fraction, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 step = _mm256_or_ps(_mm256_and_ps(t, sign), _mm256_set1_ps(1.0f));
  return _mm256_cvttps_epi32(_mm256_add_ps(whole, _mm256_and_ps(up, step)));
}

// The reference quantizer's block of 32 (d = max|x| / 127, q = round(x / d)) in 8 lanes, the
// same bits: qs gets the quants, the result is d; *sum (when given) gets sum(q).
inline float quantize_block_32(const float* x, int8_t* qs, int* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax);  // a NaN is skipped, as std::max does
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float d = _mm_cvtss_f32(m4) / 127.0f;
  const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = round_half_away_epi32(_mm256_mul_ps(v[i], id));
  if (sum) *sum = hsum_i32_8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return d;
}

void quantize_row_q8_0_avx2(const float* src, void* dst, int64_t n) {
  block_q8_0* y = static_cast<block_q8_0*>(dst);
  for (int64_t b = 0; b < n / QK8_0; ++b) y[b].d = fp32_to_fp16(quantize_block_32(src + b * QK8_0, y[b].qs, nullptr));
}

void quantize_row_q8_1_avx2(const float* src, void* dst, int64_t n) {
  block_q8_1* y = static_cast<block_q8_1*>(dst);
  for (int64_t b = 0; b < n / QK8_1; ++b) {
    int sum;
    const float d = quantize_block_32(src + b * QK8_1, y[b].qs, &sum);
    y[b].d = fp32_to_fp16(d);
    y[b].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

// avx2_panel.h's and avx512_panel.h's traits: signed values for the AVX2 dot products
// (SignedDot), unsigned ones with zero point 128 for vpdpbusd.
struct Q8_0Tile {
  using BX = block_q8_0;
  using BY = block_q8_0;
  static constexpr bool kOffset = false;
  static constexpr int kZeroShift = 7;  // unsigned as q + 128
  static __m256i unpack(const BX& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
  static __m256i unpack_unsigned(const BX& b) { return _mm256_xor_si256(unpack(b), _mm256_set1_epi8(char(0x80))); }
};
#endif

}  // namespace

void register_q8(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q8_0)] = {GGMLType::Q8_0, dequantize_row_q8_0, quantize_row_q8_0,
                                               vec_dot_q8_0_q8_0};
  t.types[static_cast<int>(GGMLType::Q8_1)] = {GGMLType::Q8_1, dequantize_row_q8_1, quantize_row_q8_1, nullptr};
#if defined(__AVX2__)
  t.types[static_cast<int>(GGMLType::Q8_0)].quantize_row = quantize_row_q8_0_avx2;
  t.types[static_cast<int>(GGMLType::Q8_1)].quantize_row = quantize_row_q8_1_avx2;
  use_avx2_kernels<SignedDot<Q8_0Tile>>(t.types[static_cast<int>(GGMLType::Q8_0)]);
  t.types[static_cast<int>(GGMLType::Q8_0)].pack_panel = pack_panel<block_q8_0>;
  t.types[static_cast<int>(GGMLType::Q8_1)].pack_panel = pack_panel<block_q8_1>;
#endif
#if defined(EMBER_HAS_PANELS)
  use_avx512_kernels<Q8_0Tile>(t.types[static_cast<int>(GGMLType::Q8_0)]);
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
