// Row-parallel element-wise ops: add, mul, scale, activations (SiLU, GELU, sigmoid), gated
// units, soft-capping, and the copy-in of external inputs and the gather of output rows.
#include <cstring>

#include "core/mathfn.h"
#include "ops/common.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

template <typename F>
void map_rows(const Node& n, ExecContext& ctx, int ith, int nth, F f) {
  const Tensor& out = out_tensor(ctx, n);
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) f(row_f32(ctx, out, r), r, out.ne0);
}

void op_input(const Node& n, ExecContext& ctx, int ith, int nth) {
  const float* in = ctx.inputs[n.as<InputParams>().index];
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    std::memcpy(y, in + r * cols, cols * sizeof(float));
  });
}

void op_add(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &a = src_tensor(ctx, n, 0), &b = src_tensor(ctx, n, 1);
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float *x0 = operand_row(ctx, a, r), *x1 = operand_row(ctx, b, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = x0[c] + x1[c];
  });
}

void op_mul(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &a = src_tensor(ctx, n, 0), &b = src_tensor(ctx, n, 1);
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float *x0 = operand_row(ctx, a, r), *x1 = operand_row(ctx, b, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = x0[c] * x1[c];
  });
}

void op_scale(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor& a = src_tensor(ctx, n, 0);
  const float s = n.as<ScaleParams>().scale;
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float* x = operand_row(ctx, a, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = x[c] * s;
  });
}

void op_silu(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor& a = src_tensor(ctx, n, 0);
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float* x = operand_row(ctx, a, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = silu(x[c]);
  });
}

void op_sigmoid(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor& a = src_tensor(ctx, n, 0);
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float* x = operand_row(ctx, a, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = 1.0f / (1.0f + exp_approx(-x[c]));
  });
}

void op_gelu(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor& a = src_tensor(ctx, n, 0);
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float* x = operand_row(ctx, a, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = gelu_tanh(x[c]);
  });
}

// act(gate) * up
void op_swiglu(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &g = src_tensor(ctx, n, 0), &u = src_tensor(ctx, n, 1);
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float *xg = operand_row(ctx, g, r), *xu = operand_row(ctx, u, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = silu(xg[c]) * xu[c];
  });
}

void op_geglu(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &g = src_tensor(ctx, n, 0), &u = src_tensor(ctx, n, 1);
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float *xg = operand_row(ctx, g, r), *xu = operand_row(ctx, u, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = gelu_tanh(xg[c]) * xu[c];
  });
}

// cap * tanh(x / cap)
void op_softcap(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor& a = src_tensor(ctx, n, 0);
  const float cap = n.as<SoftcapParams>().cap;
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    const float* x = operand_row(ctx, a, r);
    for (int64_t c = 0; c < cols; ++c) y[c] = cap * tanh_approx(x[c] / cap);
  });
}

// Gathers the rows whose logits are wanted (ctx.output_rows) before the output projection.
void op_select_outputs(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor& a = src_tensor(ctx, n, 0);
  map_rows(n, ctx, ith, nth, [&](float* y, int64_t r, int64_t cols) {
    std::memcpy(y, operand_row(ctx, a, ctx.output_rows[r]), cols * sizeof(float));
  });
}

}  // namespace

void register_elementwise_ops(KernelTable& t) {
  t.ops[static_cast<int>(Op::Input)] = op_input;
  t.ops[static_cast<int>(Op::Add)] = op_add;
  t.ops[static_cast<int>(Op::Mul)] = op_mul;
  t.ops[static_cast<int>(Op::Scale)] = op_scale;
  t.ops[static_cast<int>(Op::Silu)] = op_silu;
  t.ops[static_cast<int>(Op::Gelu)] = op_gelu;
  t.ops[static_cast<int>(Op::Sigmoid)] = op_sigmoid;
  t.ops[static_cast<int>(Op::SwiGLU)] = op_swiglu;
  t.ops[static_cast<int>(Op::GeGLU)] = op_geglu;
  t.ops[static_cast<int>(Op::Softcap)] = op_softcap;
  t.ops[static_cast<int>(Op::SelectOutputs)] = op_select_outputs;
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
