// The compute graph: tensors (weights, inputs, intermediate activations) and the node list
// that a model's Python builder creates once. plan() places every intermediate in one arena
// (reusing memory by liveness) and allocates the KV cache; run() executes the nodes on the
// thread pool for a batch of tokens, allocating nothing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/kernels.h"
#include "core/op.h"
#include "core/threadpool.h"
#include "core/types.h"

namespace ember {

// Row counts that depend on the batch: the number of tokens, or of rows whose logits are wanted.
constexpr int64_t kRowsTokens = -1;
constexpr int64_t kRowsOutputs = -2;

// Zero-filled memory mapped from the OS: pages become resident only when written, so a short
// prompt or a decode step costs only what it touches (a memset would make all of it resident).
struct ZeroPagesDeleter {
  size_t size = 0;
  void operator()(uint8_t* p) const;
};
using ZeroPages = std::unique_ptr<uint8_t, ZeroPagesDeleter>;
ZeroPages map_zero_pages(size_t size);

// Arena placements (activations, per-node scratch) are aligned to kAlign bytes.
constexpr size_t kAlign = 64;
inline size_t align_up(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }
// A node's scratch laid out piece after piece, each aligned: take(bytes) is where the next starts.
struct ScratchLayout {
  size_t end = 0;
  size_t take(size_t bytes) {
    const size_t start = end;
    end += align_up(bytes);
    return start;
  }
};

struct Tensor {
  GGMLType type = GGMLType::F32;
  int64_t ne0 = 0;            // elements per row
  int64_t ne1 = 0;            // rows, or kRowsTokens / kRowsOutputs
  size_t row_stride = 0;      // bytes between rows (views of a wider tensor have a larger one)
  // Reshape and permute views. A tensor with row_split k has k rows for each of its ne1 "base"
  // rows (tokens): logical row r is (base t, sub h), t-major (r = t k + h) or, once permuted,
  // h-major (r = h T + t, T base rows). In memory the rows are t-major at t * base_stride +
  // h * row_stride, or (for the output of an op that read an h-major view) h-major and dense.
  int64_t row_split = 1;
  bool h_major = false;           // logical order
  bool h_major_memory = false;    // memory order
  size_t base_stride = 0;         // t-major memory: bytes between base rows
  bool is_weight = false;
  const void* weight_data = nullptr;  // weights: mmapped file data, owned by Python
  int32_t alias_of = -1;      // views: the tensor whose memory this one shares
  size_t alias_offset = 0;    // views: byte offset into that tensor's rows
  size_t arena_offset = 0;    // activations: placement in the arena
  int32_t producer = -1;      // node that writes it (-1 for weights and views)
};

// Whether logical row r lies at r * row_stride (what matmul and the output copy need).
inline bool evenly_strided(const Tensor& t) {
  if (t.row_split == 1) return true;
  if (t.h_major != t.h_major_memory) return false;
  return t.h_major_memory || t.base_stride == t.row_stride * static_cast<size_t>(t.row_split);
}

constexpr int kMaxSources = 6;

struct Node {
  Op op = Op::Input;
  int32_t out = -1;           // tensor id
  int32_t src[kMaxSources] = {-1, -1, -1, -1, -1, -1};
  NodeParams params;          // of the type EMBER_OPS gives the op
  size_t work_offset = 0;     // scratch in the arena for this node
  size_t work_size = 0;
  // MatMul: an earlier MatMul of the same input, converted to the same vec_dot_type into the
  // same scratch layout, whose scratch this node reads instead of converting again (Q, K and V;
  // gate and up); -1 when the node converts its own input.
  int32_t input_from = -1;
  template <typename P>
  const P& as() const { return std::get<P>(params); }
};

// One layer's cache. Attention: K and V rows of n_kv_heads * head_dim each, in k_type / v_type
// (F32, F16 or Q8_0; a Q8_0 row is whole blocks per head). Multi-head latent attention: F16 K
// rows of the latent and the rotary key (kv_lora_rank + rope dims), no V rows (the values are
// the latent, the first kv_lora_rank elements of each K row).
struct KVCache {
  int64_t n_ctx = 0, n_seq = 0, k_elems = 0, v_elems = 0;  // elements of a K / V row of one position
  GGMLType k_type = GGMLType::F16, v_type = GGMLType::F16;
  size_t k_bytes = 0, v_bytes = 0;  // bytes of a K / V row of one position
  ZeroPages k, v;  // [n_seq][n_ctx] rows
  uint8_t* k_row(int64_t seq, int64_t pos) { return k.get() + (seq * n_ctx + pos) * k_bytes; }
  uint8_t* v_row(int64_t seq, int64_t pos) { return v.get() + (seq * n_ctx + pos) * v_bytes; }
  // Bytes of positions [0, n) of one sequence.
  size_t bytes_per_seq(int64_t n) const { return static_cast<size_t>(n) * (k_bytes + v_bytes); }
  size_t bytes() const { return static_cast<size_t>(n_seq) * bytes_per_seq(n_ctx); }
};

// The scratch memory of a multi-head latent attention node (ops/attention.cpp), laid out in one
// place for the op and for the planner, which sizes it for the largest batch. Offsets from the
// node's work_offset; per-head rows are in (token, head) order.
struct MlaWork {
  size_t q_act = 0, q_act_stride = 0;  // the no-rope queries in the vec_dot_type of attn_k_b
  size_t query = 0;                    // F32 [rows][rank + rope]: absorbed queries, then the rotary part
  size_t latent = 0;                   // F32 [rows][rank]: attention-weighted latents
  size_t o_act = 0, o_act_stride = 0;  // the latents in the vec_dot_type of attn_v_b
  size_t f32_rows = 0, f32_rows_stride = 0;      // float activations: dequantized weight rows, per thread
  size_t per_thread = 0, per_thread_stride = 0;  // scores over the context and an accumulator, per thread
  size_t size = 0;
};

// The scratch of an Attention node (ops/attention.cpp). Per thread: F32 copies of kAttnBlock
// cached K and V rows, and for a tile of up to kAttnLanes query rows the queries, their scores
// over one block, their outputs over a segment and merged, and softmax statistics. Shared,
// after the threads' parts: the partial results of a one-token batch whose segments the threads
// share out, per query head and segment (padded_head_dim + 2 floats: output, max, sum).
// Offsets from the node's work_offset.
constexpr int64_t kAttnBlock = 64, kAttnLanes = 32;
// Positions a query row attends to in one pass: its softmax over each segment is merged with
// the others in order, whichever thread computed it (a lone token's segments are shared out).
constexpr int64_t kAttnSegment = 4 * kAttnBlock;
// Rows of head_dim floats in the scratch are padded with zeros to whole 16-float vectors.
constexpr int64_t padded_head_dim(int64_t head_dim) { return (head_dim + 15) / 16 * 16; }
struct AttentionWork {
  size_t keys = 0, values = 0, queries = 0, scores = 0, out = 0, result = 0, stats = 0;  // in a thread's part
  size_t per_thread = 0;  // bytes of a thread's part
  size_t partials = 0, partial_floats = 0;
  size_t size = 0;
};

struct ExecContext {
  const KernelTable* kernels = nullptr;
  class Graph* graph = nullptr;
  ThreadPool* pool = nullptr;
  uint8_t* arena = nullptr;
  int64_t n_tokens = 0, n_outputs = 0;
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* seq_ids = nullptr;
  const int32_t* output_rows = nullptr;
  const float* const* inputs = nullptr;  // external F32 inputs, by Input node order

  int64_t base_rows(const Tensor& t) const {
    return t.ne1 == kRowsTokens ? n_tokens : t.ne1 == kRowsOutputs ? n_outputs : t.ne1;
  }
  int64_t rows(const Tensor& t) const { return base_rows(t) * t.row_split; }
  // Byte offset of logical row r from the tensor's first byte.
  size_t row_offset(const Tensor& t, int64_t r) const {
    if (t.row_split == 1) return static_cast<size_t>(r) * t.row_stride;
    const int64_t k = t.row_split, n = base_rows(t);
    const int64_t base = t.h_major ? r % n : r / k, sub = t.h_major ? r / n : r % k;
    if (t.h_major_memory) return static_cast<size_t>(sub * n + base) * t.row_stride;
    return static_cast<size_t>(base) * t.base_stride + static_cast<size_t>(sub) * t.row_stride;
  }
  void barrier() { pool->barrier(); }
};

class Graph {
 public:
  // float_activations: every matmul dequantizes its weight rows to F32 and takes float dot
  // products with the F32 activations, instead of converting the activations to the weight
  // type's vec_dot_type (8-bit blocks for quantized weights). Slower; no activation rounding.
  explicit Graph(int n_threads, bool float_activations = false);

  int32_t add_weight(GGMLType type, int64_t ne0, int64_t ne1, const void* data, size_t n_bytes);
  int32_t add_input(int64_t ne0);  // F32 activations [n_tokens, ne0] given to run()
  int32_t add_node(Op op, int64_t ne0, int64_t ne1, std::initializer_list<int32_t> srcs,
                   NodeParams params = NoParams{});
  int32_t add_view(int32_t src, int64_t col_offset, int64_t n_cols);
  // [rows, ne0] as [rows * ne0 / new_ne0, new_ne0] (or back), where memory is dense per token.
  int32_t add_reshape(int32_t src, int64_t new_ne0);
  // Swaps the two row axes of a reshaped tensor: (token, sub-row) <-> (sub-row, token).
  int32_t add_permute(int32_t src);
  // Gives a new op output the logical row layout of the tensor it is computed row by row from.
  void copy_row_layout(int32_t out, int32_t like);
  // Gives a new op output k dense rows per base row (t-major): the expert matmul's slots.
  void split_rows(int32_t out, int64_t k);
  void set_output(int32_t tensor) { output_ = tensor; }

  // Places activations in the arena for batches of up to max_tokens tokens and max_outputs
  // output rows, and allocates the KV cache of every attention layer, K and V rows of the given
  // types (F32, F16 or Q8_0).
  void plan(int64_t max_tokens, int64_t max_outputs, int64_t n_ctx, int64_t n_seq,
            GGMLType k_type = GGMLType::F16, GGMLType v_type = GGMLType::F16);
  // Runs a batch. tokens/positions/seq_ids have n_tokens entries; output_rows n_outputs.
  // Returns a pointer to the output tensor's rows (F32, n_outputs x output's ne0).
  const float* run(int64_t n_tokens, const int32_t* tokens, const int32_t* positions,
                   const int32_t* seq_ids, int64_t n_outputs, const int32_t* output_rows,
                   const float* const* inputs, int64_t n_inputs);

  const Tensor& tensor(int32_t id) const { return tensors_.at(id); }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Node& node(int32_t id) const { return nodes_.at(id); }
  uint8_t* data(const Tensor& t, uint8_t* arena) const;
  const uint8_t* weight_or_data(const Tensor& t, uint8_t* arena) const;
  int32_t output() const { return output_; }
  int64_t output_cols() const { return tensors_.at(output_).ne0; }
  size_t arena_size() const { return arena_size_; }
  size_t kv_size() const;
  int n_threads() const { return pool_.size(); }
  bool float_activations() const { return float_activations_; }
  // Whether a matmul over weights of this type dequantizes them (float activations, not F32).
  bool dequantizes(GGMLType weight_type) const { return float_activations_ && weight_type != GGMLType::F32; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t max_outputs() const { return max_outputs_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_seq() const { return n_seq_; }
  int64_t n_inputs() const { return n_inputs_; }
  // Rows of a tensor in the largest planned batch.
  int64_t max_rows(const Tensor& t) const;
  KVCache& kv(int32_t layer) { return kv_.at(layer); }
  int32_t n_kv_layers() const { return static_cast<int32_t>(kv_.size()); }
  // Copies cached positions [0, n) of sequence src to sequence dst in every layer.
  void kv_copy(int64_t src, int64_t dst, int64_t n);
  // Bytes of positions [0, n) of one sequence in every layer (K then V rows, layer by layer).
  size_t kv_state_bytes(int64_t n) const;
  // Copies positions [0, n) of sequence seq out to / in from `size` bytes laid out as kv_state_bytes says.
  void kv_save(int64_t seq, int64_t n, uint8_t* out, size_t size);
  void kv_load(int64_t seq, int64_t n, const uint8_t* in, size_t size);
  const KernelTable* kernels() const { return kernels_; }
  // The scratch layout of an MlaAttention node for batches of up to max_tokens tokens.
  MlaWork mla_work(const Node& n, int64_t max_tokens) const;
  // The scratch layout of an Attention node.
  AttentionWork attention_work(const Node& n) const;
  // Per-node wall time (ns, summed over runs) when profiling is on; measured by thread 0.
  void set_profiling(bool on);
  const std::vector<uint64_t>& node_times() const { return node_ns_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  void set_kernels(const KernelTable* k) { kernels_ = k; }

 private:
  size_t max_bytes(const Tensor& t) const;
  size_t node_work_size(const Node& n) const;
  // The tensor whose memory tensor `id` is: itself, or the one a view aliases.
  int32_t root_of(int32_t id) const { return tensors_[id].alias_of >= 0 ? tensors_[id].alias_of : id; }
  // The MatMul whose converted input node `ni` can read (the rule at Node::input_from), or -1.
  int32_t converted_input_source(size_t ni) const;
  void check_kv_types(GGMLType k_type, GGMLType v_type) const;
  static void run_task(void* arg, int ith, int nth);

  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::vector<KVCache> kv_;
  std::vector<uint64_t> node_ns_;
  bool profiling_ = false;
  bool float_activations_ = false;
  int32_t output_ = -1;
  int64_t n_inputs_ = 0;
  int64_t max_tokens_ = 0, max_outputs_ = 0, n_ctx_ = 0, n_seq_ = 0;
  size_t arena_size_ = 0;
  ZeroPages arena_;
  const KernelTable* kernels_ = nullptr;
  ThreadPool pool_;
  ExecContext ctx_;
};

}  // namespace ember
