// Q4_0 and Q4_1. A block holds 32 weights as nibbles: qs[j] low nibble is element j, high
// nibble element j + 16. Q4_0: value = d * (q - 8), dotted with Q8_0 activations.
// Q4_1: value = d * q + m, dotted with Q8_1 activations: sum = d dy sum(q qy) + m s_y.
#include <algorithm>
#include <cfloat>

#include "core/fp16.h"
#include "core/kernels.h"
#include "quants/exact_fp.h"
#include "quants/x86/avx2_panel.h"
#include "quants/x86/avx512_panel.h"
#include "quants/x86/avx2_simd.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const block_q4_0* x = static_cast<const block_q4_0*>(src);
  for (int64_t b = 0; b < n / QK4_0; ++b) {
    const float d = fp16_to_fp32(x[b].d);
#if defined(__AVX2__)
    const __m256i q = _mm256_sub_epi8(unpack_nibbles_32(x[b].qs), _mm256_set1_epi8(8));
    store_block_f32_32(q, _mm256_set1_ps(d), _mm256_setzero_ps(), dst + b * QK4_0);
#else
    for (int j = 0; j < QK4_0 / 2; ++j) {
      dst[b * QK4_0 + j] = d * ((x[b].qs[j] & 0x0F) - 8);
      dst[b * QK4_0 + j + QK4_0 / 2] = d * ((x[b].qs[j] >> 4) - 8);
    }
#endif
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const block_q4_1* x = static_cast<const block_q4_1*>(src);
  for (int64_t b = 0; b < n / QK4_1; ++b) {
    const float d = fp16_to_fp32(x[b].d), m = fp16_to_fp32(x[b].m);
#if defined(__AVX2__)
    store_block_f32_32(unpack_nibbles_32(x[b].qs), _mm256_set1_ps(d), _mm256_set1_ps(m), dst + b * QK4_1);
#else
    for (int j = 0; j < QK4_1 / 2; ++j) {
      dst[b * QK4_1 + j] = d * (x[b].qs[j] & 0x0F) + m;
      dst[b * QK4_1 + j + QK4_1 / 2] = d * (x[b].qs[j] >> 4) + m;
    }
#endif
  }
}

void vec_dot_q4_0_q8_0(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q4_0* x = static_cast<const block_q4_0*>(vx);
  const block_q8_0* y = static_cast<const block_q8_0*>(vy);
  const int64_t nb = n / QK4_0;
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < QK4_0 / 2; ++j) {
      isum += ((x[b].qs[j] & 0x0F) - 8) * y[b].qs[j];
      isum += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + QK4_0 / 2];
    }
    sum += isum * fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d);
  }
  *out = sum;
}

void vec_dot_q4_1_q8_1(int64_t n, float* out, const void* vx, const void* vy) {
  const block_q4_1* x = static_cast<const block_q4_1*>(vx);
  const block_q8_1* y = static_cast<const block_q8_1*>(vy);
  const int64_t nb = n / QK4_1;
  float sum = 0.0f, offsets = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < QK4_1 / 2; ++j) {
      isum += (x[b].qs[j] & 0x0F) * y[b].qs[j];
      isum += (x[b].qs[j] >> 4) * y[b].qs[j + QK4_1 / 2];
    }
    sum += isum * fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d);
    offsets += fp16_to_fp32(x[b].m) * fp16_to_fp32(y[b].s);
  }
  *out = sum + offsets;
}

#if defined(__AVX2__)
struct Q4_0Tile {
  using BX = block_q4_0;
  using BY = block_q8_0;
  static constexpr bool kOffset = false;
  static constexpr int kZeroShift = 3;  // z = 8
  static __m256i unpack_unsigned(const BX& b) { return unpack_nibbles_32(b.qs); }
};

struct Q4_1Tile {
  using BX = block_q4_1;
  using BY = block_q8_1;
  static constexpr bool kOffset = true;
  static constexpr int kZeroShift = -1;
  static __m256i unpack_unsigned(const BX& b) { return unpack_nibbles_32(b.qs); }
};
#endif

EMBER_EXACT_FP_BEGIN

// ggml's quantize_row_q4_0_ref: d = (value of largest magnitude) / -8, q = min(15, trunc(x / d + 8.5)).
void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  block_q4_0* y = static_cast<block_q4_0*>(dst);
  for (int64_t b = 0; b < n / QK4_0; ++b) {
    const float* x = src + b * QK4_0;
    const float d = signed_absmax(x, QK4_0) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(x[j + QK4_0 / 2] * id + 8.5f));
      y[b].qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

// ggml's quantize_row_q4_1_ref: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)).
void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  block_q4_1* y = static_cast<block_q4_1*>(dst);
  for (int64_t b = 0; b < n / QK4_1; ++b) {
    const float* x = src + b * QK4_1;
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK4_1; ++j) min = std::min(min, x[j]), max = std::max(max, x[j]);
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(min);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      const int lo = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
      const int hi = std::min(15, static_cast<int>((x[j + QK4_1 / 2] - min) * id + 0.5f));
      y[b].qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

EMBER_EXACT_FP_END

}  // namespace

void register_q4(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q4_0)] = {GGMLType::Q8_0, dequantize_row_q4_0, quantize_row_q4_0,
                                               vec_dot_q4_0_q8_0};
  t.types[static_cast<int>(GGMLType::Q4_1)] = {GGMLType::Q8_1, dequantize_row_q4_1, quantize_row_q4_1,
                                               vec_dot_q4_1_q8_1};
#if defined(__AVX2__)
  use_avx2_kernels<Q4_0Tile>(t.types[static_cast<int>(GGMLType::Q4_0)]);
  use_avx2_kernels<Q4_1Tile>(t.types[static_cast<int>(GGMLType::Q4_1)]);
#endif
#if defined(EMBER_HAS_PANELS)
  use_avx512_kernels<Q4_0Tile>(t.types[static_cast<int>(GGMLType::Q4_0)]);
  use_avx512_kernels<Q4_1Tile>(t.types[static_cast<int>(GGMLType::Q4_1)]);
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
