// Embedding lookup: row ids[r] of a weight of any type, dequantized to F32. The ids are the
// batch's tokens or, with by_position, its positions (learned position embeddings).
#include "ops/common.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

void op_get_rows(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &w = src_tensor(ctx, n, 0), &out = out_tensor(ctx, n);
  const int32_t* ids = n.as<GetRowsParams>().by_position ? ctx.positions : ctx.tokens;
  const DequantizeRowFn dequant = ctx.kernels->of(w.type).dequantize_row;
  const uint8_t* base = static_cast<const uint8_t*>(w.weight_data);
  const Range rows = split(ctx.rows(out), ith, nth);
  for (int64_t r = rows.begin; r < rows.end; ++r)
    dequant(base + static_cast<size_t>(ids[r]) * w.row_stride, row_f32(ctx, out, r), w.ne0);
}

}  // namespace

void register_get_rows_ops(KernelTable& t) { t.ops[static_cast<int>(Op::GetRows)] = op_get_rows; }

}  // namespace EMBER_ISA_NS
}  // namespace ember
