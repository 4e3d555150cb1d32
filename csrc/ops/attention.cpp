// Attention over the F16 KV cache. Phase 1 writes the batch's K and V rows into the cache at
// (sequence, position); phase 2 computes, for every (token, head), softmax(q.K^T * scale) V
// over the positions that token may see: its own sequence, positions <= its own, and with a
// sliding window w only the last w of them. Grouped-query attention maps query head h to KV
// head h / (n_head / n_kv_head) by index; nothing is copied.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "core/mathfn.h"
#include "ops/common.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ember {
namespace EMBER_ISA_NS {

namespace {

inline float dot_f32_f16(const float* q, const uint16_t* k, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i),
                          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + i))), acc);
  sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i))), acc);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  sum = _mm_cvtss_f32(s4);
#endif
  for (; i < n; ++i) sum += q[i] * fp16_to_fp32(k[i]);
  return sum;
}

// acc += w * v
inline void axpy_f16(float* acc, float w, const uint16_t* v, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 wv = _mm512_set1_ps(w);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(wv, _mm512_cvtph_ps(_mm256_loadu_si256(
                                                      reinterpret_cast<const __m256i*>(v + i))),
                                              _mm512_loadu_ps(acc + i)));
#elif defined(__AVX2__)
  const __m256 wv = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128(
                                                      reinterpret_cast<const __m128i*>(v + i))),
                                              _mm256_loadu_ps(acc + i)));
#endif
  for (; i < n; ++i) acc[i] += w * fp16_to_fp32(v[i]);
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

void op_attention(const Node& n, ExecContext& ctx, int ith, int nth) {
  const int64_t n_head = n.i[0], n_kv_head = n.i[1], head_dim = n.i[2], window = n.i[3];
  const float scale = n.f[0], softcap = n.f[1];
  KVCache& cache = ctx.graph->kv(n.i[4]);
  store_kv(n, ctx, cache, ith, nth);
  ctx.barrier();

  const Tensor &q = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  const int64_t group = n_head / n_kv_head;
  float* scores = reinterpret_cast<float*>(ctx.arena + n.work_offset +
                                           ith * (n.work_size / ctx.pool->size()));
  float* acc = scores + cache.n_ctx;
  const Range items = split(ctx.n_tokens * n_head, ith, nth);
  for (int64_t item = items.begin; item < items.end; ++item) {
    const int64_t t = item / n_head, h = item % n_head, kvh = h / group;
    const int64_t pos = ctx.positions[t], seq = ctx.seq_ids[t];
    const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
    const float* qh = operand_row(ctx, q, t) + h * head_dim;
    float max_score = -INFINITY;
    for (int64_t j = first; j <= pos; ++j) {
      float s = dot_f32_f16(qh, cache.k_row(seq, j) + kvh * head_dim, head_dim) * scale;
      if (softcap > 0.0f) s = softcap * tanh_approx(s / softcap);
      scores[j] = s;
      max_score = std::max(max_score, s);
    }
    float sum = 0.0f;
    for (int64_t j = first; j <= pos; ++j) {
      scores[j] = exp_approx(scores[j] - max_score);
      sum += scores[j];
    }
    std::memset(acc, 0, head_dim * sizeof(float));
    for (int64_t j = first; j <= pos; ++j) axpy_f16(acc, scores[j], cache.v_row(seq, j) + kvh * head_dim, head_dim);
    float* y = row_f32(ctx, out, t) + h * head_dim;
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < head_dim; ++c) y[c] = acc[c] * inv;
  }
}

}  // namespace

void register_attention_ops(KernelTable& t) { t.ops[static_cast<int>(Op::Attention)] = op_attention; }

}  // namespace EMBER_ISA_NS
}  // namespace ember
