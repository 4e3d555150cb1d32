// The scale searches of the K-quant quantizers, as ggml's reference quantizers do them
// (ggml-quants.c: make_qx_quants with rmse_type 1, make_q3_quants, make_qkx2_quants). Every
// float operation happens in ggml's order and precision, so the blocks come out identical.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"
#include "core/types.h"
#include "quants/exact_fp.h"

namespace ember {
namespace EMBER_ISA_NS {
namespace {

// The 12 scale bytes of Q4_K/Q5_K hold 8 scales and 8 mins of 6 bits (ggml's get_scale_min_k4):
// bytes 0-3 are scales 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; bytes 8-11 hold the low 4
// bits of scales 4-7 (low nibble) and mins 4-7 (high nibble), whose top 2 bits are the top 2 bits
// of bytes 0-3 (scales) and 4-7 (mins). Decoded as two 64-bit words, each with one set of masks:
// `first` holds bytes scales 0-3, mins 0-3; `second` scales 4-7, mins 4-7. (Integer work, kept
// outside the exact-float section below so that the dot kernels can inline it.)
struct ScalesMins {
  uint64_t first, second;
};

inline ScalesMins unpack_scales_mins(const uint8_t packed[K_SCALE_SIZE]) {
  uint64_t w01;
  uint32_t w2;
  std::memcpy(&w01, packed, 8);
  std::memcpy(&w2, packed + 8, 4);
  // w2's low nibbles go to the low 32 bits, its high nibbles to the high 32 bits.
  const uint64_t nibbles = (w2 | (static_cast<uint64_t>(w2) << 28)) & 0x0F0F0F0F0F0F0F0FULL;
  return {w01 & 0x3F3F3F3F3F3F3F3FULL, nibbles | ((w01 >> 2) & 0x3030303030303030ULL)};
}

// Byte j of these is scale j, min j.
inline uint64_t scale_bytes(const ScalesMins& sm) { return (sm.first & 0xFFFFFFFFULL) | (sm.second << 32); }
inline uint64_t min_bytes(const ScalesMins& sm) { return (sm.first >> 32) | (sm.second & 0xFFFFFFFF00000000ULL); }

// The same as two arrays of 8.
inline void unpack_scales_mins(const uint8_t packed[K_SCALE_SIZE], uint8_t scales[8], uint8_t mins[8]);

// The same as int32 (Q4_K and Q5_K's kernels with tokens in lanes).
inline void scales_and_mins_32(const uint8_t packed[K_SCALE_SIZE], int32_t scales[16], int32_t mins[16]) {
  uint8_t s[8], m[8];
  unpack_scales_mins(packed, s, m);
  for (int j = 0; j < 8; ++j) scales[j] = s[j], mins[j] = m[j];
}

inline void unpack_scales_mins(const uint8_t packed[K_SCALE_SIZE], uint8_t scales[8], uint8_t mins[8]) {
  const ScalesMins sm = unpack_scales_mins(packed);
  const uint64_t sb = scale_bytes(sm), mb = min_bytes(sm);
  std::memcpy(scales, &sb, 8);
  std::memcpy(mins, &mb, 8);
}

EMBER_EXACT_FP_BEGIN

constexpr float kGroupMaxEps = 1e-15f;  // a group whose largest magnitude is below this is zero

inline int clamp_int(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// Levels -nmax..nmax-1 for x * iscale, and the sums sum(w x l), sum(w l^2) with w = x^2.
inline void symmetric_levels(int n, int nmax, const float* x, float iscale, int8_t* levels, float& sumlx,
                             float& suml2) {
  sumlx = suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    levels[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
}

// Symmetric scale for n <= 32 values on the levels -nmax..nmax-1 (Q6_K): the largest magnitude
// maps to -nmax, then 18 scales around it are tried; the one with the best x^2-weighted fit
// (largest sum(w x l)^2 / sum(w l^2)) wins, with scale sum(w x l) / sum(w l^2).
// L receives l + nmax.
inline float symmetric_scale(int n, int nmax, const float* x, int8_t* L) {
  const float max = signed_absmax(x, n);
  if (std::fabs(max) < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  int8_t best_levels[32], levels[32];
  float sumlx, suml2;
  symmetric_levels(n, nmax, x, static_cast<float>(-nmax) / max, best_levels, sumlx, suml2);
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / max;
    symmetric_levels(n, nmax, x, iscale, levels, sumlx, suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      std::copy(levels, levels + n, best_levels);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(best_levels[i] + nmax);
  return scale;
}

// Q3_K's symmetric scale for n values on -nmax..nmax-1: levels from the largest magnitude, then
// up to 5 sweeps that move one level at a time to x * sum(w l^2) / sum(w x l) (w = x^2)
// whenever that improves sum(w x l)^2 / sum(w l^2). L receives l + nmax.
inline float iterated_symmetric_scale(int n, int nmax, const float* x, int8_t* L) {
  const float max = signed_absmax(x, n);
  if (std::fabs(max) < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  float sumlx, suml2;
  symmetric_levels(n, nmax, x, static_cast<float>(-nmax) / max, L, sumlx, suml2);
  for (int sweep = 0; sweep < 5; ++sweep) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// The weighted error of value = scale * l + min against x: sum(w |diff|) or sum(w diff^2).
template <bool kAbsolute>
inline float fit_error(int n, const float* x, const float* weights, const uint8_t* levels, float scale, float min) {
  float error = 0.0f;
  for (int i = 0; i < n; ++i) {
    float diff = scale * levels[i] + min - x[i];
    diff = kAbsolute ? std::fabs(diff) : diff * diff;
    error += weights[i] * diff;
  }
  return error;
}

// Scale and offset for n <= 32 values on the levels 0..nmax, value = scale * l + min with
// min <= 0 (Q2_K, Q4_K, Q5_K). Starts from the range [min(x, 0), max(x)], then for nstep + 1
// grids (nmax + rmin + rdelta * step levels across the range) solves the weighted least-squares
// scale and min for the levels the grid picks, keeping the pair with the smallest weighted error
// (absolute with kAbsolute, squared otherwise). Returns the scale; *neg_min receives -min.
template <bool kAbsolute>
inline float min_scale_search(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min,
                              float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax));
  float best_error = fit_error<kAbsolute>(n, x, weights, L, scale, min);
  uint8_t levels[32];
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * step + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      levels[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      const float error = fit_error<kAbsolute>(n, x, weights, levels, this_scale, this_min);
      if (error < best_error) {
        std::copy(levels, levels + n, L);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Q4_K/Q5_K: scale and min of each of the 8 sub-blocks of 32, values on 0..nmax, from the
// weighted search with weights rms(sub-block) + |x|. L receives the levels the search chose.
inline void sub_block_scales_k(const float* x, int nmax, float rmin, int nstep, uint8_t* L, float scales[8],
                               float neg_mins[8]) {
  float weights[32];
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xj[l]);
    scales[j] = min_scale_search<false>(32, nmax, xj, weights, L + 32 * j, &neg_mins[j], rmin, 0.1f, nstep);
  }
}

// Q4_K/Q5_K scale bytes: 8 scales and 8 mins as 6-bit multiples of d and dmin (d = the largest
// scale / 63, dmin = the largest min / 63), packed as get_scale_min_k4 reads them.
inline void pack_scales_mins_k(const float scales[8], const float neg_mins[8], uint8_t packed[K_SCALE_SIZE],
                               ggml_half& d, ggml_half& dmin) {
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (neg_mins[j] > max_min) max_min = neg_mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < 8; ++j) {
    // ggml stores the rounded value in a byte before clamping; so does this
    const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * neg_mins[j])));
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 0xF) | (lm & 0xF) << 4);
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  d = fp32_to_fp16(max_scale / 63.f);
  dmin = fp32_to_fp16(max_min / 63.f);
}

// Q4_K/Q5_K: levels 0..nmax for the scales as stored (the searched levels stay where a sub-block's
// stored scale is zero).
inline void levels_for_packed_scales_k(const float* x, const uint8_t packed[K_SCALE_SIZE], ggml_half d16,
                                       ggml_half dmin16, int nmax, uint8_t* L) {
  uint8_t scales[8], mins[8];
  unpack_scales_mins(packed, scales, mins);
  for (int j = 0; j < 8; ++j) {
    const float d = fp16_to_fp32(d16) * scales[j];
    if (d == 0.0f) continue;
    const float dm = fp16_to_fp32(dmin16) * mins[j];
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = static_cast<uint8_t>(clamp_int(nearest_int((x[32 * j + i] + dm) / d), 0, nmax));
  }
}

// Q2_K/Q3_K: 2-bit levels, value 128 h + 32 j + i at bits 2 j of qs[32 h + i].
inline void pack_2bit_levels(const uint8_t* L, uint8_t qs[QK_K / 4]) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = L + 128 * h;
    for (int i = 0; i < 32; ++i)
      qs[32 * h + i] = static_cast<uint8_t>(q[i] | q[i + 32] << 2 | q[i + 64] << 4 | q[i + 96] << 6);
  }
}

EMBER_EXACT_FP_END

}  // namespace
}  // namespace EMBER_ISA_NS
}  // namespace ember
