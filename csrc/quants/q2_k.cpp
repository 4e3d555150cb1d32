// Q2_K: 256 weights in 16 sub-blocks of 16, dotted with Q8_K activations.
// scales[s]: low nibble the scale, high nibble the min of sub-block s; value = d sc q - dmin m.
// qs holds 2-bit q: the 128 values of half h come from qs[32 h .. 32 h + 31], values
// 128 h + 32 j + i are bits 2 j .. 2 j + 1 of byte 32 h + i (i < 32, j < 4).
// Dot: d dy sum_s sc_s sum(q qy) - dmin dy sum_s m_s bsums_s (Q8_K's bsums carry the min term).
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

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) {
  const block_q2_K* x = static_cast<const block_q2_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    float* out = dst + b * QK_K;
    for (int s = 0; s < QK_K / 16; ++s) {
      const float scale = d * (x[b].scales[s] & 0x0F), min = dmin * (x[b].scales[s] >> 4);
      const uint8_t* qs = x[b].qs + 32 * (s / 8) + 16 * (s % 2);
      const int shift = 2 * ((s % 8) / 2);
      for (int i = 0; i < 16; ++i) out[16 * s + i] = scale * ((qs[i] >> shift) & 3) - min;
    }
  }
}

#if defined(__AVX2__)
// d dy sum_s sc_s sum(q qy) - dmin dy sum_s m_s bsums_s for one weight super-block and C
// activation blocks, in avx2_k_tile.h's order. Each 2-bit plane is unpacked once for all C.
struct Q2KTile {
  using BX = block_q2_K;
  using BY = block_q8_K;
  static constexpr int kSub = 16, kZeroShift = -1;
  static constexpr bool kMins = true;
  static constexpr int kQuantMax = 3;  // the largest unsigned quant
  // The 256 quants (0..3) as bytes, 32 per vector in element order.
  static void quants(const BX& x, __m256i q[8]) {
    for (int h = 0; h < 2; ++h) {
      const __m256i q2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * h));
      for (int j = 0; j < 4; ++j) q[4 * h + j] = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * j), _mm256_set1_epi8(3));
    }
  }
  static void scales(const BX& x, int32_t sc[16], int32_t mn[16]) {
    for (int s = 0; s < 16; ++s) sc[s] = x.scales[s] & 0x0F, mn[s] = x.scales[s] >> 4;
  }
  static float d(const BX& x) { return fp16_to_fp32(x.d); }
  static float dmin(const BX& x) { return fp16_to_fp32(x.dmin); }
  template <int C, typename Y>
  static void sums(const BX& x, const Y* const y[C], int64_t b, __m256i sum[C], __m256i min_sums[C]) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m256i scales = _mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(0x0F)));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F)));
    for (int c = 0; c < C; ++c) {
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].bsums));
      min_sums[c] = _mm256_madd_epi16(mins, bsums);
      sum[c] = _mm256_setzero_si256();
    }
    __m256i q[8];
    quants(x, q);
    for (int v = 0; v < 8; ++v) add_scaled_dots<C>(sum, q[v], scales_for_32(scales, v), y, b, 32 * v);
  }
};
#endif

void vec_dot_q2_k_q8_k(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q2_K* x = static_cast<const block_q2_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / QK_K;
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0, imin = 0;
    for (int s = 0; s < QK_K / 16; ++s) {
      const uint8_t* qs = x[b].qs + 32 * (s / 8) + 16 * (s % 2);
      const int8_t* qy = y[b].qs + 16 * s;
      const int shift = 2 * ((s % 8) / 2);
      int dot = 0;
      for (int i = 0; i < 16; ++i) dot += ((qs[i] >> shift) & 3) * qy[i];
      isum += (x[b].scales[s] & 0x0F) * dot;
      imin += (x[b].scales[s] >> 4) * y[b].bsums[s];
    }
    sum += y[b].d * (fp16_to_fp32(x[b].d) * isum - fp16_to_fp32(x[b].dmin) * imin);
  }
  *out = sum;
}

EMBER_EXACT_FP_BEGIN

// ggml's quantize_row_q2_K_ref: scale and min per sub-block of 16 (levels 0..3) from the weighted
// search with weights |x| and absolute error; scales and mins quantized to 4 bits against the
// largest of each; the values re-quantized with the stored ones.
void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  block_q2_K* y = static_cast<block_q2_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    uint8_t L[QK_K];
    float weights[16], scales[QK_K / 16], mins[QK_K / 16];
    float max_scale = 0, max_min = 0;
    for (int s = 0; s < QK_K / 16; ++s) {
      for (int i = 0; i < 16; ++i) weights[i] = std::fabs(x[16 * s + i]);
      scales[s] = min_scale_search<true>(16, 3, x + 16 * s, weights, L + 16 * s, &mins[s], -0.5f, 0.1f, 15);
      if (scales[s] > max_scale) max_scale = scales[s];
      if (mins[s] > max_min) max_min = mins[s];
    }
    if (max_scale > 0) {
      const float iscale = 15.f / max_scale;
      for (int s = 0; s < QK_K / 16; ++s) y[b].scales[s] = static_cast<uint8_t>(nearest_int(iscale * scales[s]));
      y[b].d = fp32_to_fp16(max_scale / 15.f);
    } else {
      std::fill(y[b].scales, y[b].scales + QK_K / 16, uint8_t{0});
      y[b].d = fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = 15.f / max_min;
      for (int s = 0; s < QK_K / 16; ++s) y[b].scales[s] |= static_cast<uint8_t>(nearest_int(iscale * mins[s]) << 4);
      y[b].dmin = fp32_to_fp16(max_min / 15.f);
    } else {
      y[b].dmin = fp32_to_fp16(0.f);
    }
    for (int s = 0; s < QK_K / 16; ++s) {
      const float d = fp16_to_fp32(y[b].d) * (y[b].scales[s] & 0xF);
      if (d == 0.0f) continue;
      const float dm = fp16_to_fp32(y[b].dmin) * (y[b].scales[s] >> 4);
      for (int i = 0; i < 16; ++i)
        L[16 * s + i] = static_cast<uint8_t>(clamp_int(nearest_int((x[16 * s + i] + dm) / d), 0, 3));
    }
    pack_2bit_levels(L, y[b].qs);
  }
}

EMBER_EXACT_FP_END

}  // namespace

void register_q2_k(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q2_K)] = {GGMLType::Q8_K, dequantize_row_q2_k, quantize_row_q2_k,
                                               vec_dot_q2_k_q8_k};
#if defined(__AVX2__)
  t.types[static_cast<int>(GGMLType::Q2_K)].vec_dot = vec_dot_k_tile<Q2KTile>;
  t.types[static_cast<int>(GGMLType::Q2_K)].dequantize_row = dequantize_row_k<Q2KTile>;
  t.types[static_cast<int>(GGMLType::Q2_K)].gemm_tile = gemm_tile_k<Q2KTile>;
#endif
#if defined(EMBER_HAS_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q2_K)].gemm_panel = k_panel_kernel_for<Q2KTile>();
#elif defined(EMBER_HAS_AVX2_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q2_K)].gemm_panel = gemm_panel_k8<Q2KTile>;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
