// Rotary position embedding on [n_tokens, n_heads * head_dim] rows: dimensions [offset,
// offset + n_rot) of each head rotate, the others pass through. For pair i < n_rot / 2,
// theta_i = pos * freq_scale * base^(-2i / n_rot) / factor_i. Normal layout rotates pairs
// (2i, 2i+1); NeoX layout rotates (i, i + n_rot/2).
#include <cmath>

#include "ops/common.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

constexpr int kMaxRotPairs = 512;

// Rotates one head's n_rot dimensions from `x` into `y` by the angles whose cosines and sines
// are given per pair. The two layouts get separate loops so that each is a plain vector loop.
inline void rotate_head(const float* x, float* y, int64_t half, bool neox, const float* cos_t, const float* sin_t) {
  if (neox) {
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = x[i], x1 = x[i + half];
      y[i] = x0 * cos_t[i] - x1 * sin_t[i];
      y[i + half] = x0 * sin_t[i] + x1 * cos_t[i];
    }
    return;
  }
  for (int64_t i = 0; i < half; ++i) {
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    y[2 * i] = x0 * cos_t[i] - x1 * sin_t[i];
    y[2 * i + 1] = x0 * sin_t[i] + x1 * cos_t[i];
  }
}

void op_rope(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &in = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  const RopeParams& p = n.as<RopeParams>();
  const int64_t head_dim = p.head_dim, n_rot = p.n_rot, offset = p.offset;
  const bool neox = p.neox;
  const float* factors = n.src[1] >= 0 ? operand_row(ctx, src_tensor(ctx, n, 1), 0) : nullptr;
  const int64_t n_heads = out.ne0 / head_dim, half = n_rot / 2;
  // theta_i = pos * freq_i: the per-pair frequencies once per call, the angles once per row.
  float freq[kMaxRotPairs], cos_t[kMaxRotPairs], sin_t[kMaxRotPairs];
  for (int64_t i = 0; i < half; ++i) {
    freq[i] = p.freq_scale * std::pow(p.base, -2.0f * i / n_rot);
    if (factors) freq[i] /= factors[i];
  }
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const float pos = static_cast<float>(ctx.positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float theta = pos * freq[i];
      cos_t[i] = std::cos(theta);
      sin_t[i] = std::sin(theta);
    }
    const float* x = operand_row(ctx, in, r);
    float* y = row_f32(ctx, out, r);
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* xh = x + h * head_dim;
      float* yh = y + h * head_dim;
      for (int64_t i = 0; i < offset; ++i) yh[i] = xh[i];
      rotate_head(xh + offset, yh + offset, half, neox, cos_t, sin_t);
      for (int64_t i = offset + n_rot; i < head_dim; ++i) yh[i] = xh[i];
    }
  }
}

}  // namespace

void register_rope_ops(KernelTable& t) { t.ops[static_cast<int>(Op::Rope)] = op_rope; }

}  // namespace EMBER_ISA_NS
}  // namespace ember
