// Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit
// min: value = d * scale_j * q - dmin * min_j, q a nibble. qs holds 4 chunks of 32 bytes; chunk c
// gives sub-block 2c (low nibbles) and 2c + 1 (high nibbles). Dotted with Q8_K activations:
// sum = dy (d sum_j scale_j sum(q qy) - dmin sum_j min_j sum(qy)), sum(qy) from the bsums.
#include <cstring>

#include "core/fp16.h"
#include "core/kernels.h"
#include "quants/simd.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

// The 12 scale bytes hold 8 scales and 8 mins of 6 bits (ggml's get_scale_min_k4): bytes 0-3
// are scales 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; bytes 8-11 hold the low 4 bits of
// scales 4-7 (low nibble) and mins 4-7 (high nibble), whose top 2 bits are the top 2 bits of
// bytes 0-3 (scales) and 4-7 (mins). Out: 4 little-endian words, scales 0-3, 4-7, mins 0-3, 4-7.
inline void unpack_scales_mins(const uint8_t packed[K_SCALE_SIZE], uint32_t out[4]) {
  uint32_t w[3];
  std::memcpy(w, packed, K_SCALE_SIZE);
  const uint32_t low6 = 0x3F3F3F3F, low4 = 0x0F0F0F0F, top2 = 0x30303030;
  out[0] = w[0] & low6;
  out[1] = (w[2] & low4) | ((w[0] >> 2) & top2);
  out[2] = w[1] & low6;
  out[3] = ((w[2] >> 4) & low4) | ((w[1] >> 2) & top2);
}

void dequantize_row_q4_k(const void* src, float* dst, int64_t n) {
  const block_q4_K* x = static_cast<const block_q4_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    uint8_t sm[16];  // scales 0-7, mins 0-7
    uint32_t words[4];
    unpack_scales_mins(x[b].scales, words);
    std::memcpy(sm, words, 16);
    float* out = dst + b * QK_K;
    for (int c = 0; c < QK_K / 64; ++c) {
      const uint8_t* q = x[b].qs + 32 * c;
      const float scale_lo = d * sm[2 * c], min_lo = dmin * sm[8 + 2 * c];
      const float scale_hi = d * sm[2 * c + 1], min_hi = dmin * sm[8 + 2 * c + 1];
      for (int l = 0; l < 32; ++l) {
        out[64 * c + l] = scale_lo * (q[l] & 0x0F) - min_lo;
        out[64 * c + 32 + l] = scale_hi * (q[l] >> 4) - min_hi;
      }
    }
  }
}

#if defined(__AVX2__)
// One super-block: dy d sum_j scale_j sum(q qy) as 8 float lanes (to be summed), and the min
// term dy dmin sum_j min_j sum(qy) as 4 float lanes.
inline void dot_block_q4_k(const block_q4_K& x, const block_q8_K& y, __m256& acc, __m128& acc_min) {
  uint32_t words[4];
  unpack_scales_mins(x.scales, words);
  const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words)));

  // Mins: 8 int16 mins against the 8 sub-block sums of qy (pairs of the 16 bsums).
  const __m128i bsums_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums));
  const __m128i bsums_hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums + 8));
  const __m128i min_dot = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), _mm_hadd_epi16(bsums_lo, bsums_hi));
  acc_min = _mm_fmadd_ps(_mm_set1_ps(y.d * fp16_to_fp32(x.dmin)), _mm_cvtepi32_ps(min_dot), acc_min);

  // Scales: 8 int16 in both lanes; sub-block j's scale is picked out by shuffling word j everywhere.
  const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm16));
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i sumi = _mm256_setzero_si256();
  for (int c = 0; c < QK_K / 64; ++c) {
    const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * c));
    const __m256i qy_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 64 * c));
    const __m256i qy_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 64 * c + 32));
    const __m256i p_lo = _mm256_maddubs_epi16(_mm256_and_si256(q4, low4), qy_lo);
    const __m256i p_hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q4, 4), low4), qy_hi);
    const __m256i scale_lo = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>(0x0100 + 0x0202 * (2 * c))));
    const __m256i scale_hi = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>(0x0100 + 0x0202 * (2 * c + 1))));
    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(p_lo, scale_lo), _mm256_madd_epi16(p_hi, scale_hi)));
  }
  acc = _mm256_fmadd_ps(_mm256_set1_ps(y.d * fp16_to_fp32(x.d)), _mm256_cvtepi32_ps(sumi), acc);
}
#endif

void vec_dot_q4_k_q8_k(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q4_K* x = static_cast<const block_q4_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / QK_K;
#if defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_min = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) dot_block_q4_k(x[b], y[b], acc, acc_min);
  acc_min = _mm_add_ps(acc_min, _mm_movehl_ps(acc_min, acc_min));
  acc_min = _mm_add_ss(acc_min, _mm_movehdup_ps(acc_min));
  *out = hsum_f32_8(acc) - _mm_cvtss_f32(acc_min);
#else
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t sm[16];
    uint32_t words[4];
    unpack_scales_mins(x[b].scales, words);
    std::memcpy(sm, words, 16);
    int scaled = 0, mins = 0;
    for (int c = 0; c < QK_K / 64; ++c) {
      const uint8_t* q = x[b].qs + 32 * c;
      const int8_t* qy = y[b].qs + 64 * c;
      int dot_lo = 0, dot_hi = 0;
      for (int l = 0; l < 32; ++l) {
        dot_lo += (q[l] & 0x0F) * qy[l];
        dot_hi += (q[l] >> 4) * qy[32 + l];
      }
      scaled += sm[2 * c] * dot_lo + sm[2 * c + 1] * dot_hi;
    }
    for (int j = 0; j < 8; ++j) mins += sm[8 + j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    sum += y[b].d * (fp16_to_fp32(x[b].d) * scaled - fp16_to_fp32(x[b].dmin) * mins);
  }
  *out = sum;
#endif
}

}  // namespace

void register_q4_k(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q4_K)] = {GGMLType::Q8_K, dequantize_row_q4_k, nullptr, vec_dot_q4_k_q8_k};
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
