// Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit
// min: value = d * scale_j * q - dmin * min_j, q a nibble. qs holds 4 chunks of 32 bytes; chunk c
// gives sub-block 2c (low nibbles) and 2c + 1 (high nibbles). Dotted with Q8_K activations:
// sum = dy (d sum_j scale_j sum(q qy) - dmin sum_j min_j sum(qy)), sum(qy) from the bsums.

#include "core/fp16.h"
#include "core/kernels.h"
#include "quants/k_scales.h"
#include "quants/x86/avx512_k_panel.h"
#include "quants/x86/avx2_k_tile.h"
#include "quants/x86/avx2_simd.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

void dequantize_row_q4_k(const void* src, float* dst, int64_t n) {
  const block_q4_K* x = static_cast<const block_q4_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    uint8_t scales[8], mins[8];
    unpack_scales_mins(x[b].scales, scales, mins);
    float* out = dst + b * QK_K;
    for (int c = 0; c < QK_K / 64; ++c) {
      const uint8_t* q = x[b].qs + 32 * c;
      const float scale_lo = d * scales[2 * c], min_lo = dmin * mins[2 * c];
      const float scale_hi = d * scales[2 * c + 1], min_hi = dmin * mins[2 * c + 1];
      for (int l = 0; l < 32; ++l) {
        out[64 * c + l] = scale_lo * (q[l] & 0x0F) - min_lo;
        out[64 * c + 32 + l] = scale_hi * (q[l] >> 4) - min_hi;
      }
    }
  }
}

EMBER_EXACT_FP_BEGIN

// ggml's quantize_row_q4_K_ref. Each sub-block of 32 gets a scale and min from the weighted
// search (weights: the sub-block's rms plus |x|); the 8 scales and 8 mins are then quantized to 6
// bits against the largest of each, and the values re-quantized with those rounded scales.
void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
  block_q4_K* y = static_cast<block_q4_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    uint8_t L[QK_K];
    float scales[8], mins[8];
    sub_block_scales_k(x, 15, -1.0f, 20, L, scales, mins);
    pack_scales_mins_k(scales, mins, y[b].scales, y[b].d, y[b].dmin);
    levels_for_packed_scales_k(x, y[b].scales, y[b].d, y[b].dmin, 15, L);
    for (int c = 0; c < QK_K / 64; ++c)
      for (int l = 0; l < 32; ++l) y[b].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | L[64 * c + 32 + l] << 4);
  }
}

EMBER_EXACT_FP_END

#if defined(__AVX2__)
// dy (d sum_j scale_j sum(q qy) - dmin sum_j min_j sum(qy)) for one weight super-block and C
// activation blocks, in avx2_k_tile.h's order. Each chunk of quants is unpacked once for
// all C.
struct Q4KTile {
  using BX = block_q4_K;
  using BY = block_q8_K;
  static constexpr int kSub = 32, kZeroShift = -1;
  static constexpr bool kMins = true;
  // The 256 quants (0..15) as bytes, sub-block s in q[s].
  static void quants(const BX& x, __m256i q[8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * k));
      q[2 * k] = _mm256_and_si256(q4, low4);
      q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
    }
  }
  static void scales(const BX& x, int32_t sc[16], int32_t mn[16]) { scales_and_mins_32(x.scales, sc, mn); }
  static float d(const BX& x) { return fp16_to_fp32(x.d); }
  static float dmin(const BX& x) { return fp16_to_fp32(x.dmin); }

  template <int C, typename Y>
  static void sums(const BX& x, const Y* const y[C], int64_t b, __m256i sumi[C], __m256i min_sums[C]) {
    // Words scales 0-3, mins 0-3 | scales 4-7, mins 4-7, then each duplicated into a 32-bit pair.
    const ScalesMins sm = unpack_scales_mins(x.scales);
    const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_set_epi64x(static_cast<long long>(sm.second), static_cast<long long>(sm.first)));
    const __m256i scale_pairs = _mm256_unpacklo_epi16(sm16, sm16);  // scales 0-3 | scales 4-7
    const __m256i min_pairs = _mm256_unpackhi_epi16(sm16, sm16);    // mins 0-3 | mins 4-7

    // Mins: min j against bsums 2j and 2j + 1.
    for (int c = 0; c < C; ++c)
      min_sums[c] = _mm256_madd_epi16(min_pairs, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].bsums)));

    // Scales in both lanes; scale j is broadcast by a dword shuffle.
    const __m256i scales_0123 = _mm256_permute2x128_si256(scale_pairs, scale_pairs, 0x00);
    const __m256i scales_4567 = _mm256_permute2x128_si256(scale_pairs, scale_pairs, 0x11);
    __m256i q[8];
    quants(x, q);
    for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
    auto chunk = [&](int k, __m256i scale_lo, __m256i scale_hi) {
      const __m256i lo = q[2 * k], hi = q[2 * k + 1];
      for (int c = 0; c < C; ++c) {
        const __m256i qy_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].qs + 64 * k));
        const __m256i qy_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].qs + 64 * k + 32));
        const __m256i p_lo = _mm256_maddubs_epi16(lo, qy_lo);
        const __m256i p_hi = _mm256_maddubs_epi16(hi, qy_hi);
        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(p_lo, scale_lo), _mm256_madd_epi16(p_hi, scale_hi)));
      }
    };
    chunk(0, _mm256_shuffle_epi32(scales_0123, 0x00), _mm256_shuffle_epi32(scales_0123, 0x55));
    chunk(1, _mm256_shuffle_epi32(scales_0123, 0xAA), _mm256_shuffle_epi32(scales_0123, 0xFF));
    chunk(2, _mm256_shuffle_epi32(scales_4567, 0x00), _mm256_shuffle_epi32(scales_4567, 0x55));
    chunk(3, _mm256_shuffle_epi32(scales_4567, 0xAA), _mm256_shuffle_epi32(scales_4567, 0xFF));
  }
};
#endif

void vec_dot_q4_k_q8_k(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q4_K* x = static_cast<const block_q4_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / QK_K;
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t scales[8], mins[8];
    unpack_scales_mins(x[b].scales, scales, mins);
    int scaled = 0, offset = 0;
    for (int c = 0; c < QK_K / 64; ++c) {
      const uint8_t* q = x[b].qs + 32 * c;
      const int8_t* qy = y[b].qs + 64 * c;
      int dot_lo = 0, dot_hi = 0;
      for (int l = 0; l < 32; ++l) {
        dot_lo += (q[l] & 0x0F) * qy[l];
        dot_hi += (q[l] >> 4) * qy[32 + l];
      }
      scaled += scales[2 * c] * dot_lo + scales[2 * c + 1] * dot_hi;
    }
    for (int j = 0; j < 8; ++j) offset += mins[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    sum += y[b].d * (fp16_to_fp32(x[b].d) * scaled - fp16_to_fp32(x[b].dmin) * offset);
  }
  *out = sum;
}

}  // namespace

void register_q4_k(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q4_K)] = {GGMLType::Q8_K, dequantize_row_q4_k, quantize_row_q4_k,
                                               vec_dot_q4_k_q8_k};
#if defined(__AVX2__)
  t.types[static_cast<int>(GGMLType::Q4_K)].vec_dot = vec_dot_k_tile<Q4KTile>;
  t.types[static_cast<int>(GGMLType::Q4_K)].dequantize_row = dequantize_row_k<Q4KTile>;
  t.types[static_cast<int>(GGMLType::Q4_K)].gemm_tile = gemm_tile_k<Q4KTile>;
#endif
#if defined(EMBER_HAS_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q4_K)].gemm_panel = k_panel_kernel_for<Q4KTile>();
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
