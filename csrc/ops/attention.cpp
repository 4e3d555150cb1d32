// Attention over the F16 KV cache. Phase 1 writes the batch's K and V rows into the cache at
// (sequence, position); phase 2 computes, for every (token, head), softmax(q.K^T * scale) V
// over the positions that token may see: its own sequence, positions <= its own, and with a
// sliding window w only the last w of them. Non-causal attention (encoders, AttentionParams::causal false) sees
// every position of its sequence up to the last one in the batch. With ALiBi (jina-bert-v2) the
// scaled score of position j from position i gets -slope(h) |i - j|, head h's slope as ggml's
// (max bias b, n = n_head rounded down to a power of 2): 2^(-b (h + 1) / n) for h < n, else
// 2^(-b (2 (h - n) + 1) / (2 n)). Grouped-query attention maps query head h to KV
// head h / (n_head / n_kv_head) by index; nothing is copied.
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

#include "core/fp16.h"
#include "core/mathfn.h"
#include "ops/common.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ember {
namespace EMBER_ISA_NS {

namespace {

// Query heads that share a KV head are computed together, so each F16 key and value row is
// converted once for all of them; per head the sums run in the same order as for one head alone.
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
  const float* alibi = nullptr;  // the G heads' ALiBi slopes, or none
  int64_t query_pos = 0;         // the query's position (ALiBi's distances)
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
  if (p.alibi) {  // the bias before the scale softmax_in_place applies: -slope |i - j| / scale
    for (int g = 0; g < G; ++g) {
      const float step = p.alibi[g] / p.scale;
      float* s = p.scores + g * p.n_ctx;
      for (int64_t j = p.first; j <= p.pos; ++j) s[j] -= step * static_cast<float>(std::abs(j - p.query_pos));
    }
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

// Heads h0 .. h0 + run - 1 of token t, all on KV head kvh, over positions up to pos.
void attend_heads(const Node& n, const AttentionParams& a, ExecContext& ctx, KVCache& cache, int64_t t, int64_t h0,
                  int64_t kvh, int64_t pos, int64_t run, float* scores, float* acc) {
  const int64_t head_dim = a.head_dim, window = a.window;
  const int64_t seq = ctx.seq_ids[t];
  HeadsPass p;
  p.q = operand_row(ctx, src_tensor(ctx, n, 0), t) + h0 * head_dim;
  p.keys = {cache.k_row(seq, 0) + kvh * head_dim, cache.k_elems};
  p.values = {cache.v_row(seq, 0) + kvh * head_dim, cache.v_elems};
  p.key_dim = p.value_dim = head_dim;
  p.first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  p.pos = pos;
  p.n_ctx = cache.n_ctx;
  p.scale = a.scale;
  p.softcap = a.softcap;
  p.scores = scores;
  p.acc = acc;
  p.y = row_f32(ctx, out_tensor(ctx, n), t) + h0 * head_dim;
  float slopes[kMaxHeads];
  if (a.alibi_max_bias > 0.0f) {
    for (int64_t g = 0; g < run; ++g) slopes[g] = alibi_slope(h0 + g, a.n_head, a.alibi_max_bias);
    p.alibi = slopes;
    p.query_pos = ctx.positions[t];
  }
  attend_run(p, run);
}

void store_kv(const Node& n, ExecContext& ctx, KVCache& cache, int ith, int nth) {
  const Tensor &k = src_tensor(ctx, n, 1), &v = src_tensor(ctx, n, 2);
  const Range rows = split(ctx.n_tokens, ith, nth);
  for (int64_t t = rows.begin; t < rows.end; ++t) {
    const float *kr = operand_row(ctx, k, t), *vr = operand_row(ctx, v, t);
    uint16_t* kd = cache.k_row(ctx.seq_ids[t], ctx.positions[t]);
    uint16_t* vd = cache.v_row(ctx.seq_ids[t], ctx.positions[t]);
    for (int64_t c = 0; c < cache.k_elems; ++c) {
      kd[c] = fp32_to_fp16(kr[c]);
      vd[c] = fp32_to_fp16(vr[c]);
    }
  }
}

// The last position token t sees: its own, or (non-causal) the largest of its sequence in the batch.
int64_t last_visible(const AttentionParams& p, const ExecContext& ctx, int64_t t) {
  int64_t last = ctx.positions[t];
  if (p.causal) return last;
  for (int64_t u = 0; u < ctx.n_tokens; ++u)
    if (ctx.seq_ids[u] == ctx.seq_ids[t]) last = std::max<int64_t>(last, ctx.positions[u]);
  return last;
}

void op_attention(const Node& n, ExecContext& ctx, int ith, int nth) {
  const AttentionParams& p = n.as<AttentionParams>();
  const int64_t n_head = p.n_head, n_kv_head = p.n_kv_head;
  KVCache& cache = ctx.graph->kv(p.kv_layer);
  store_kv(n, ctx, cache, ith, nth);
  ctx.barrier();

  const int64_t group = n_head / n_kv_head;
  float* scores = reinterpret_cast<float*>(ctx.arena + n.work_offset + ith * (n.work_size / ctx.pool->size()));
  float* acc = scores + kMaxHeads * cache.n_ctx;
  // Items are (token, head) pairs; a thread takes its range in runs of heads that share a KV head.
  const Range items = split(ctx.n_tokens * n_head, ith, nth);
  int64_t last_t = -1, pos = 0;
  for (int64_t item = items.begin; item < items.end;) {
    const int64_t t = item / n_head, h = item % n_head, kvh = h / group;
    if (t != last_t) last_t = t, pos = last_visible(p, ctx, t);
    const int64_t run = std::min({items.end - item, (kvh + 1) * group - h, int64_t{kMaxHeads}});
    attend_heads(n, p, ctx, cache, t, h, kvh, pos, run, scores, acc);
    item += run;
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
    uint16_t* row = cache.k_row(ctx.seq_ids[t], ctx.positions[t]);
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
    p.keys = p.values = {cache.k_row(seq, 0), cache.k_elems};
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
