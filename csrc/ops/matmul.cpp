// y[t, r] = dot(W row r, x row t) for weights of any type. Activations are first converted,
// row by row, to the weight type's vec_dot_type (an 8-bit block format for quantized weights),
// then each thread computes a contiguous range of weight rows for all tokens, in tiles of
// kRowTile weight rows x kColTile tokens so each weight block is reused while it is in cache.
// With kPanelMinTokens tokens or more, types that have a panel kernel (AVX-512, and AMX tiles
// in the amx table) get their activations repacked into panels of kPanelTokens tokens once per
// call, and each tile of weight rows is multiplied with every panel while it is in cache.
// A graph with float activations instead dequantizes each thread's weight rows, kDequantRows at
// a time, and takes F32 dot products with the activations as they are.
#include "ops/matmul.h"

namespace ember {
namespace EMBER_ISA_NS {

Range row_tiles(int64_t n_rows, int ith, int nth) {
  const Range tiles = split((n_rows + kRowTile - 1) / kRowTile, ith, nth);
  return {tiles.begin * kRowTile, std::min(n_rows, tiles.end * kRowTile)};
}

void matmul_tiles(const TypeKernels& tk, int64_t K, const uint8_t* weights, size_t w_stride, Range rows,
                  const uint8_t* act, size_t act_stride, int64_t M, float* out, size_t out_stride) {
  // With a single column tile (decode), a thread's rows go to the kernel in one call, so its
  // per-call work on the activations is done once.
  const int64_t row_step = M <= kColTile ? std::max<int64_t>(1, rows.end - rows.begin) : kRowTile;
  for (int64_t r0 = rows.begin; r0 < rows.end; r0 += row_step) {
    const int64_t r1 = std::min(rows.end, r0 + row_step);
    for (int64_t c0 = 0; c0 < M; c0 += kColTile) {
      const int64_t c1 = std::min(M, c0 + kColTile);
      if (tk.gemm_tile) {
        tk.gemm_tile(K, out + c0 * out_stride + r0, out_stride, weights + r0 * w_stride, w_stride,
                     act + c0 * act_stride, act_stride, static_cast<int>(r1 - r0), static_cast<int>(c1 - c0));
        continue;
      }
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) tk.vec_dot(K, out + c * out_stride + r, weights + r * w_stride, act + c * act_stride);
    }
  }
}

void pack_panels(const KernelTable& kernels, GGMLType act_type, int64_t K, const uint8_t* act, size_t act_stride,
                 int64_t M, uint8_t* panels, int ith, int nth) {
  const PackPanelFn pack = kernels.of(act_type).pack_panel;
  const int64_t n_panels = (M + kPanelTokens - 1) / kPanelTokens;
  const Range mine = split(n_panels, ith, nth);
  for (int64_t p = mine.begin; p < mine.end; ++p) {
    const int tokens = static_cast<int>(std::min<int64_t>(kPanelTokens, M - p * kPanelTokens));
    pack(K, act + p * kPanelTokens * act_stride, act_stride, tokens, panels + p * panel_bytes(K));
  }
}

void matmul_panel_rows(const TypeKernels& tk, int64_t K, const uint8_t* weights, size_t w_stride, Range rows,
                       const uint8_t* panels, int64_t M, float* out, size_t out_stride) {
  for (int64_t r0 = rows.begin; r0 < rows.end; r0 += kRowTile) {
    const int n_rows = static_cast<int>(std::min(kRowTile, rows.end - r0));
    tk.gemm_panel(K, out + r0, out_stride, weights + r0 * w_stride, w_stride, panels, n_rows, static_cast<int>(M));
  }
}

void matmul_float_rows(const KernelTable& kernels, GGMLType w_type, int64_t K, const uint8_t* weights,
                       size_t w_stride, Range rows, const uint8_t* act, size_t act_stride, int64_t M, float* out,
                       size_t out_stride, float* rows_f32) {
  const DequantizeRowFn dequantize = kernels.of(w_type).dequantize_row;
  const TypeKernels& f32 = kernels.of(GGMLType::F32);
  // Few tokens (decoding): 4 rows at a time, so that the dequantized rows stay in L1 between
  // their store and the dot products (benchmarks/RESULTS.md, "Kernel choices").
  const int64_t step = M <= kFewTokens ? 4 : kDequantRows;
  for (int64_t r0 = rows.begin; r0 < rows.end; r0 += step) {
    const int64_t n_rows = std::min(step, rows.end - r0);
    for (int64_t r = 0; r < n_rows; ++r) dequantize(weights + (r0 + r) * w_stride, rows_f32 + r * K, K);
    if (f32.gemm_tile) {
      f32.gemm_tile(K, out + r0, out_stride, rows_f32, K * sizeof(float), act, act_stride,
                    static_cast<int>(n_rows), static_cast<int>(M));
      continue;
    }
    for (int64_t c = 0; c < M; ++c)
      for (int64_t r = 0; r < n_rows; ++r)
        f32.vec_dot(K, out + c * out_stride + r0 + r, rows_f32 + r * K, act + c * act_stride);
  }
}

namespace {

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

void op_matmul(const Node& n, ExecContext& ctx, int ith, int nth) {
  const Tensor &w = src_tensor(ctx, n, 0), &x = src_tensor(ctx, n, 1), &y = out_tensor(ctx, n);
  const TypeKernels& tk = ctx.kernels->of(w.type);
  const int64_t K = w.ne0, N = w.ne1, M = ctx.rows(x);
  const uint8_t* weights = static_cast<const uint8_t*>(w.weight_data);
  float* out = row_f32(ctx, y, 0);
  const size_t out_stride = y.row_stride / sizeof(float);
  const Range rows = row_tiles(N, ith, nth);
  if (ctx.graph->dequantizes(w.type)) {
    float* rows_f32 = reinterpret_cast<float*>(ctx.arena + n.work_offset +
                                               ith * align_up(kDequantRows * K * sizeof(float)));
    return matmul_float_rows(*ctx.kernels, w.type, K, weights, w.row_stride, rows,
                             ctx.graph->weight_or_data(x, ctx.arena), x.row_stride, M, out, out_stride, rows_f32);
  }

  // An earlier matmul of the same input may have left it converted (and packed) in this scratch.
  const bool converted = n.input_from >= 0;
  const uint8_t* act = ctx.graph->weight_or_data(x, ctx.arena);
  size_t act_stride = x.row_stride;
  if (tk.vec_dot_type != GGMLType::F32) {
    const size_t stride = align_up(row_bytes(tk.vec_dot_type, K));
    uint8_t* work = ctx.arena + n.work_offset;
    if (!converted) {
      quantize_activations(ctx, x, tk.vec_dot_type, K, M, work, stride, ith, nth);
      ctx.barrier();
    }
    act = work;
    act_stride = stride;
  }
  if (uses_panels(tk, M)) {
    uint8_t* panels = ctx.arena + n.work_offset + M * act_stride;  // after the quantized rows
    if (!converted) {
      pack_panels(*ctx.kernels, tk.vec_dot_type, K, act, act_stride, M, panels, ith, nth);
      ctx.barrier();
    }
    return matmul_panel_rows(tk, K, weights, w.row_stride, rows, panels, M, out, out_stride);
  }
  matmul_tiles(tk, K, weights, w.row_stride, rows, act, act_stride, M, out, out_stride);
}

}  // namespace

void register_matmul_ops(KernelTable& t) { t.ops[static_cast<int>(Op::MatMul)] = op_matmul; }

}  // namespace EMBER_ISA_NS
}  // namespace ember
