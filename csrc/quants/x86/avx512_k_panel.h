// AVX-512 (VNNI) prompt kernels for the K-quants (Q2_K .. Q6_K, IQ4_XS): 16 tokens in the lanes of a
// vector, as avx512_panel.h does for the 32-weight types.
//
// The Q8_K activations of 16 tokens are repacked once per matmul into panels of PanelKBlocks:
// chunk k of a super-block holds elements 4k .. 4k + 3 of every token, so one vpdpbusd
// multiplies a broadcast 4-byte group of a weight row's unsigned quants with all 16 tokens. A
// row's super-block is unpacked once per panel (T::quants, the same unpacking as the one-token
// kernels'), and the sums follow the K-quant order of avx2_k_tile.h exactly: each sub-block's integer
// sum, zero point subtracted, times its scale, summed in integers over the super-block (and the
// mins times the tokens' sub-block sums), then one FMA each into the partial sums S and M of
// super-block b mod 8, kept in memory. So a prompt gives each token the bits it gets alone.
//
// A type plugs in through its avx2_k_tile.h Traits plus:
//   kSub                          weights per scale (16 or 32)
//   kZeroShift                    log2 of the zero point of the unsigned quants, or -1
//   kMins                         whether the type subtracts dmin min_j sum(qy)
//   quants(const BX&, __m256i[8])  the 256 unsigned quants, 32 per vector in element order
//   scales(const BX&, sc[16], mn[16]), d(const BX&), dmin(const BX&)
#pragma once
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define EMBER_HAS_K_PANELS 1
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/kernels.h"
#include "core/types.h"
#include "quants/x86/avx2_k_tile.h"

namespace ember {
namespace EMBER_ISA_NS {

// One super-block of a 16-token Q8_K panel.
struct PanelKBlock {
  int8_t qs[QK_K / 4][kPanelTokens][4];  // chunk k: token t's elements 4k .. 4k + 3
  float d[kPanelTokens];                  // the token's scale
  int32_t bsums[QK_K / 16][kPanelTokens]; // group g: the sum of the token's elements 16g .. 16g + 15
};
// A matmul plans panel_bytes(n) per panel (kernels.h), which is more than a K panel needs.
static_assert(sizeof(PanelKBlock) <= (QK_K / 32) * kPanelBlockBytes, "PanelKBlock fits panel_bytes");

// Packs n_cols (<= 16) rows of Q8_K blocks into one panel; the lanes of missing tokens are 0.
inline void pack_panel_k(int64_t n, const void* vy, size_t y_stride, int n_cols, void* vpanel) {
  PanelKBlock* panel = static_cast<PanelKBlock*>(vpanel);
  const uint8_t* y = static_cast<const uint8_t*>(vy);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    PanelKBlock& p = panel[b];
    std::memset(&p, 0, sizeof(p));
    for (int t = 0; t < n_cols; ++t) {
      const block_q8_K& yb = reinterpret_cast<const block_q8_K*>(y + t * y_stride)[b];
      for (int k = 0; k < QK_K / 4; ++k) std::memcpy(p.qs[k][t], yb.qs + 4 * k, 4);
      p.d[t] = yb.d;
      for (int g = 0; g < QK_K / 16; ++g) p.bsums[g][t] = yb.bsums[g];
    }
  }
}

// The tokens' sums over sub-block j (16 lanes).
template <typename T>
inline __m512i sub_block_sums(const PanelKBlock& p, int j) {
  if constexpr (T::kSub == 32) return _mm512_add_epi32(_mm512_load_si512(p.bsums[2 * j]), _mm512_load_si512(p.bsums[2 * j + 1]));
  else return _mm512_load_si512(p.bsums[j]);
}

// One row's super-block unpacked for a panel kernel: quants as 4-byte groups, scales, mins.
template <typename T>
struct UnpackedK {
  alignas(32) int32_t q[QK_K / 4];
  int32_t sc[16], mn[16];
  float d, dmin;
  void set(const typename T::BX& x) {
    __m256i v[8];
    T::quants(x, v);
    for (int i = 0; i < 8; ++i) _mm256_store_si256(reinterpret_cast<__m256i*>(q + 8 * i), v[i]);
    T::scales(x, sc, mn);
    d = T::d(x);
    dmin = T::dmin(x);
  }
};

// Adds sub-block j's integer sums isum (zero point not yet subtracted) to a row's scaled and
// mins sums, for the tokens whose sums over the sub-block are ysum.
template <typename T>
inline void add_sub_block(__m512i isum, __m512i ysum, int32_t sc, int32_t mn, __m512i& scaled, __m512i& mins) {
  if constexpr (T::kZeroShift >= 0) isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(ysum, T::kZeroShift));
  scaled = _mm512_add_epi32(scaled, _mm512_mullo_epi32(isum, _mm512_set1_epi32(sc)));
  if constexpr (T::kMins) mins = _mm512_add_epi32(mins, _mm512_mullo_epi32(ysum, _mm512_set1_epi32(mn)));
}

// The 8 partial sums of avx2_k_tile.h's order for 16 tokens (S, then M), and their result.
struct PanelPartials {
  alignas(64) float S[8][kPanelTokens], M[8][kPanelTokens];
  void clear() { std::memset(this, 0, sizeof(*this)); }
  void store(float* out, size_t out_stride, int n_cols) const {
    __m512 d[8];
    for (int l = 0; l < 8; ++l) d[l] = _mm512_sub_ps(_mm512_load_ps(S[l]), _mm512_load_ps(M[l]));
    alignas(64) float sums[kPanelTokens];
    _mm512_store_ps(sums, combine_partials(d));
    for (int c = 0; c < n_cols; ++c) out[c * out_stride] = sums[c];
  }
};

// Partial sums b mod 8 += super-block b's integer sums (avx2_k_tile.h's order).
template <typename T>
inline void add_super_block(__m512i scaled, __m512i mins, __m512 dy, float d, float dmin, PanelPartials& p, int64_t b) {
  float* S = p.S[b % 8];
  float* M = p.M[b % 8];
  _mm512_store_ps(S, _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled), _mm512_mul_ps(dy, _mm512_set1_ps(d)), _mm512_load_ps(S)));
  if constexpr (T::kMins)
    _mm512_store_ps(M, _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dy, _mm512_set1_ps(dmin)), _mm512_load_ps(M)));
}

// R weight rows x one panel of up to 16 tokens.
template <typename T, int R>
inline void k_panel_kernel(int64_t nb, float* out, size_t out_stride, const uint8_t* x, size_t x_stride,
                           const PanelKBlock* panel, int n_cols) {
  using BX = typename T::BX;
  constexpr int kChunks = T::kSub / 4;
  const BX* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = reinterpret_cast<const BX*>(x + r * x_stride);
  PanelPartials partials[R];
  for (int r = 0; r < R; ++r) partials[r].clear();
  UnpackedK<T> w[R];
  for (int64_t b = 0; b < nb; ++b) {
    const PanelKBlock& p = panel[b];
    for (int r = 0; r < R; ++r) w[r].set(xr[r][b]);
    // Reload each 4-byte group as a broadcast from memory (see panel_kernel).
    __asm__ volatile("" : : "r"(w) : "memory");
    __m512i scaled[R], mins[R];
    for (int r = 0; r < R; ++r) scaled[r] = mins[r] = _mm512_setzero_si512();
    for (int j = 0; j < QK_K / T::kSub; ++j) {
      __m512i isum[R];
      for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
      for (int k = j * kChunks; k < (j + 1) * kChunks; ++k) {
        const __m512i a = _mm512_load_si512(p.qs[k]);
        for (int r = 0; r < R; ++r) isum[r] = _mm512_dpbusd_epi32(isum[r], _mm512_set1_epi32(w[r].q[k]), a);
      }
      const __m512i ysum = sub_block_sums<T>(p, j);
      for (int r = 0; r < R; ++r) add_sub_block<T>(isum[r], ysum, w[r].sc[j], w[r].mn[j], scaled[r], mins[r]);
    }
    const __m512 dy = _mm512_load_ps(p.d);
    for (int r = 0; r < R; ++r) add_super_block<T>(scaled[r], mins[r], dy, w[r].d, w[r].dmin, partials[r], b);
  }
  for (int r = 0; r < R; ++r) partials[r].store(out + r, out_stride, n_cols);
}

// The kernel table's gemm_panel for a K-quant: n_rows weight rows x n_cols tokens in
// consecutive panels (panel_bytes(n) apart).
template <typename T>
void gemm_panel_k(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* panels,
                  int n_rows, int n_cols) {
  const int64_t nb = n / QK_K;
  const uint8_t* x = static_cast<const uint8_t*>(vx);
  for_each_panel(n, panels, n_cols, [&](const uint8_t* panel, int c0, int cols) {
    const PanelKBlock* p = reinterpret_cast<const PanelKBlock*>(panel);
    float* o = out + c0 * out_stride;
    for_each_group<4, 1>(n_rows, [&](auto rows, int r) {
      k_panel_kernel<T, decltype(rows)::value>(nb, o + r, out_stride, x + r * x_stride, x_stride, p, cols);
    });
  });
}

#if defined(EMBER_ISA_amx)
template <typename T>
void gemm_panel_k_amx(int64_t n, float* out, size_t out_stride, const void* vx, size_t x_stride, const void* panels,
                      int n_rows, int n_cols);  // quants/x86/amx_panel.h
#endif

// A K-quant's prompt kernel: the tiles in the amx table, vpdpbusd otherwise.
template <typename T>
constexpr GemmPanelFn k_panel_kernel_for() {
#if defined(EMBER_ISA_amx)
  return gemm_panel_k_amx<T>;
#else
  return gemm_panel_k<T>;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
#if defined(EMBER_ISA_amx)
#include "quants/x86/amx_panel.h"
#endif
#endif
