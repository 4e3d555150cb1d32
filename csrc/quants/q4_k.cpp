// Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit
// min: value = d * scale_j * q - dmin * min_j, q a nibble. qs holds 4 chunks of 32 bytes; chunk c
// gives sub-block 2c (low nibbles) and 2c + 1 (high nibbles). Dotted with Q8_K activations:
// sum = dy (d sum_j scale_j sum(q qy) - dmin sum_j min_j sum(qy)), sum(qy) from the bsums.

#include <cstring>
#include <type_traits>

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
  static constexpr int kQuantMax = 15;  // the largest unsigned quant
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

#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
  // 64 quants a vector: the low (high) nibbles of 64 bytes of qs are sub-blocks 2c and 2c + 2
  // (2c + 1 and 2c + 3), so the Q8KLine copy holds the activations' sub-blocks in the order
  // 0, 2, 1, 3, 4, 6, 5, 7 (32 bytes each; bsums as they are).
  static void line(const block_q8_K& y, Q8KLine& l) {
    static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int i = 0; i < 8; ++i) std::memcpy(l.qs + 32 * i, y.qs + 32 * kOrder[i], 32);
    std::memcpy(l.bsums, y.bsums, sizeof(y.bsums));
  }
  // The activations for quant vector v (sub-blocks s, s + 2 with s = 0, 1, 4, 5 for v = 0 .. 3).
  template <typename Y>
  static __m512i activations(const Y& y, int v) {
    if constexpr (std::is_same_v<Y, Q8KLine>) {
      return _mm512_loadu_si512(y.qs + 64 * v);
    } else {
      const int s = v < 2 ? v : v + 2;
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 32 * s));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 32 * s + 64));
      return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
  }

  // Each sub-block's 8 vpdpbusd sums of 4 products (|sum| <= 4 * 15 * 128, an int16) are packed
  // to words in pairs of vectors and multiplied by their scales with vpdpwssd. The scales and mins
  // come as words straight from the 12 packed bytes (k_scales.h's layout) by byte shuffles, shifts
  // and bitwise selects: scale j < 4 is byte j & 63, scale j >= 4 (byte j + 4 & 15) | (byte j - 4
  // >> 6) << 4; min j < 4 byte j + 4 & 63, min j >= 4 (byte j + 4 >> 4) | (byte j >> 6) << 4.
  template <int C, typename Y>
  static void sums(const BX& x, const Y* const y[C], int64_t b, __m256i sumi[C], __m256i min_sums[C]) {
    // Byte shuffles (per 128-bit lane; Z gives 0) of the 16-byte load at x.scales in every lane.
    // packs(r0, r1) holds, per 128-bit lane, 4 sums of sub-block A then 4 of B: A, B = 0, 1 in
    // lanes 0-1 and 2, 3 in lanes 2-3 (4, 5 and 6, 7 for packs(r2, r3)): scales j < 4 as words
    // (byte j, Z), scales j >= 4 as (byte j + 4, byte j - 4). Min j goes to words 2j, 2j + 1
    // (against bsums 2j, 2j + 1), as (byte j + 4, Z) for j < 4, (byte j + 4, byte j) for j >= 4.
    constexpr int8_t Z = -128;
    alignas(64) static constexpr int8_t kScales0123[64] = {
        0, Z, 0, Z, 0, Z, 0, Z, 1, Z, 1, Z, 1, Z, 1, Z, 0, Z, 0, Z, 0, Z, 0, Z, 1, Z, 1, Z, 1, Z, 1, Z,
        2, Z, 2, Z, 2, Z, 2, Z, 3, Z, 3, Z, 3, Z, 3, Z, 2, Z, 2, Z, 2, Z, 2, Z, 3, Z, 3, Z, 3, Z, 3, Z};
    alignas(64) static constexpr int8_t kScales4567[64] = {
        8, 0, 8, 0, 8, 0, 8, 0, 9, 1, 9, 1, 9, 1, 9, 1, 8, 0, 8, 0, 8, 0, 8, 0, 9, 1, 9, 1, 9, 1, 9, 1,
        10, 2, 10, 2, 10, 2, 10, 2, 11, 3, 11, 3, 11, 3, 11, 3, 10, 2, 10, 2, 10, 2, 10, 2, 11, 3, 11, 3, 11, 3, 11, 3};
    alignas(32) static constexpr int8_t kMins[32] = {4, Z, 4, Z, 5, Z, 5, Z, 6, Z, 6, Z, 7, Z, 7, Z,
                                                     8, 4, 8, 4, 9, 5, 9, 5, 10, 6, 10, 6, 11, 7, 11, 7};
    const __m512i raw = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m512i scales_0123 =
        _mm512_and_si512(_mm512_shuffle_epi8(raw, _mm512_load_si512(kScales0123)), _mm512_set1_epi16(0x003F));
    const __m512i w4567 = _mm512_shuffle_epi8(raw, _mm512_load_si512(kScales4567));
    // (w & 15) | (w >> 10 & 0x30): a bitwise select (0xCA: a ? b : c) under the mask 0x000F.
    const __m512i scales_4567 = _mm512_ternarylogic_epi32(_mm512_set1_epi16(0x000F), w4567, _mm512_srli_epi16(w4567, 10), 0xCA);
    const __m256i wm = _mm256_shuffle_epi8(_mm512_castsi512_si256(raw), _mm256_load_si256(reinterpret_cast<const __m256i*>(kMins)));
    // Mins j < 4: w & 63; j >= 4: (w >> 4 & 15) | (w >> 10 & 0x30).
    const __m256i mins = _mm256_ternarylogic_epi32(
        _mm256_set_epi16(15, 15, 15, 15, 15, 15, 15, 15, 63, 63, 63, 63, 63, 63, 63, 63),
        _mm256_srlv_epi16(wm, _mm256_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0)),
        _mm256_srli_epi16(wm, 10), 0xCA);

    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i q01 = _mm512_loadu_si512(x.qs), q23 = _mm512_loadu_si512(x.qs + 64);
    const __m512i q[4] = {_mm512_and_si512(q01, low4), _mm512_and_si512(_mm512_srli_epi16(q01, 4), low4),
                          _mm512_and_si512(q23, low4), _mm512_and_si512(_mm512_srli_epi16(q23, 4), low4)};
    for (int c = 0; c < C; ++c) {
      const Y& yb = y[c][b];
      __m512i r[4];
      for (int v = 0; v < 4; ++v) r[v] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[v], activations(yb, v));
      const __m512i acc = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_packs_epi32(r[0], r[1]), scales_0123),
                                              _mm512_packs_epi32(r[2], r[3]), scales_4567);
      sumi[c] = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
      min_sums[c] = _mm256_madd_epi16(mins, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb.bsums)));
    }
  }
#else
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
#endif
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
#elif defined(EMBER_HAS_AVX2_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q4_K)].gemm_panel = gemm_panel_k8<Q4KTile>;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
