// RMSNorm and LayerNorm over each row, or over each group of `group` columns (per-head QK-norm),
// with an optional weight (and bias) of the group's width.
#include <cmath>

#include "ops/common.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

// Sums of f(x[c]) in double, c < n, in kLanes independent partial sums (lane c % kLanes) added
// at the end: the lanes are independent, so the compiler keeps them in vector registers instead
// of one serial chain of additions.
constexpr int kLanes = 8;
template <typename F>
inline double lane_sum(const float* x, int64_t n, F f) {
  double lanes[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += f(x[c + j]);
  for (int j = 0; c < n; ++c, ++j) lanes[j] += f(x[c]);
  double sum = 0.0;
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}

// Returns the weight row for a node's optional weight source k (nullptr when absent).
const float* optional_vector(const ExecContext& ctx, const Node& n, int k) {
  return n.src[k] >= 0 ? operand_row(ctx, src_tensor(ctx, n, k), 0) : nullptr;
}

// y = x / sqrt(mean(x^2) + eps) * w
void op_rms_norm(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &in = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  const NormParams& p = n.as<NormParams>();
  const float eps = p.eps;
  const int64_t group = p.group > 0 ? p.group : out.ne0;
  const float* w = optional_vector(ctx, n, 1);
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const float* x = operand_row(ctx, in, r);
    float* y = row_f32(ctx, out, r);
    for (int64_t g0 = 0; g0 < out.ne0; g0 += group) {
      const double sum = lane_sum(x + g0, group, [](float v) { return static_cast<double>(v) * v; });
      const float scale = 1.0f / std::sqrt(static_cast<float>(sum / group) + eps);
      if (w) {
        for (int64_t c = 0; c < group; ++c) y[g0 + c] = x[g0 + c] * scale * w[c];
      } else {
        for (int64_t c = 0; c < group; ++c) y[g0 + c] = x[g0 + c] * scale;
      }
    }
  }
}

// y = (x - mean) / sqrt(var + eps) * w + b
void op_layer_norm(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &in = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  const float eps = n.as<NormParams>().eps;
  const int64_t cols = out.ne0;
  const float* w = optional_vector(ctx, n, 1);
  const float* b = optional_vector(ctx, n, 2);
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const float* x = operand_row(ctx, in, r);
    float* y = row_f32(ctx, out, r);
    const float mean = static_cast<float>(lane_sum(x, cols, [](float v) { return static_cast<double>(v); }) / cols);
    const double var = lane_sum(x, cols, [mean](float v) { return static_cast<double>(v - mean) * (v - mean); });
    const float scale = 1.0f / std::sqrt(static_cast<float>(var / cols) + eps);
    for (int64_t c = 0; c < cols; ++c) {
      float v = (x[c] - mean) * scale;
      if (w) v *= w[c];
      if (b) v += b[c];
      y[c] = v;
    }
  }
}

}  // namespace

void register_norm_ops(KernelTable& t) {
  t.ops[static_cast<int>(Op::RmsNorm)] = op_rms_norm;
  t.ops[static_cast<int>(Op::LayerNorm)] = op_layer_norm;
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
