// The loops of the matmul over one weight matrix, shared by the matmul op (ops/matmul.cpp) and
// the expert matmul (ops/matmul_id.cpp): weight rows [rows.begin, rows.end) of a matrix whose
// rows are w_stride bytes apart, times M activation rows, into out[c * out_stride + r].
#pragma once
#include "ops/common.h"

namespace ember {
namespace EMBER_ISA_NS {

constexpr int64_t kRowTile = 16;
constexpr int64_t kColTile = 8;
constexpr int64_t kPanelMinTokens = 16;
constexpr int64_t kFewTokens = 4;

// Thread ith's share of the weight rows, in whole tiles of kRowTile.
Range row_tiles(int64_t n_rows, int ith, int nth);

// Whether M activation rows go through panels (quants/x86/avx512_panel.h) for weights with these kernels.
inline bool uses_panels(const TypeKernels& tk, int64_t M) {
  return tk.vec_dot_type != GGMLType::F32 && tk.gemm_panel && M >= kPanelMinTokens;
}

// Activation rows (the weight type's vec_dot_type, act_stride bytes apart) times weight rows
// by tiles (gemm_tile) or one dot product at a time (vec_dot).
void matmul_tiles(const TypeKernels& tk, int64_t K, const uint8_t* weights, size_t w_stride, Range rows,
                  const uint8_t* act, size_t act_stride, int64_t M, float* out, size_t out_stride);

// Packs M activation rows into panels of kPanelTokens (thread ith packs its share).
void pack_panels(const KernelTable& kernels, GGMLType act_type, int64_t K, const uint8_t* act, size_t act_stride,
                 int64_t M, uint8_t* panels, int ith, int nth);
// The weight rows times M activations that pack_panels packed.
void matmul_panel_rows(const TypeKernels& tk, int64_t K, const uint8_t* weights, size_t w_stride, Range rows,
                       const uint8_t* panels, int64_t M, float* out, size_t out_stride);

// Float activations: the weight rows dequantized to F32, kDequantRows at a time (4 for few
// tokens) into rows_f32, then F32 dot products with the M rows of act (F32, act_stride bytes apart).
void matmul_float_rows(const KernelTable& kernels, GGMLType w_type, int64_t K, const uint8_t* weights,
                       size_t w_stride, Range rows, const uint8_t* act, size_t act_stride, int64_t M, float* out,
                       size_t out_stride, float* rows_f32);

}  // namespace EMBER_ISA_NS
}  // namespace ember
