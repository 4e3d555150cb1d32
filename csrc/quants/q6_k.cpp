// Q6_K: super-blocks of 256 weights in 16 sub-blocks of 16, each with an int8 scale:
// value = d * scale_j * (q - 32), q six bits. Each half h of the block (128 weights) takes
// 64 bytes of ql (low 4 bits) and 32 bytes of qh (top 2 bits): for l < 32, ql[l] gives
// elements l (low nibble) and l + 64 (high nibble), ql[l + 32] elements l + 32 and l + 96, and
// qh[l] bits 2k..2k+1 are the top bits of element l + 32 k. Dotted with Q8_K activations:
// sum = d dy sum_j scale_j (sum(q qy) - 32 sum(qy)), sum(qy) from the bsums.
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

// The 128 values of half a block, 0..63, in element order.
inline void unpack_q6_half(const uint8_t* ql, const uint8_t* qh, int q[128]) {
  for (int l = 0; l < 32; ++l) {
    q[l] = (ql[l] & 0x0F) | ((qh[l] & 0x03) << 4);
    q[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 0x03) << 4);
    q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 0x03) << 4);
    q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 0x03) << 4);
  }
}

void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
  const block_q6_K* x = static_cast<const block_q6_K*>(src);
  int q[128];
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int h = 0; h < 2; ++h) {
      unpack_q6_half(x[b].ql + 64 * h, x[b].qh + 32 * h, q);
      for (int i = 0; i < 128; ++i) dst[b * QK_K + 128 * h + i] = d * x[b].scales[8 * h + i / 16] * (q[i] - 32);
    }
  }
}

#if defined(__AVX2__)
// int16 scales for a half block in both lanes -> lane 0 holds scale k, lane 1 scale k + 1, in
// every word: the scales for the 32 values of one chunk (two sub-blocks of 16).
inline __m256i pick_scale_pair(__m256i scales, int k) {
  const __m128i lo = _mm_set1_epi16(static_cast<short>(0x0100 + 0x0202 * k));
  const __m128i hi = _mm_set1_epi16(static_cast<short>(0x0100 + 0x0202 * (k + 1)));
  return _mm256_shuffle_epi8(scales, _mm256_set_m128i(hi, lo));
}

// d dy sum_j scale_j (sum(q qy) - 32 sum(qy)) for one weight super-block and C activation
// blocks, in avx2_k_tile.h's order. Each half block is unpacked once for all C.
struct Q6KTile {
  using BX = block_q6_K;
  using BY = block_q8_K;
  static constexpr int kSub = 16, kZeroShift = 5;  // z = 32
  static constexpr bool kMins = false;
  static constexpr int kQuantMax = 63;  // the largest unsigned quant
  // The 256 quants (0..63) as bytes, 32 per vector in element order.
  static void quants(const BX& x, __m256i q[8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x.ql + 64 * h;
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh + 32 * h));
      // Bits 2k..2k+1 of qh moved to bits 4..5 (16-bit shifts: the mask drops what crosses bytes).
      q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2));
      q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2));
      q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, top2));
      q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                     _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2));
    }
  }
  static void scales(const BX& x, int32_t sc[16], int32_t*) {
    for (int s = 0; s < 16; ++s) sc[s] = x.scales[s];
  }
  static float d(const BX& x) { return fp16_to_fp32(x.d); }
  static float dmin(const BX&) { return 0.0f; }
#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
  // 64 quants a vector, elements 64 v .. 64 v + 63: the low (v even) or high nibbles of 64 bytes
  // of ql, with the top bits from the half block's 32 bytes of qh in both 256-bit halves, moved to
  // bits 4..5 by word shifts of 4, 2 (v even) or 0, -2 (v odd) bits. Each vpdpbusd sum of 4 products
  // (|sum| <= 4 * 63 * 128, an int16) is packed to words in pairs of vectors: per 128-bit lane L,
  // 4 sums of sub-block L (8 + L) then 4 of 4 + L (12 + L), against their scales as words
  // (a shuffle puts scale bytes in the words' high bytes, an arithmetic shift extends them).
  template <int C, typename Y>
  static void sums(const BX& x, const Y* const y[C], int64_t b, __m256i sumi[C], __m256i*) {
    constexpr int8_t Z = -128;  // a shuffle index giving 0
    alignas(64) static constexpr int8_t kScales0[64] = {
        Z, 0, Z, 0, Z, 0, Z, 0, Z, 4, Z, 4, Z, 4, Z, 4, Z, 1, Z, 1, Z, 1, Z, 1, Z, 5, Z, 5, Z, 5, Z, 5,
        Z, 2, Z, 2, Z, 2, Z, 2, Z, 6, Z, 6, Z, 6, Z, 6, Z, 3, Z, 3, Z, 3, Z, 3, Z, 7, Z, 7, Z, 7, Z, 7};
    alignas(64) static constexpr int8_t kScales1[64] = {
        Z, 8, Z, 8, Z, 8, Z, 8, Z, 12, Z, 12, Z, 12, Z, 12, Z, 9, Z, 9, Z, 9, Z, 9, Z, 13, Z, 13, Z, 13, Z, 13,
        Z, 10, Z, 10, Z, 10, Z, 10, Z, 14, Z, 14, Z, 14, Z, 14, Z, 11, Z, 11, Z, 11, Z, 11, Z, 15, Z, 15, Z, 15, Z, 15};
    const __m128i scale_bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m512i raw = _mm512_broadcast_i32x4(scale_bytes);
    const __m512i scales0 = _mm512_srai_epi16(_mm512_shuffle_epi8(raw, _mm512_load_si512(kScales0)), 8);
    const __m512i scales1 = _mm512_srai_epi16(_mm512_shuffle_epi8(raw, _mm512_load_si512(kScales1)), 8);
    const __m256i scales16 = _mm256_cvtepi8_epi16(scale_bytes);

    const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
    const __m512i shift_even = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shift_odd = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m512i q[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(x.ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh + 32 * h)));
      // top2 ? shifted qh : nibble (a bitwise select, 0xCA).
      q[2 * h] = _mm512_ternarylogic_epi32(top2, _mm512_sllv_epi16(qh, shift_even), _mm512_and_si512(ql, low4), 0xCA);
      q[2 * h + 1] = _mm512_ternarylogic_epi32(top2, _mm512_srlv_epi16(qh, shift_odd),
                                               _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), 0xCA);
    }
    for (int c = 0; c < C; ++c) {
      const Y& yb = y[c][b];
      __m512i r[4];
      for (int v = 0; v < 4; ++v) r[v] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[v], _mm512_loadu_si512(yb.qs + 64 * v));
      const __m512i acc = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_packs_epi32(r[0], r[1]), scales0),
                                              _mm512_packs_epi32(r[2], r[3]), scales1);
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb.bsums));
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, scales16), 5);  // 32 scale_j sum(qy)
      sumi[c] = _mm256_sub_epi32(_mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1)), offset);
    }
  }
#else
  template <int C, typename Y>
  static void sums(const BX& x, const Y* const y[C], int64_t b, __m256i sumi[C], __m256i*) {
    const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
    __m256i q[8];
    quants(x, q);
    for (int h = 0; h < 2; ++h) {
      const __m256i scales = _mm256_permute2x128_si256(scales16, scales16, h == 0 ? 0x00 : 0x11);
      for (int k = 0; k < 4; ++k) {
        const __m256i scale = pick_scale_pair(scales, 2 * k);
        for (int c = 0; c < C; ++c) {
          const __m256i qyk = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].qs + 128 * h + 32 * k));
          sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(_mm256_maddubs_epi16(q[4 * h + k], qyk), scale));
        }
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].bsums));
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, scales16), 5);  // 32 scale_j sum(qy)
      sumi[c] = _mm256_sub_epi32(sumi[c], offset);
    }
  }
#endif
};
#endif

void vec_dot_q6_k_q8_k(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q6_K* x = static_cast<const block_q6_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / QK_K;
  float sum = 0.0f;
  int q[128];
  for (int64_t b = 0; b < nb; ++b) {
    int scaled = 0;
    for (int h = 0; h < 2; ++h) {
      unpack_q6_half(x[b].ql + 64 * h, x[b].qh + 32 * h, q);
      for (int j = 0; j < 8; ++j) {
        int dot = 0;
        for (int i = 0; i < 16; ++i) dot += (q[16 * j + i] - 32) * y[b].qs[128 * h + 16 * j + i];
        scaled += x[b].scales[8 * h + j] * dot;
      }
    }
    sum += y[b].d * fp16_to_fp32(x[b].d) * scaled;
  }
  *out = sum;
}

EMBER_EXACT_FP_BEGIN

// ggml's quantize_row_q6_K_ref: a symmetric scale per sub-block of 16 (levels -32..31), the 16
// scales quantized to int8 against the one of largest magnitude (which maps to -128), then the
// values re-quantized with the stored scales.
void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  block_q6_K* y = static_cast<block_q6_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      scales[j] = symmetric_scale(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs_scale) max_abs_scale = std::fabs(scales[j]), max_scale = scales[j];
    }
    if (max_abs_scale < kGroupMaxEps) {
      y[b] = block_q6_K{};
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[b].d = fp32_to_fp16(1 / iscale);
    for (int j = 0; j < QK_K / 16; ++j)
      y[b].scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = fp16_to_fp32(y[b].d) * y[b].scales[j];
      if (d == 0.0f) continue;
      for (int i = 0; i < 16; ++i)
        L[16 * j + i] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
    }
    // Half h: ql[64 h + l] = element 128 h + l (low nibble) and + 64 (high), ql[64 h + 32 + l] the
    // same for + 32 and + 96; qh[32 h + l] holds the top 2 bits of elements 128 h + l + 32 k at bit 2 k.
    for (int h = 0; h < 2; ++h) {
      const int8_t* q = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        y[b].ql[64 * h + l] = static_cast<uint8_t>((q[l] & 0xF) | (q[l + 64] & 0xF) << 4);
        y[b].ql[64 * h + 32 + l] = static_cast<uint8_t>((q[l + 32] & 0xF) | (q[l + 96] & 0xF) << 4);
        y[b].qh[32 * h + l] = static_cast<uint8_t>(q[l] >> 4 | (q[l + 32] >> 4) << 2 | (q[l + 64] >> 4) << 4 |
                                                    (q[l + 96] >> 4) << 6);
      }
    }
  }
}

EMBER_EXACT_FP_END

}  // namespace

void register_q6_k(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q6_K)] = {GGMLType::Q8_K, dequantize_row_q6_k, quantize_row_q6_k,
                                               vec_dot_q6_k_q8_k};
#if defined(__AVX2__)
  t.types[static_cast<int>(GGMLType::Q6_K)].vec_dot = vec_dot_k_tile<Q6KTile>;
  t.types[static_cast<int>(GGMLType::Q6_K)].dequantize_row = dequantize_row_k<Q6KTile>;
  t.types[static_cast<int>(GGMLType::Q6_K)].gemm_tile = gemm_tile_k<Q6KTile>;
#endif
#if defined(EMBER_HAS_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q6_K)].gemm_panel = k_panel_kernel_for<Q6KTile>();
#elif defined(EMBER_HAS_AVX2_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q6_K)].gemm_panel = gemm_panel_k8<Q6KTile>;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
