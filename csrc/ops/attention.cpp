// Attention over the KV cache. Phase 1 writes the batch's K and V rows into the cache at
// (sequence, position), in the cache's types (F32, F16 or Q8_0); phase 2 computes, for every
// (token, head), softmax(q.K^T * scale) V over the positions that token may see: its own
// sequence, positions <= its own, and with a sliding window w only the last w of them.
// Non-causal attention (encoders, AttentionParams::causal false) sees every position of its
// sequence up to the last one in the batch. With ALiBi (jina-bert-v2) the scaled score of
// position j from position i gets -slope(h) |i - j|, head h's slope as ggml's (max bias b,
// n = n_head rounded down to a power of 2): 2^(-b (h + 1) / n) for h < n, else
// 2^(-b (2 (h - n) + 1) / (2 n)). Grouped-query attention maps query head h to KV
// head h / (n_head / n_kv_head) by index; nothing is copied.
//
// Phase 2 is tiled as flash attention is (Dao et al. 2022): the cached rows are taken
// kAttnBlock positions at a time and every query row that reads them is updated with an online
// softmax (running max m and sum l; a block with max m' rescales the output and l by
// exp(m - m')), so no score row longer than a block exists. A prompt's tokens of one sequence
// form tiles of up to kAttnLanes (token, head) rows on one KV head, and each block of keys and
// values is converted to F32 once for the whole tile. A lone token (decode) is a tile of its
// heads on all KV heads, so that each position's cache row is read whole and in order; its few
// rows per KV head read the F16, Q8_0 or F32 elements in place, converted in registers inside
// the dot products and the weighted sum of values. When the token is the whole batch the
// threads split its positions and combine their partial softmaxes.
//
// Multi-head latent attention (DeepSeek-V2/V3) caches per token only the compressed latent c
// (kv_lora_rank) and the rotary key k_pe, one row shared by all heads, and computes in the
// absorbed form: with head h's key and value up-projections W_UK[h] (attn_k_b, rank x nope)
// and W_UV[h] (attn_v_b, value x rank), q_nope . (W_UK c) = (W_UK^T q_nope) . c, so each
// query is projected into the latent space once, attends over the cached rows [c | k_pe] as
// one shared KV head whose values are the latents, and the weighted latent is projected to the
// head's output by W_UV. No per-head key or value is formed, in prefill or decode.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/fp16.h"
#include "core/mathfn.h"
#include "ops/common.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

// The vector type of the tiled attention is passed between inline functions only.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

// Multi-head latent attention: query heads are computed together, so each F16 key and value
// row is converted once for all of them; per head the sums run in the same order as for one
// head alone.
constexpr int kMaxHeads = 4;  // heads per pass (accumulators in registers)

constexpr int64_t kPrefetchAhead = 8;  // positions

inline void prefetch_bytes(const void* p, size_t bytes) {
#if defined(__AVX2__)
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
#else
  (void)p, (void)bytes;
#endif
}

// out[g * out_stride] = dot(q + g * n, k) for g < G.
template <int G>
inline void dots_f32_f16(const float* q, const uint16_t* k, int64_t n, float* out, size_t out_stride) {
  int64_t i = 0;
  float sum[G];
#if defined(__AVX512F__)
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 kv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + i)));
    for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * n + i), kv, acc[g]);
  }
  for (int g = 0; g < G; ++g) sum[g] = _mm512_reduce_add_ps(acc[g]);
#elif defined(__AVX2__)
  __m256 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i)));
    for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * n + i), kv, acc[g]);
  }
  for (int g = 0; g < G; ++g) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[g]), _mm256_extractf128_ps(acc[g], 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    sum[g] = _mm_cvtss_f32(s4);
  }
#else
  for (int g = 0; g < G; ++g) sum[g] = 0.0f;
#endif
  for (int g = 0; g < G; ++g) {
    for (int64_t r = i; r < n; ++r) sum[g] += q[g * n + r] * fp16_to_fp32(k[r]);
    out[g * out_stride] = sum[g];
  }
}

// Rows of F16 cache entries, row j at base + j * stride.
struct CacheRows {
  const uint16_t* base;
  int64_t stride;
  const uint16_t* row(int64_t j) const { return base + j * stride; }
};

// acc[g * head_dim + c] = sum over j in [first, pos] of w[g * w_stride + j] * v_j[c], g < G, in
// order of j: one chain of FMAs per column, whatever the vector width. With AVX-512, 64 columns
// (4 G accumulators) stay in registers across all j; with AVX2, 16.
template <int G>
inline void weighted_values(float* acc, const float* w, size_t w_stride, CacheRows values, int64_t first,
                            int64_t pos, int64_t head_dim) {
  int64_t c0 = 0;
#if defined(__AVX512F__)
  for (; c0 + 64 <= head_dim; c0 += 64) {
    __m512 a[G][4];
    for (int g = 0; g < G; ++g)
      for (int q = 0; q < 4; ++q) a[g][q] = _mm512_setzero_ps();
    for (int64_t j = first; j <= pos; ++j) {
      const uint16_t* v = values.row(j) + c0;
      __m512 vq[4];
      for (int q = 0; q < 4; ++q) vq[q] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * q)));
      for (int g = 0; g < G; ++g) {
        const __m512 wj = _mm512_set1_ps(w[g * w_stride + j]);
        for (int q = 0; q < 4; ++q) a[g][q] = _mm512_fmadd_ps(wj, vq[q], a[g][q]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int q = 0; q < 4; ++q) _mm512_storeu_ps(acc + g * head_dim + c0 + 16 * q, a[g][q]);
  }
#endif
#if defined(__AVX2__)
  for (; c0 + 16 <= head_dim; c0 += 16) {
    __m256 a[G][2];
    for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = _mm256_setzero_ps();
    for (int64_t j = first; j <= pos; ++j) {
      const uint16_t* v = values.row(j) + c0;
      const __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)));
      const __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 8)));
      for (int g = 0; g < G; ++g) {
        const __m256 wj = _mm256_broadcast_ss(w + g * w_stride + j);
        a[g][0] = _mm256_fmadd_ps(wj, v0, a[g][0]);
        a[g][1] = _mm256_fmadd_ps(wj, v1, a[g][1]);
      }
    }
    for (int g = 0; g < G; ++g) {
      _mm256_storeu_ps(acc + g * head_dim + c0, a[g][0]);
      _mm256_storeu_ps(acc + g * head_dim + c0 + 8, a[g][1]);
    }
  }
#endif
  for (int g = 0; g < G; ++g)
    for (int64_t c = c0; c < head_dim; ++c) acc[g * head_dim + c] = 0.0f;
  for (int64_t j = first; j <= pos && c0 < head_dim; ++j) {
    const uint16_t* v = values.row(j);
    for (int64_t c = c0; c < head_dim; ++c) {
      const float vc = fp16_to_fp32(v[c]);
      for (int g = 0; g < G; ++g) acc[g * head_dim + c] += w[g * w_stride + j] * vc;
    }
  }
}

// s[j] = exp(c(s[j] scale) - max), j < n, where c caps the logits softly when softcap > 0;
// returns the sum of the new s[j]. With AVX-512, 16 positions at a time (the last ones masked).
inline float softmax_in_place(float* s, int64_t n, float scale, float softcap) {
  int64_t j = 0;
  float max_score = -INFINITY, sum = 0.0f;
#if defined(__AVX512F__)
  const __m512 vscale = _mm512_set1_ps(scale), vcap = _mm512_set1_ps(softcap), inv_cap = _mm512_set1_ps(1.0f / softcap);
  auto lanes = [&](int64_t j) { return n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1); };
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (; j < n; j += 16) {
    const __mmask16 m = lanes(j);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), vscale);
    if (softcap > 0.0f) x = _mm512_mul_ps(vcap, tanh_approx16(_mm512_mul_ps(x, inv_cap)));
    _mm512_mask_storeu_ps(s + j, m, x);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, x);
  }
  max_score = _mm512_reduce_max_ps(vmax);
  const __m512 vm = _mm512_set1_ps(max_score);
  __m512 vsum = _mm512_setzero_ps();
  for (j = 0; j < n; j += 16) {
    const __mmask16 m = lanes(j);
    const __m512 e = exp_approx16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), vm));
    _mm512_mask_storeu_ps(s + j, m, e);
    vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
  }
  return _mm512_reduce_add_ps(vsum);
#else
  for (; j < n; ++j) {
    float x = s[j] * scale;
    if (softcap > 0.0f) x = softcap * tanh_approx(x / softcap);
    s[j] = x;
    max_score = std::max(max_score, x);
  }
  for (j = 0; j < n; ++j) {
    s[j] = exp_approx(s[j] - max_score);
    sum += s[j];
  }
  return sum;
#endif
}

// What one pass of G query heads reads and writes: the queries (G x key_dim floats, head after
// head), the cached keys and values, the positions [first, pos] they see, and the output
// (G x value_dim floats). scores: G x n_ctx floats, acc: G x value_dim.
struct HeadsPass {
  const float* q;
  CacheRows keys, values;
  int64_t key_dim, value_dim, first, pos, n_ctx;
  float scale, softcap;
  float *scores, *acc, *y;
};

// ALiBi's slope of head h of n_head (ggml's soft_max max_bias).
float alibi_slope(int64_t h, int64_t n_head, float max_bias) {
  const int64_t n = int64_t{1} << static_cast<int>(std::floor(std::log2(static_cast<double>(n_head))));
  return h < n ? std::pow(2.0f, -max_bias * static_cast<float>(h + 1) / static_cast<float>(n))
               : std::pow(2.0f, -max_bias * static_cast<float>(2 * (h - n) + 1) / static_cast<float>(2 * n));
}

// Scores over the visible positions, softmax, the weighted sum of values.
template <int G>
void attend(const HeadsPass& p) {
  // The cache rows come from memory (a step's weights pass through the caches in between):
  // fetch the keys kPrefetchAhead positions ahead, and each value row as its key is used.
  const size_t key_bytes = p.key_dim * sizeof(uint16_t), value_bytes = p.value_dim * sizeof(uint16_t);
  for (int64_t j = p.first; j <= p.pos; ++j) {
    if (j + kPrefetchAhead <= p.pos) prefetch_bytes(p.keys.row(j + kPrefetchAhead), key_bytes);
    if (p.values.base != p.keys.base) prefetch_bytes(p.values.row(j), value_bytes);
    dots_f32_f16<G>(p.q, p.keys.row(j), p.key_dim, p.scores + j, p.n_ctx);
  }
  float inv_sum[G];
  for (int g = 0; g < G; ++g)
    inv_sum[g] = 1.0f / softmax_in_place(p.scores + g * p.n_ctx + p.first, p.pos + 1 - p.first, p.scale, p.softcap);
  weighted_values<G>(p.acc, p.scores, p.n_ctx, p.values, p.first, p.pos, p.value_dim);
  for (int g = 0; g < G; ++g)
    for (int64_t c = 0; c < p.value_dim; ++c) p.y[g * p.value_dim + c] = p.acc[g * p.value_dim + c] * inv_sum[g];
}

// attend<run>, run = 1 .. kMaxHeads.
void attend_run(const HeadsPass& p, int64_t run) {
  switch (run) {
    case 4: return attend<4>(p);
    case 3: return attend<3>(p);
    case 2: return attend<2>(p);
    default: return attend<1>(p);
  }
}

// -- tiled attention over the KV cache --------------------------------------------------------
// Every query row's arithmetic is the same whichever rows share its tile (a prompt's or a lone
// token's), and its blocks start at multiples of kAttnBlock: a token's result does not depend on
// how the batch was cut, except for a lone token split across threads (attend_split).

#if defined(__AVX512F__)
constexpr int kW = 16;  // floats per vector; also keys per group of dot products
#else
constexpr int kW = 8;
#endif
typedef float fvec __attribute__((vector_size(kW * sizeof(float))));
typedef int32_t ivec __attribute__((vector_size(kW * sizeof(float))));
static_assert(kAttnBlock % kW == 0, "a block is whole key groups");

inline fvec loadv(const float* p) {
  fvec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, fvec v) { std::memcpy(p, &v, sizeof v); }
inline fvec splat(float x) { return fvec{} + x; }
// Lane 0 after rounds w = kW / 2, ..., 1 of v[i] = op(v[i], v[i + w]) (i < w), op + or max,
// in registers.
template <bool Max>
inline float hfold(fvec v) {
#if defined(__AVX2__)
  auto op8 = [](__m256 x, __m256 y) { return Max ? _mm256_max_ps(x, y) : _mm256_add_ps(x, y); };
  auto op4 = [](__m128 x, __m128 y) { return Max ? _mm_max_ps(x, y) : _mm_add_ps(x, y); };
#if defined(__AVX512F__)
  const __m256 s8 = op8(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
#else
  const __m256 s8 = v;
#endif
  __m128 s4 = op4(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = op4(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(op4(s4, _mm_movehdup_ps(s4)));
#else
  for (int w = kW / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) v[i] = Max ? std::max(v[i], v[i + w]) : v[i] + v[i + w];
  return v[0];
#endif
}
inline float hsum(fvec v) { return hfold<false>(v); }
inline float hmax(fvec v) { return hfold<true>(v); }

// exp_approx on a vector: the same range reduction and polynomial; rounding to the nearest
// integer by adding and subtracting 1.5 * 2^23 (|x log2 e| < 2^22 after the clamp).
inline fvec exp_v(fvec x) {
  using namespace exp_consts;
  x = x < kMin ? splat(kMin) : x;
  x = x > kMax ? splat(kMax) : x;
  const fvec n = (x * kLog2e + 12582912.0f) - 12582912.0f;
  fvec r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  fvec p = splat(kPoly[0]);
  for (int i = 1; i < 7; ++i) p = p * r + kPoly[i];
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  fvec scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// c(x * scale): the scaled score, capped softly (cap tanh(x / cap)) when softcap > 0.
inline fvec capped(fvec x, float scale, float softcap) {
  x *= scale;
  if (softcap > 0.0f) x = softcap * (1.0f - 2.0f / (exp_v(x * (2.0f / softcap)) + 1.0f));
  return x;
}

// Dot products of one query with kW keys: kW accumulators of partial sums, then a reduction
// network. Round H adds, for each key, lane k and lane k + H of its 2H partial sums and packs
// two vectors' keys into one (the first's keys, then the second's), until lane i holds key i's sum.
constexpr int reduce_lane(int h, bool hi, int i) {
  const int half = kW / 2, source = i < half ? 0 : kW, k = i % half;
  return source + (k / h) * 2 * h + k % h + (hi ? h : 0);
}
template <int H, bool Hi, size_t... I>
[[gnu::always_inline]] inline fvec reduce_shuffle(fvec x, fvec y, std::index_sequence<I...>) {
  return __builtin_shufflevector(x, y, reduce_lane(H, Hi, static_cast<int>(I))...);
}
// a[0 .. 2H - 1] -> a[0 .. H - 1], then the rounds below.
template <int H>
[[gnu::always_inline]] inline void reduce_rounds(fvec* a) {
  using Lanes = std::make_index_sequence<kW>;
  for (int i = 0; i < H; ++i)
    a[i] = reduce_shuffle<H, false>(a[2 * i], a[2 * i + 1], Lanes{}) + reduce_shuffle<H, true>(a[2 * i], a[2 * i + 1], Lanes{});
  if constexpr (H > 1) reduce_rounds<H / 2>(a);
}

// Elements c .. c + kW - 1 of a cached row of type T (F32, F16 or Q8_0; c a multiple of kW) as
// floats: the values row_to_f32 writes, converted in registers.
template <GGMLType T>
[[gnu::always_inline]] inline fvec cached_elems(const uint8_t* row, int64_t c) {
  fvec v;
  if constexpr (T == GGMLType::F16) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(row) + c;
#if defined(__AVX512F__)
    v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
#elif defined(__AVX2__)
    v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
#else
    for (int i = 0; i < kW; ++i) v[i] = fp16_to_fp32(h[i]);
#endif
  } else if constexpr (T == GGMLType::Q8_0) {
    static_assert(QK8_0 % kW == 0, "a vector of elements lies in one block");
    const block_q8_0& b = reinterpret_cast<const block_q8_0*>(row)[c / QK8_0];
    const int8_t* qs = b.qs + c % QK8_0;
#if defined(__AVX512F__)
    v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
#elif defined(__AVX2__)
    v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs))));
#else
    for (int i = 0; i < kW; ++i) v[i] = static_cast<float>(qs[i]);
#endif
    v = fp16_to_fp32(b.d) * v;
  } else {
    v = loadv(reinterpret_cast<const float*>(row) + c);
  }
  return v;
}

// f(std::integral_constant<GGMLType, T>) for the cache type t.
template <typename F>
inline void with_cache_type(GGMLType t, F&& f) {
  switch (t) {
    case GGMLType::F16: return f(std::integral_constant<GGMLType, GGMLType::F16>{});
    case GGMLType::Q8_0: return f(std::integral_constant<GGMLType, GGMLType::Q8_0>{});
    default: return f(std::integral_constant<GGMLType, GGMLType::F32>{});
  }
}

// Lane i: dot(q, key i) over d elements (a multiple of kW), elements c .. c + kW - 1 of key i
// being elems(i, c): the same products and sums however the keys are stored.
template <typename Elems>
[[gnu::always_inline]] inline fvec key_dots(const float* q, int64_t d, Elems elems) {
  fvec acc[kW];
  for (int i = 0; i < kW; ++i) acc[i] = fvec{};
  for (int64_t c = 0; c < d; c += kW) {
    const fvec qc = loadv(q + c);
    for (int i = 0; i < kW; ++i) acc[i] += qc * elems(i, c);
  }
  reduce_rounds<kW / 2>(acc);
  return acc[0];
}

// Key dots over kW cached rows of type T, row i at keys + i * stride.
template <GGMLType T>
[[gnu::always_inline]] inline fvec key_dots(const float* q, const uint8_t* keys, size_t stride, int64_t d) {
  return key_dots(q, d, [&](int i, int64_t c) __attribute__((always_inline)) {
    return cached_elems<T>(keys + i * stride, c);
  });
}

// Key dots over a group of kW F32 keys packed chunk by chunk: elements c .. c + kW - 1 of key i
// at keys + c kW + i kW, so that one pointer addresses all of a chunk's keys.
[[gnu::always_inline]] inline fvec packed_key_dots(const float* q, const float* keys, int64_t d) {
  return key_dots(q, d, [&](int i, int64_t c) __attribute__((always_inline)) { return loadv(keys + (c + i) * kW); });
}

// One cached row of n elements (F32, F16 or Q8_0) as floats, inline: a block converts 64 rows.
// Elements c .. c + kW - 1 go to dst + (c / kW) chunk (chunk kW: one contiguous row).
inline void row_to_f32(GGMLType type, const uint8_t* src, float* dst, int64_t n, int64_t chunk = kW) {
  with_cache_type(type, [&](auto t) {
    constexpr GGMLType T = decltype(t)::value;
    int64_t i = 0;
    for (; i + kW <= n; i += kW) storev(dst + i / kW * chunk, cached_elems<T>(src, i));
    float* tail = dst + i / kW * chunk - i;
    if constexpr (T == GGMLType::F16) {
      for (; i < n; ++i) tail[i] = fp16_to_fp32(reinterpret_cast<const uint16_t*>(src)[i]);
    } else if constexpr (T == GGMLType::F32) {
      for (; i < n; ++i) tail[i] = reinterpret_cast<const float*>(src)[i];
    }  // Q8_0 rows are whole blocks, whole vectors
  });
}

// The cached rows of one KV head of one sequence: row j at base + j * stride, n elements of type.
struct CachedHead {
  const uint8_t* base;  // position 0
  size_t stride;        // bytes from one position to the next
  GGMLType type;
  int64_t n;
  const uint8_t* row(int64_t j) const { return base + j * stride; }
  // KV head kvh of the sequence whose head 0 this is.
  CachedHead head(int64_t kvh) const { return {base + row_bytes(type, kvh * n), stride, type, n}; }
  // Positions j0 .. j0 + count - 1 as F32 rows into dst, prefetching the block after them: rows
  // padded_head_dim(n) apart, or packed (groups of kW keys as packed_key_dots reads them, dst a
  // group's start). The padding is left as it is.
  void load(int64_t j0, int64_t count, int64_t end, float* dst, bool packed = false) const {
    const int64_t row = padded_head_dim(n);
    const size_t bytes = row_bytes(type, n);
    for (int64_t j = 0; j < count; ++j) {
      if (j0 + j + kAttnBlock < end)
        for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(base + (j0 + j + kAttnBlock) * stride + b);
      if (packed)
        row_to_f32(type, base + (j0 + j) * stride, dst + (j / kW * row + j % kW) * kW, n, kW * kW);
      else
        row_to_f32(type, base + (j0 + j) * stride, dst + j * row, n);
    }
  }
};

// KV head 0 of sequence seq's cached keys or values.
CachedHead cached_rows(const KVCache& cache, bool values, int64_t seq, int64_t head_dim) {
  const GGMLType type = values ? cache.v_type : cache.k_type;
  const size_t stride = values ? cache.v_bytes : cache.k_bytes;
  const ZeroPages& rows = values ? cache.v : cache.k;
  return {rows.get() + seq * cache.n_ctx * stride, stride, type, head_dim};
}

// Per-thread scratch (AttentionWork): keys and values of a block, queries, scores (a row's
// kAttnBlock apart), a segment's outputs, the merged outputs, and per row the running max, sum
// and last rescaling of the segment and the max and sum of the merged ones. Rows of values,
// queries and outputs are padded_head_dim floats, the padding zero; the keys are the same rows
// packed in groups of kW (CachedHead::load).
struct Scratch {
  float *keys, *values, *queries, *scores, *out, *result, *stats;
  float* max() const { return stats; }  // of the current segment
  float* sum() const { return stats + kAttnLanes; }
  float* rescale() const { return stats + 2 * kAttnLanes; }
  float* total_max() const { return stats + 3 * kAttnLanes; }  // of the segments merged into result
  float* total_sum() const { return stats + 4 * kAttnLanes; }
};

// Up to kAttnLanes query rows of one sequence, each on KV head kvh and seeing positions
// [first, last]; with ALiBi, each row's head slope and token position. Rows of one KV head are
// consecutive.
struct QueryRows {
  int64_t n = 0;
  const float* q[kAttnLanes];
  int64_t kvh[kAttnLanes], first[kAttnLanes], last[kAttnLanes], pos[kAttnLanes];
  float slope[kAttnLanes];
};

// Zero padding of the scratch rows, then the queries copied into it.
void prepare_rows(const QueryRows& rows, int64_t d, const Scratch& w) {
  const int64_t dp = padded_head_dim(d);
  if (dp != d) {
    std::fill(w.keys, w.keys + kAttnBlock * dp, 0.0f);
    std::fill(w.values, w.values + kAttnBlock * dp, 0.0f);
    std::fill(w.queries, w.queries + rows.n * dp, 0.0f);
  }
  for (int64_t r = 0; r < rows.n; ++r) std::copy(rows.q[r], rows.q[r] + d, w.queries + r * dp);
}

// One block's scores of one row: scaled, capped, biased by -slope |j - pos| (ALiBi, slope > 0),
// masked to [first, last], then the online softmax step: the new max, the old outputs'
// rescaling exp(m - m'), the weights exp(s - m') in place of the scores and their sum added to l.
inline void softmax_block(float* s, int64_t groups, int64_t j0, int64_t first, int64_t last, float scale,
                          float softcap, float slope, int64_t pos_q, float& m, float& l, float& rescale) {
  fvec iota;
  for (int i = 0; i < kW; ++i) iota[i] = static_cast<float>(i);
  const fvec lo = splat(static_cast<float>(first)), hi = splat(static_cast<float>(last));
  fvec block_max = splat(-INFINITY);
  for (int64_t g = 0; g < groups; ++g) {
    const fvec pos = iota + static_cast<float>(j0 + g * kW);
    fvec x = capped(loadv(s + g * kW), scale, softcap);
    if (slope > 0.0f) {
      const fvec distance = pos - static_cast<float>(pos_q);
      x -= slope * (distance < 0.0f ? -distance : distance);
    }
    x = (pos >= lo) & (pos <= hi) ? x : splat(-INFINITY);
    storev(s + g * kW, x);
    block_max = block_max > x ? block_max : x;
  }
  const float m_new = std::max(m, hmax(block_max));
  const float shift = m_new == -INFINITY ? 0.0f : m_new;  // a row that has seen nothing yet
  rescale = exp_v(splat(m - shift))[0];
  fvec sum = fvec{};
  for (int64_t g = 0; g < groups; ++g) {
    const fvec x = loadv(s + g * kW), e = x == splat(-INFINITY) ? fvec{} : exp_v(x - splat(shift));
    storev(s + g * kW, e);
    sum += e;
  }
  l = l * rescale + hsum(sum);
  m = m_new;
}

// out[i][c0 ..] += sum over j < nb of w[i][j] v[j][c0 ..], for R rows and CV vectors of columns;
// value row j of type T at v + j * stride.
template <int R, int CV, GGMLType T>
[[gnu::always_inline]] inline void weigh_values(float* out, const float* w, const uint8_t* v, size_t stride, int64_t d,
                                                int64_t c0, int64_t nb) {
  fvec acc[R][CV];
  for (int i = 0; i < R; ++i)
    for (int u = 0; u < CV; ++u) acc[i][u] = loadv(out + i * d + c0 + u * kW);
  for (int64_t j = 0; j < nb; ++j) {
    fvec vj[CV];
    for (int u = 0; u < CV; ++u) vj[u] = cached_elems<T>(v + j * stride, c0 + u * kW);
    for (int i = 0; i < R; ++i) {
      const float wij = w[i * kAttnBlock + j];
      for (int u = 0; u < CV; ++u) acc[i][u] += wij * vj[u];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int u = 0; u < CV; ++u) storev(out + i * d + c0 + u * kW, acc[i][u]);
}

#if defined(__AVX512F__)
constexpr int kValueVecs = 4;  // column vectors per pass of weigh_values (R rows x this in registers)
#else
constexpr int kValueVecs = 2;
#endif

// The outputs of n rows (d apart, a multiple of kW; already rescaled) plus their weights times
// the block's values, value row j of type T at v + j * stride. A decoding token's heads on one
// KV head (up to 4) read each value row once.
template <GGMLType T>
void add_weighted_values(float* out, const float* w, const uint8_t* v, size_t stride, int64_t n, int64_t d,
                         int64_t nb) {
  for_each_group<4, 3, 2, 1>(static_cast<int>(n), [&](auto rows, int r) {
    constexpr int R = decltype(rows)::value;
    float* o = out + r * d;
    const float* wr = w + r * kAttnBlock;
    int64_t c0 = 0;
    for (; c0 + kValueVecs * kW <= d; c0 += kValueVecs * kW) weigh_values<R, kValueVecs, T>(o, wr, v, stride, d, c0, nb);
    for (; c0 < d; c0 += kW) weigh_values<R, 1, T>(o, wr, v, stride, d, c0, nb);
  });
}

// Query rows of one KV head up to this many read the cache's rows in place (converting them in
// registers for each row); more convert each block to F32 once and read the copy.
constexpr int64_t kInPlaceRows = 8;
constexpr int64_t kPrefetchBlocks = 1;  // in place: the cache rows this many blocks ahead are fetched

// Prefetches bytes [from, to) of each of rows j0 .. j1 - 1.
inline void prefetch_rows(const CachedHead& c, int64_t j0, int64_t j1, size_t from, size_t to) {
  for (int64_t j = j0; j < j1; ++j)
    for (size_t b = from & ~size_t{63}; b < to; b += 64) __builtin_prefetch(c.row(j) + b);
}

// The online softmax of the rows over the positions of one segment, [s0, s0 + kAttnSegment)
// within [lo, hi], block by block and, within a block, KV head by KV head: scores of kW keys at
// a time, the softmax step per row, the outputs rescaled, the weighted values added. Leaves the
// unnormalised outputs in w.out, the maxima and sums in w.max() and w.sum(). keys and values are
// KV head 0's. A row's arithmetic is the same whichever rows share the call and whether the
// cache rows are read in place or from F32 copies (the conversion is exact), so a row's partial
// result is the same bits in a tile and in a split.
__attribute__((noinline)) void attend_segment(const QueryRows& rows, const CachedHead& keys, const CachedHead& values,
                                              float scale, float softcap, int64_t s0, int64_t lo, int64_t hi,
                                              const Scratch& w) {
  const int64_t d = padded_head_dim(keys.n);
  for (int64_t r = 0; r < rows.n; ++r) w.max()[r] = -INFINITY, w.sum()[r] = 0.0f;
  std::fill(w.out, w.out + rows.n * d, 0.0f);
  // Runs of rows on one KV head; whether each reads the cache in place.
  int64_t run_end[kAttnLanes + 1], n_runs = 0;
  bool in_place[kAttnLanes];
  for (int64_t r = 0; r < rows.n; ++n_runs) {
    int64_t e = r + 1;
    while (e < rows.n && rows.kvh[e] == rows.kvh[r]) ++e;
    run_end[n_runs] = e;
    in_place[n_runs] = keys.n == d && d % kW == 0 && e - r <= kInPlaceRows;
    r = e;
  }
  // The bytes of a cache row the rows read, for prefetching.
  const size_t k_from = row_bytes(keys.type, rows.kvh[0] * keys.n), k_to = row_bytes(keys.type, (rows.kvh[rows.n - 1] + 1) * keys.n);
  const size_t v_from = row_bytes(values.type, rows.kvh[0] * values.n),
               v_to = row_bytes(values.type, (rows.kvh[rows.n - 1] + 1) * values.n);
  const int64_t from = std::max(lo, s0), to = std::min(hi, s0 + kAttnSegment - 1);
  for (int64_t j0 = from / kAttnBlock * kAttnBlock; j0 <= to; j0 += kAttnBlock) {
    const int64_t nb = std::min(kAttnBlock, to + 1 - j0), groups = (nb + kW - 1) / kW;
    if (in_place[0] && kPrefetchBlocks > 0) {
      const int64_t p0 = j0 + kPrefetchBlocks * kAttnBlock, p1 = std::min(hi + 1, p0 + kAttnBlock);
      prefetch_rows(keys, p0, p1, k_from, k_to);
      prefetch_rows(values, p0, p1, v_from, v_to);
    }
    for (int64_t run = 0, r0 = 0; run < n_runs; r0 = run_end[run++]) {
      const int64_t r1 = run_end[run];
      const CachedHead k = keys.head(rows.kvh[r0]), v = values.head(rows.kvh[r0]);
      // Groups of kW keys read in place; the others (all, or a last partial one) from F32 copies.
      const int64_t direct = in_place[run] ? nb / kW : 0;
      if (direct < groups) {
        k.load(j0 + direct * kW, nb - direct * kW, to + 1, w.keys + direct * kW * d, true);
        for (int64_t j = nb; j < groups * kW; ++j)  // the last group's missing keys
          for (int64_t c = 0; c < d; c += kW) std::fill_n(w.keys + (j / kW * d + c + j % kW) * kW, kW, 0.0f);
      }
      with_cache_type(k.type, [&](auto t) {
        constexpr GGMLType T = decltype(t)::value;
        for (int64_t r = r0; r < r1; ++r) {
          float* s = w.scores + r * kAttnBlock;
          const float* q = w.queries + r * d;
          int64_t g = 0;
          for (; g < direct; ++g) storev(s + g * kW, key_dots<T>(q, k.row(j0 + g * kW), k.stride, d));
          for (; g < groups; ++g)
            storev(s + g * kW, packed_key_dots(q, w.keys + g * kW * d, d));
          softmax_block(s, groups, j0, rows.first[r], rows.last[r], scale, softcap, rows.slope[r], rows.pos[r],
                        w.max()[r], w.sum()[r], w.rescale()[r]);
          for (int64_t c = 0; c < d; ++c) w.out[r * d + c] *= w.rescale()[r];
        }
      });
      float* out = w.out + r0 * d;
      const float* weights = w.scores + r0 * kAttnBlock;
      if (in_place[run]) {
        with_cache_type(v.type, [&](auto t) {
          add_weighted_values<decltype(t)::value>(out, weights, v.row(j0), v.stride, r1 - r0, d, nb);
        });
      } else {
        v.load(j0, nb, to + 1, w.values);
        add_weighted_values<GGMLType::F32>(out, weights, reinterpret_cast<const uint8_t*>(w.values), d * sizeof(float),
                                           r1 - r0, d, nb);
      }
    }
  }
}

// A running result (y, m, l: d floats, a multiple of kW) takes in a segment's partial (o, m_s,
// l_s): the one with the smaller max is scaled by exp(its max - the larger), so each update has
// one product per element.
__attribute__((noinline)) void merge_partial(float* y, float& m, float& l, const float* o, float m_s, float l_s,
                                             int64_t d) {
  if (l_s == 0.0f) return;  // the row saw no position of the segment
  if (m_s > m) {
    const float a = exp_v(splat(m - m_s))[0];
    for (int64_t c = 0; c < d; c += kW) storev(y + c, loadv(y + c) * a + loadv(o + c));
    l = l * a + l_s;
    m = m_s;
  } else {
    const float b = exp_v(splat(m_s - m))[0];
    for (int64_t c = 0; c < d; c += kW) storev(y + c, loadv(o + c) * b + loadv(y + c));
    l = l_s * b + l;
  }
}

__attribute__((noinline)) void store_output(float* dst, const float* y, float l, int64_t d) {
  const float inv = 1.0f / l;
  for (int64_t c = 0; c < d; ++c) dst[c] = y[c] * inv;
}

// The last position token t sees: its own, or (non-causal) the largest of its sequence in the batch.
int64_t last_visible(const AttentionParams& p, const ExecContext& ctx, int64_t t) {
  int64_t last = ctx.positions[t];
  if (p.causal) return last;
  for (int64_t u = 0; u < ctx.n_tokens; ++u)
    if (ctx.seq_ids[u] == ctx.seq_ids[t]) last = std::max<int64_t>(last, ctx.positions[u]);
  return last;
}

int64_t first_visible(const AttentionParams& p, const ExecContext& ctx, int64_t t) {
  return p.window > 0 ? std::max<int64_t>(0, ctx.positions[t] - p.window + 1) : 0;
}

// A tile: tokens t0 .. t0 + n_tokens - 1 (one sequence) x query heads h0 .. h0 + n_heads - 1,
// row r = (token r / n_heads, head h0 + r % n_heads), segment after segment. The heads of a
// tile of several tokens are on one KV head.
void attend_tile(const Node& n, const AttentionParams& a, ExecContext& ctx, const KVCache& cache, int64_t t0,
                 int64_t n_tokens, int64_t h0, int64_t n_heads, const Scratch& w) {
  const int64_t d = a.head_dim, dp = padded_head_dim(d), group = a.n_head / a.n_kv_head, seq = ctx.seq_ids[t0];
  const Tensor &q = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  QueryRows rows;
  rows.n = n_tokens * n_heads;
  int64_t lo = INT64_MAX, hi = -1;
  for (int64_t r = 0; r < rows.n; ++r) {
    const int64_t t = t0 + r / n_heads, h = h0 + r % n_heads;
    rows.q[r] = operand_row(ctx, q, t) + h * d;
    rows.kvh[r] = h / group;
    rows.first[r] = first_visible(a, ctx, t), rows.last[r] = last_visible(a, ctx, t), rows.pos[r] = ctx.positions[t];
    rows.slope[r] = a.alibi_max_bias > 0.0f ? alibi_slope(h, a.n_head, a.alibi_max_bias) : 0.0f;
    lo = std::min(lo, rows.first[r]), hi = std::max(hi, rows.last[r]);
    w.total_max()[r] = -INFINITY, w.total_sum()[r] = 0.0f;
  }
  prepare_rows(rows, d, w);
  std::fill(w.result, w.result + rows.n * dp, 0.0f);
  const CachedHead keys = cached_rows(cache, false, seq, d), values = cached_rows(cache, true, seq, d);
  for (int64_t s0 = lo / kAttnSegment * kAttnSegment; s0 <= hi; s0 += kAttnSegment) {
    attend_segment(rows, keys, values, a.scale, a.softcap, s0, lo, hi, w);
    for (int64_t r = 0; r < rows.n; ++r)
      merge_partial(w.result + r * dp, w.total_max()[r], w.total_sum()[r], w.out + r * dp, w.max()[r], w.sum()[r], dp);
  }
  for (int64_t r = 0; r < rows.n; ++r)
    store_output(row_f32(ctx, out, t0 + r / n_heads) + (h0 + r % n_heads) * d, w.result + r * dp,
                 w.total_sum()[r], d);
}

// KV heads whose query heads one pass over a lone token's cache rows takes (all of a position's
// row is read at once, as the memory lies): as many as fit a tile.
int64_t kv_heads_per_pass(const AttentionParams& a) {
  const int64_t G = a.n_head / a.n_kv_head;
  return std::max<int64_t>(1, std::min<int64_t>(a.n_kv_head, kAttnLanes / G));
}

// -- the op ---

void store_kv(const Node& n, ExecContext& ctx, KVCache& cache, int ith, int nth) {
  const Tensor &k = src_tensor(ctx, n, 1), &v = src_tensor(ctx, n, 2);
  const QuantizeRowFn to_k = ctx.kernels->of(cache.k_type).quantize_row, to_v = ctx.kernels->of(cache.v_type).quantize_row;
  const Range rows = split(ctx.n_tokens, ith, nth);
  for (int64_t t = rows.begin; t < rows.end; ++t) {
    to_k(operand_row(ctx, k, t), cache.k_row(ctx.seq_ids[t], ctx.positions[t]), cache.k_elems);
    to_v(operand_row(ctx, v, t), cache.v_row(ctx.seq_ids[t], ctx.positions[t]), cache.v_elems);
  }
}

// A batch of one token with G <= kAttnLanes heads per KV head: the threads share out its
// (KV heads, segment) pairs, leave each head's partial output, max and sum per segment, then
// merge some heads' segments in order, as a tile does. A pair takes kv_heads_per_pass KV heads
// where there are segments enough to keep every thread busy, else one.
void attend_split(const Node& n, const AttentionParams& a, ExecContext& ctx, const KVCache& cache,
                  const AttentionWork& work, const Scratch& w, int ith, int nth) {
  const int64_t d = a.head_dim, dp = padded_head_dim(d), G = a.n_head / a.n_kv_head;
  const int64_t stride = static_cast<int64_t>(work.partial_floats), seq = ctx.seq_ids[0];
  const int64_t first = first_visible(a, ctx, 0), last = last_visible(a, ctx, 0);
  const int64_t seg0 = first / kAttnSegment, n_segs = last / kAttnSegment - seg0 + 1;
  const int64_t per_item = n_segs >= 4 * nth ? kv_heads_per_pass(a) : 1;
  const int64_t kv_items = (a.n_kv_head + per_item - 1) / per_item;
  float* partials = reinterpret_cast<float*>(ctx.arena + n.work_offset + work.partials);
  auto partial = [&](int64_t h, int64_t seg) { return partials + (h * n_segs + seg) * stride; };
  const float* q = operand_row(ctx, src_tensor(ctx, n, 0), 0);
  const CachedHead keys = cached_rows(cache, false, seq, d), values = cached_rows(cache, true, seq, d);
  const Range items = split(kv_items * n_segs, ith, nth);
  for (int64_t item = items.begin; item < items.end; ++item) {
    const int64_t h0 = item / n_segs * per_item * G, seg = item % n_segs;
    QueryRows rows;
    rows.n = std::min(per_item * G, a.n_head - h0);
    for (int64_t r = 0; r < rows.n; ++r) {
      const int64_t h = h0 + r;
      rows.q[r] = q + h * d, rows.kvh[r] = h / G, rows.first[r] = first, rows.last[r] = last;
      rows.pos[r] = ctx.positions[0];
      rows.slope[r] = a.alibi_max_bias > 0.0f ? alibi_slope(h, a.n_head, a.alibi_max_bias) : 0.0f;
    }
    prepare_rows(rows, d, w);
    attend_segment(rows, keys, values, a.scale, a.softcap, (seg0 + seg) * kAttnSegment, first, last, w);
    for (int64_t r = 0; r < rows.n; ++r) {
      float* part = partial(h0 + r, seg);
      std::copy(w.out + r * dp, w.out + (r + 1) * dp, part);
      part[dp] = w.max()[r], part[dp + 1] = w.sum()[r];
    }
  }
  ctx.barrier();
  float* y = row_f32(ctx, out_tensor(ctx, n), 0);
  const Range heads = split(a.n_head, ith, nth);
  for (int64_t h = heads.begin; h < heads.end; ++h) {
    float m = -INFINITY, l = 0.0f;
    std::fill(w.result, w.result + dp, 0.0f);
    for (int64_t seg = 0; seg < n_segs; ++seg) {
      const float* part = partial(h, seg);
      merge_partial(w.result, m, l, part, part[dp], part[dp + 1], dp);
    }
    store_output(y + h * d, w.result, l, d);
  }
}

void op_attention(const Node& n, ExecContext& ctx, int ith, int nth) {
  const AttentionParams& a = n.as<AttentionParams>();
  KVCache& cache = ctx.graph->kv(a.kv_layer);
  store_kv(n, ctx, cache, ith, nth);
  ctx.barrier();

  const AttentionWork work = ctx.graph->attention_work(n);
  uint8_t* mine = ctx.arena + n.work_offset + ith * work.per_thread;
  auto at = [&](size_t offset) { return reinterpret_cast<float*>(mine + offset); };
  const Scratch w{at(work.keys),   at(work.values), at(work.queries), at(work.scores),
                  at(work.out),    at(work.result), at(work.stats)};
  const int64_t G = a.n_head / a.n_kv_head;
  if (ctx.n_tokens == 1 && G <= kAttnLanes && nth > 1) return attend_split(n, a, ctx, cache, work, w, ith, nth);

  // Tasks in a fixed order, task i to thread i % nth: for each run of consecutive tokens of one
  // sequence, each KV head's tiles of at most kAttnLanes (token, head) rows; a run of one token
  // (a sequence decoding), tiles of kv_heads_per_pass KV heads.
  const int64_t n_heads = std::min<int64_t>(G, kAttnLanes), n_tok = kAttnLanes / n_heads;
  const int64_t lone = G <= kAttnLanes ? kv_heads_per_pass(a) : 0;
  int64_t task = 0;
  for (int64_t t0 = 0, t1; t0 < ctx.n_tokens; t0 = t1) {
    for (t1 = t0 + 1; t1 < ctx.n_tokens && ctx.seq_ids[t1] == ctx.seq_ids[t0];) ++t1;
    if (t1 - t0 == 1 && lone > 0) {
      for (int64_t kvh = 0; kvh < a.n_kv_head; kvh += lone)
        if (task++ % nth == ith) attend_tile(n, a, ctx, cache, t0, 1, kvh * G, std::min(lone, a.n_kv_head - kvh) * G, w);
      continue;
    }
    for (int64_t kvh = 0; kvh < a.n_kv_head; ++kvh)
      for (int64_t h0 = 0; h0 < G; h0 += n_heads)
        for (int64_t t = t0; t < t1; t += n_tok)
          if (task++ % nth == ith)
            attend_tile(n, a, ctx, cache, t, std::min(n_tok, t1 - t), kvh * G + h0, std::min(n_heads, G - h0), w);
  }
}


// -- multi-head latent attention ------------------------------------------------------------------
// Sources: q [T, H (nope + rope)] (each head's last rope dimensions rotated), c [T, rank] (the
// normalised latent), k_pe [T, rope] (rotated), attn_k_b [H rank rows, nope], attn_v_b
// [H value rows, rank]. Output [T, H value].

constexpr int64_t kHeadRowTile = 16;  // weight rows per work item of a per-head product
static_assert(kHeadRowTile <= kDequantRows, "a work item's rows fit the dequantized rows' scratch");
constexpr int64_t kHeadColTile = 8;   // (token, head) rows per tile call

// Rows (t, h) of the latent-space work, t < T, h < H, at base + (t H + h) * stride.
struct HeadRows {
  uint8_t* base;
  size_t stride;
  uint8_t* row(int64_t t, int64_t h, int64_t n_head) const { return base + (t * n_head + h) * stride; }
};

// Converts rows src(t, h) (F32, k elements) to the activation format of weight w: its
// vec_dot_type, or F32 where the graph dequantizes w. Threads share the rows.
template <typename Src>
void convert_head_rows(ExecContext& ctx, const Tensor& w, int64_t T, int64_t H, int64_t k, Src src, HeadRows dst,
                       int ith, int nth) {
  const bool f32 = ctx.graph->dequantizes(w.type);
  const QuantizeRowFn quantize = ctx.kernels->of(f32 ? GGMLType::F32 : ctx.kernels->of(w.type).vec_dot_type).quantize_row;
  const Range rows = split(T * H, ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) quantize(src(r / H, r % H), dst.row(r / H, r % H, H), k);
}

// y(t, h)[j] = dot(W row h N + j, act(t, h)) for j < N: head h's N x K block of W times each
// token's row of head h. Work items are (head, tile of kHeadRowTile weight rows); each weight
// row is read once for all tokens.
void head_products(ExecContext& ctx, const Tensor& w, int64_t T, int64_t H, int64_t N, HeadRows act, float* y,
                   size_t y_stride, float* rows_f32, int ith, int nth) {
  const int64_t K = w.ne0, tiles = (N + kHeadRowTile - 1) / kHeadRowTile;
  const bool dequantized = ctx.graph->dequantizes(w.type);
  const TypeKernels& tk = ctx.kernels->of(dequantized ? GGMLType::F32 : w.type);
  const DequantizeRowFn dequantize = ctx.kernels->of(w.type).dequantize_row;
  const uint8_t* weights = static_cast<const uint8_t*>(w.weight_data);
  const size_t f32_stride = K * sizeof(float);
  const Range items = split(H * tiles, ith, nth);
  for (int64_t item = items.begin; item < items.end; ++item) {
    const int64_t h = item / tiles, j0 = (item % tiles) * kHeadRowTile, n_rows = std::min(kHeadRowTile, N - j0);
    const uint8_t* rows = weights + (h * N + j0) * w.row_stride;
    size_t rows_stride = w.row_stride;
    if (dequantized) {  // F32 copies of these rows, then the F32 kernels
      for (int64_t r = 0; r < n_rows; ++r) dequantize(rows + r * w.row_stride, rows_f32 + r * K, K);
      rows = reinterpret_cast<const uint8_t*>(rows_f32);
      rows_stride = f32_stride;
    }
    for (int64_t t0 = 0; t0 < T; t0 += kHeadColTile) {
      const int64_t n_cols = std::min(kHeadColTile, T - t0);
      float* out = y + (t0 * H + h) * y_stride + j0;
      const uint8_t* x = act.row(t0, h, H);
      if (tk.gemm_tile) {
        tk.gemm_tile(K, out, H * y_stride, rows, rows_stride, x, H * act.stride, static_cast<int>(n_rows),
                     static_cast<int>(n_cols));
        continue;
      }
      for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t r = 0; r < n_rows; ++r)
          tk.vec_dot(K, out + c * H * y_stride + r, rows + r * rows_stride, x + c * H * act.stride);
    }
  }
}

void op_mla_attention(const Node& n, ExecContext& ctx, int ith, int nth) {
  const MlaAttentionParams& params = n.as<MlaAttentionParams>();
  const int64_t H = params.n_head, rank = params.rank, rope = params.rope, nope = params.nope, value = params.value;
  const int64_t T = ctx.n_tokens;
  const int64_t q_dim = rank + rope;
  const Tensor &q = src_tensor(ctx, n, 0), &c = src_tensor(ctx, n, 1), &k_pe = src_tensor(ctx, n, 2),
               &wk = src_tensor(ctx, n, 3), &wv = src_tensor(ctx, n, 4);
  KVCache& cache = ctx.graph->kv(params.kv_layer);
  const MlaWork work = ctx.graph->mla_work(n, ctx.graph->max_tokens());
  uint8_t* base = ctx.arena + n.work_offset;
  const HeadRows q_act{base + work.q_act, work.q_act_stride}, o_act{base + work.o_act, work.o_act_stride};
  float* query = reinterpret_cast<float*>(base + work.query);
  float* latent = reinterpret_cast<float*>(base + work.latent);
  float* rows_f32 = reinterpret_cast<float*>(base + work.f32_rows + ith * work.f32_rows_stride);

  // 1. The cache rows [c | k_pe] of the batch; the no-rope queries in attn_k_b's activation format.
  const Range tokens = split(T, ith, nth);
  for (int64_t t = tokens.begin; t < tokens.end; ++t) {
    uint16_t* row = reinterpret_cast<uint16_t*>(cache.k_row(ctx.seq_ids[t], ctx.positions[t]));
    const float *cr = operand_row(ctx, c, t), *pr = operand_row(ctx, k_pe, t);
    for (int64_t i = 0; i < rank; ++i) row[i] = fp32_to_fp16(cr[i]);
    for (int64_t i = 0; i < rope; ++i) row[rank + i] = fp32_to_fp16(pr[i]);
  }
  convert_head_rows(ctx, wk, T, H, nope, [&](int64_t t, int64_t h) { return operand_row(ctx, q, t) + h * (nope + rope); },
                    q_act, ith, nth);
  ctx.barrier();

  // 2. Each head's query in the latent space, W_UK[h]^T q_nope, followed by its rotary part.
  head_products(ctx, wk, T, H, rank, q_act, query, q_dim, rows_f32, ith, nth);
  const Range heads = split(T * H, ith, nth);
  for (int64_t r = heads.begin; r < heads.end; ++r) {
    const float* pe = operand_row(ctx, q, r / H) + (r % H) * (nope + rope) + nope;
    std::copy(pe, pe + rope, query + r * q_dim + rank);
  }
  ctx.barrier();

  // 3. Attention over the cached rows, all heads on the one shared row per position; the values
  // are the rows' first rank elements.
  float* scores = reinterpret_cast<float*>(base + work.per_thread + ith * work.per_thread_stride);
  float* acc = scores + kMaxHeads * cache.n_ctx;
  for (int64_t item = heads.begin; item < heads.end;) {
    const int64_t t = item / H, h = item % H, run = std::min({heads.end - item, H - h, int64_t{kMaxHeads}});
    const int64_t seq = ctx.seq_ids[t];
    HeadsPass p;
    p.q = query + item * q_dim;
    p.keys = p.values = {reinterpret_cast<const uint16_t*>(cache.k_row(seq, 0)), cache.k_elems};
    p.key_dim = q_dim;
    p.value_dim = rank;
    p.first = 0;
    p.pos = ctx.positions[t];
    p.n_ctx = cache.n_ctx;
    p.scale = params.scale;
    p.softcap = 0.0f;
    p.scores = scores;
    p.acc = acc;
    p.y = latent + item * rank;
    attend_run(p, run);
    item += run;
  }
  ctx.barrier();

  // 4. Each head's output, W_UV[h] times its weighted latent.
  convert_head_rows(ctx, wv, T, H, rank, [&](int64_t t, int64_t h) { return latent + (t * H + h) * rank; }, o_act,
                    ith, nth);
  ctx.barrier();
  const Tensor& out = out_tensor(ctx, n);
  head_products(ctx, wv, T, H, value, o_act, row_f32(ctx, out, 0), value, rows_f32, ith, nth);
}

}  // namespace

void register_attention_ops(KernelTable& t) {
  t.ops[static_cast<int>(Op::Attention)] = op_attention;
  t.ops[static_cast<int>(Op::MlaAttention)] = op_mla_attention;
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
