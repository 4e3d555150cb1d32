// IQ4_NL and IQ4_XS: 4-bit indices into one fixed non-linear table of 16 int8 values
// (kValues, ggml-common.h kvalues_iq4nl), nibbles packed as in Q4_0: qs[j] low nibble is element
// j of a group of 32, high nibble element j + 16.
// IQ4_NL: blocks of 32, value = d * kValues[i], dotted with Q8_0 activations.
// IQ4_XS: super-blocks of 256 in 8 sub-blocks of 32, each with a 6-bit scale ls_j (low 4 bits:
// nibble j of scales_l, top 2 bits: bits 2j..2j+1 of scales_h): value = d (ls_j - 32) kValues[i],
// dotted with Q8_K activations: sum = dy d sum_j (ls_j - 32) sum(kValues[i] qy).
// The SIMD kernels take the values either signed (the AVX2 dot products, with the sign moved
// onto the activations) or as unsigned bytes kValues[i] + 128 with the zero point 128 taken off
// the integer sums (vpdpbusd); both give the same exact integer sums.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/fp16.h"
#include "core/kernels.h"
#include "quants/exact_fp.h"
#include "quants/k_scales.h"
#include "quants/x86/avx2_k_panel.h"
#include "quants/x86/avx512_k_panel.h"
#include "quants/x86/avx2_panel.h"
#include "quants/x86/avx512_panel.h"
#include "quants/x86/avx2_k_tile.h"
#include "quants/x86/avx2_simd.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

alignas(16) constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
alignas(16) constexpr uint8_t kUnsignedValues[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

// The 8 biased sub-block scales ls_j of an IQ4_XS super-block, byte j of the result: nibble j of
// scales_l and bit pair j of scales_h spread to one byte each by shifts and masks.
inline uint64_t iq4_xs_biased_scales(const block_iq4_xs& x) {
  uint32_t low32;
  std::memcpy(&low32, x.scales_l, 4);
  uint64_t low = low32, high = x.scales_h;
  low = (low | low << 16) & 0x0000FFFF0000FFFFULL;
  low = (low | low << 8) & 0x00FF00FF00FF00FFULL;
  low = (low | low << 4) & 0x0F0F0F0F0F0F0F0FULL;
  high = (high | high << 24) & 0x000000FF000000FFULL;
  high = (high | high << 12) & 0x000F000F000F000FULL;
  high = (high | high << 6) & 0x0303030303030303ULL;
  return low | high << 4;
}

// The same, bias removed (-32..31).
inline void iq4_xs_scales(const block_iq4_xs& x, int scales[8]) {
  const uint64_t biased = iq4_xs_biased_scales(x);
  for (int j = 0; j < 8; ++j) scales[j] = static_cast<int>((biased >> 8 * j) & 0xFF) - 32;
}

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
  const block_iq4_nl* x = static_cast<const block_iq4_nl*>(src);
  for (int64_t b = 0; b < n / QK4_NL; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < QK4_NL / 2; ++j) {
      dst[b * QK4_NL + j] = d * kValues[x[b].qs[j] & 0x0F];
      dst[b * QK4_NL + j + QK4_NL / 2] = d * kValues[x[b].qs[j] >> 4];
    }
  }
}

void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
  const block_iq4_xs* x = static_cast<const block_iq4_xs*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    int scales[8];
    iq4_xs_scales(x[b], scales);
    float* out = dst + b * QK_K;
    for (int s = 0; s < 8; ++s) {
      const float dl = d * scales[s];
      const uint8_t* qs = x[b].qs + 16 * s;
      for (int j = 0; j < 16; ++j) {
        out[32 * s + j] = dl * kValues[qs[j] & 0x0F];
        out[32 * s + j + 16] = dl * kValues[qs[j] >> 4];
      }
    }
  }
}

void vec_dot_iq4_nl_q8_0(int64_t n, float* out, const void* vx, const void* vy) {
  const block_iq4_nl* x = static_cast<const block_iq4_nl*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / QK4_NL; ++b) {
    int isum = 0;
    for (int j = 0; j < QK4_NL / 2; ++j) {
      isum += kValues[x[b].qs[j] & 0x0F] * y[b].qs[j];
      isum += kValues[x[b].qs[j] >> 4] * y[b].qs[j + QK4_NL / 2];
    }
    sum += isum * fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d);
  }
  *out = sum;
}

void vec_dot_iq4_xs_q8_k(int64_t n, float* out, const void* vx, const void* vy) {
  const block_iq4_xs* x = static_cast<const block_iq4_xs*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    int scales[8];
    iq4_xs_scales(x[b], scales);
    int scaled = 0;
    for (int s = 0; s < 8; ++s) {
      const uint8_t* qs = x[b].qs + 16 * s;
      const int8_t* qy = y[b].qs + 32 * s;
      int dot = 0;
      for (int j = 0; j < 16; ++j) dot += kValues[qs[j] & 0x0F] * qy[j] + kValues[qs[j] >> 4] * qy[j + 16];
      scaled += scales[s] * dot;
    }
    sum += y[b].d * fp16_to_fp32(x[b].d) * scaled;
  }
  *out = sum;
}

EMBER_EXACT_FP_BEGIN

// ggml's best_index_int8 over kValues: the index of the table value nearest to x (the lower one
// on a tie), by bisection.
inline int nearest_value(float x) {
  if (x <= kValues[0]) return 0;
  if (x >= kValues[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < kValues[mid]) hi = mid;
    else lo = mid;
  }
  return x - kValues[hi - 1] < kValues[hi] - x ? hi - 1 : hi;
}

// The scale of a group of 32 values, as ggml's quantize_row_iq4_nl_impl chooses it without
// importance weights (what llama-quantize does when it has no imatrix): weights x^2, the start
// scale max / -127 (the largest magnitude on the table's most negative value), refined by least
// squares over the levels it gives, then 15 more starts (itry - 127) / max, itry = -7..7, each
// kept if its least-squares fit is better. 0 for a group whose largest magnitude is below
// kGroupMaxEps.
float group_scale(const float* x) {
  constexpr int kTries = 7;
  float weight[32];
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    weight[j] = x[j] * x[j];
    const float ax = std::fabs(x[j]);
    if (ax > amax) amax = ax, max = x[j];
  }
  if (amax < kGroupMaxEps) return 0.0f;
  auto fit = [&](float id, float& sumqx, float& sumq2) {
    sumqx = sumq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float q = kValues[nearest_value(id * x[j])];
      sumqx += weight[j] * q * x[j];
      sumq2 += weight[j] * q * q;
    }
  };
  float sumqx, sumq2;
  fit(1 / (-max / kValues[0]), sumqx, sumq2);
  float d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
  float best = d * sumqx;
  for (int itry = -kTries; itry <= kTries; ++itry) {
    fit((itry + kValues[0]) / max, sumqx, sumq2);
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

// Group g of 32 levels into 16 bytes: level j in the low nibble, level j + 16 in the high one.
inline void pack_levels(const uint8_t L[32], uint8_t qs[16]) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | L[j + 16] << 4);
}

// ggml's quantize_iq4_nl without importance weights: each block's scale from group_scale,
// stored as f16; the levels from the unrounded scale.
void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
  block_iq4_nl* y = static_cast<block_iq4_nl*>(dst);
  for (int64_t b = 0; b < n / QK4_NL; ++b) {
    const float* x = src + b * QK4_NL;
    const float d = group_scale(x);
    y[b].d = fp32_to_fp16(d);
    const float id = d != 0.0f ? 1 / d : 0.0f;
    uint8_t L[32];
    for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(nearest_value(id * x[j]));
    pack_levels(L, y[b].qs);
  }
}

// ggml's quantize_iq4_xs without importance weights: the 8 sub-block scales from group_scale,
// then d = -(the scale of largest magnitude) / 32, each sub-block's scale rounded to a multiple
// l of d in -32..31 (stored as l + 32), and its levels from the rounded scale d l (d unrounded).
void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
  block_iq4_xs* y = static_cast<block_iq4_xs*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    float scales[8];
    float max_scale = 0.0f, amax_scale = 0.0f;
    for (int s = 0; s < 8; ++s) {
      scales[s] = group_scale(x + 32 * s);
      if (std::fabs(scales[s]) > amax_scale) amax_scale = std::fabs(scales[s]), max_scale = scales[s];
    }
    const float d = -max_scale / 32;
    y[b].d = fp32_to_fp16(d);
    y[b].scales_h = 0;
    const float id = d != 0.0f ? 1 / d : 0.0f;
    for (int s = 0; s < 8; ++s) {
      const int l = clamp_int(nearest_int(id * scales[s]), -32, 31);
      const float dl = d * l;
      const float idl = dl != 0.0f ? 1 / dl : 0.0f;
      uint8_t L[32];
      for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(nearest_value(idl * x[32 * s + j]));
      pack_levels(L, y[b].qs + 16 * s);
      const int biased = l + 32;
      if (s % 2 == 0) y[b].scales_l[s / 2] = static_cast<uint8_t>(biased & 0xF);
      else y[b].scales_l[s / 2] |= static_cast<uint8_t>((biased & 0xF) << 4);
      y[b].scales_h |= static_cast<uint16_t>((biased >> 4) << 2 * s);
    }
  }
}

EMBER_EXACT_FP_END

#if defined(__AVX2__)
// 256-bit vpdpbusd: the unsigned values (value + 128) meet the activations as they are.
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define EMBER_IQ4_VNNI 1
#endif

// The 32 values of a group of packed nibbles from a 16-entry byte table (in both 128-bit lanes).
inline __m256i lookup_32(const uint8_t* qs, __m256i table) { return _mm256_shuffle_epi8(table, unpack_nibbles_32(qs)); }
inline __m256i signed_table() { return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kValues))); }
inline __m256i unsigned_table() {
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kUnsignedValues)));
}

void dequantize_row_iq4_nl_avx2(const void* src, float* dst, int64_t n) {
  const block_iq4_nl* x = static_cast<const block_iq4_nl*>(src);
  const __m256i table = signed_table();
  for (int64_t b = 0; b < n / QK4_NL; ++b)
    store_block_f32_32(lookup_32(x[b].qs, table), _mm256_set1_ps(fp16_to_fp32(x[b].d)), _mm256_set1_ps(-0.0f),
                       dst + b * QK4_NL);
}

// avx2_panel.h's and avx512_panel.h's traits: signed values for the AVX2 dot products (SignedDot,
// as Q8_0's), unsigned ones with zero point 128 for vpdpbusd.
struct IQ4NLTile {
  using BX = block_iq4_nl;
  using BY = block_q8_0;
  static constexpr bool kOffset = false;
  static constexpr int kZeroShift = 7;  // unsigned as value + 128
  static __m256i unpack(const BX& b) { return lookup_32(b.qs, signed_table()); }
  static __m256i unpack_unsigned(const BX& b) { return lookup_32(b.qs, unsigned_table()); }
  // Nibbles (one per byte, 0..15) to signed values, for avx2_panel.h's rows8t_kernel.
  static __m256i values(__m256i nibbles) { return _mm256_shuffle_epi8(signed_table(), nibbles); }
#if defined(EMBER_HAS_PANELS)
  // Nibbles (one per byte, 0..15) to unsigned values, for unpack_transposed_16.
  static __m512i values_512(__m512i nibbles) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kUnsignedValues)));
    return _mm512_shuffle_epi8(table, nibbles);
  }
#endif
};

// avx2_k_tile.h's and avx512_k_panel.h's traits.
struct IQ4XSTile {
  using BX = block_iq4_xs;
  using BY = block_q8_K;
  static constexpr int kSub = 32, kZeroShift = 7;  // unsigned as value + 128
  static constexpr int kQuantMax = 241;             // kUnsignedValues[15]
  static constexpr bool kMins = false;
  // Nibbles of sub-blocks 2k and 2k + 1 (one 32-byte load) -> the two sub-blocks' 32 nibbles each, in
  // element order.
  static void nibble_pair(const BX& x, int k, __m256i& first, __m256i& second) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * k));
    const __m256i lo = _mm256_and_si256(packed, low4), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    first = _mm256_permute2x128_si256(lo, hi, 0x20);
    second = _mm256_permute2x128_si256(lo, hi, 0x31);
  }
  static void quants(const BX& x, __m256i q[8]) {
    const __m256i table = unsigned_table();
    for (int k = 0; k < 4; ++k) {
      nibble_pair(x, k, q[2 * k], q[2 * k + 1]);
      q[2 * k] = _mm256_shuffle_epi8(table, q[2 * k]);
      q[2 * k + 1] = _mm256_shuffle_epi8(table, q[2 * k + 1]);
    }
  }
  static void scales(const BX& x, int32_t sc[16], int32_t*) {
    int s[8];
    iq4_xs_scales(x, s);
    for (int j = 0; j < 8; ++j) sc[j] = s[j];
  }
  static float d(const BX& x) { return fp16_to_fp32(x.d); }
  static float dmin(const BX&) { return 0.0f; }
  // The scales (-32..31) of sub-blocks 0, 2, 4, 6, 1, 3, 5, 7 in dwords 0..7 (the order of sums'
  // lanes): nibble s of scales_l and bit pair s of scales_h shifted into place lane by lane.
  static __m256i scales_even_odd(const BX& x) {
    uint32_t low;
    std::memcpy(&low, x.scales_l, 4);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(low)),
                                                          _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28)),
                                        _mm256_set1_epi32(0x0F));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x.scales_h << 4),
                                                          _mm256_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14)),
                                        _mm256_set1_epi32(0x30));
    return _mm256_sub_epi32(_mm256_or_si256(lo, hi), _mm256_set1_epi32(32));
  }
  // 16 bytes at p and 16 at p + 32 as one vector.
  static __m256i two_halves(const int8_t* p) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32)), 1);
  }
#if defined(EMBER_IQ4_VNNI)
  using Line = Q8KLine;
#else
  // Without VNNI the copy also holds the quants' magnitudes, mag[i] = |qs[i]| (see signed_sums).
  struct Line : Q8KLine {
    alignas(32) uint8_t mag[QK_K];
  };
#endif
  // gemm_tile_k's copy of an activation block: in each 64 quants, elements 0-15, 32-47, 16-31,
  // 48-63 (what the low and then the high nibbles of 32 packed bytes meet), and the bsums in the
  // order whose pair sums are the sums of sub-blocks 0, 2, 4, 6, 1, 3, 5, 7.
  static void line(const BY& src, Line& dst) {
    for (int k = 0; k < 4; ++k)
      for (int q = 0; q < 4; ++q) std::memcpy(dst.qs + 64 * k + 16 * q, src.qs + 64 * k + 16 * ((q % 2) * 2 + q / 2), 16);
    for (int j = 0; j < 8; ++j) {
      const int s = j < 4 ? 2 * j : 2 * (j - 4) + 1;
      dst.bsums[2 * j] = src.bsums[2 * s];
      dst.bsums[2 * j + 1] = src.bsums[2 * s + 1];
    }
#if !defined(EMBER_IQ4_VNNI)
    for (int i = 0; i < QK_K; i += 32) {
      const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(dst.qs + i));
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst.mag + i), _mm256_abs_epi8(q));
    }
#endif
  }
  // The activations of sub-blocks 2k and 2k + 1 (see sums) that meet their low and high nibbles.
  template <typename Y>
  static void activations(const Y& yb, int k, __m256i& y_lo, __m256i& y_hi) {
    if constexpr (std::is_same_v<Y, Line>) {
      y_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(yb.qs + 64 * k));
      y_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(yb.qs + 64 * k + 32));
    } else {
      y_lo = two_halves(yb.qs + 64 * k), y_hi = two_halves(yb.qs + 64 * k + 16);
    }
  }
  // sums without VNNI: one signed factor's magnitudes times the other with the first one's signs
  // (|value| <= 127, |qy| <= 128: vpmaddubsw's byte-pair sums fit in int16), each pair sum
  // multiplied by its sub-block's scale in vpmaddwd, so the lanes' totals are the scaled sums with
  // no reduction across lanes. From a Line the magnitudes are the activations' (mag), so only the
  // values take a sign; from a Q8_K block they are the values'.
  template <int C, typename Y>
  static void signed_sums(const BX& x, const Y* const y[C], int64_t b, __m256i sumi[C], __m256i table, __m256i low4) {
    // Word j of scales: sub-block j's scale; chunk k's multipliers: scale 2k in the low 128 bits,
    // scale 2k + 1 in the high.
    alignas(32) static constexpr int8_t kPick[4][32] = {
        {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
        {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
        {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
        {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
         14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15}};
    const __m128i biased = _mm_cvtsi64_si128(static_cast<long long>(iq4_xs_biased_scales(x)));
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_sub_epi8(biased, _mm_set1_epi8(32))));
    for (int c = 0; c < C; ++c) sumi[c] = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * k));
      const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(packed, low4));
      const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4));
      const __m256i scale = _mm256_shuffle_epi8(scales, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[k])));
      for (int c = 0; c < C; ++c) {
        __m256i y_lo, y_hi, p_lo, p_hi;
        activations(y[c][b], k, y_lo, y_hi);
        if constexpr (std::is_same_v<Y, Line>) {  // (signed_sums runs without VNNI, where Line has mag)
          const __m256i m_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(y[c][b].mag + 64 * k));
          const __m256i m_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(y[c][b].mag + 64 * k + 32));
          p_lo = _mm256_maddubs_epi16(m_lo, _mm256_sign_epi8(lo, y_lo));
          p_hi = _mm256_maddubs_epi16(m_hi, _mm256_sign_epi8(hi, y_hi));
        } else {
          p_lo = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(y_lo, lo));
          p_hi = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(y_hi, hi));
        }
        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(p_lo, scale), _mm256_madd_epi16(p_hi, scale)));
      }
    }
  }
  // Super-block b's sums with C activation blocks. The 32 packed bytes of sub-blocks 2k and
  // 2k + 1 give, unshuffled, their low nibbles (elements 0..15 of each, one per 128-bit lane) and
  // their high nibbles (elements 16..31), met by the matching activations (in line's order, or
  // gathered from a Q8_K block). With VNNI the unsigned values (value + 128) go through vpdpbusd,
  // the integer dot products are reduced to one lane per sub-block (lanes: sub-blocks 0, 2, 4, 6,
  // 1, 3, 5, 7), 128 sum(qy) comes off each lane (from the bsums) and the lanes are multiplied by
  // the scales; without it, signed_sums.
  template <int C, typename Y>
  static void sums(const BX& x, const Y* const y[C], int64_t b, __m256i sumi[C], __m256i*) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
#if defined(EMBER_IQ4_VNNI)
    const __m256i table = unsigned_table();
    __m256i pair[C][4];  // lanes 0-3: sub-block 2k, lanes 4-7: sub-block 2k + 1
    for (int k = 0; k < 4; ++k) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * k));
      const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(packed, low4));
      const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4));
      for (int c = 0; c < C; ++c) {
        __m256i y_lo, y_hi;
        activations(y[c][b], k, y_lo, y_hi);
        pair[c][k] = dot_u8_i8_acc(dot_u8_i8_i32(lo, y_lo), hi, y_hi);
      }
    }
    const __m256i scales = scales_even_odd(x);
    for (int c = 0; c < C; ++c) {
      __m256i per_sub_block = pair_sums_64(pair_sums_32(pair[c][0], pair[c][1]), pair_sums_32(pair[c][2], pair[c][3]));
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].bsums));
      __m256i y_sums = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));
      if constexpr (std::is_same_v<Y, block_q8_K>)
        y_sums = _mm256_permutevar8x32_epi32(y_sums, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
      per_sub_block = _mm256_sub_epi32(per_sub_block, _mm256_slli_epi32(y_sums, 7));
      sumi[c] = _mm256_mullo_epi32(per_sub_block, scales);
    }
#else
    signed_sums<C>(x, y, b, sumi, signed_table(), low4);
#endif
  }
};
#endif

}  // namespace

void register_iq4(KernelTable& t) {
  TypeKernels& nl = t.types[static_cast<int>(GGMLType::IQ4_NL)];
  TypeKernels& xs = t.types[static_cast<int>(GGMLType::IQ4_XS)];
  nl = {GGMLType::Q8_0, dequantize_row_iq4_nl, quantize_row_iq4_nl, vec_dot_iq4_nl_q8_0};
  xs = {GGMLType::Q8_K, dequantize_row_iq4_xs, quantize_row_iq4_xs, vec_dot_iq4_xs_q8_k};
#if defined(__AVX2__)
  nl.dequantize_row = dequantize_row_iq4_nl_avx2;
  use_avx2_kernels<SignedDot<IQ4NLTile>>(nl);
  xs.dequantize_row = dequantize_row_k<IQ4XSTile>;
  xs.vec_dot = vec_dot_k_tile<IQ4XSTile>;
  xs.gemm_tile = gemm_tile_k<IQ4XSTile>;
#endif
#if defined(EMBER_HAS_PANELS)
  use_avx512_kernels<IQ4NLTile>(nl);
#endif
#if defined(EMBER_HAS_K_PANELS)
  xs.gemm_panel = k_panel_kernel_for<IQ4XSTile>();
#elif defined(EMBER_HAS_AVX2_K_PANELS)
  xs.gemm_panel = gemm_panel_k8<IQ4XSTile>;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
