// The expert matmul (ggml's mul_mat_id): y[t k + j] = W[ids[t, j]] x for each token t and each of
// its k chosen experts j, the experts' weights stacked in one tensor (N rows each, expert e's
// rows from e N). The ids are F32 values of whole numbers (the top_k op's output); an id that is
// not one of 0 .. n_experts - 1 gives a row of zeros.
// x has one row per token (gate and up projections: every expert reads the token's row) or one
// per slot t k + j (the down projection reads what its expert's gate and up made).
//
// The slots are first grouped by expert (a counting sort, which every thread does for itself),
// their activation rows converted to the weight type's vec_dot_type in that order, and then each
// expert's rows are multiplied with all of its tokens at once, with the matmul's own tile and
// panel loops (ops/matmul.h): a batch reads each chosen expert's weights once, and a decode step
// reads only the k experts it chose. Threads split every expert's rows, as the matmul splits its
// rows, so each token's dot products are the ones it gets alone (the kernels are batch
// invariant). An expert with one slot writes that slot's output row directly; the outputs of
// experts with several go through a grouped buffer, copied to slot order after a barrier. So a
// decode step, whose k experts have a slot each, waits on the other threads once, as a matmul does.
#include <algorithm>
#include <cstring>

#include "ops/matmul.h"
#include "ops/matmul_id.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

bool valid_expert(float id, int64_t n_experts) {
  return id >= 0.0f && id < static_cast<float>(n_experts) && id == static_cast<float>(static_cast<int64_t>(id));
}

// offsets[e] = first grouped position of expert e (offsets[n_experts]: the valid slots);
// order and position as ExpertWork says. Slots keep their order within an expert.
void group_by_expert(const ExecContext& ctx, const Tensor& ids, int64_t n_experts, int64_t k, int32_t* offsets,
                     int32_t* order, int32_t* position) {
  const int64_t T = ctx.rows(ids);
  std::fill(offsets, offsets + n_experts + 1, 0);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = operand_row(ctx, ids, t);
    for (int64_t j = 0; j < k; ++j)
      if (valid_expert(row[j], n_experts)) ++offsets[static_cast<int64_t>(row[j]) + 1];
  }
  for (int64_t e = 0; e < n_experts; ++e) offsets[e + 1] += offsets[e];
  // Each slot goes to its expert's next free position; offsets[e] runs to expert e's end ...
  for (int64_t t = 0; t < T; ++t) {
    const float* row = operand_row(ctx, ids, t);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j;
      position[s] = -1;
      if (!valid_expert(row[j], n_experts)) continue;
      const int32_t p = offsets[static_cast<int64_t>(row[j])]++;
      order[p] = static_cast<int32_t>(s);
      position[s] = p;
    }
  }
  // ... which is expert e + 1's start: shift back.
  for (int64_t e = n_experts; e > 0; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
}

// The expert whose grouped positions hold p (offsets as group_by_expert leaves them).
int64_t expert_of(const int32_t* offsets, int64_t n_experts, int32_t p) {
  return std::upper_bound(offsets, offsets + n_experts + 1, p) - offsets - 1;
}

void op_matmul_id(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &w = src_tensor(ctx, n, 0), &x = src_tensor(ctx, n, 1), &ids = src_tensor(ctx, n, 2);
  const Tensor& y = out_tensor(ctx, n);
  const int64_t n_experts = n.as<MatMulIdParams>().n_experts, k = ids.ne0, K = w.ne0, N = w.ne1 / n_experts;
  const int64_t T = ctx.rows(ids), slots = T * k;
  const int64_t x_per_token = ctx.rows(x) / T;  // 1, or k: one row per slot
  const bool dequantized = ctx.graph->dequantizes(w.type);
  const TypeKernels& tk = ctx.kernels->of(w.type);
  const GGMLType act_type = dequantized ? GGMLType::F32 : tk.vec_dot_type;
  const ExpertWork layout = expert_work(n_experts, ctx.graph->max_rows(ids) * k, K, N, act_type,
                                        tk.gemm_panel && !dequantized, dequantized, ctx.graph->n_threads());
  uint8_t* work = ctx.arena + n.work_offset;
  uint8_t* mine_group = work + static_cast<size_t>(ith) * layout.group_stride;
  int32_t* offsets = reinterpret_cast<int32_t*>(mine_group + layout.offsets);
  int32_t* order = reinterpret_cast<int32_t*>(mine_group + layout.order);
  int32_t* position = reinterpret_cast<int32_t*>(mine_group + layout.position);
  uint8_t* act = work + layout.act;
  float* grouped = reinterpret_cast<float*>(work + layout.out);

  group_by_expert(ctx, ids, n_experts, k, offsets, order, position);

  // Each grouped row converted to the activation format; the threads share the rows' blocks.
  // One token whose experts all read its row (decode's gate and up projections): that row
  // converted once, and every slot reads it (a stride of 0 between the slots' rows).
  const int64_t n_grouped = offsets[n_experts];
  const bool one_row = x_per_token == 1 && T == 1;
  const size_t act_stride = one_row ? 0 : layout.act_stride;
  {
    const QuantizeRowFn convert = ctx.kernels->of(act_type).quantize_row;
    const TypeTraits& traits = type_traits(act_type);
    const int64_t per_row = K / traits.block_size;
    const Range blocks = split(std::min<int64_t>(n_grouped, one_row ? 1 : n_grouped) * per_row, ith, nth);
    for (int64_t i = blocks.begin; i < blocks.end;) {
      const int64_t p = i / per_row, b0 = i % per_row, b1 = std::min(per_row, b0 + (blocks.end - i));
      const int64_t s = order[p], row = x_per_token == 1 ? s / k : s;
      convert(operand_row(ctx, x, row) + b0 * traits.block_size, act + p * act_stride + b0 * traits.type_size,
              (b1 - b0) * traits.block_size);
      i += b1 - b0;
    }
  }
  ctx.barrier();

  // Panels of the experts with enough tokens, expert after expert.
  const size_t panel_size = panel_bytes(K);
  bool any_panels = false;
  if (!dequantized) {
    int64_t first = 0;  // first panel of the expert
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t M = offsets[e + 1] - offsets[e];
      if (!uses_panels(tk, M)) continue;
      any_panels = true;
      pack_panels(*ctx.kernels, act_type, K, act + offsets[e] * act_stride, act_stride, M,
                  work + layout.panels + first * panel_size, ith, nth);
      first += (M + kPanelTokens - 1) / kPanelTokens;
    }
  }
  if (any_panels) ctx.barrier();

  const uint8_t* weights = static_cast<const uint8_t*>(w.weight_data);
  const size_t expert_bytes = static_cast<size_t>(N) * w.row_stride;
  const Range rows = row_tiles(N, ith, nth);
  int64_t first_panel = 0;
  bool any_grouped = false;  // an expert with several slots, whose outputs need reordering
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t M = offsets[e + 1] - offsets[e];
    if (M == 0) continue;
    any_grouped |= M > 1;
    const uint8_t* we = weights + e * expert_bytes;
    const uint8_t* ae = act + offsets[e] * act_stride;
    float* oe = M == 1 ? row_f32(ctx, y, order[offsets[e]]) : grouped + offsets[e] * N;
    if (dequantized) {
      float* rows_f32 = reinterpret_cast<float*>(work + layout.f32_rows + ith * align_up(kDequantRows * K * sizeof(float)));
      matmul_float_rows(*ctx.kernels, w.type, K, we, w.row_stride, rows, ae, act_stride, M, oe, N, rows_f32);
    } else if (uses_panels(tk, M)) {
      matmul_panel_rows(tk, K, we, w.row_stride, rows, work + layout.panels + first_panel * panel_size, M, oe, N);
      first_panel += (M + kPanelTokens - 1) / kPanelTokens;
    } else {
      matmul_tiles(tk, K, we, w.row_stride, rows, ae, act_stride, M, oe, N);
    }
  }

  // Zeros for the invalid slots; then, where experts had several slots, their rows in slot order.
  const Range mine = split(slots, ith, nth);
  for (int64_t s = mine.begin; s < mine.end; ++s)
    if (position[s] < 0) std::fill(row_f32(ctx, y, s), row_f32(ctx, y, s) + N, 0.0f);
  if (!any_grouped) return;
  ctx.barrier();
  for (int64_t s = mine.begin; s < mine.end; ++s) {
    const int32_t p = position[s];
    if (p < 0) continue;
    const int64_t e = expert_of(offsets, n_experts, p);
    if (offsets[e + 1] - offsets[e] > 1) std::memcpy(row_f32(ctx, y, s), grouped + static_cast<int64_t>(p) * N, N * sizeof(float));
  }
}

}  // namespace

void register_matmul_id_ops(KernelTable& t) { t.ops[static_cast<int>(Op::MatMulId)] = op_matmul_id; }

}  // namespace EMBER_ISA_NS
}  // namespace ember
