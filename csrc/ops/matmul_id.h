// The scratch memory of the expert matmul (ops/matmul_id.cpp), laid out in one place for the
// op and for the graph's planner (core/graph.cpp), which sizes it for the largest batch.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/graph.h"

namespace ember {

struct ExpertWork {
  // Per thread (each groups the slots itself), group_stride bytes apart:
  size_t offsets = 0;  // int32 [n_experts + 1]: where each expert's slots start in the grouped order
  size_t order = 0;    // int32 [slots]: grouped position -> slot (token t, choice j: slot t k + j)
  size_t position = 0; // int32 [slots]: slot -> grouped position, -1 for an invalid expert id
  size_t group_stride = 0;
  size_t act = 0;      // the slots' activation rows in grouped order, act_stride bytes apart
  size_t panels = 0;   // panels of each expert with enough tokens (panel_bytes(K) each)
  size_t out = 0;      // F32 [slots][N]: results in grouped order
  size_t f32_rows = 0; // float activations: per thread, kDequantRows dequantized weight rows
  size_t act_stride = 0, size = 0;
};

// slots = tokens x experts per token; act_type: what the activations are converted to (F32
// with float activations); panels: whether the weight type has a panel kernel (and is not dequantized).
inline ExpertWork expert_work(int64_t n_experts, int64_t slots, int64_t K, int64_t N, GGMLType act_type,
                              bool panels, bool dequantized, int n_threads) {
  ExpertWork w;
  ScratchLayout layout;
  auto take = [&](size_t bytes) { return layout.take(bytes); };
  w.offsets = take(static_cast<size_t>(n_experts + 1) * sizeof(int32_t));
  w.order = take(static_cast<size_t>(slots) * sizeof(int32_t));
  w.position = take(static_cast<size_t>(slots) * sizeof(int32_t));
  w.group_stride = layout.end;
  layout.end *= static_cast<size_t>(n_threads);
  w.act_stride = align_up(row_bytes(act_type, K));
  w.act = take(static_cast<size_t>(slots) * w.act_stride);
  // Each expert's panels start a new panel: at most slots / kPanelTokens + one partial per expert.
  const int64_t max_panels = (slots + kPanelTokens - 1) / kPanelTokens + std::min(n_experts, slots);
  w.panels = take(panels ? static_cast<size_t>(max_panels) * panel_bytes(K) : 0);
  w.out = take(static_cast<size_t>(slots) * N * sizeof(float));
  w.f32_rows = take(dequantized ? static_cast<size_t>(n_threads) * align_up(kDequantRows * K * sizeof(float)) : 0);
  w.size = layout.end;
  return w;
}

}  // namespace ember
