// Q5_0 and Q5_1. A block holds 32 five-bit weights: the low four bits as nibbles (qs[j] low
// nibble is element j, high nibble element j + 16) and the fifth bits in qh, a little-endian
// u32 whose bit j belongs to element j.
// Q5_0: value = d * (q - 16), dotted with Q8_0 activations.
// Q5_1: value = d * q + m, dotted with Q8_1 activations: sum = d dy sum(q qy) + m s_y.
#include <algorithm>
#include <cfloat>
#include <cstring>

#include "core/fp16.h"
#include "core/kernels.h"
#include "quants/exact_fp.h"
#include "quants/x86/avx2_panel.h"
#include "quants/x86/avx512_panel.h"
#include "quants/x86/avx2_simd.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

// The 32 five-bit values of a block, 0..31, in element order.
inline void unpack_q5(const uint8_t qh[4], const uint8_t qs[16], int q[32]) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0F) | (((bits >> j) & 1) << 4);
    q[j + 16] = (qs[j] >> 4) | (((bits >> (j + 16)) & 1) << 4);
  }
}

#if defined(__AVX2__)
// The 32 values of a block as bytes 0..31.
inline __m256i unpack_q5_32(const uint8_t qh[4], const uint8_t qs[16]) {
  const __m256i fifth = _mm256_and_si256(bits_to_byte_mask_32(qh), _mm256_set1_epi8(0x10));
  return _mm256_or_si256(unpack_nibbles_32(qs), fifth);
}
#endif

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  const block_q5_0* x = static_cast<const block_q5_0*>(src);
  for (int64_t b = 0; b < n / QK5_0; ++b) {
    const float d = fp16_to_fp32(x[b].d);
#if defined(__AVX2__)
    const __m256i q = _mm256_sub_epi8(unpack_q5_32(x[b].qh, x[b].qs), _mm256_set1_epi8(16));
    store_block_f32_32(q, _mm256_set1_ps(d), _mm256_setzero_ps(), dst + b * QK5_0);
#else
    int q[QK5_0];
    unpack_q5(x[b].qh, x[b].qs, q);
    for (int j = 0; j < QK5_0; ++j) dst[b * QK5_0 + j] = d * (q[j] - 16);
#endif
  }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  const block_q5_1* x = static_cast<const block_q5_1*>(src);
  for (int64_t b = 0; b < n / QK5_1; ++b) {
    const float d = fp16_to_fp32(x[b].d), m = fp16_to_fp32(x[b].m);
#if defined(__AVX2__)
    store_block_f32_32(unpack_q5_32(x[b].qh, x[b].qs), _mm256_set1_ps(d), _mm256_set1_ps(m), dst + b * QK5_1);
#else
    int q[QK5_1];
    unpack_q5(x[b].qh, x[b].qs, q);
    for (int j = 0; j < QK5_1; ++j) dst[b * QK5_1 + j] = d * q[j] + m;
#endif
  }
}

void vec_dot_q5_0_q8_0(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q5_0* x = static_cast<const block_q5_0*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  const int64_t nb = n / QK5_0;
  float sum = 0.0f;
  int q[QK5_0];
  for (int64_t b = 0; b < nb; ++b) {
    unpack_q5(x[b].qh, x[b].qs, q);
    int isum = 0;
    for (int j = 0; j < QK5_0; ++j) isum += (q[j] - 16) * y[b].qs[j];
    sum += isum * fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d);
  }
  *out = sum;
}

void vec_dot_q5_1_q8_1(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q5_1* x = static_cast<const block_q5_1*>(vx);
  const block_q8_1* y = static_cast<const block_q8_1*>(vy);
  const int64_t nb = n / QK5_1;
  float sum = 0.0f, offsets = 0.0f;
  int q[QK5_1];
  for (int64_t b = 0; b < nb; ++b) {
    unpack_q5(x[b].qh, x[b].qs, q);
    int isum = 0;
    for (int j = 0; j < QK5_1; ++j) isum += q[j] * y[b].qs[j];
    sum += isum * fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d);
    offsets += fp16_to_fp32(x[b].m) * fp16_to_fp32(y[b].s);
  }
  *out = sum + offsets;
}

#if defined(__AVX2__)
struct Q5_0Tile {
  using BX = block_q5_0;
  using BY = block_q8_0;
  static constexpr bool kOffset = false;
  static constexpr int kZeroShift = 4;  // z = 16
  static __m256i unpack_unsigned(const BX& b) { return unpack_q5_32(b.qh, b.qs); }
};

struct Q5_1Tile {
  using BX = block_q5_1;
  using BY = block_q8_1;
  static constexpr bool kOffset = true;
  static constexpr int kZeroShift = -1;
  static __m256i unpack_unsigned(const BX& b) { return unpack_q5_32(b.qh, b.qs); }
};
#endif

EMBER_EXACT_FP_BEGIN

// Low nibbles into qs (element j low, j + 16 high), fifth bits into qh.
inline void pack_q5(const int q[32], uint8_t qh[4], uint8_t qs[16]) {
  uint32_t bits = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
    bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j | static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh, &bits, 4);
}

// ggml's quantize_row_q5_0_ref: d = (value of largest magnitude) / -16, q = min(31, trunc(x / d + 16.5)).
void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  block_q5_0* y = static_cast<block_q5_0*>(dst);
  for (int64_t b = 0; b < n / QK5_0; ++b) {
    const float* x = src + b * QK5_0;
    const float d = signed_absmax(x, QK5_0) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    int q[QK5_0];
    for (int j = 0; j < QK5_0; ++j) q[j] = std::min(31, static_cast<int>(x[j] * id + 16.5f));
    pack_q5(q, y[b].qh, y[b].qs);
  }
}

// ggml's quantize_row_q5_1_ref: d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5).
void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  block_q5_1* y = static_cast<block_q5_1*>(dst);
  for (int64_t b = 0; b < n / QK5_1; ++b) {
    const float* x = src + b * QK5_1;
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK5_1; ++j) min = std::min(min, x[j]), max = std::max(max, x[j]);
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(min);
    int q[QK5_1];
    for (int j = 0; j < QK5_1; ++j) q[j] = static_cast<int>((x[j] - min) * id + 0.5f);
    pack_q5(q, y[b].qh, y[b].qs);
  }
}

EMBER_EXACT_FP_END

}  // namespace

void register_q5(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q5_0)] = {GGMLType::Q8_0, dequantize_row_q5_0, quantize_row_q5_0,
                                               vec_dot_q5_0_q8_0};
  t.types[static_cast<int>(GGMLType::Q5_1)] = {GGMLType::Q8_1, dequantize_row_q5_1, quantize_row_q5_1,
                                               vec_dot_q5_1_q8_1};
#if defined(__AVX2__)
  use_avx2_kernels<Q5_0Tile>(t.types[static_cast<int>(GGMLType::Q5_0)]);
  use_avx2_kernels<Q5_1Tile>(t.types[static_cast<int>(GGMLType::Q5_1)]);
#endif
#if defined(EMBER_HAS_PANELS)
  use_avx512_kernels<Q5_0Tile>(t.types[static_cast<int>(GGMLType::Q5_0)]);
  use_avx512_kernels<Q5_1Tile>(t.types[static_cast<int>(GGMLType::Q5_1)]);
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
