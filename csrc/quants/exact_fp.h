// What the weight quantizers share with ggml's reference quantizers (ggml-quants.c), which
// ember reproduces bit for bit.
//
// ggml compiles those without fused multiply-add, and a*b + c fused into one FMA rounds once
// instead of twice, which can move a value across a rounding boundary. The ISA builds of ember
// enable FMA (and GCC contracts a*b + c on its own when it may), so every quantizer is defined
// between EMBER_EXACT_FP_BEGIN and EMBER_EXACT_FP_END, which switch contraction off.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__clang__)
#define EMBER_EXACT_FP_BEGIN _Pragma("clang fp contract(off)")
#define EMBER_EXACT_FP_END _Pragma("clang fp contract(on)")
#elif defined(__GNUC__)
#define EMBER_EXACT_FP_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define EMBER_EXACT_FP_END _Pragma("GCC pop_options")
#else
#define EMBER_EXACT_FP_BEGIN
#define EMBER_EXACT_FP_END
#endif

namespace ember {
namespace EMBER_ISA_NS {
namespace {

EMBER_EXACT_FP_BEGIN

// ggml's nearest_int: round half to even for |x| < 2^22. Adding 1.5 * 2^23 leaves the integer in
// the low mantissa bits, offset by 2^22.
inline int nearest_int(float x) {
  const float shifted = x + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  return (bits & 0x007FFFFF) - 0x00400000;
}

// The value of largest magnitude, with its sign; the first one wins a tie.
inline float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) amax = ax, max = x[i];
  }
  return max;
}

EMBER_EXACT_FP_END

}  // namespace
}  // namespace EMBER_ISA_NS
}  // namespace ember
