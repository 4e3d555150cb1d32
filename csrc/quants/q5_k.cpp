// Q5_K: 256 weights in 8 sub-blocks of 32, dotted with Q8_K activations; value = d sc q - dmin m.
// q (0..31) = low nibble | high bit << 4. Sub-block 2 c takes the low nibbles of qs[32 c .. 32 c + 31],
// sub-block 2 c + 1 their high nibbles; the high bit of value 32 s + i is bit s of qh[i].
// The 8 six-bit scales sc and mins m are packed in 12 bytes as Q4_K's (see k_scales.h).
// Dot: d dy sum_s sc_s sum(q qy) - dmin dy sum_s m_s (bsums_2s + bsums_2s+1).

#include "core/fp16.h"
#include "core/kernels.h"
#include "quants/k_scales.h"
#include "quants/x86/avx512_k_panel.h"
#include "quants/x86/avx2_k_panel.h"
#include "quants/x86/avx2_k_tile.h"
#include "quants/x86/avx2_simd.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

// q of value 32 s + i (0..31).
inline int q5(const block_q5_K& x, int s, int i) {
  const int low = (x.qs[32 * (s / 2) + i] >> (4 * (s % 2))) & 0x0F;
  return low | (((x.qh[i] >> s) & 1) << 4);
}

void dequantize_row_q5_k(const void* src, float* dst, int64_t n) {
  const block_q5_K* x = static_cast<const block_q5_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    uint8_t sc[8], m[8];
    unpack_scales_mins(x[b].scales, sc, m);
    float* out = dst + b * QK_K;
    for (int s = 0; s < 8; ++s) {
      const float scale = d * sc[s], min = dmin * m[s];
      for (int i = 0; i < 32; ++i) out[32 * s + i] = scale * q5(x[b], s, i) - min;
    }
  }
}

#if defined(__AVX2__)
// d dy sum_s sc_s sum(q qy) - dmin dy sum_s m_s sum(qy) for one weight super-block and C
// activation blocks, in avx2_k_tile.h's order. Each sub-block is unpacked once for all C.
struct Q5KTile {
  using BX = block_q5_K;
  using BY = block_q8_K;
  static constexpr int kSub = 32, kZeroShift = -1;
  static constexpr bool kMins = true;
  static constexpr int kQuantMax = 31;  // the largest unsigned quant
  // The 256 quants (0..31) as bytes, sub-block s in q[s].
  static void quants(const BX& x, __m256i q[8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh));
    for (int k = 0; k < 4; ++k) {
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * k));
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * k + half;
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q4, 4 * half), low4);
        q[s] = _mm256_or_si256(low, _mm256_and_si256(move_bit(qh, s, 4), bit4));
      }
    }
  }
  static void scales(const BX& x, int32_t sc[16], int32_t mn[16]) { scales_and_mins_32(x.scales, sc, mn); }
  static float d(const BX& x) { return fp16_to_fp32(x.d); }
  static float dmin(const BX& x) { return fp16_to_fp32(x.dmin); }
  template <int C, typename Y>
  static void sums(const BX& x, const Y* const y[C], int64_t b, __m256i sum[C], __m256i min_sums[C]) {
    const ScalesMins sm = unpack_scales_mins(x.scales);
    // Scales and mins as int16: the 8 scales in both 128-bit halves, each min twice (against the
    // two 16-value bsums of its sub-block).
    const __m128i scales8 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(scale_bytes(sm))));
    const __m128i mins8 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(min_bytes(sm))));
    const __m256i scales = _mm256_set_m128i(scales8, scales8);
    const __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(mins8, mins8), _mm_unpacklo_epi16(mins8, mins8));
    for (int c = 0; c < C; ++c) {
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].bsums));
      min_sums[c] = _mm256_madd_epi16(mins, bsums);
      sum[c] = _mm256_setzero_si256();
    }
    __m256i q[8];
    quants(x, q);
    for (int s = 0; s < 8; ++s) {
      const __m256i scale = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * s)));
      add_scaled_dots<C>(sum, q[s], scale, y, b, 32 * s);
    }
  }
};
#endif

void vec_dot_q5_k_q8_k(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q5_K* x = static_cast<const block_q5_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / QK_K;
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t sc[8], m[8];
    unpack_scales_mins(x[b].scales, sc, m);
    int isum = 0, imin = 0;
    for (int s = 0; s < 8; ++s) {
      const int8_t* qy = y[b].qs + 32 * s;
      int dot = 0;
      for (int i = 0; i < 32; ++i) dot += q5(x[b], s, i) * qy[i];
      isum += sc[s] * dot;
      imin += m[s] * (y[b].bsums[2 * s] + y[b].bsums[2 * s + 1]);
    }
    sum += y[b].d * (fp16_to_fp32(x[b].d) * isum - fp16_to_fp32(x[b].dmin) * imin);
  }
  *out = sum;
}

EMBER_EXACT_FP_BEGIN

// ggml's quantize_row_q5_K_ref: as Q4_K (see q4_k.cpp) with levels 0..31, the fifth bit in qh.
void quantize_row_q5_k(const float* src, void* dst, int64_t n) {
  block_q5_K* y = static_cast<block_q5_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    uint8_t L[QK_K];
    float scales[8], mins[8];
    sub_block_scales_k(x, 31, -0.5f, 15, L, scales, mins);
    pack_scales_mins_k(scales, mins, y[b].scales, y[b].d, y[b].dmin);
    levels_for_packed_scales_k(x, y[b].scales, y[b].d, y[b].dmin, 31, L);
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int s = 0; s < 8; ++s) {
      for (int i = 0; i < 32; ++i) {
        const uint8_t q = L[32 * s + i];
        y[b].qh[i] |= static_cast<uint8_t>((q >> 4) << s);
        if (s % 2 == 0) y[b].qs[32 * (s / 2) + i] = q & 0x0F;
        else y[b].qs[32 * (s / 2) + i] |= static_cast<uint8_t>((q & 0x0F) << 4);
      }
    }
  }
}

EMBER_EXACT_FP_END

}  // namespace

void register_q5_k(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q5_K)] = {GGMLType::Q8_K, dequantize_row_q5_k, quantize_row_q5_k,
                                               vec_dot_q5_k_q8_k};
#if defined(__AVX2__)
  t.types[static_cast<int>(GGMLType::Q5_K)].vec_dot = vec_dot_k_tile<Q5KTile>;
  t.types[static_cast<int>(GGMLType::Q5_K)].dequantize_row = dequantize_row_k<Q5KTile>;
  t.types[static_cast<int>(GGMLType::Q5_K)].gemm_tile = gemm_tile_k<Q5KTile>;
#endif
#if defined(EMBER_HAS_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q5_K)].gemm_panel = k_panel_kernel_for<Q5KTile>();
#elif defined(EMBER_HAS_AVX2_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q5_K)].gemm_panel = gemm_panel_k8<Q5KTile>;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
