// y[t, r] = dot(W row r, x row t) for weights of any type. Activations are first converted,
// row by row, to the weight type's vec_dot_type (an 8-bit block format for quantized weights),
// then each thread computes a contiguous range of weight rows for all tokens, in tiles of
// kRowTile weight rows x kColTile tokens so each weight block is reused while it is in cache.
// With kPanelMinTokens tokens or more, types that have a panel kernel (AVX-512, and AMX tiles
// in the amx table) get their activations repacked into panels of kPanelTokens tokens once per
// call, and each tile of weight rows is multiplied with every panel while it is in cache.
// A graph with float activations instead dequantizes each thread's weight rows, kDequantRows at
// a time, and takes F32 dot products with the activations as they are.
#include "ops/common.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

constexpr int64_t kRowTile = 16;
constexpr int64_t kColTile = 8;
constexpr int64_t kPanelMinTokens = 16;
constexpr int64_t kFewTokens = 4;

// Thread ith's share of the weight rows, in whole tiles of kRowTile.
Range row_tiles(int64_t n_rows, int ith, int nth) {
  const Range tiles = split((n_rows + kRowTile - 1) / kRowTile, ith, nth);
  return {tiles.begin * kRowTile, std::min(n_rows, tiles.end * kRowTile)};
}

// The M activation rows converted to `type`, row t at work + t * stride. The threads share the
// rows' blocks (a block's conversion depends on it alone), so one token keeps both threads busy.
void quantize_activations(ExecContext& ctx, const Tensor& x, GGMLType type, int64_t K, int64_t M, uint8_t* work,
                          size_t stride, int ith, int nth) {
  const QuantizeRowFn quantize = ctx.kernels->of(type).quantize_row;
  const TypeTraits& traits = type_traits(type);
  const int64_t per_row = K / traits.block_size;
  const Range blocks = split(M * per_row, ith, nth);
  for (int64_t i = blocks.begin; i < blocks.end;) {
    const int64_t t = i / per_row, b0 = i % per_row, b1 = std::min(per_row, b0 + (blocks.end - i));
    quantize(operand_row(ctx, x, t) + b0 * traits.block_size, work + t * stride + b0 * traits.type_size,
             (b1 - b0) * traits.block_size);
    i += b1 - b0;
  }
}

void matmul_panels(const Node& n, ExecContext& ctx, int ith, int nth, const uint8_t* act, size_t act_stride) {
  const Tensor &w = src_tensor(ctx, n, 0), &x = src_tensor(ctx, n, 1), &y = out_tensor(ctx, n);
  const TypeKernels& tk = ctx.kernels->of(w.type);
  const int64_t K = w.ne0, N = w.ne1, M = ctx.rows(x);
  const int64_t n_panels = (M + kPanelTokens - 1) / kPanelTokens;
  const size_t bytes = panel_bytes(K);
  uint8_t* panels = ctx.arena + n.work_offset + M * act_stride;  // after the quantized rows
  auto tokens_of = [&](int64_t p) { return static_cast<int>(std::min<int64_t>(kPanelTokens, M - p * kPanelTokens)); };
  const PackPanelFn pack = ctx.kernels->of(tk.vec_dot_type).pack_panel;
  const Range mine = split(n_panels, ith, nth);
  for (int64_t p = mine.begin; p < mine.end; ++p)
    pack(K, act + p * kPanelTokens * act_stride, act_stride, tokens_of(p), panels + p * bytes);
  ctx.barrier();

  const uint8_t* weights = static_cast<const uint8_t*>(w.weight_data);
  float* out = row_f32(ctx, y, 0);
  const size_t out_stride = y.row_stride / sizeof(float);
  const Range rows = row_tiles(N, ith, nth);
  for (int64_t r0 = rows.begin; r0 < rows.end; r0 += kRowTile) {
    const int n_rows = static_cast<int>(std::min(kRowTile, rows.end - r0));
    tk.gemm_panel(K, out + r0, out_stride, weights + r0 * w.row_stride, w.row_stride, panels, n_rows, static_cast<int>(M));
  }
}

void matmul_float(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &w = src_tensor(ctx, n, 0), &x = src_tensor(ctx, n, 1), &y = out_tensor(ctx, n);
  const DequantizeRowFn dequantize = ctx.kernels->of(w.type).dequantize_row;
  const TypeKernels& f32 = ctx.kernels->of(GGMLType::F32);
  const int64_t K = w.ne0, N = w.ne1, M = ctx.rows(x);
  const uint8_t* act = ctx.graph->weight_or_data(x, ctx.arena);
  float* rows_f32 = reinterpret_cast<float*>(ctx.arena + n.work_offset +
                                             ith * align_up(kDequantRows * K * sizeof(float)));
  const uint8_t* weights = static_cast<const uint8_t*>(w.weight_data);
  float* out = row_f32(ctx, y, 0);
  const size_t out_stride = y.row_stride / sizeof(float);
  const Range rows = row_tiles(N, ith, nth);
  // Few tokens (decoding): 4 rows at a time, so that the dequantized rows stay in L1 between
  // their store and the dot products (gemma3-270m decode step 26 -> 16.5 ms against 16 rows).
  const int64_t step = M <= kFewTokens ? 4 : kDequantRows;
  for (int64_t r0 = rows.begin; r0 < rows.end; r0 += step) {
    const int64_t n_rows = std::min(step, rows.end - r0);
    for (int64_t r = 0; r < n_rows; ++r) dequantize(weights + (r0 + r) * w.row_stride, rows_f32 + r * K, K);
    if (f32.gemm_tile) {
      f32.gemm_tile(K, out + r0, out_stride, rows_f32, K * sizeof(float), act, x.row_stride,
                    static_cast<int>(n_rows), static_cast<int>(M));
      continue;
    }
    for (int64_t c = 0; c < M; ++c)
      for (int64_t r = 0; r < n_rows; ++r)
        f32.vec_dot(K, out + c * out_stride + r0 + r, rows_f32 + r * K, act + c * x.row_stride);
  }
}

void op_matmul(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &w = src_tensor(ctx, n, 0), &x = src_tensor(ctx, n, 1), &y = out_tensor(ctx, n);
  const TypeKernels& tk = ctx.kernels->of(w.type);
  const int64_t K = w.ne0, N = w.ne1, M = ctx.rows(x);
  if (ctx.graph->dequantizes(w.type)) return matmul_float(n, ctx, ith, nth);

  const uint8_t* act = ctx.graph->weight_or_data(x, ctx.arena);
  size_t act_stride = x.row_stride;
  if (tk.vec_dot_type != GGMLType::F32) {
    const size_t stride = align_up(row_bytes(tk.vec_dot_type, K));
    uint8_t* work = ctx.arena + n.work_offset;
    quantize_activations(ctx, x, tk.vec_dot_type, K, M, work, stride, ith, nth);
    ctx.barrier();
    act = work;
    act_stride = stride;
    if (tk.gemm_panel && M >= kPanelMinTokens) return matmul_panels(n, ctx, ith, nth, act, act_stride);
  }

  const uint8_t* weights = static_cast<const uint8_t*>(w.weight_data);
  float* out = row_f32(ctx, y, 0);
  const size_t out_stride = y.row_stride / sizeof(float);
  // Split weight rows between threads in whole tiles. With a single column tile (decode), a
  // thread's rows go to the kernel in one call, so its per-call work on the activations is done once.
  const Range rows = row_tiles(N, ith, nth);
  const int64_t row_step = M <= kColTile ? std::max<int64_t>(1, rows.end - rows.begin) : kRowTile;
  for (int64_t r0 = rows.begin; r0 < rows.end; r0 += row_step) {
    const int64_t r1 = std::min(rows.end, r0 + row_step);
    for (int64_t c0 = 0; c0 < M; c0 += kColTile) {
      const int64_t c1 = std::min(M, c0 + kColTile);
      if (tk.gemm_tile) {
        tk.gemm_tile(K, out + c0 * out_stride + r0, out_stride, weights + r0 * w.row_stride, w.row_stride,
                     act + c0 * act_stride, act_stride, static_cast<int>(r1 - r0), static_cast<int>(c1 - c0));
        continue;
      }
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r)
          tk.vec_dot(K, out + c * out_stride + r, weights + r * w.row_stride, act + c * act_stride);
    }
  }
}

}  // namespace

void register_matmul_ops(KernelTable& t) { t.ops[static_cast<int>(Op::MatMul)] = op_matmul; }

}  // namespace EMBER_ISA_NS
}  // namespace ember
