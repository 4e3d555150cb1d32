// Q3_K: 256 weights in 16 sub-blocks of 16, dotted with Q8_K activations; value = d sc q.
// q = low - (hbit ? 0 : 4), in -4..3: the 2-bit low part is laid out as in Q2_K (values
// 128 h + 32 j + i are bits 2 j .. 2 j + 1 of qs[32 h + i]); hbit is bit 4 h + j of hmask[i].
// The 16 six-bit scales sc (stored with a bias of 32) are packed in 12 bytes: the low nibbles of
// bytes 0..7 are the low 4 bits of scales 0..7, their high nibbles those of scales 8..15, and
// bits 2 k .. 2 k + 1 of byte 8 + i the top 2 bits of scale 4 k + i.
// Dot: with u = q + 4 = low | hbit << 2 (unsigned), sum(q qy) = sum(u qy) - 4 bsums.
#include <cstring>

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

// The 16 six-bit scales of a block (still biased by 32) as 16 bytes, in 4 words. The 12 bytes are
// read as 3 little-endian words.
struct PackedScales {
  uint32_t words[4];
};

PackedScales unpack_scales(const uint8_t* packed) {
  uint32_t w[3];
  std::memcpy(w, packed, sizeof(w));
  const uint32_t low4 = 0x0F0F0F0F, low2 = 0x03030303;
  return {{
      (w[0] & low4) | (((w[2] >> 0) & low2) << 4),
      (w[1] & low4) | (((w[2] >> 2) & low2) << 4),
      ((w[0] >> 4) & low4) | (((w[2] >> 4) & low2) << 4),
      ((w[1] >> 4) & low4) | (((w[2] >> 6) & low2) << 4),
  }};
}

// Scale of sub-block s, bias removed (-32..31).
inline int scale_of(const PackedScales& p, int s) {
  return static_cast<int>((p.words[s / 4] >> (8 * (s % 4))) & 0xFF) - 32;
}

// q + 4 of value 16 s + i (0..7).
inline int biased_q(const block_q3_K& x, int s, int i) {
  const int h = s / 8, j = (s % 8) / 2, byte = 16 * (s % 2) + i;
  const int low = (x.qs[32 * h + byte] >> (2 * j)) & 3;
  const int hbit = (x.hmask[byte] >> (4 * h + j)) & 1;
  return low | (hbit << 2);
}

void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
  const block_q3_K* x = static_cast<const block_q3_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    const PackedScales scales = unpack_scales(x[b].scales);
    float* out = dst + b * QK_K;
    for (int s = 0; s < QK_K / 16; ++s) {
      const float scale = d * scale_of(scales, s);
      for (int i = 0; i < 16; ++i) out[16 * s + i] = scale * (biased_q(x[b], s, i) - 4);
    }
  }
}

#if defined(__AVX2__)
// d dy sum_s sc_s sum((u - 4) qy), u = q + 4 (0..7), for one weight super-block and C activation
// blocks, in avx2_k_tile.h's order. Each 3-bit plane is unpacked once for all C.
struct Q3KTile {
  using BX = block_q3_K;
  using BY = block_q8_K;
  static constexpr int kSub = 16, kZeroShift = 2;  // z = 4
  static constexpr bool kMins = false;
  static constexpr int kQuantMax = 7;  // the largest unsigned quant
  // The 256 values of u (0..7) as bytes, 32 per vector in element order.
  static void quants(const BX& x, __m256i q[8]) {
    const __m256i low2 = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
    const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.hmask));
    for (int h = 0; h < 2; ++h) {
      const __m256i q2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * h));
      for (int j = 0; j < 4; ++j) {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * j), low2);
        q[4 * h + j] = _mm256_or_si256(low, _mm256_and_si256(move_bit(hmask, 4 * h + j, 2), bit2));
      }
    }
  }
  static void scales(const BX& x, int32_t sc[16], int32_t*) {
    const PackedScales packed = unpack_scales(x.scales);
    for (int s = 0; s < 16; ++s) sc[s] = scale_of(packed, s);
  }
  static float d(const BX& x) { return fp16_to_fp32(x.d); }
  static float dmin(const BX&) { return 0.0f; }
  template <int C, typename Y>
  static void sums(const BX& x, const Y* const y[C], int64_t b, __m256i sum[C], __m256i*) {
    const PackedScales packed = unpack_scales(x.scales);
    const __m128i biased = _mm_setr_epi32(packed.words[0], packed.words[1], packed.words[2], packed.words[3]);
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_sub_epi8(biased, _mm_set1_epi8(32)));
    for (int c = 0; c < C; ++c) {
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][b].bsums));
      // Start from -4 sum_s sc_s bsums_s, the correction for the +4 bias of u.
      sum[c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(scales, bsums), 2));
    }
    __m256i u[8];
    quants(x, u);
    for (int v = 0; v < 8; ++v) add_scaled_dots<C>(sum, u[v], scales_for_32(scales, v), y, b, 32 * v);
  }
};
#endif

void vec_dot_q3_k_q8_k(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q3_K* x = static_cast<const block_q3_K*>(vx);
  const block_q8_K* y = static_cast<const block_q8_K*>(vy);
  const int64_t nb = n / QK_K;
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const PackedScales scales = unpack_scales(x[b].scales);
    int isum = 0;
    for (int s = 0; s < QK_K / 16; ++s) {
      const int8_t* qy = y[b].qs + 16 * s;
      int dot = 0;
      for (int i = 0; i < 16; ++i) dot += (biased_q(x[b], s, i) - 4) * qy[i];
      isum += scale_of(scales, s) * dot;
    }
    sum += y[b].d * fp16_to_fp32(x[b].d) * isum;
  }
  *out = sum;
}

EMBER_EXACT_FP_BEGIN

// ggml's quantize_row_q3_K_ref: a symmetric scale per sub-block of 16 (levels -4..3, iterated
// search), the 16 scales quantized to 6 bits (biased by 32) against the one of largest magnitude,
// then the values re-quantized with the stored scales.
void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  block_q3_K* y = static_cast<block_q3_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, amax = 0;
    for (int s = 0; s < QK_K / 16; ++s) {
      scales[s] = iterated_symmetric_scale(16, 4, x + 16 * s, L + 16 * s);
      if (std::fabs(scales[s]) > amax) amax = std::fabs(scales[s]), max_scale = scales[s];
    }
    std::memset(y[b].scales, 0, sizeof(y[b].scales));
    if (max_scale != 0.0f) {
      const float iscale = -32.f / max_scale;
      for (int s = 0; s < QK_K / 16; ++s) {
        // ggml keeps the rounded scale in an int8_t before clamping; so does this
        const int l = clamp_int(static_cast<int8_t>(nearest_int(iscale * scales[s])), -32, 31) + 32;
        if (s < 8) y[b].scales[s] = static_cast<uint8_t>(l & 0xF);
        else y[b].scales[s - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
        y[b].scales[8 + s % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (s / 4)));
      }
      y[b].d = fp32_to_fp16(1 / iscale);
    } else {
      y[b].d = fp32_to_fp16(0.f);
    }
    const PackedScales stored = unpack_scales(y[b].scales);
    for (int s = 0; s < QK_K / 16; ++s) {
      const float d = fp16_to_fp32(y[b].d) * scale_of(stored, s);
      if (d == 0.0f) continue;
      for (int i = 0; i < 16; ++i)
        L[16 * s + i] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * s + i] / d), -4, 3) + 4);
    }
    // The bit worth 4 of value v goes to bit v / 32 of hmask[v % 32]; qs keeps the low 2 bits.
    uint8_t low[QK_K];
    std::memset(y[b].hmask, 0, sizeof(y[b].hmask));
    for (int v = 0; v < QK_K; ++v) {
      const int q = L[v];
      if (q > 3) y[b].hmask[v % 32] |= static_cast<uint8_t>(1 << (v / 32));
      low[v] = static_cast<uint8_t>(q > 3 ? q - 4 : q);
    }
    pack_2bit_levels(low, y[b].qs);
  }
}

EMBER_EXACT_FP_END

}  // namespace

void register_q3_k(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q3_K)] = {GGMLType::Q8_K, dequantize_row_q3_k, quantize_row_q3_k,
                                               vec_dot_q3_k_q8_k};
#if defined(__AVX2__)
  t.types[static_cast<int>(GGMLType::Q3_K)].vec_dot = vec_dot_k_tile<Q3KTile>;
  t.types[static_cast<int>(GGMLType::Q3_K)].dequantize_row = dequantize_row_k<Q3KTile>;
  t.types[static_cast<int>(GGMLType::Q3_K)].gemm_tile = gemm_tile_k<Q3KTile>;
#endif
#if defined(EMBER_HAS_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q3_K)].gemm_panel = k_panel_kernel_for<Q3KTile>();
#elif defined(EMBER_HAS_AVX2_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q3_K)].gemm_panel = gemm_panel_k8<Q3KTile>;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
