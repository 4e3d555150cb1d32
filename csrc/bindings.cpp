// ember._core: the graph builder and runner, the per-type kernels (for tests and quantize),
// and CPU/ISA information.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/alloc_counter.h"
#include "core/amx_tiles.h"
#include "core/graph.h"
#include "cpu_features.h"
#include "text/bpe.h"
#include "text/spm.h"
#include "text/substrings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ember {
namespace {

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F32Array = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using I32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F32Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using ByteRows = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

StringTable string_table(const nb::bytes& raw, const I64Array& fields) {
  return StringTable{reinterpret_cast<const uint8_t*>(raw.c_str()), raw.size(), fields.data(), fields.shape(0)};
}

std::string_view utf8_of(nb::handle text) {
  if (!PyUnicode_Check(text.ptr())) throw nb::type_error("expected str");
  Py_ssize_t n = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
  if (!utf8) throw nb::python_error();
  return std::string_view(utf8, static_cast<size_t>(n));
}

// SpmVocab.encode: the ids of one piece of text.
std::vector<int32_t> spm_encode(const SpmVocab& vocab, nb::handle text) {
  std::vector<int32_t> out;
  vocab.encode(utf8_of(text), out);
  return out;
}

// BpeVocab.encode: the ids of a list of pre-tokenized words (str), in order.
std::vector<int32_t> bpe_encode(const BpeVocab& vocab, const nb::list& words) {
  std::vector<int32_t> out;
  for (nb::handle word : words) vocab.encode_word(utf8_of(word), out);
  return out;
}

GGMLType checked_type(int32_t type_id) {
  if (!type_supported(type_id)) throw std::invalid_argument("unknown tensor type id " + std::to_string(type_id));
  return static_cast<GGMLType>(type_id);
}

const TypeKernels& kernels_for(const KernelTable& table, GGMLType type) {
  const TypeKernels& k = table.of(type);
  if (!k.dequantize_row) {
    throw std::invalid_argument(std::string("no kernels for tensor type ") + type_traits(type).name +
                                " in this build");
  }
  return k;
}

// A Graph plus the Python objects whose memory its weights point into.
class PyGraph {
 public:
  PyGraph(int n_threads, bool float_activations) : graph_(checked_threads(n_threads), float_activations) { graph_.set_kernels(&active_kernels()); }

  int32_t weight(int32_t type_id, int64_t ne0, int64_t ne1, nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu> data) {
    GGMLType type = checked_type(type_id);
    const TypeKernels& k = kernels_for(*graph_.kernels(), type);
    if (!k.vec_dot && type != GGMLType::Q8_1)
      throw std::invalid_argument(std::string("no matmul kernel for tensor type ") + type_traits(type).name);
    owners_.push_back(nb::cast(data));
    return graph_.add_weight(type, ne0, ne1, data.data(), data.nbytes());
  }

  int32_t input(int64_t ne0) { return graph_.add_input(ne0); }
  int32_t get_rows(int32_t w, bool by_position) {
    const Tensor& t = graph_.tensor(w);
    if (!t.is_weight) throw std::invalid_argument("get_rows reads a weight");
    const int64_t n_rows = t.ne1;  // read before add_node, which may move the tensor list
    int32_t id = graph_.add_node(Op::GetRows, t.ne0, kRowsTokens, {w}, GetRowsParams{by_position});
    get_rows_limits_.push_back({by_position, n_rows});
    return id;
  }
  int32_t matmul(int32_t w, int32_t x) {
    const Tensor &tw = graph_.tensor(w), &tx = f32_operand(x);
    if (!tw.is_weight) throw std::invalid_argument("matmul: first operand must be a weight");
    if (tw.ne0 != tx.ne0) throw std::invalid_argument("matmul: inner dimensions differ");
    if (!evenly_strided(tx)) throw std::invalid_argument("matmul: the activation rows are not evenly strided (a permuted view)");
    return same_rows(graph_.add_node(Op::MatMul, tw.ne1, tx.ne1, {w, x}), x);
  }
  int32_t binary(Op op, int32_t a, int32_t b) {
    const Tensor &ta = f32_operand(a), &tb = f32_operand(b);
    if (ta.ne0 != tb.ne0) throw std::invalid_argument("element-wise op: column counts differ");
    const bool broadcast = tb.ne1 == 1 && tb.row_split == 1;
    if (!broadcast && (tb.ne1 != ta.ne1 || tb.row_split != ta.row_split || (tb.row_split > 1 && tb.h_major != ta.h_major)))
      throw std::invalid_argument("element-wise op: row counts differ");
    return same_rows(graph_.add_node(op, ta.ne0, ta.ne1, {a, b}), a);
  }
  int32_t unary(Op op, int32_t a, NodeParams params = NoParams{}) {
    const Tensor& t = f32_operand(a);
    return same_rows(graph_.add_node(op, t.ne0, t.ne1, {a}, params), a);
  }
  int32_t rms_norm(int32_t x, int32_t w, float eps, int32_t group) {
    const Tensor& t = f32_operand(x);
    const int64_t width = group > 0 ? group : t.ne0;
    if (t.ne0 % width != 0) throw std::invalid_argument("rms_norm: group does not divide the row");
    check_vector(w, width);
    return same_rows(graph_.add_node(Op::RmsNorm, t.ne0, t.ne1, {x, w}, NormParams{eps, group}), x);
  }
  int32_t layer_norm(int32_t x, int32_t w, int32_t b, float eps) {
    const Tensor& t = f32_operand(x);
    check_vector(w, t.ne0);
    check_vector(b, t.ne0);
    return same_rows(graph_.add_node(Op::LayerNorm, t.ne0, t.ne1, {x, w, b}, NormParams{eps, 0}), x);
  }
  int32_t rope(int32_t x, int32_t head_dim, int32_t n_rot, bool neox, float base, float freq_scale,
               int32_t factors, int32_t offset) {
    const Tensor& t = token_rows(x);
    if (head_dim <= 0 || t.ne0 % head_dim != 0) throw std::invalid_argument("rope: head_dim does not divide the row");
    if (offset < 0 || offset > head_dim) throw std::invalid_argument("rope: bad offset");
    if (n_rot <= 0 || n_rot > head_dim - offset || n_rot % 2 || n_rot / 2 > 512) throw std::invalid_argument("rope: bad n_rot");
    check_vector(factors, n_rot / 2);
    RopeParams p{head_dim, n_rot, neox, base, freq_scale};
    p.offset = offset;
    return graph_.add_node(Op::Rope, t.ne0, t.ne1, {x, factors}, p);
  }
  int32_t attention(int32_t q, int32_t k, int32_t v, int32_t n_head, int32_t n_kv_head, int32_t head_dim,
                    float scale, int32_t window, float softcap, bool causal, float alibi_max_bias) {
    const Tensor &tq = token_rows(q), &tk = token_rows(k), &tv = token_rows(v);
    if (n_head <= 0 || n_kv_head <= 0 || head_dim <= 0 || n_head % n_kv_head)
      throw std::invalid_argument("attention: bad head counts");
    if (tq.ne0 != int64_t(n_head) * head_dim || tk.ne0 != int64_t(n_kv_head) * head_dim || tv.ne0 != tk.ne0)
      throw std::invalid_argument("attention: q/k/v widths do not match the head counts");
    if (!(alibi_max_bias >= 0.0f) || !std::isfinite(alibi_max_bias))
      throw std::invalid_argument("attention: alibi_max_bias must be finite and >= 0");
    AttentionParams p;
    p.n_head = n_head;
    p.n_kv_head = n_kv_head;
    p.head_dim = head_dim;
    p.window = window;
    p.scale = scale;
    p.softcap = softcap;
    p.causal = causal;
    p.alibi_max_bias = alibi_max_bias;
    return graph_.add_node(Op::Attention, tq.ne0, tq.ne1, {q, k, v}, p);
  }
  // Routing (models/moe.py) and the expert matmul (ops/routing.cpp, ops/matmul_id.cpp).
  int32_t top_k(int32_t scores, int32_t k, int32_t n_groups, int32_t groups_used, int32_t group_score) {
    const Tensor& t = plain_rows(scores, "top_k");
    const int64_t E = t.ne0;
    if (k < 1 || k > E) throw std::invalid_argument("top_k: k must be between 1 and the number of columns");
    if (n_groups > 1) {
      if (E % n_groups) throw std::invalid_argument("top_k: the groups do not divide the columns");
      if (groups_used < 1 || groups_used > n_groups) throw std::invalid_argument("top_k: bad number of groups used");
      if (k > int64_t(groups_used) * (E / n_groups)) throw std::invalid_argument("top_k: k is more than the groups used hold");
    } else if (n_groups < 0) {
      throw std::invalid_argument("top_k: bad number of groups");
    }
    if (group_score != 0 && group_score != 1) throw std::invalid_argument("top_k: group_score is 0 (top-2 sum) or 1 (max)");
    return graph_.add_node(Op::TopK, k, t.ne1, {scores}, TopKParams{k, n_groups, groups_used, group_score});
  }
  int32_t take(int32_t a, int32_t ids) {
    const Tensor &ta = plain_rows(a, "take"), &ti = plain_rows(ids, "take");
    if (ta.ne1 != ti.ne1) throw std::invalid_argument("take: row counts differ");
    return graph_.add_node(Op::Take, ti.ne0, ta.ne1, {a, ids});
  }
  int32_t sum_normalize(int32_t x, float min_sum) {
    const Tensor& t = plain_rows(x, "sum_normalize");
    if (!(min_sum > 0.0f)) throw std::invalid_argument("sum_normalize: min_sum must be > 0");
    return graph_.add_node(Op::SumNormalize, t.ne0, t.ne1, {x}, SumNormalizeParams{min_sum});
  }
  int32_t weighted_sum(int32_t x, int32_t weights) {
    const Tensor &tw = plain_rows(weights, "weighted_sum"), &tx = f32_operand(x);
    if (tx.ne1 != tw.ne1 || tx.row_split != tw.ne0 || tx.h_major)
      throw std::invalid_argument("weighted_sum: x must have one row per weight of each of weights' rows");
    return graph_.add_node(Op::WeightedSum, tx.ne0, tw.ne1, {x, weights});
  }
  int32_t matmul_id(int32_t w, int32_t x, int32_t ids, int32_t n_experts) {
    const Tensor &tw = graph_.tensor(w), &tx = f32_operand(x), &ti = plain_rows(ids, "matmul_id");
    if (!tw.is_weight) throw std::invalid_argument("matmul_id: first operand must be a weight");
    if (n_experts < 1 || tw.ne1 % n_experts) throw std::invalid_argument("matmul_id: the experts do not divide the weight's rows");
    if (tw.ne0 != tx.ne0) throw std::invalid_argument("matmul_id: inner dimensions differ");
    const int64_t k = ti.ne0;
    if (tx.ne1 != ti.ne1 || (tx.row_split != 1 && tx.row_split != k) || tx.h_major)
      throw std::invalid_argument("matmul_id: x must have a row per token or per chosen expert of each token");
    const int32_t out = graph_.add_node(Op::MatMulId, tw.ne1 / n_experts, ti.ne1, {w, x, ids}, MatMulIdParams{n_experts});
    graph_.split_rows(out, k);
    return out;
  }
  // Multi-head latent attention (ops/attention.cpp): q rotated in each head's last `rope`
  // dimensions, the normalised latent c, the rotated shared key k_pe, and the per-head key and
  // value up-projections attn_k_b [n_head * rank rows of nope] and attn_v_b [n_head * value rows of rank].
  int32_t mla_attention(int32_t q, int32_t c, int32_t k_pe, int32_t wk_b, int32_t wv_b, int32_t n_head, int32_t rank,
                        int32_t rope, int32_t nope, int32_t value, float scale) {
    const Tensor &tq = token_rows(q), &tc = token_rows(c), &tp = token_rows(k_pe);
    const Tensor &wk = graph_.tensor(wk_b), &wv = graph_.tensor(wv_b);
    if (n_head <= 0 || rank <= 0 || rope <= 0 || nope <= 0 || value <= 0)
      throw std::invalid_argument("mla_attention: head counts and sizes must be positive");
    if (tq.ne0 != int64_t(n_head) * (nope + rope)) throw std::invalid_argument("mla_attention: q is not n_head * (nope + rope) wide");
    if (tc.ne0 != rank || tp.ne0 != rope) throw std::invalid_argument("mla_attention: c or k_pe has the wrong width");
    if (!wk.is_weight || !wv.is_weight) throw std::invalid_argument("mla_attention: attn_k_b and attn_v_b must be weights");
    if (wk.ne0 != nope || wk.ne1 != int64_t(n_head) * rank)
      throw std::invalid_argument("mla_attention: attn_k_b is not n_head * rank rows of nope");
    if (wv.ne0 != rank || wv.ne1 != int64_t(n_head) * value)
      throw std::invalid_argument("mla_attention: attn_v_b is not n_head * value rows of rank");
    MlaAttentionParams p;
    p.n_head = n_head;
    p.rank = rank;
    p.rope = rope;
    p.nope = nope;
    p.value = value;
    p.scale = scale;
    return graph_.add_node(Op::MlaAttention, int64_t(n_head) * value, tq.ne1, {q, c, k_pe, wk_b, wv_b}, p);
  }
  int32_t select_outputs(int32_t x) {
    const Tensor& t = token_rows(x);
    return graph_.add_node(Op::SelectOutputs, t.ne0, kRowsOutputs, {x});
  }
  int32_t view(int32_t x, int64_t col_offset, int64_t n_cols) {
    if (graph_.tensor(x).row_split != 1) throw std::invalid_argument("view: column slices are of unsplit rows");
    return graph_.add_view(x, col_offset, n_cols);
  }
  int32_t reshape(int32_t x, int64_t ne0) { return graph_.add_reshape(x, ne0); }
  int32_t permute(int32_t x) { return graph_.add_permute(x); }
  void set_output(int32_t x) {
    if (!evenly_strided(graph_.tensor(x)))
      throw std::invalid_argument("the output must be evenly strided (not a permuted view; scale it by 1 to make it dense)");
    graph_.set_output(x);
  }

  void plan(int64_t max_tokens, int64_t max_outputs, int64_t n_ctx, int64_t n_seq, int32_t type_k, int32_t type_v) {
    if (!type_supported(type_k) || !type_supported(type_v))
      throw std::invalid_argument("KV cache type " + std::to_string(type_supported(type_k) ? type_v : type_k) +
                                  " is not a tensor type ember knows");
    graph_.plan(max_tokens, max_outputs, n_ctx, n_seq, static_cast<GGMLType>(type_k), static_cast<GGMLType>(type_v));
  }

  nb::ndarray<nb::numpy, float, nb::ndim<2>> run(I32Array tokens, I32Array positions, I32Array seq_ids,
                                                  I32Array output_rows, std::vector<F32Array> inputs) {
    const int64_t n = static_cast<int64_t>(tokens.shape(0));
    if (static_cast<int64_t>(positions.shape(0)) != n || static_cast<int64_t>(seq_ids.shape(0)) != n)
      throw std::invalid_argument("tokens, positions and seq_ids must have the same length");
    for (int64_t i = 0; i < n; ++i) {
      const int32_t tok = tokens.data()[i], pos = positions.data()[i];
      for (const auto& lim : get_rows_limits_) {
        const int32_t id = lim.by_position ? pos : tok;
        if (id < 0 || id >= lim.rows)
          throw std::out_of_range((lim.by_position ? "position " : "token id ") + std::to_string(id) +
                                  " out of range [0, " + std::to_string(lim.rows) + ")");
      }
    }
    std::vector<const float*> ptrs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].size() != static_cast<size_t>(n) * input_cols(static_cast<int64_t>(i)))
        throw std::invalid_argument("input " + std::to_string(i) + " has the wrong size");
      ptrs.push_back(inputs[i].data());
    }
    const int64_t n_out = static_cast<int64_t>(output_rows.shape(0));
    const int64_t cols = graph_.output_cols();
    const float* result;
    std::unique_lock<std::mutex> lock;
    {
      nb::gil_scoped_release release;
      lock = std::unique_lock<std::mutex>(run_mutex_);  // one run at a time per graph
      result = graph_.run(n, tokens.data(), positions.data(), seq_ids.data(), n_out, output_rows.data(),
                          ptrs.data(), static_cast<int64_t>(ptrs.size()));
    }
    const Tensor& out = graph_.tensor(graph_.output());
    // Rows in logical order, evenly strided (set_output checks): reshaped outputs give all their rows.
    const int64_t rows = (out.ne1 == kRowsOutputs ? n_out : out.ne1 == kRowsTokens ? n : out.ne1) * out.row_split;
    float* copy = new float[rows * cols];
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(copy + r * cols, reinterpret_cast<const uint8_t*>(result) + r * out.row_stride, cols * sizeof(float));
    nb::capsule owner(copy, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    return nb::ndarray<nb::numpy, float, nb::ndim<2>>(copy, {static_cast<size_t>(rows), static_cast<size_t>(cols)}, owner);
  }

  void kv_copy(int64_t src, int64_t dst, int64_t n) {
    std::lock_guard<std::mutex> lock(run_mutex_);
    graph_.kv_copy(src, dst, n);
  }
  // Positions [0, n) of sequence seq in every layer's KV cache, as bytes (a saved state).
  nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> kv_save(int64_t seq, int64_t n) {
    std::lock_guard<std::mutex> lock(run_mutex_);
    if (n < 0 || n > graph_.n_ctx()) throw std::out_of_range("kv_save: length out of range");
    const size_t size = graph_.kv_state_bytes(n);
    uint8_t* copy = new uint8_t[size > 0 ? size : 1];
    nb::capsule owner(copy, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
    graph_.kv_save(seq, n, copy, size);
    return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(copy, {size}, owner);
  }
  void kv_load(int64_t seq, int64_t n, nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> state) {
    std::lock_guard<std::mutex> lock(run_mutex_);
    graph_.kv_load(seq, n, state.data(), state.shape(0));
  }
  void set_profiling(bool on) { graph_.set_profiling(on); }
  // [(op name, weight type name or "", total ns)] per node, in execution order.
  nb::list profile() const {
    nb::list out;
    const auto& times = graph_.node_times();
    for (size_t i = 0; i < graph_.nodes().size() && i < times.size(); ++i) {
      const Node& n = graph_.nodes()[i];
      std::string type;
      if (n.op == Op::MatMul || n.op == Op::MatMulId || n.op == Op::GetRows) type = type_traits(graph_.tensor(n.src[0]).type).name;
      out.append(nb::make_tuple(op_name(n.op), type, times[i]));
    }
    return out;
  }
  size_t arena_size() const { return graph_.arena_size(); }
  size_t kv_size() const { return graph_.kv_size(); }
  int n_threads() const { return graph_.n_threads(); }
  bool float_activations() const { return graph_.float_activations(); }
  std::string isa() const { return graph_.kernels()->isa; }

 private:
  struct RowLimit {
    bool by_position;
    int64_t rows;
  };

  // Activation operands are F32 (an F32 weight may be one; a quantized weight may not).
  const Tensor& f32_operand(int32_t id) const {
    const Tensor& t = graph_.tensor(id);
    if (t.type != GGMLType::F32) throw std::invalid_argument("activation operands must be F32");
    return t;
  }
  // An op's output computed row by row from `like` has its rows.
  int32_t same_rows(int32_t out, int32_t like) {
    graph_.copy_row_layout(out, like);
    return out;
  }
  // Ops that read the batch's positions or sequence ids row by row need the batch's token rows.
  const Tensor& token_rows(int32_t id) const {
    const Tensor& t = f32_operand(id);
    if (t.row_split != 1) throw std::invalid_argument("this op needs one row per token (reshape the rows back)");
    if (t.ne1 != kRowsTokens)
      throw std::invalid_argument("expected the batch's token rows (not output rows or a weight)");
    return t;
  }
  // An F32 activation of one row per base row (not reshaped).
  const Tensor& plain_rows(int32_t id, const char* op) const {
    const Tensor& t = f32_operand(id);
    if (t.row_split != 1) throw std::invalid_argument(std::string(op) + ": expected one row per token (reshape the rows back)");
    return t;
  }
  void check_vector(int32_t w, int64_t width) const {
    if (w < 0) return;
    const Tensor& t = graph_.tensor(w);
    if (t.type != GGMLType::F32 || t.ne1 != 1 || t.ne0 != width)
      throw std::invalid_argument("expected an F32 vector of " + std::to_string(width) + " elements");
  }
  int64_t input_cols(int64_t index) const {
    for (const Tensor& t : graph_.tensors())
      if (t.producer >= 0 && graph_.node(t.producer).op == Op::Input && graph_.node(t.producer).as<InputParams>().index == index)
        return t.ne0;
    throw std::invalid_argument("no such input");
  }

  static int checked_threads(int n) {
    if (n < 1 || n > 1024) throw std::invalid_argument("n_threads must be between 1 and 1024");
    return n;
  }

  Graph graph_;
  std::mutex run_mutex_;
  std::vector<nb::object> owners_;
  std::vector<RowLimit> get_rows_limits_;
};

size_t checked_row_bytes(GGMLType type, int64_t n) {
  const int64_t bs = type_traits(type).block_size;
  if (n <= 0 || n % bs) throw std::invalid_argument("row length must be a positive multiple of " + std::to_string(bs));
  return row_bytes(type, n);
}

nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> quantize_row(int32_t type_id, F32Array x) {
  const GGMLType type = checked_type(type_id);
  const TypeKernels& k = kernels_for(active_kernels(), type);
  if (!k.quantize_row) throw std::invalid_argument("no quantize_row kernel for this type");
  const int64_t n = static_cast<int64_t>(x.size());
  const size_t nbytes = checked_row_bytes(type, n);
  uint8_t* out = new uint8_t[nbytes];
  k.quantize_row(x.data(), out, n);
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
  return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(out, {nbytes}, owner);
}

nb::ndarray<nb::numpy, float, nb::ndim<1>> dequantize_row(int32_t type_id, Bytes raw, int64_t n) {
  const GGMLType type = checked_type(type_id);
  const TypeKernels& k = kernels_for(active_kernels(), type);
  if (checked_row_bytes(type, n) > raw.size()) throw std::invalid_argument("data shorter than n elements");
  float* out = new float[n];
  k.dequantize_row(raw.data(), out, n);
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, {static_cast<size_t>(n)}, owner);
}

// dot(weight row of `type`, activation row x): x is converted to the type's vec_dot_type first,
// exactly as the matmul does.
float vec_dot(int32_t type_id, Bytes weight_row, F32Array x) {
  const GGMLType type = checked_type(type_id);
  const TypeKernels& k = kernels_for(active_kernels(), type);
  if (!k.vec_dot) throw std::invalid_argument("no vec_dot kernel for this type");
  const int64_t n = static_cast<int64_t>(x.size());
  if (checked_row_bytes(type, n) > weight_row.size()) throw std::invalid_argument("weight row shorter than x");
  const TypeKernels& act = active_kernels().of(k.vec_dot_type);
  std::vector<uint8_t> xq(checked_row_bytes(k.vec_dot_type, n));
  act.quantize_row(x.data(), xq.data(), n);
  float out = 0.0f;
  k.vec_dot(n, &out, weight_row.data(), xq.data());
  return out;
}

// Rows of src_type -> rows of dst_type on n_threads threads: each row is dequantized to F32
// (unless it is F32) and quantized with dst_type's quantize_row. Threads take chunks of rows
// from a shared counter, so uneven rows (or a busy core) do not hold the others up.
void convert_rows_parallel(GGMLType src_type, const uint8_t* src, GGMLType dst_type, uint8_t* dst, int64_t n_rows,
                           int64_t n_per_row, int n_threads) {
  const KernelTable& table = active_kernels();
  const DequantizeRowFn dequantize = table.of(src_type).dequantize_row;
  const QuantizeRowFn quantize = table.of(dst_type).quantize_row;
  const size_t src_row = row_bytes(src_type, n_per_row), dst_row = row_bytes(dst_type, n_per_row);
  const int64_t chunk = std::max<int64_t>(1, 16384 / n_per_row);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    std::vector<float> f32(src_type == GGMLType::F32 ? 0 : n_per_row);
    for (int64_t first; (first = next.fetch_add(chunk)) < n_rows;) {
      for (int64_t r = first; r < std::min(n_rows, first + chunk); ++r) {
        const uint8_t* in = src + r * src_row;
        const float* row = reinterpret_cast<const float*>(in);
        if (src_type != GGMLType::F32) {
          dequantize(in, f32.data(), n_per_row);
          row = f32.data();
        }
        quantize(row, dst + r * dst_row, n_per_row);
      }
    }
  };
  const int64_t useful = (n_rows + chunk - 1) / chunk;
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < std::min<int64_t>(n_threads, useful); ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
}

nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>> convert_rows_checked(GGMLType src_type, const uint8_t* src,
                                                                  size_t src_bytes, GGMLType dst_type,
                                                                  int64_t n_rows, int64_t n_per_row, int n_threads) {
  if (n_threads < 1 || n_threads > 1024) throw std::invalid_argument("n_threads must be between 1 and 1024");
  if (!active_kernels().of(dst_type).quantize_row)
    throw std::invalid_argument(std::string("no quantize_row kernel for ") + type_traits(dst_type).name);
  if (!active_kernels().of(src_type).dequantize_row)
    throw std::invalid_argument(std::string("no dequantize_row kernel for ") + type_traits(src_type).name);
  const size_t src_row = checked_row_bytes(src_type, n_per_row), dst_row = checked_row_bytes(dst_type, n_per_row);
  if (src_bytes != src_row * static_cast<size_t>(n_rows))
    throw std::invalid_argument("rows are not n_per_row values of the source type");
  uint8_t* out = new uint8_t[dst_row * n_rows];
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
  {
    nb::gil_scoped_release release;
    convert_rows_parallel(src_type, src, dst_type, out, n_rows, n_per_row, n_threads);
  }
  return nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>(out, {static_cast<size_t>(n_rows), dst_row}, owner);
}

// float32 rows (n_rows, n) -> (n_rows, row bytes of `type`), quantized on n_threads threads.
nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>> quantize_rows(int32_t type_id, F32Rows x, int n_threads) {
  const int64_t n_rows = static_cast<int64_t>(x.shape(0)), n = static_cast<int64_t>(x.shape(1));
  return convert_rows_checked(GGMLType::F32, reinterpret_cast<const uint8_t*>(x.data()), x.nbytes(),
                              checked_type(type_id), n_rows, n, n_threads);
}

// Raw rows of src_type (n_rows, row bytes), n values each -> rows of dst_type, on n_threads threads.
nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>> convert_rows(int32_t src_type_id, ByteRows raw, int32_t dst_type_id,
                                                          int64_t n_per_row, int n_threads) {
  return convert_rows_checked(checked_type(src_type_id), raw.data(), raw.nbytes(), checked_type(dst_type_id),
                              static_cast<int64_t>(raw.shape(0)), n_per_row, n_threads);
}

nb::dict cpu_flags() {
  const CpuFeatures& f = cpu_features();
  nb::dict d;
  d["avx2"] = f.avx2;
  d["fma"] = f.fma;
  d["f16c"] = f.f16c;
  d["avx512f"] = f.avx512f;
  d["avx512bw"] = f.avx512bw;
  d["avx512vl"] = f.avx512vl;
  d["avx512dq"] = f.avx512dq;
  d["avx512vnni"] = f.avx512vnni;
  d["avx512bf16"] = f.avx512bf16;
  d["avx_vnni"] = f.avx_vnni;
  d["amx_tile"] = f.amx_tile;
  d["amx_int8"] = f.amx_int8;
  d["amx_bf16"] = f.amx_bf16;
  d["amx_granted"] = f.amx_granted;
  d["amx_emulated"] = f.amx_emulated;
  return d;
}

// C + A . B through the AMX tiles (native, or emulated under EMBER_EMULATE_AMX=1), for tests:
// a (M, 4K) and b (K, 4N) bytes, c (M, N) int32, each byte signed or not as a_sign / b_sign say.
nb::ndarray<nb::numpy, int32_t, nb::ndim<2>> tile_dot_product_checked(char a_sign, char b_sign, ByteRows a, ByteRows b,
                                                                    nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> c) {
  const std::vector<std::string> isas = available_isas();
  if (std::find(isas.begin(), isas.end(), "amx") == isas.end())
    throw std::runtime_error("this CPU (or OS) gives no AMX tiles, and the AMX emulator is not enabled (EMBER_EMULATE_AMX=1 enables it)");
  const int M = static_cast<int>(a.shape(0)), K = static_cast<int>(b.shape(0)), N = static_cast<int>(c.shape(1));
  if ((a_sign != 's' && a_sign != 'u') || (b_sign != 's' && b_sign != 'u'))
    throw std::invalid_argument("a_sign and b_sign are 's' or 'u'");
  if (a.shape(1) != 4 * b.shape(0) || b.shape(1) != 4 * c.shape(1) || c.shape(0) != a.shape(0))
    throw std::invalid_argument("shapes must be a (M, 4K), b (K, 4N), c (M, N)");
  int32_t* out = new int32_t[static_cast<size_t>(M) * N];
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
  std::memcpy(out, c.data(), sizeof(int32_t) * M * N);
  tile_dot_product(a_sign, b_sign, M, K, N, a.data(), b.data(), out);
  return nb::ndarray<nb::numpy, int32_t, nb::ndim<2>>(out, {static_cast<size_t>(M), static_cast<size_t>(N)}, owner);
}

std::vector<std::string> types_with_kernels() {
  std::vector<std::string> out;
  const KernelTable& t = active_kernels();
  for (int i = 0; i < kTypeCount; ++i)
    if (t.types[i].vec_dot && type_traits(static_cast<GGMLType>(i)).name) out.push_back(type_traits(static_cast<GGMLType>(i)).name);
  return out;
}

}  // namespace
}  // namespace ember

NB_MODULE(_core, m) {
  using namespace ember;
  m.doc() = "ember's compute core: graph runtime, thread pool and quantized kernels";

  nb::class_<PyGraph>(m, "Graph")
      .def(nb::init<int, bool>(), "n_threads"_a, "float_activations"_a = false)
      .def("weight", &PyGraph::weight, "type"_a, "ne0"_a, "ne1"_a, "data"_a)
      // The methods that add an op are named by the op table (core/op.h).
      .def(op_name(Op::Input), &PyGraph::input, "ne0"_a)
      .def(op_name(Op::GetRows), &PyGraph::get_rows, "weight"_a, "by_position"_a = false)
      .def(op_name(Op::MatMul), &PyGraph::matmul, "weight"_a, "x"_a)
      .def(op_name(Op::Add), [](PyGraph& g, int32_t a, int32_t b) { return g.binary(Op::Add, a, b); })
      .def(op_name(Op::Mul), [](PyGraph& g, int32_t a, int32_t b) { return g.binary(Op::Mul, a, b); })
      .def(op_name(Op::SwiGLU), [](PyGraph& g, int32_t a, int32_t b) { return g.binary(Op::SwiGLU, a, b); }, "gate"_a, "up"_a)
      .def(op_name(Op::GeGLU), [](PyGraph& g, int32_t a, int32_t b) { return g.binary(Op::GeGLU, a, b); }, "gate"_a, "up"_a)
      .def(op_name(Op::Scale), [](PyGraph& g, int32_t a, float s) { return g.unary(Op::Scale, a, ScaleParams{s}); })
      .def(op_name(Op::Silu), [](PyGraph& g, int32_t a) { return g.unary(Op::Silu, a); })
      .def(op_name(Op::Gelu), [](PyGraph& g, int32_t a) { return g.unary(Op::Gelu, a); })
      .def(op_name(Op::Sigmoid), [](PyGraph& g, int32_t a) { return g.unary(Op::Sigmoid, a); })
      .def(op_name(Op::Softmax), [](PyGraph& g, int32_t a) { return g.unary(Op::Softmax, a); })
      .def(op_name(Op::TopK), &PyGraph::top_k, "scores"_a, "k"_a, "n_groups"_a = 0, "groups_used"_a = 0, "group_score"_a = 0)
      .def(op_name(Op::Take), &PyGraph::take, "x"_a, "ids"_a)
      .def(op_name(Op::SumNormalize), &PyGraph::sum_normalize, "x"_a, "min_sum"_a = 6.103515625e-5f)
      .def(op_name(Op::WeightedSum), &PyGraph::weighted_sum, "x"_a, "weights"_a)
      .def(op_name(Op::MatMulId), &PyGraph::matmul_id, "weight"_a, "x"_a, "ids"_a, "n_experts"_a)
      .def(op_name(Op::Softcap), [](PyGraph& g, int32_t a, float cap) {
        if (!(cap > 0.0f)) throw std::invalid_argument("softcap must be > 0");
        return g.unary(Op::Softcap, a, SoftcapParams{cap});
      })
      .def(op_name(Op::RmsNorm), &PyGraph::rms_norm, "x"_a, "weight"_a = -1, "eps"_a = 1e-6f, "group"_a = 0)
      .def(op_name(Op::LayerNorm), &PyGraph::layer_norm, "x"_a, "weight"_a = -1, "bias"_a = -1, "eps"_a = 1e-5f)
      .def(op_name(Op::Rope), &PyGraph::rope, "x"_a, "head_dim"_a, "n_rot"_a, "neox"_a, "base"_a, "freq_scale"_a = 1.0f,
           "factors"_a = -1, "offset"_a = 0)
      .def(op_name(Op::MlaAttention), &PyGraph::mla_attention, "q"_a, "c"_a, "k_pe"_a, "k_b"_a, "v_b"_a, "n_head"_a,
           "rank"_a, "rope"_a, "nope"_a, "value"_a, "scale"_a)
      .def(op_name(Op::Attention), &PyGraph::attention, "q"_a, "k"_a, "v"_a, "n_head"_a, "n_kv_head"_a, "head_dim"_a,
           "scale"_a, "window"_a = 0, "softcap"_a = 0.0f, "causal"_a = true, "alibi_max_bias"_a = 0.0f)
      .def(op_name(Op::SelectOutputs), &PyGraph::select_outputs)
      .def("view", &PyGraph::view, "x"_a, "col_offset"_a, "n_cols"_a)
      .def("reshape", &PyGraph::reshape, "x"_a, "ne0"_a)
      .def("permute", &PyGraph::permute, "x"_a)
      .def("set_output", &PyGraph::set_output)
      .def("plan", &PyGraph::plan, "max_tokens"_a, "max_outputs"_a, "n_ctx"_a, "n_seq"_a = 1,
           "type_k"_a = static_cast<int32_t>(GGMLType::F16), "type_v"_a = static_cast<int32_t>(GGMLType::F16))
      .def("run", &PyGraph::run, "tokens"_a, "positions"_a, "seq_ids"_a, "output_rows"_a,
           "inputs"_a = std::vector<F32Array>())
      .def("kv_copy", &PyGraph::kv_copy, "src"_a, "dst"_a, "n"_a)
      .def("kv_save", &PyGraph::kv_save, "seq"_a, "n"_a)
      .def("kv_load", &PyGraph::kv_load, "seq"_a, "n"_a, "state"_a)
      .def("set_profiling", &PyGraph::set_profiling, "on"_a)
      .def("profile", &PyGraph::profile)
      .def_prop_ro("arena_size", &PyGraph::arena_size)
      .def_prop_ro("kv_size", &PyGraph::kv_size)
      .def_prop_ro("n_threads", &PyGraph::n_threads)
      .def_prop_ro("float_activations", &PyGraph::float_activations)
      .def_prop_ro("isa", &PyGraph::isa);

  nb::class_<TextIndex>(m, "TextIndex")
      .def("__init__",
           [](TextIndex* self, const nb::bytes& raw, const I64Array& fields) {
             new (self) TextIndex(string_table(raw, fields));
           },
           "raw"_a, "fields"_a)
      .def("find", [](const TextIndex& t, const std::string& text) { return t.find(text); }, "text"_a)
      .def("__len__", &TextIndex::size);
  nb::class_<BpeVocab>(m, "BpeVocab")
      .def("__init__",
           [](BpeVocab* self, std::shared_ptr<TextIndex> tokens, const nb::bytes& merges, const I64Array& merge_fields,
              bool ignore_merges, bool byte_encode) {
             new (self) BpeVocab(std::move(tokens), string_table(merges, merge_fields), ignore_merges, byte_encode);
           },
           "tokens"_a, "merges"_a, "merge_fields"_a, "ignore_merges"_a, "byte_encode"_a = true)
      .def("encode", &bpe_encode, "words"_a)
      .def_prop_ro("n_merges", &BpeVocab::n_merges);
  nb::class_<SpmVocab>(m, "SpmVocab")
      .def("__init__",
           [](SpmVocab* self, std::shared_ptr<TextIndex> tokens, nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> scores,
              const std::vector<int32_t>& byte_ids) {
             if (byte_ids.size() != 256) throw std::invalid_argument("SpmVocab: byte_ids must have 256 entries");
             std::array<int32_t, 256> bytes;
             std::copy(byte_ids.begin(), byte_ids.end(), bytes.begin());
             new (self) SpmVocab(std::move(tokens), std::vector<float>(scores.data(), scores.data() + scores.shape(0)), bytes);
           },
           "tokens"_a, "scores"_a, "byte_ids"_a)
      .def("encode", &spm_encode, "text"_a);
  nb::class_<SubstringSet>(m, "SubstringSet")
      .def(nb::init<std::vector<std::string>>(), "strings"_a)
      .def("present", [](const SubstringSet& s, nb::handle text) { return s.present(utf8_of(text)); }, "text"_a);

  m.def("quantize_row", &quantize_row, "type"_a, "x"_a);
  m.def("dequantize_row", &dequantize_row, "type"_a, "raw"_a, "n"_a);
  m.def("quantize_rows", &quantize_rows, "type"_a, "x"_a, "n_threads"_a = 1);
  m.def("convert_rows", &convert_rows, "src_type"_a, "raw"_a, "dst_type"_a, "n_per_row"_a, "n_threads"_a = 1);
  m.def("vec_dot", &vec_dot, "type"_a, "weight_row"_a, "x"_a);
  m.def("cpu_flags", &cpu_flags);
  m.def("available_isas", &available_isas);
  m.def("built_isas", &built_isas);
  m.def("isa", [] { return std::string(active_kernels().isa); });
  m.def("set_isa", &set_active_isa, "isa"_a);
  m.def("tile_dot_product", &tile_dot_product_checked, "a_sign"_a, "b_sign"_a, "a"_a, "b"_a, "c"_a);
  m.def("types_with_kernels", &types_with_kernels);
  m.def("op_names", [] { return std::vector<std::string>(std::begin(kOpNames), std::end(kOpNames)); });
  m.def("allocations_during_run", &allocations_during_run);
}
