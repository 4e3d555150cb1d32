// AVX2 prompt kernels for the K-quants (Q2_K .. Q6_K): 8 tokens in the lanes of a vector, two
// vectors a panel of 16, as avx512_k_panel.h does with 16 lanes, for the tables without AVX-512.
//
// The Q8_K activations of 16 tokens are repacked once per matmul into panels of PanelK8Blocks:
// group k of a super-block holds elements 4k .. 4k + 3 of every token, so one vpmaddubsw
// multiplies a broadcast 4-byte group of a weight row's unsigned quants with 8 tokens. The weight
// rows are unpacked once per call (T::quants, the unpacking of the one-token kernels), and each
// vpmaddubsw's word sums are added as words over as many groups as cannot overflow an int16 (the
// whole sub-block for the 4-bit quants) before one vpmaddwd by the sub-block's scale. The zero
// point and the mins are the tokens' bsums times the scales and mins (vpmaddwd of word pairs).
// The sums follow the K-quant order of avx2_k_tile.h exactly: each super-block's exact integer
// sums, then one FMA each into the partial sums S and M of super-block b mod 8, kept in memory,
// combined at the end. So a prompt gives each token the bits it gets alone.
//
// A type plugs in through its avx2_k_tile.h Traits (kSub, kZeroShift, kMins, quants, scales, d,
// dmin) plus kQuantMax, the largest of its unsigned quants. Where a pair of those could overflow
// an int16 (IQ4_XS: values + 128, up to 241), the quants are taken as signed values (the zero
// point off, q - 128), vpmaddubsw multiplies their magnitudes with the activations carrying their
// signs (vpsignb), and each group's pair sums go to 32 bits through the scale at once.
#pragma once
#if defined(__AVX2__) && \
    !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__))
#define EMBER_HAS_AVX2_K_PANELS 1
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/kernels.h"
#include "core/types.h"
#include "quants/x86/avx2_k_tile.h"

namespace ember {
namespace EMBER_ISA_NS {

// One super-block of a 16-token Q8_K panel.
struct PanelK8Block {
  int8_t qs[QK_K / 4][kPanelTokens][4];       // group k: token t's elements 4k .. 4k + 3
  int16_t bsums[QK_K / 32][kPanelTokens][2];  // pair p: the token's bsums 2p and 2p + 1
  float d[kPanelTokens];                      // the token's scale
};
// A matmul plans panel_bytes(n) per panel (kernels.h), which is more than a K panel needs.
static_assert(sizeof(PanelK8Block) <= (QK_K / 32) * kPanelBlockBytes, "PanelK8Block fits panel_bytes");

// Packs n_cols (<= 16) rows of Q8_K blocks into one panel; the lanes of missing tokens are 0.
inline void pack_panel_k8(int64_t n, const void* vy, size_t y_stride, int n_cols, void* vpanel) {
  PanelK8Block* panel = static_cast<PanelK8Block*>(vpanel);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    PanelK8Block& p = panel[b];
    std::memset(&p, 0, sizeof(p));
    for (int t = 0; t < n_cols; ++t) {
      const block_q8_K& yb = reinterpret_cast<const block_q8_K*>(y + t * y_stride)[b];
      for (int k = 0; k < QK_K / 4; ++k) std::memcpy(p.qs[k][t], yb.qs + 4 * k, 4);
      for (int g = 0; g < QK_K / 32; ++g) std::memcpy(p.bsums[g][t], yb.bsums + 2 * g, 4);
      p.d[t] = yb.d;
    }
  }
}

// Two int16 in a 32-bit word: lo in the low half (a vpmaddwd operand).
inline int32_t word_pair(int32_t lo, int32_t hi) {
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFFu) | (static_cast<uint32_t>(hi) << 16));
}

template <typename T>
constexpr bool kSignedK8 = T::kQuantMax > 127;  // a pair of products could overflow an int16

// One row's super-block unpacked for the panel kernel: the quants as 4-byte groups, and the scales,
// zero-point and mins factors as word pairs to broadcast.
struct UnpackedK8 {
  alignas(32) int32_t q[QK_K / 4];  // kSignedK8: the signed values q - 128
  alignas(32) int32_t f[QK_K / 4];  // kSignedK8: their magnitudes, broadcast beside the values
  int32_t scale[16];  // sub-block j: (sc_j, sc_j), against a vpmaddubsw's pairs of word sums
  int32_t zero[8];    // bsums pair p: (c_2p, c_2p + 1) with c_g the scale of bsum g's sub-block
  int32_t min[8];     // the same for the mins
  float d, dmin;
  template <typename T>
  void set(const typename T::BX& x) {
    __m256i v[8];
    T::quants(x, v);
    for (int i = 0; i < 8; ++i) {
      if constexpr (kSignedK8<T>) {
        v[i] = _mm256_xor_si256(v[i], _mm256_set1_epi8(char(0x80)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(f + 8 * i), _mm256_abs_epi8(v[i]));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 8 * i), v[i]);
    }
    int32_t sc[16] = {}, mn[16] = {};
    T::scales(x, sc, mn);
    for (int j = 0; j < QK_K / T::kSub; ++j) scale[j] = word_pair(sc[j], sc[j]);
    // bsum g (16 elements) lies in sub-block g * 16 / kSub.
    constexpr int kPerSub = T::kSub / 16;
    for (int p = 0; p < 8; ++p) {
      zero[p] = word_pair(sc[2 * p / kPerSub], sc[(2 * p + 1) / kPerSub]);
      min[p] = word_pair(mn[2 * p / kPerSub], mn[(2 * p + 1) / kPerSub]);
    }
    d = T::d(x);
    dmin = T::dmin(x);
  }
};

// The 8 partial sums of avx2_k_tile.h's order for 16 tokens (S, then M), and their result.
struct PanelPartials8 {
  alignas(32) float S[8][kPanelTokens], M[8][kPanelTokens];
  void clear() { std::memset(this, 0, sizeof(*this)); }
  template <int H>
  void store(float* out, size_t out_stride, int n_cols) const {
    alignas(32) float sums[kPanelTokens];
    for (int h = 0; h < H; ++h) {
      __m256 d[8];
      for (int l = 0; l < 8; ++l) d[l] = _mm256_sub_ps(_mm256_load_ps(S[l] + 8 * h), _mm256_load_ps(M[l] + 8 * h));
      _mm256_store_ps(sums + 8 * h, combine_partials(d));
    }
    for (int c = 0; c < n_cols; ++c) out[c * out_stride] = sums[c];
  }
};

// sum over the 8 bsums pairs p of pairs[p] . (the tokens' bsums 2p, 2p + 1), for tokens 8h .. 8h + 7.
inline __m256i weighted_bsums(const PanelK8Block& p, const int32_t pairs[8], int h) {
  __m256i sum = _mm256_setzero_si256();
  for (int g = 0; g < 8; ++g)
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.bsums[g][8 * h])),
                                                  _mm256_set1_epi32(pairs[g])));
  return sum;
}

// R unpacked weight rows (w[b * R + r]) x one panel of up to 8 H tokens.
template <typename T, int R, int H>
inline void k8_panel_kernel(int64_t nb, float* out, size_t out_stride, const UnpackedK8* w, const PanelK8Block* panel,
                            int n_cols) {
  constexpr int kGroups = T::kSub / 4;  // 4-byte groups per sub-block
  // Groups whose vpmaddubsw word sums (each |q0 y0 + q1 y1| <= 2 * kQuantMax * 128) add up in an
  // int16 (kSignedK8: one, of magnitudes <= 128).
  constexpr int kDepth = kSignedK8<T> ? 1 : std::min(kGroups, 32767 / (2 * T::kQuantMax * 128));
  static_assert(kDepth >= 1 && kGroups % kDepth == 0, "whole runs of groups per sub-block");
  PanelPartials8 partials[R];
  for (int r = 0; r < R; ++r) partials[r].clear();
  for (int64_t b = 0; b < nb; ++b) {
    const PanelK8Block& p = panel[b];
    const UnpackedK8* wb = w + b * R;
    __m256i scaled[R][H];
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < H; ++h) scaled[r][h] = _mm256_setzero_si256();
    for (int j = 0; j < QK_K / T::kSub; ++j) {
      if constexpr (kSignedK8<T>) {
        __m256i scale[R];
        for (int r = 0; r < R; ++r) scale[r] = _mm256_set1_epi32(wb[r].scale[j]);
        for (int k = j * kGroups; k < (j + 1) * kGroups; ++k) {
          __m256i a[H];
          for (int h = 0; h < H; ++h) a[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qs[k][8 * h]));
          for (int r = 0; r < R; ++r) {
            const __m256i v = _mm256_set1_epi32(wb[r].q[k]), magnitudes = _mm256_set1_epi32(wb[r].f[k]);
            for (int h = 0; h < H; ++h)
              scaled[r][h] =
                  madd_acc_i16(scaled[r][h], _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(a[h], v)), scale[r]);
          }
        }
        continue;
      }
      for (int k0 = j * kGroups; k0 < (j + 1) * kGroups; k0 += kDepth) {
        __m256i words[R][H];
        for (int r = 0; r < R; ++r)
          for (int h = 0; h < H; ++h) words[r][h] = _mm256_setzero_si256();
        for (int k = k0; k < k0 + kDepth; ++k) {
          __m256i a[H];
          for (int h = 0; h < H; ++h) a[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qs[k][8 * h]));
          for (int r = 0; r < R; ++r) {
            const __m256i q = _mm256_set1_epi32(wb[r].q[k]);
            for (int h = 0; h < H; ++h) words[r][h] = _mm256_add_epi16(words[r][h], _mm256_maddubs_epi16(q, a[h]));
          }
          // Each group's sums in registers before the next group's loads (the compiler would
          // otherwise hoist every vpmaddubsw of the run ahead of the adds and spill their results).
          for (int r = 0; r < R; ++r)
            for (int h = 0; h < H; ++h) __asm__ volatile("" : "+x"(words[r][h]) : : "memory");
        }
        for (int r = 0; r < R; ++r) {
          const __m256i scale = _mm256_set1_epi32(wb[r].scale[j]);
          for (int h = 0; h < H; ++h) scaled[r][h] = _mm256_add_epi32(scaled[r][h], _mm256_madd_epi16(words[r][h], scale));
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      const __m256 dy = _mm256_load_ps(p.d + 8 * h);
      for (int r = 0; r < R; ++r) {
        __m256i sum = scaled[r][h];
        if constexpr (T::kZeroShift >= 0 && !kSignedK8<T>)
          sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(weighted_bsums(p, wb[r].zero, h), T::kZeroShift));
        float* S = partials[r].S[b % 8] + 8 * h;
        _mm256_store_ps(S, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dy, _mm256_set1_ps(wb[r].d)),
                                           _mm256_load_ps(S)));
        if constexpr (T::kMins) {
          float* M = partials[r].M[b % 8] + 8 * h;
          const __m256i mins = weighted_bsums(p, wb[r].min, h);
          _mm256_store_ps(M, _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dy, _mm256_set1_ps(wb[r].dmin)),
                                             _mm256_load_ps(M)));
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) partials[r].template store<H>(out + r, out_stride, n_cols);
}

// The kernel table's gemm_panel for a K-quant: n_rows weight rows x n_cols tokens in
// consecutive panels (panel_bytes(n) apart). Each group of rows is unpacked once for every panel.
template <typename T>
void gemm_panel_k8(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* panels,
                   int n_rows, int n_cols) {
  constexpr int kRows = 2;
  const int64_t nb = n / QK_K;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  thread_local std::vector<UnpackedK8> unpacked;
  if (unpacked.size() < static_cast<size_t>(nb * kRows)) unpacked.resize(nb * kRows);
  for_each_group<kRows, 1>(n_rows, [&](auto rows, int r0) {
    constexpr int R = decltype(rows)::value;
    for (int r = 0; r < R; ++r) {
      const typename T::BX* row = reinterpret_cast<const typename T::BX*>(x + (r0 + r) * x_stride);
      for (int64_t b = 0; b < nb; ++b) unpacked[b * R + r].template set<T>(row[b]);
    }
    for_each_panel(n, panels, n_cols, [&](const uint8_t* panel, int c0, int cols) {
      const PanelK8Block* p = reinterpret_cast<const PanelK8Block*>(panel);
      float* o = out + c0 * out_stride + r0;
      if (cols > 8) k8_panel_kernel<T, R, 2>(nb, o, out_stride, unpacked.data(), p, cols);
      else k8_panel_kernel<T, R, 1>(nb, o, out_stride, unpacked.data(), p, cols);
    });
  });
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
#endif
