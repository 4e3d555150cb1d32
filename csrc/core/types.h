// Tensor types (ggml's ids, as stored in GGUF) and their block layouts.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ember {

enum class GGMLType : int32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30,
};
constexpr int kTypeCount = 31;

struct TypeTraits {
  const char* name;   // nullptr: not a type ember supports
  int64_t block_size; // elements per block
  size_t type_size;   // bytes per block
};

const TypeTraits& type_traits(GGMLType type);
bool type_supported(int32_t type_id);
// Bytes of a row of `n` elements (n must be a multiple of the block size).
size_t row_bytes(GGMLType type, int64_t n);

using ggml_half = uint16_t;
constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32, QK4_NL = 32, QK_K = 256;
constexpr int K_SCALE_SIZE = 12;

// Block layouts, byte-for-byte as in GGUF files (ggml-common.h).
struct block_q4_0 { ggml_half d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { ggml_half d, m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { ggml_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { ggml_half d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { ggml_half d; int8_t qs[QK8_0]; };
// Activation block for the *_1 types: s = d * sum(qs), so the weight offset m folds into one term.
struct block_q8_1 { ggml_half d, s; int8_t qs[QK8_1]; };
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; ggml_half d, dmin; };
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; ggml_half d; };
struct block_q4_K { ggml_half d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { ggml_half d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; ggml_half d; };
// IQ4_NL: 32 weights as 4-bit indices into a fixed non-linear table (nibbles as in Q4_0).
struct block_iq4_nl { ggml_half d; uint8_t qs[QK4_NL / 2]; };
// IQ4_XS: 256 weights in 8 sub-blocks of 32 with IQ4_NL's table and a 6-bit scale each (low
// 4 bits in scales_l, top 2 bits in scales_h).
struct block_iq4_xs { ggml_half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
// Activation block for K-quants: bsums[i] = sum of qs[16 i .. 16 i + 15].
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };

static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
static_assert(sizeof(block_q8_1) == 36, "block_q8_1");
static_assert(sizeof(block_q2_K) == 84, "block_q2_K");
static_assert(sizeof(block_q3_K) == 110, "block_q3_K");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K");
static_assert(sizeof(block_q8_K) == 292, "block_q8_K");
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl");
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs");

}  // namespace ember
