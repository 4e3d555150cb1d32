// Q8_K: the activation format for the K-quants. 256 values per block, one float scale,
// q = round(x / d) with d = max|x| / 127 taken with the sign of the extreme value (ggml's
// quantize_row_q8_K_ref, so -128 is reachable), and bsums[i] = sum of q[16 i .. 16 i + 15].
#include <cmath>
#include <cstdint>

#include "core/kernels.h"
#include "quants/x86/avx2_simd.h"
#include "quants/x86/avx2_k_panel.h"
#include "quants/x86/avx512_k_panel.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
  block_q8_K* y = static_cast<block_q8_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) amax = ax, max = x[j];
    }
    if (amax == 0.0f) {
      y[b] = block_q8_K{};
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; ++j) {
      const int v = static_cast<int>(std::nearbyint(iscale * x[j]));
      y[b].qs[j] = static_cast<int8_t>(v > 127 ? 127 : v);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += y[b].qs[j * 16 + i];
      y[b].bsums[j] = static_cast<int16_t>(sum);
    }
    y[b].d = 1.0f / iscale;
  }
}

#if defined(__AVX2__)
// quantize_row_q8_k in vectors, with the same results: the largest magnitude by vmaxps (which
// passes over NaNs as the scalar comparison does), the first element of that magnitude for the
// sign of d, the same float products, rounded by vcvtps2dq (to nearest even, as nearbyint), and
// each value's low byte kept (the scalar int -> int8_t conversion).
void quantize_row_q8_k_avx2(const float* src, void* dst, int64_t n) {
  block_q8_K* y = static_cast<block_q8_K*>(dst);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    __m256 amax8 = _mm256_setzero_ps();
    for (int j = 0; j < QK_K; j += 8) amax8 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), magnitude), amax8);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float amax = _mm_cvtss_f32(m);
    if (amax == 0.0f) {
      y[b] = block_q8_K{};
      continue;
    }
    float max = amax;
    const __m256 target = _mm256_set1_ps(amax);
    for (int j = 0; j < QK_K; j += 8) {
      const __m256 ax = _mm256_and_ps(_mm256_loadu_ps(x + j), magnitude);
      const int hits = _mm256_movemask_ps(_mm256_cmp_ps(ax, target, _CMP_EQ_OQ));
      if (hits) {
        max = x[j + __builtin_ctz(static_cast<unsigned>(hits))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 vscale = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127), low_byte = _mm256_set1_epi32(0xFF);
    for (int j = 0; j < QK_K; j += 32) {
      __m256i v[4];
      for (int i = 0; i < 4; ++i) {
        const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(vscale, _mm256_loadu_ps(x + j + 8 * i)));
        v[i] = _mm256_and_si256(_mm256_min_epi32(r, top), low_byte);
      }
      // Bytes in lane order a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7, then in element order.
      const __m256i packed = _mm256_packus_epi16(_mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3]));
      const __m256i q = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs + j), q);
      // Sums of 8 bytes (as q + 128, by vpsadbw), paired into the sums of 16.
      const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80))),
                                          _mm256_setzero_si256());
      alignas(32) int64_t eights[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(eights), sad);
      y[b].bsums[j / 16] = static_cast<int16_t>(eights[0] + eights[1] - 2048);
      y[b].bsums[j / 16 + 1] = static_cast<int16_t>(eights[2] + eights[3] - 2048);
    }
    y[b].d = 1.0f / iscale;
  }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The same quantizer 16 values a vector, each vector one of the sums of 16: the largest magnitude
// and its first element as above, the products rounded by vcvtps2dq, capped at 127 and narrowed to
// their low bytes by vpmovdb (the scalar int -> int8_t conversion), each sum taken over those bytes.
void quantize_row_q8_k_avx512(const float* src, void* dst, int64_t n) {
  block_q8_K* y = static_cast<block_q8_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    __m512 amax16 = _mm512_setzero_ps();
    for (int j = 0; j < QK_K; j += 16) amax16 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + j)), amax16);
    const float amax = _mm512_reduce_max_ps(amax16);
    if (amax == 0.0f) {
      y[b] = block_q8_K{};
      continue;
    }
    float max = amax;
    const __m512 target = _mm512_set1_ps(amax);
    for (int j = 0; j < QK_K; j += 16) {
      const __mmask16 hits = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)), target, _CMP_EQ_OQ);
      if (hits) {
        max = x[j + __builtin_ctz(static_cast<unsigned>(hits))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 vscale = _mm512_set1_ps(iscale);
    const __m512i top = _mm512_set1_epi32(127);
    const __m128i bias = _mm_set1_epi8(static_cast<char>(0x80));
    for (int j = 0; j < QK_K; j += 16) {
      const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(vscale, _mm512_loadu_ps(x + j)));
      const __m128i q = _mm512_cvtepi32_epi8(_mm512_min_epi32(r, top));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + j), q);
      // The sum of the 16 bytes as q + 128 (vpsadbw over two halves of 8).
      const __m128i sad = _mm_sad_epu8(_mm_xor_si128(q, bias), _mm_setzero_si128());
      y[b].bsums[j / 16] = static_cast<int16_t>(_mm_cvtsi128_si64(sad) + _mm_extract_epi64(sad, 1) - 2048);
    }
    y[b].d = 1.0f / iscale;
  }
}
#endif

void dequantize_row_q8_k(const void* src, float* dst, int64_t n) {
  const block_q8_K* x = static_cast<const block_q8_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b)
    for (int j = 0; j < QK_K; ++j) dst[b * QK_K + j] = x[b].d * x[b].qs[j];
}

}  // namespace

void register_q8_k(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q8_K)] = {GGMLType::Q8_K, dequantize_row_q8_k, quantize_row_q8_k, nullptr};
#if defined(__AVX2__)
  t.types[static_cast<int>(GGMLType::Q8_K)].quantize_row = quantize_row_q8_k_avx2;
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
  t.types[static_cast<int>(GGMLType::Q8_K)].quantize_row = quantize_row_q8_k_avx512;
#endif
#if defined(EMBER_HAS_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q8_K)].pack_panel = pack_panel_k;
#elif defined(EMBER_HAS_AVX2_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q8_K)].pack_panel = pack_panel_k8;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
