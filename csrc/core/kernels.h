// The kernel table: everything that is compiled once per instruction set. Each ISA variant
// (namespaces ember::scalar, ember::avx2, ember::avx512, ember::amx) fills one table;
// cpu_features.cpp chooses which one the graph uses.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/op.h"
#include "core/types.h"

#define EMBER_STRINGIFY_(x) #x
#define EMBER_STRINGIFY(x) EMBER_STRINGIFY_(x)

namespace ember {

struct Node;
struct ExecContext;

// Dequantize / quantize one row of n elements (n a multiple of the block size).
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);
// Dot product of one weight row x (its type) with one activation row y (the type's vec_dot_type).
using VecDotFn = void (*)(int64_t n, float* out, const void* x, const void* y);
// Tile kernel: out[c * out_stride + r] = dot(x row r, y row c) for r < n_rows, c < n_cols.
// Rows of x are x_stride bytes apart, rows of y y_stride bytes apart.
using GemmTileFn = void (*)(int64_t n, float* out, size_t out_stride, const void* x, size_t x_stride,
                            const void* y, size_t y_stride, int n_rows, int n_cols);

// Activation panels (AVX-512): kPanelTokens activation rows repacked block by block so that one
// instruction multiplies a weight row's 4 bytes with every token (quants/x86/avx512_panel.h).
constexpr int kPanelTokens = 16;
constexpr size_t kPanelBlockBytes = 8 * kPanelTokens * 4 + 3 * kPanelTokens * 4;  // per 32 elements
// Bytes of one panel of rows of n elements.
constexpr size_t panel_bytes(int64_t n) { return static_cast<size_t>(n / 32) * kPanelBlockBytes; }
// Packs n_cols <= kPanelTokens activation rows (the vec_dot_type) of n elements into one panel.
using PackPanelFn = void (*)(int64_t n, const void* y, size_t y_stride, int n_cols, void* panel);
// out[c * out_stride + r] = dot(x row r, token c) for r < n_rows, c < n_cols: token c is token
// c % kPanelTokens of panel c / kPanelTokens, the panels panel_bytes(n) apart.
using GemmPanelFn = void (*)(int64_t n, float* out, size_t out_stride, const void* x, size_t x_stride,
                             const void* panel, int n_rows, int n_cols);
// Panel p of consecutive panels of rows of n elements.
inline const uint8_t* panel_at(const void* panels, int64_t n, int64_t p) {
  return static_cast<const uint8_t*>(panels) + p * panel_bytes(n);
}
// The blocking of the tile and panel kernels: f(std::integral_constant<int, S>{}, i) over
// [0, n) in groups of Sizes, largest first: as many groups of the first size as fit from i = 0,
// then of the next size, and so on down to the last, 1, which takes the rest.
template <int... Sizes, typename F>
inline void for_each_group(int n, F&& f) {
  constexpr int sizes[] = {Sizes...};
  static_assert(sizes[sizeof...(Sizes) - 1] == 1, "the last group size must be 1");
  int i = 0;
  ((void)[&] { for (; i + Sizes <= n; i += Sizes) f(std::integral_constant<int, Sizes>{}, i); }(), ...);
}

// f(panel, first token, tokens) for each panel of a GemmPanelFn's n_cols tokens.
template <typename F>
inline void for_each_panel(int64_t n, const void* panels, int n_cols, F&& f) {
  for (int c0 = 0; c0 < n_cols; c0 += kPanelTokens)
    f(panel_at(panels, n, c0 / kPanelTokens), c0, n_cols - c0 < kPanelTokens ? n_cols - c0 : kPanelTokens);
}

// Weight rows a thread dequantizes to F32 at a time in a matmul with float activations.
constexpr int64_t kDequantRows = 16;

struct TypeKernels {
  GGMLType vec_dot_type = GGMLType::F32;  // the format activations are converted to
  DequantizeRowFn dequantize_row = nullptr;
  QuantizeRowFn quantize_row = nullptr;  // for activation types (Q8_0, Q8_1, Q8_K, F16, BF16, F32)
  VecDotFn vec_dot = nullptr;
  GemmTileFn gemm_tile = nullptr;  // optional; the matmul falls back to vec_dot
  int tile_rows = 0, tile_cols = 0;  // preferred tile shape for gemm_tile
  PackPanelFn pack_panel = nullptr;  // for activation types whose weights have gemm_panel
  GemmPanelFn gemm_panel = nullptr;  // optional; for prompts, with the activations in panels
};

using OpFn = void (*)(const Node& node, ExecContext& ctx, int ith, int nth);

struct KernelTable {
  const char* isa = nullptr;
  TypeKernels types[kTypeCount];
  OpFn ops[kOpCount] = {};
  const TypeKernels& of(GGMLType t) const { return types[static_cast<int>(t)]; }
};

// Every function that fills part of an ISA's kernel table, once, in the order register_kernels
// (ops/registry.cpp) calls them: the ops (ops/*.cpp), then the tensor types (quants/*.cpp).
#define EMBER_KERNEL_REGISTRARS(X)                                                                   \
  X(register_elementwise_ops) X(register_norm_ops) X(register_rope_ops) X(register_get_rows_ops)   \
  X(register_attention_ops) X(register_matmul_ops) X(register_matmul_id_ops) X(register_routing_ops) \
  X(register_float_types) X(register_q8) X(register_q4) X(register_q5) X(register_q8_k)             \
  X(register_q2_k) X(register_q3_k) X(register_q4_k) X(register_q5_k) X(register_q6_k) X(register_iq4)

// The declarations of one ISA namespace. register_kernels fills the whole table.
#define EMBER_DECLARE_REGISTRAR_(fn) void fn(KernelTable& table);
#define EMBER_DECLARE_ISA(NS)                      \
  namespace NS {                                   \
  void register_kernels(KernelTable& table);       \
  EMBER_KERNEL_REGISTRARS(EMBER_DECLARE_REGISTRAR_) \
  }
EMBER_DECLARE_ISA(scalar)
EMBER_DECLARE_ISA(avx2)
EMBER_DECLARE_ISA(avxvnni)
EMBER_DECLARE_ISA(avx512)
EMBER_DECLARE_ISA(amx)
#undef EMBER_DECLARE_ISA
#undef EMBER_DECLARE_REGISTRAR_

}  // namespace ember
