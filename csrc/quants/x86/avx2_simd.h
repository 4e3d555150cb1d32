// SIMD building blocks shared by the quantized dot products (AVX2 and up).
#pragma once
#if defined(__AVX2__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ember {

// The f16 values h(0) .. h(n - 1), 1 <= n <= 8, as 8 floats (lanes from n on are 0). Inserted
// lane by lane: a store-and-reload of a small array would stall on store forwarding.
template <typename F>
inline __m256 f16x8(F&& h, int n) {
  __m128i v = _mm_cvtsi32_si128(h(0));
  switch (n) {
    case 8: v = _mm_insert_epi16(v, h(7), 7); [[fallthrough]];
    case 7: v = _mm_insert_epi16(v, h(6), 6); [[fallthrough]];
    case 6: v = _mm_insert_epi16(v, h(5), 5); [[fallthrough]];
    case 5: v = _mm_insert_epi16(v, h(4), 4); [[fallthrough]];
    case 4: v = _mm_insert_epi16(v, h(3), 3); [[fallthrough]];
    case 3: v = _mm_insert_epi16(v, h(2), 2); [[fallthrough]];
    case 2: v = _mm_insert_epi16(v, h(1), 1); [[fallthrough]];
    default: break;
  }
  return _mm256_cvtph_ps(v);
}

inline float hsum_f32_8(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum_i32_8(__m256i x) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Steps of a sum across lanes of 8 vectors that moves no lane across more than the shuffles
// need (vphaddd costs two shuffles and an add): pairs of 32-bit lanes, then of 64-bit lanes, then
// of 128-bit halves.
// a, b -> per 128-bit lane [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
inline __m256i pair_sums_32(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
// Two pair_sums_32 results (of a, b and c, d) -> per 128-bit lane the sums of a, b, c, d.
inline __m256i pair_sums_64(__m256i ab, __m256i cd) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}
// Two pair_sums_64 results (of a-d and e-h) -> the 8 totals of a .. h.
inline __m256i pair_sums_128(__m256i abcd, __m256i efgh) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(abcd, efgh, 0x20), _mm256_permute2x128_si256(abcd, efgh, 0x31));
}

// The 8 lanes of each of 8 vectors summed: lane r of the result is the sum of p[r].
inline __m256i sum_lanes_8x8(const __m256i p[8]) {
  return pair_sums_128(pair_sums_64(pair_sums_32(p[0], p[1]), pair_sums_32(p[2], p[3])),
                       pair_sums_64(pair_sums_32(p[4], p[5]), pair_sums_32(p[6], p[7])));
}

// Sums of 4 adjacent products of unsigned bytes ax and signed bytes sy, as 8 int32 lanes.
inline __m256i dot_u8_i8_i32(__m256i ax, __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
#endif
}

// acc + the same sums (vpdpbusd's accumulator where there is one).
inline __m256i dot_u8_i8_acc(__m256i acc, __m256i ax, __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, ax, sy);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, ax, sy);
#else
  return _mm256_add_epi32(acc, dot_u8_i8_i32(ax, sy));
#endif
}

// acc + sums of adjacent products of int16 a and b, as 8 int32 lanes (vpdpwssd where available).
inline __m256i madd_acc_i16(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// K-quants with 16-value sub-blocks: from their 16 int16 scales, the multiplier for values
// 32 k .. 32 k + 31 of the block (k < 8): scale 2 k in the low 128 bits, scale 2 k + 1 in the high.
inline __m256i scales_for_32(__m256i scales16, int k) {
  const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(scales16, _mm256_set1_epi32(k)), pick);
}

// Each byte of x shifted so that its bit `from` lands at bit `to` (both < 8); the other bits are
// left for the caller to mask off.
inline __m256i move_bit(__m256i x, int from, int to) {
  return from >= to ? _mm256_srli_epi16(x, from - to) : _mm256_slli_epi16(x, to - from);
}

// 16 bytes of packed nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones.
inline __m256i unpack_nibbles_32(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// dst[j] = d * q[j] + m for 16 signed bytes q (values in element order).
inline void store_f32_16(__m128i q, __m256 d, __m256 m, float* dst) {
  const __m128i eights[2] = {q, _mm_srli_si128(q, 8)};
  for (int k = 0; k < 2; ++k) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eights[k]));
    _mm256_storeu_ps(dst + 8 * k, _mm256_add_ps(_mm256_mul_ps(d, f), m));
  }
}

// The same for 32 signed bytes with one d and m (a block's values).
inline void store_block_f32_32(__m256i q, __m256 d, __m256 m, float* dst) {
  store_f32_16(_mm256_castsi256_si128(q), d, m, dst);
  store_f32_16(_mm256_extracti128_si256(q, 1), d, m, dst + 16);
}

// 32 bits -> 32 bytes: byte j is 0xFF where bit j % 8 of bits[j / 8] is set, else 0.
inline __m256i bits_to_byte_mask_32(const uint8_t* bits) {
  uint32_t word;
  std::memcpy(&word, bits, 4);
  // Byte k of the result looks at source byte k / 8 and tests bit k % 8 of it.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(word)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

}  // namespace ember
#endif
