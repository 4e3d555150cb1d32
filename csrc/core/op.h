// The graph's ops: one list (EMBER_OPS) gives the Op enum, each op's name (the ember._core.Graph
// method that adds it, and what profile() reports) and the type of its parameters.
// Adding an op: a line here, its parameters struct if it has parameters (listed in NodeParams),
// a kernel in ops/ that a register_* function of EMBER_KERNEL_REGISTRARS (core/kernels.h) puts in
// the table, and a Graph method in bindings.cpp named op_name(op).
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <variant>

namespace ember {

// X(enum value, name, parameters struct)
#define EMBER_OPS(X)                                \
  X(Input, "input", InputParams)                    \
  X(GetRows, "get_rows", GetRowsParams)             \
  X(MatMul, "matmul", NoParams)                     \
  X(Add, "add", NoParams)                           \
  X(Mul, "mul", NoParams)                           \
  X(Scale, "scale", ScaleParams)                    \
  X(RmsNorm, "rms_norm", NormParams)                \
  X(LayerNorm, "layer_norm", NormParams)            \
  X(Rope, "rope", RopeParams)                       \
  X(Silu, "silu", NoParams)                         \
  X(Gelu, "gelu", NoParams)                         \
  X(SwiGLU, "swiglu", NoParams)                     \
  X(GeGLU, "geglu", NoParams)                       \
  X(Attention, "attention", AttentionParams)        \
  X(SelectOutputs, "select_outputs", NoParams)      \
  X(Softcap, "softcap", SoftcapParams)              \
  X(Sigmoid, "sigmoid", NoParams)                   \
  X(Softmax, "softmax", NoParams)                   \
  X(TopK, "top_k", TopKParams)                      \
  X(Take, "take", NoParams)                         \
  X(SumNormalize, "sum_normalize", SumNormalizeParams) \
  X(WeightedSum, "weighted_sum", NoParams)          \
  X(MatMulId, "matmul_id", MatMulIdParams)         \
  X(MlaAttention, "mla_attention", MlaAttentionParams)

struct NoParams {};

// Copies external input `index` (the index-th tensor passed to run()).
struct InputParams {
  int32_t index = 0;
};

// Row ids are the batch's positions (learned position embeddings) instead of its tokens.
struct GetRowsParams {
  bool by_position = false;
};

struct ScaleParams {
  float scale = 1.0f;
};

// y = cap * tanh(x / cap)
struct SoftcapParams {
  float cap = 1.0f;
};

struct NormParams {
  float eps = 0.0f;
  int32_t group = 0;  // RmsNorm: columns normalised together (per-head QK-norm); 0 = the whole row
};

struct RopeParams {
  int32_t head_dim = 0;
  int32_t n_rot = 0;         // dimensions of each head that rotate, from `offset` on
  bool neox = false;         // rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1)
  float base = 10000.0f;
  float freq_scale = 1.0f;
  int32_t offset = 0;        // dimensions of each head before the rotated ones
};

struct AttentionParams {
  int32_t n_head = 0, n_kv_head = 0, head_dim = 0;
  int32_t window = 0;        // sliding window in positions; 0 = the whole context
  float scale = 1.0f;        // on q . k before the softmax
  float softcap = 0.0f;      // soft-capping of the scores; 0 = none
  bool causal = true;        // false (encoders): a token sees every position of its sequence in the batch
  float alibi_max_bias = 0;  // ALiBi: head h's score of position j from position i gets -slope(h) |i - j|; 0 = none
  int32_t kv_layer = -1;     // the KV cache this node writes and reads (set by Graph::add_node)
};

// The k largest columns of each row (expert ids, largest first); with n_groups > 1, only among
// the columns of the groups_used best of n_groups equal groups, a group scored by the sum of its
// two largest values (group_score 0) or its largest (1).
struct TopKParams {
  int32_t k = 1;
  int32_t n_groups = 0, groups_used = 0;
  int32_t group_score = 0;
};

// y = x / max(sum x, min_sum)
struct SumNormalizeParams {
  float min_sum = 0.0f;
};

// The weight stacks n_experts matrices of equal rows.
struct MatMulIdParams {
  int32_t n_experts = 1;
};

// Multi-head latent attention (ops/attention.cpp): n_head query heads of nope + rope dimensions
// over one cached row per position of the latent (rank) and the rotary key (rope); value
// dimensions per head after the up-projection.
struct MlaAttentionParams {
  int32_t n_head = 0, rank = 0, rope = 0, nope = 0, value = 0;
  float scale = 1.0f;        // on q . k before the softmax
  int32_t kv_layer = -1;     // the cache this node writes and reads (set by Graph::add_node)
};

#define EMBER_OP_ENUM_(name, str, params) name,
enum class Op : int32_t { EMBER_OPS(EMBER_OP_ENUM_) Count };
#undef EMBER_OP_ENUM_

constexpr int kOpCount = static_cast<int>(Op::Count);

#define EMBER_OP_NAME_(name, str, params) str,
constexpr const char* kOpNames[] = {EMBER_OPS(EMBER_OP_NAME_)};
#undef EMBER_OP_NAME_
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == kOpCount, "one name per op");

constexpr const char* op_name(Op op) { return kOpNames[static_cast<int>(op)]; }

// Every distinct parameters struct, once; a Node holds one of them.
using NodeParams = std::variant<NoParams, InputParams, GetRowsParams, ScaleParams, SoftcapParams, NormParams,
                                RopeParams, AttentionParams, TopKParams, SumNormalizeParams, MatMulIdParams,
                                MlaAttentionParams>;

template <typename T, typename... Ts>
constexpr size_t index_in(const std::variant<Ts...>*) {
  constexpr bool same[] = {std::is_same<T, Ts>::value...};
  for (size_t i = 0; i < sizeof...(Ts); ++i)
    if (same[i]) return i;
  return sizeof...(Ts);
}
template <typename T>
constexpr size_t params_index() {
  return index_in<T>(static_cast<const NodeParams*>(nullptr));
}

// The NodeParams alternative each op takes.
#define EMBER_OP_PARAMS_(name, str, params) params_index<params>(),
constexpr size_t kOpParamsIndex[] = {EMBER_OPS(EMBER_OP_PARAMS_)};
#undef EMBER_OP_PARAMS_
#define EMBER_OP_PARAMS_LISTED_(name, str, params) \
  static_assert(params_index<params>() < std::variant_size<NodeParams>::value, #params " is not in NodeParams");
EMBER_OPS(EMBER_OP_PARAMS_LISTED_)
#undef EMBER_OP_PARAMS_LISTED_

constexpr bool params_fit(Op op, const NodeParams& p) { return p.index() == kOpParamsIndex[static_cast<int>(op)]; }

}  // namespace ember
