// The ops a mixture-of-experts router is composed of (models/moe.py): row softmax, top-k
// selection of expert ids (optionally limited to the best groups of experts, DeepSeek-V3),
// taking the selected experts' probabilities, normalising them to sum 1, and the weighted sum
// of the experts' outputs. Expert ids travel as F32 whole numbers (what matmul_id reads).
#include <cmath>
#include <cstring>
#include <limits>

#include "core/mathfn.h"
#include "ops/common.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// y = exp(x - max x) / sum
void op_softmax(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &a = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const float* x = operand_row(ctx, a, r);
    float* y = row_f32(ctx, out, r);
    float top = kNegInf;
    for (int64_t c = 0; c < out.ne0; ++c) top = std::max(top, x[c]);
    double sum = 0.0;
    for (int64_t c = 0; c < out.ne0; ++c) sum += (y[c] = exp_approx(x[c] - top));
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t c = 0; c < out.ne0; ++c) y[c] *= inv;
  }
}

// The index of the largest value not yet taken (taken values are NaN); ties go to the lower index.
int64_t take_largest(float* v, int64_t n) {
  int64_t best = 0;
  while (best < n && std::isnan(v[best])) ++best;
  for (int64_t i = best + 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  v[best] = std::numeric_limits<float>::quiet_NaN();
  return best;
}

// Per token: the k largest scores' column indices, largest first. With n_groups > 1 the
// columns are n_groups equal groups; each group scores the sum of its two largest values
// (group_score 0, DeepSeek-V3) or its largest (1, DeepSeek-V2), and only the columns of the
// groups_used best groups are candidates. NaN scores count as -inf.
void op_top_k(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &a = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  const TopKParams& p = n.as<TopKParams>();
  const int64_t E = a.ne0, k = p.k, n_groups = std::max(1, p.n_groups), groups_used = p.groups_used;
  const bool top2 = p.group_score == 0;
  const int64_t per_group = E / n_groups;
  float* scratch = reinterpret_cast<float*>(ctx.arena + n.work_offset + ith * align_up(2 * E * sizeof(float)));
  float* group_scores = scratch + E;
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const float* x = operand_row(ctx, a, r);
    for (int64_t c = 0; c < E; ++c) scratch[c] = std::isnan(x[c]) ? kNegInf : x[c];
    if (n_groups > 1) {
      for (int64_t g = 0; g < n_groups; ++g) {
        float first = kNegInf, second = kNegInf;
        for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
          if (scratch[c] > first) second = first, first = scratch[c];
          else if (scratch[c] > second) second = scratch[c];
        }
        group_scores[g] = top2 ? first + second : first;
      }
      for (int64_t i = 0; i < groups_used; ++i) take_largest(group_scores, n_groups);
      for (int64_t g = 0; g < n_groups; ++g)  // the chosen groups are NaN now; mask the others
        if (!std::isnan(group_scores[g])) std::fill(scratch + g * per_group, scratch + (g + 1) * per_group, kNegInf);
    }
    float* y = row_f32(ctx, out, r);
    for (int64_t j = 0; j < k; ++j) y[j] = static_cast<float>(take_largest(scratch, E));
  }
}

// out[t, j] = a[t, ids[t, j]] (0 where an id is not a column of a).
void op_take(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &a = src_tensor(ctx, n, 0), &ids = src_tensor(ctx, n, 1), &out = out_tensor(ctx, n);
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const float *x = operand_row(ctx, a, r), *id = operand_row(ctx, ids, r);
    float* y = row_f32(ctx, out, r);
    for (int64_t j = 0; j < out.ne0; ++j) {
      const bool valid = id[j] >= 0.0f && id[j] < static_cast<float>(a.ne0) &&
                         id[j] == static_cast<float>(static_cast<int64_t>(id[j]));
      y[j] = valid ? x[static_cast<int64_t>(id[j])] : 0.0f;
    }
  }
}

// y = x / max(sum x, min_sum)
void op_sum_normalize(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &a = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  const float min_sum = n.as<SumNormalizeParams>().min_sum;
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const float* x = operand_row(ctx, a, r);
    float* y = row_f32(ctx, out, r);
    double sum = 0.0;
    for (int64_t c = 0; c < out.ne0; ++c) sum += x[c];
    const float s = std::max(static_cast<float>(sum), min_sum);
    for (int64_t c = 0; c < out.ne0; ++c) y[c] = x[c] / s;
  }
}

// y[t] = sum over j of w[t, j] x[t k + j], j = 0, 1, ... in order (x: k rows per token).
void op_weighted_sum(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &x = src_tensor(ctx, n, 0), &w = src_tensor(ctx, n, 1), &out = out_tensor(ctx, n);
  const int64_t k = w.ne0;
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t t = rows.begin; t < rows.end; ++t) {
    const float* wt = operand_row(ctx, w, t);
    float* y = row_f32(ctx, out, t);
    const float* x0 = operand_row(ctx, x, t * k);
    for (int64_t c = 0; c < out.ne0; ++c) y[c] = wt[0] * x0[c];
    for (int64_t j = 1; j < k; ++j) {
      const float* xj = operand_row(ctx, x, t * k + j);
      for (int64_t c = 0; c < out.ne0; ++c) y[c] += wt[j] * xj[c];
    }
  }
}

}  // namespace

void register_routing_ops(KernelTable& t) {
  t.ops[static_cast<int>(Op::Softmax)] = op_softmax;
  t.ops[static_cast<int>(Op::TopK)] = op_top_k;
  t.ops[static_cast<int>(Op::Take)] = op_take;
  t.ops[static_cast<int>(Op::SumNormalize)] = op_sum_normalize;
  t.ops[static_cast<int>(Op::WeightedSum)] = op_weighted_sum;
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
