// Helpers shared by the op implementations (compiled once per ISA).
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/graph.h"

namespace ember {

struct Range {
  int64_t begin, end;
};

// The part of [0, n) that thread ith of nth works on.
inline Range split(int64_t n, int ith, int nth) {
  int64_t per = (n + nth - 1) / nth;
  int64_t begin = std::min<int64_t>(n, per * ith);
  return {begin, std::min<int64_t>(n, begin + per)};
}

inline const Tensor& src_tensor(const ExecContext& ctx, const Node& n, int k) {
  return ctx.graph->tensor(n.src[k]);
}
inline const Tensor& out_tensor(const ExecContext& ctx, const Node& n) { return ctx.graph->tensor(n.out); }

inline float* row_f32(const ExecContext& ctx, const Tensor& t, int64_t r) {
  return reinterpret_cast<float*>(ctx.graph->data(t, ctx.arena) + ctx.row_offset(t, r));
}
// Row r of an F32 operand; a one-row tensor (a weight vector) broadcasts over rows.
inline const float* operand_row(const ExecContext& ctx, const Tensor& t, int64_t r) {
  if (t.ne1 == 1 && t.row_split == 1) r = 0;
  return reinterpret_cast<const float*>(ctx.graph->weight_or_data(t, ctx.arena) + ctx.row_offset(t, r));
}

}  // namespace ember
