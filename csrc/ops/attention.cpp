// Attention over the F16 KV cache. Phase 1 writes the batch's K and V rows into the cache at
// (sequence, position); phase 2 computes, for every (token, head), softmax(q.K^T * scale) V
// over the positions that token may see: its own sequence, positions <= its own, and with a
// sliding window w only the last w of them. Non-causal attention (encoders, AttentionParams::causal false) sees
// every position of its sequence up to the last one in the batch. Grouped-query attention maps query head h to KV
// head h / (n_head / n_kv_head) by index; nothing is copied.
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

// acc[g * head_dim + c] = sum over j in [first, pos] of w[g * w_stride + j] * v_j[c], g < G, in
// order of j: one chain of FMAs per column, whatever the vector width. With AVX-512, 64 columns
// (4 G accumulators) stay in registers across all j; with AVX2, 16.
template <int G>
inline void weighted_values(float* acc, const float* w, size_t w_stride, KVCache& cache, int64_t seq,
                            int64_t offset, int64_t first, int64_t pos, int64_t head_dim) {
  int64_t c0 = 0;
#if defined(__AVX512F__)
  for (; c0 + 64 <= head_dim; c0 += 64) {
    __m512 a[G][4];
    for (int g = 0; g < G; ++g)
      for (int q = 0; q < 4; ++q) a[g][q] = _mm512_setzero_ps();
    for (int64_t j = first; j <= pos; ++j) {
      const uint16_t* v = cache.v_row(seq, j) + offset + c0;
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
      const uint16_t* v = cache.v_row(seq, j) + offset + c0;
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
    const uint16_t* v = cache.v_row(seq, j) + offset;
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

// Heads h0 .. h0 + G - 1 of token t, all on KV head kvh: scores over the visible positions,
// softmax, the weighted sum of values. scores: G x n_ctx floats, acc: G x head_dim.
template <int G>
void attend_heads(const Node& n, const AttentionParams& p, ExecContext& ctx, KVCache& cache, int64_t t, int64_t h0,
                  int64_t kvh, int64_t pos, float* scores, float* acc) {
  const int64_t head_dim = p.head_dim, window = p.window;
  const float scale = p.scale, softcap = p.softcap;
  const int64_t seq = ctx.seq_ids[t], n_ctx = cache.n_ctx;
  const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  const float* q = operand_row(ctx, src_tensor(ctx, n, 0), t) + h0 * head_dim;
  // The cache rows come from memory (a step's weights pass through the caches in between):
  // fetch the keys kPrefetchAhead positions ahead, and each value row as its key is used.
  const size_t row_bytes = head_dim * sizeof(uint16_t);
  for (int64_t j = first; j <= pos; ++j) {
    if (j + kPrefetchAhead <= pos) prefetch_bytes(cache.k_row(seq, j + kPrefetchAhead) + kvh * head_dim, row_bytes);
    prefetch_bytes(cache.v_row(seq, j) + kvh * head_dim, row_bytes);
    dots_f32_f16<G>(q, cache.k_row(seq, j) + kvh * head_dim, head_dim, scores + j, n_ctx);
  }
  float inv_sum[G];
  for (int g = 0; g < G; ++g) inv_sum[g] = 1.0f / softmax_in_place(scores + g * n_ctx + first, pos + 1 - first, scale, softcap);
  weighted_values<G>(acc, scores, n_ctx, cache, seq, kvh * head_dim, first, pos, head_dim);
  float* y = row_f32(ctx, out_tensor(ctx, n), t) + h0 * head_dim;
  for (int g = 0; g < G; ++g)
    for (int64_t c = 0; c < head_dim; ++c) y[g * head_dim + c] = acc[g * head_dim + c] * inv_sum[g];
}

void store_kv(const Node& n, ExecContext& ctx, KVCache& cache, int ith, int nth) {
  const Tensor &k = src_tensor(ctx, n, 1), &v = src_tensor(ctx, n, 2);
  const Range rows = split(ctx.n_tokens, ith, nth);
  for (int64_t t = rows.begin; t < rows.end; ++t) {
    const float *kr = operand_row(ctx, k, t), *vr = operand_row(ctx, v, t);
    uint16_t* kd = cache.k_row(ctx.seq_ids[t], ctx.positions[t]);
    uint16_t* vd = cache.v_row(ctx.seq_ids[t], ctx.positions[t]);
    for (int64_t c = 0; c < cache.row_elems; ++c) {
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
    switch (run) {
      case 4: attend_heads<4>(n, p, ctx, cache, t, h, kvh, pos, scores, acc); break;
      case 3: attend_heads<3>(n, p, ctx, cache, t, h, kvh, pos, scores, acc); break;
      case 2: attend_heads<2>(n, p, ctx, cache, t, h, kvh, pos, scores, acc); break;
      default: attend_heads<1>(n, p, ctx, cache, t, h, kvh, pos, scores, acc); break;
    }
    item += run;
  }
}

}  // namespace

void register_attention_ops(KernelTable& t) { t.ops[static_cast<int>(Op::Attention)] = op_attention; }

}  // namespace EMBER_ISA_NS
}  // namespace ember
