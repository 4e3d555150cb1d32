// Branch-free float functions that compilers vectorize (no libm calls in hot loops).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ember {

namespace exp_consts {
constexpr float kMin = -88.0f, kMax = 88.7f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187045e-06f;  // ln 2 = hi + lo
constexpr float kPoly[7] = {1.3888889e-3f, 8.3333333e-3f, 4.1666667e-2f, 1.6666667e-1f, 0.5f, 1.0f, 1.0f};
}  // namespace exp_consts

// exp(x) with relative error < 2e-7 over the float range: x = n ln2 + r, exp(r) by a degree-6
// polynomial, 2^n assembled in the exponent bits. Underflows to 0, overflows to inf.
inline float exp_approx(float x) {
  using namespace exp_consts;
  x = x < kMin ? kMin : (x > kMax ? kMax : x);
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kPoly[0];
  for (int i = 1; i < 7; ++i) p = p * r + kPoly[i];
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

#if defined(__AVX512F__)
// exp_approx on 16 lanes: the same reduction and polynomial, each step one FMA.
inline __m512 exp_approx16(__m512 x) {
  using namespace exp_consts;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kMin)), _mm512_set1_ps(kMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[i]));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

inline __m512 tanh_approx16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp_approx16(_mm512_add_ps(x, x));
  return _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
}
#endif

inline float silu(float x) { return x / (1.0f + exp_approx(-x)); }

inline float tanh_approx(float x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1), saturating cleanly at both ends.
  return 1.0f - 2.0f / (exp_approx(2.0f * x) + 1.0f);
}

// GELU, tanh form (GPT-2, Gemma): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanh_approx(k * x * (1.0f + 0.044715f * x * x)));
}

}  // namespace ember
