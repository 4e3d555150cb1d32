#include "core/graph.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <tuple>

#include <sys/mman.h>

#include "core/alloc_counter.h"
#include "ops/matmul_id.h"

namespace ember {

namespace {

struct Block {
  size_t offset, size;
  int64_t free_after;  // node index after which the block can be reused
};

// First-fit placement among the blocks still live.
size_t place(std::vector<Block>& live, size_t size) {
  std::sort(live.begin(), live.end(), [](const Block& a, const Block& b) { return a.offset < b.offset; });
  size_t offset = 0;
  for (const Block& b : live) {
    if (b.offset >= offset + size) break;
    offset = std::max(offset, align_up(b.offset + b.size));
  }
  return offset;
}
}  // namespace

Graph::Graph(int n_threads, bool float_activations) : float_activations_(float_activations), pool_(n_threads) {}

int32_t Graph::add_weight(GGMLType type, int64_t ne0, int64_t ne1, const void* data, size_t n_bytes) {
  const TypeTraits& tt = type_traits(type);
  if (!tt.name) throw std::invalid_argument("unsupported tensor type");
  if (ne0 <= 0 || ne1 <= 0 || ne0 % tt.block_size != 0)
    throw std::invalid_argument("weight shape does not fit its type's block size");
  if (row_bytes(type, ne0) * static_cast<size_t>(ne1) > n_bytes)
    throw std::invalid_argument("weight data smaller than its shape");
  Tensor t;
  t.type = type;
  t.ne0 = ne0;
  t.ne1 = ne1;
  t.row_stride = row_bytes(type, ne0);
  t.is_weight = true;
  t.weight_data = data;
  tensors_.push_back(t);
  return static_cast<int32_t>(tensors_.size() - 1);
}

int32_t Graph::add_input(int64_t ne0) {
  int32_t id = add_node(Op::Input, ne0, kRowsTokens, {}, InputParams{static_cast<int32_t>(n_inputs_)});
  ++n_inputs_;
  return id;
}

int32_t Graph::add_node(Op op, int64_t ne0, int64_t ne1, std::initializer_list<int32_t> srcs,
                        NodeParams params) {
  if (ne0 <= 0) throw std::invalid_argument("node with no columns");
  if (static_cast<int>(op) < 0 || op >= Op::Count || !params_fit(op, params))
    throw std::logic_error(std::string("parameters of the wrong kind for op ") + op_name(op));
  Node n;
  n.op = op;
  int k = 0;
  for (int32_t s : srcs) {
    if (k >= kMaxSources) throw std::invalid_argument("too many sources");
    // -1 marks an optional source that is absent.
    if (s < -1 || s >= static_cast<int32_t>(tensors_.size()) || (k == 0 && s < 0))
      throw std::invalid_argument("bad source tensor");
    n.src[k++] = s;
  }
  n.params = params;
  Tensor t;
  t.ne0 = ne0;
  t.ne1 = ne1;
  t.row_stride = static_cast<size_t>(ne0) * sizeof(float);
  t.producer = static_cast<int32_t>(nodes_.size());
  tensors_.push_back(t);
  n.out = static_cast<int32_t>(tensors_.size() - 1);
  if (op == Op::Attention) {
    std::get<AttentionParams>(n.params).kv_layer = static_cast<int32_t>(kv_.size());
    kv_.emplace_back();
  } else if (op == Op::MlaAttention) {
    std::get<MlaAttentionParams>(n.params).kv_layer = static_cast<int32_t>(kv_.size());
    kv_.emplace_back();
  }
  nodes_.push_back(n);
  return n.out;
}

int32_t Graph::add_view(int32_t src, int64_t col_offset, int64_t n_cols) {
  const Tensor& s = tensors_.at(src);
  if (s.is_weight || s.type != GGMLType::F32) throw std::invalid_argument("views are of F32 activations");
  if (col_offset < 0 || n_cols <= 0 || col_offset + n_cols > s.ne0) throw std::invalid_argument("view out of range");
  Tensor t = s;
  t.ne0 = n_cols;
  t.alias_of = root_of(src);
  t.alias_offset = s.alias_offset + static_cast<size_t>(col_offset) * sizeof(float);
  t.producer = -1;
  tensors_.push_back(t);
  return static_cast<int32_t>(tensors_.size() - 1);
}

int64_t Graph::max_rows(const Tensor& t) const {
  return (t.ne1 == kRowsTokens ? max_tokens_ : t.ne1 == kRowsOutputs ? max_outputs_ : t.ne1) * t.row_split;
}

namespace {
// Whether each base row's sub-rows lie densely, one after the other, in logical order.
bool dense_t_major(const Tensor& t) {
  return !t.h_major && evenly_strided(t) && t.row_stride == static_cast<size_t>(t.ne0) * sizeof(float);
}
}  // namespace

int32_t Graph::add_reshape(int32_t src, int64_t new_ne0) {
  const Tensor& s = tensors_.at(src);
  if (s.is_weight || s.type != GGMLType::F32) throw std::invalid_argument("views are of F32 activations");
  if (!dense_t_major(s)) throw std::invalid_argument("reshape: the rows are not dense in memory (a column slice or a permuted view)");
  const int64_t per_base = s.ne0 * s.row_split;
  if (new_ne0 <= 0 || per_base % new_ne0 != 0)
    throw std::invalid_argument("reshape: the new row length does not divide the elements of a token");
  Tensor t = s;
  t.ne0 = new_ne0;
  t.row_split = per_base / new_ne0;
  t.row_stride = static_cast<size_t>(new_ne0) * sizeof(float);
  t.base_stride = static_cast<size_t>(per_base) * sizeof(float);
  t.alias_of = root_of(src);
  t.producer = -1;
  tensors_.push_back(t);
  return static_cast<int32_t>(tensors_.size() - 1);
}

int32_t Graph::add_permute(int32_t src) {
  const Tensor& s = tensors_.at(src);
  if (s.is_weight || s.type != GGMLType::F32) throw std::invalid_argument("views are of F32 activations");
  if (s.row_split == 1) throw std::invalid_argument("permute: reshape the rows into (token, sub-row) first");
  Tensor t = s;
  t.h_major = !s.h_major;
  t.alias_of = root_of(src);
  t.producer = -1;
  tensors_.push_back(t);
  return static_cast<int32_t>(tensors_.size() - 1);
}

void Graph::copy_row_layout(int32_t out, int32_t like) {
  const Tensor& l = tensors_.at(like);
  Tensor& t = tensors_.at(out);
  t.row_split = l.row_split;
  t.h_major = t.h_major_memory = l.h_major;  // written densely in the logical order
  t.base_stride = t.row_stride * static_cast<size_t>(t.row_split);
}

void Graph::split_rows(int32_t out, int64_t k) {
  Tensor& t = tensors_.at(out);
  t.row_split = k;
  t.h_major = t.h_major_memory = false;
  t.base_stride = t.row_stride * static_cast<size_t>(k);
}

void ZeroPagesDeleter::operator()(uint8_t* p) const {
  if (p != nullptr) munmap(p, size);
}

ZeroPages map_zero_pages(size_t size) {
  void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::bad_alloc();
  return ZeroPages(static_cast<uint8_t*>(mem), ZeroPagesDeleter{size});
}

size_t Graph::max_bytes(const Tensor& t) const { return static_cast<size_t>(max_rows(t)) * t.row_stride; }

size_t Graph::node_work_size(const Node& n) const {
  switch (n.op) {
    case Op::MatMul: {
      // The activations, converted to the weight's vec_dot_type: one row per row of x.
      const Tensor &w = tensors_[n.src[0]], &x = tensors_[n.src[1]];
      // Float activations: per thread, kDequantRows weight rows dequantized to F32.
      if (dequantizes(w.type))
        return static_cast<size_t>(pool_.size()) * align_up(kDequantRows * w.ne0 * sizeof(float));
      GGMLType vdt = kernels_->of(w.type).vec_dot_type;
      if (vdt == GGMLType::F32) return 0;
      const size_t rows = static_cast<size_t>(max_rows(x)) * align_up(row_bytes(vdt, w.ne0));
      if (!kernels_->of(w.type).gemm_panel) return rows;
      // Then the same rows repacked into panels of kPanelTokens (ops/matmul.cpp).
      const size_t n_panels = (static_cast<size_t>(max_rows(x)) + kPanelTokens - 1) / kPanelTokens;
      return rows + n_panels * panel_bytes(w.ne0);
    }
    case Op::MatMulId: {
      const Tensor &w = tensors_[n.src[0]], &ids = tensors_[n.src[2]];
      const bool deq = dequantizes(w.type);
      const TypeKernels& tk = kernels_->of(w.type);
      const int64_t n_experts = n.as<MatMulIdParams>().n_experts;
      return expert_work(n_experts, max_rows(ids) * ids.ne0, w.ne0, w.ne1 / n_experts, deq ? GGMLType::F32 : tk.vec_dot_type,
                         tk.gemm_panel && !deq, deq, pool_.size()).size;
    }
    case Op::TopK:
      // Per thread: the scores of one row and of its expert groups (ops/routing.cpp).
      return static_cast<size_t>(pool_.size()) * align_up(2 * tensors_[n.src[0]].ne0 * sizeof(float));
    case Op::Attention:
      return attention_work(n).size;
    case Op::MlaAttention:
      return mla_work(n, max_rows(tensors_[n.src[0]])).size;
    default:
      return 0;
  }
}

int32_t Graph::converted_input_source(size_t ni) const {
  const Node& n = nodes_[ni];
  if (n.op != Op::MatMul) return -1;
  auto conversion = [&](const Node& m) {  // (vec_dot_type, whether panels follow the rows)
    const GGMLType t = tensors_[m.src[0]].type;
    const TypeKernels& tk = kernels_->of(t);
    const bool converts = !dequantizes(t) && tk.vec_dot_type != GGMLType::F32;
    return std::make_tuple(converts, tk.vec_dot_type, tk.gemm_panel != nullptr);
  };
  const auto mine = conversion(n);
  if (!std::get<0>(mine)) return -1;
  const int32_t x = n.src[1];
  const int32_t x_root = root_of(x);
  // Back over the nodes since the input's last write, a few at most (the projections of one
  // input are adjacent, or apart by a bias or a norm).
  for (size_t back = 1; back <= 8 && back <= ni; ++back) {
    const Node& m = nodes_[ni - back];
    if (root_of(m.out) == x_root) return -1;
    if (m.op == Op::MatMul && m.src[1] == x && conversion(m) == mine)
      return m.input_from >= 0 ? m.input_from : static_cast<int32_t>(ni - back);
  }
  return -1;
}

void Graph::plan(int64_t max_tokens, int64_t max_outputs, int64_t n_ctx, int64_t n_seq, GGMLType k_type,
                 GGMLType v_type) {
  if (output_ < 0) throw std::invalid_argument("graph has no output");
  if (max_tokens <= 0 || max_outputs <= 0 || n_ctx <= 0 || n_seq <= 0) throw std::invalid_argument("bad plan sizes");
  check_kv_types(k_type, v_type);
  max_tokens_ = max_tokens;
  max_outputs_ = max_outputs;
  n_ctx_ = n_ctx;
  n_seq_ = n_seq;

  // Last node that reads each tensor (views count for the tensor they alias).
  std::vector<int64_t> last_use(tensors_.size(), -1);
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    for (int32_t s : nodes_[ni].src) {
      if (s < 0) continue;
      last_use[root_of(s)] = std::max<int64_t>(last_use[root_of(s)], static_cast<int64_t>(ni));
    }
  }
  last_use[root_of(output_)] = static_cast<int64_t>(nodes_.size());

  // Matmuls that read an earlier one's converted input keep that scratch alive until they run,
  // and the first one's scratch is sized for the largest of them.
  std::vector<int64_t> work_until(nodes_.size());
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    Node& n = nodes_[ni];
    work_until[ni] = static_cast<int64_t>(ni);
    n.work_size = node_work_size(n);
    n.input_from = converted_input_source(ni);
    if (n.input_from >= 0) {
      Node& first = nodes_[n.input_from];
      work_until[n.input_from] = static_cast<int64_t>(ni);
      first.work_size = std::max(first.work_size, n.work_size);
    }
  }

  std::vector<Block> live;
  size_t total = 0;
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    const int64_t idx = static_cast<int64_t>(ni);
    live.erase(std::remove_if(live.begin(), live.end(), [&](const Block& b) { return b.free_after < idx; }),
               live.end());
    Node& n = nodes_[ni];
    Tensor& t = tensors_[n.out];
    size_t size = align_up(max_bytes(t));
    t.arena_offset = place(live, size);
    // An output nobody reads still needs its memory during its own node.
    live.push_back({t.arena_offset, size, std::max<int64_t>(last_use[n.out], idx)});
    total = std::max(total, t.arena_offset + size);
    if (n.input_from >= 0) {
      n.work_offset = nodes_[n.input_from].work_offset;  // kept live by that node's block
    } else if (n.work_size) {
      n.work_offset = place(live, n.work_size);
      live.push_back({n.work_offset, n.work_size, work_until[ni]});
      total = std::max(total, n.work_offset + n.work_size);
    }
  }
  arena_size_ = align_up(total + kAlign);
  arena_ = map_zero_pages(arena_size_);  // page-aligned, so 64-byte aligned

  for (const Node& n : nodes_) {
    if (n.op == Op::Attention) {
      const AttentionParams& p = n.as<AttentionParams>();
      KVCache& c = kv_[p.kv_layer];
      c.k_elems = c.v_elems = static_cast<int64_t>(p.n_kv_head) * p.head_dim;
      c.k_type = k_type;
      c.v_type = v_type;
    } else if (n.op == Op::MlaAttention) {
      const MlaAttentionParams& p = n.as<MlaAttentionParams>();
      KVCache& c = kv_[p.kv_layer];
      c.k_elems = static_cast<int64_t>(p.rank) + p.rope;  // latent, then rotary key
      c.v_elems = 0;
      c.k_type = c.v_type = GGMLType::F16;
    }
  }
  for (KVCache& c : kv_) {
    c.n_ctx = n_ctx;
    c.n_seq = n_seq;
    c.k_bytes = row_bytes(c.k_type, c.k_elems);
    c.v_bytes = c.v_elems ? row_bytes(c.v_type, c.v_elems) : 0;
    const size_t positions = static_cast<size_t>(n_ctx * n_seq);
    c.k = map_zero_pages(positions * c.k_bytes);
    if (c.v_elems) c.v = map_zero_pages(positions * c.v_bytes);
  }
}

void Graph::check_kv_types(GGMLType k_type, GGMLType v_type) const {
  for (GGMLType t : {k_type, v_type}) {
    if (t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::Q8_0) continue;
    std::string name = type_traits(t).name ? type_traits(t).name : std::to_string(static_cast<int>(t));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    throw std::invalid_argument("KV cache type " + name + " is not supported; use f32, f16 or q8_0");
  }
  const bool blocks = k_type == GGMLType::Q8_0 || v_type == GGMLType::Q8_0;
  for (const Node& n : nodes_) {
    if (n.op == Op::Attention && blocks && n.as<AttentionParams>().head_dim % QK8_0)
      throw std::invalid_argument("a q8_0 KV cache needs a head size that is a multiple of 32, not " +
                                  std::to_string(n.as<AttentionParams>().head_dim));
    if (n.op == Op::MlaAttention && (k_type != GGMLType::F16 || v_type != GGMLType::F16))
      throw std::invalid_argument("multi-head latent attention caches its latent in f16 only");
  }
}

MlaWork Graph::mla_work(const Node& n, int64_t max_tokens) const {
  const MlaAttentionParams& p = n.as<MlaAttentionParams>();
  const int64_t H = p.n_head, rank = p.rank, rope = p.rope, nope = p.nope;
  const Tensor &wk = tensors_[n.src[3]], &wv = tensors_[n.src[4]];
  const size_t heads = static_cast<size_t>(max_tokens * H);
  const int nth = pool_.size();
  MlaWork w;
  ScratchLayout layout;
  auto take = [&](size_t bytes) { return layout.take(bytes); };
  // The two per-head products convert their inputs to the weight type's vec_dot_type, or (float
  // activations) dequantize kDequantRows weight rows per thread.
  auto act_stride = [&](const Tensor& weight, int64_t k) {
    if (dequantizes(weight.type)) return align_up(k * sizeof(float));
    return align_up(row_bytes(kernels_->of(weight.type).vec_dot_type, k));
  };
  w.q_act_stride = act_stride(wk, nope);
  w.o_act_stride = act_stride(wv, rank);
  w.q_act = take(heads * w.q_act_stride);
  w.query = take(heads * (rank + rope) * sizeof(float));
  w.latent = take(heads * rank * sizeof(float));
  w.o_act = take(heads * w.o_act_stride);
  const size_t dequant = std::max(dequantizes(wk.type) ? nope : 0, dequantizes(wv.type) ? rank : 0);
  w.f32_rows_stride = align_up(kDequantRows * dequant * sizeof(float));
  w.f32_rows = take(nth * w.f32_rows_stride);
  w.per_thread_stride = align_up(4 * (n_ctx_ + rank) * sizeof(float));  // scores and accumulator, kMaxHeads heads
  w.per_thread = take(nth * w.per_thread_stride);
  w.size = layout.end;
  return w;
}

AttentionWork Graph::attention_work(const Node& n) const {
  const AttentionParams& p = n.as<AttentionParams>();
  const size_t d = static_cast<size_t>(padded_head_dim(p.head_dim)), f = sizeof(float);
  AttentionWork w;
  ScratchLayout layout;
  auto take = [&](size_t bytes) { return layout.take(bytes); };
  w.keys = take(kAttnBlock * d * f);
  w.values = take(kAttnBlock * d * f);
  w.queries = take(kAttnLanes * d * f);
  w.scores = take(kAttnBlock * kAttnLanes * f);
  w.out = take(kAttnLanes * d * f);
  w.result = take(kAttnLanes * d * f);
  w.stats = take(5 * kAttnLanes * f);
  w.per_thread = layout.end;
  layout.end *= static_cast<size_t>(pool_.size());
  w.partial_floats = d + 2;
  const size_t segments = static_cast<size_t>((n_ctx_ + kAttnSegment - 1) / kAttnSegment);
  w.partials = take(static_cast<size_t>(p.n_head) * segments * w.partial_floats * f);
  w.size = layout.end;
  return w;
}

size_t Graph::kv_size() const {
  size_t bytes = 0;
  for (const KVCache& c : kv_) bytes += c.bytes();
  return bytes;
}

void Graph::kv_copy(int64_t src, int64_t dst, int64_t n) {
  if (src < 0 || dst < 0 || src >= n_seq_ || dst >= n_seq_ || n < 0 || n > n_ctx_)
    throw std::out_of_range("kv_copy: sequence or length out of range");
  if (src == dst) return;
  for (KVCache& c : kv_) {
    std::memcpy(c.k_row(dst, 0), c.k_row(src, 0), n * c.k_bytes);
    if (c.v_elems) std::memcpy(c.v_row(dst, 0), c.v_row(src, 0), n * c.v_bytes);
  }
}

size_t Graph::kv_state_bytes(int64_t n) const {
  size_t bytes = 0;
  for (const KVCache& c : kv_) bytes += c.bytes_per_seq(n);
  return bytes;
}

void Graph::kv_save(int64_t seq, int64_t n, uint8_t* out, size_t size) {
  if (seq < 0 || seq >= n_seq_ || n < 0 || n > n_ctx_)
    throw std::out_of_range("kv_save: sequence or length out of range");
  if (size != kv_state_bytes(n)) throw std::invalid_argument("kv_save: buffer size does not match the state");
  for (KVCache& c : kv_) {
    const size_t k_rows = static_cast<size_t>(n) * c.k_bytes, v_rows = static_cast<size_t>(n) * c.v_bytes;
    std::memcpy(out, c.k_row(seq, 0), k_rows);
    if (v_rows) std::memcpy(out + k_rows, c.v_row(seq, 0), v_rows);
    out += k_rows + v_rows;
  }
}

void Graph::kv_load(int64_t seq, int64_t n, const uint8_t* in, size_t size) {
  if (seq < 0 || seq >= n_seq_ || n < 0 || n > n_ctx_)
    throw std::out_of_range("kv_load: sequence or length out of range");
  if (size != kv_state_bytes(n)) throw std::invalid_argument("kv_load: the state has the wrong size for this model");
  for (KVCache& c : kv_) {
    const size_t k_rows = static_cast<size_t>(n) * c.k_bytes, v_rows = static_cast<size_t>(n) * c.v_bytes;
    std::memcpy(c.k_row(seq, 0), in, k_rows);
    if (v_rows) std::memcpy(c.v_row(seq, 0), in + k_rows, v_rows);
    in += k_rows + v_rows;
  }
}

uint8_t* Graph::data(const Tensor& t, uint8_t* arena) const {
  if (t.alias_of >= 0) return arena + tensors_[t.alias_of].arena_offset + t.alias_offset;
  return arena + t.arena_offset;
}

const uint8_t* Graph::weight_or_data(const Tensor& t, uint8_t* arena) const {
  return t.is_weight ? static_cast<const uint8_t*>(t.weight_data) : data(t, arena);
}

void Graph::set_profiling(bool on) {
  profiling_ = on;
  node_ns_.assign(nodes_.size(), 0);
}

void Graph::run_task(void* arg, int ith, int nth) {
  Graph* g = static_cast<Graph*>(arg);
  ExecContext& ctx = g->ctx_;
  const bool timing = g->profiling_ && ith == 0;
  auto last = std::chrono::steady_clock::now();
  for (size_t i = 0; i < g->nodes_.size(); ++i) {
    const Node& n = g->nodes_[i];
    g->kernels_->ops[static_cast<int>(n.op)](n, ctx, ith, nth);
    ctx.barrier();
    if (timing) {
      const auto now = std::chrono::steady_clock::now();
      g->node_ns_[i] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count();
      last = now;
    }
  }
}

const float* Graph::run(int64_t n_tokens, const int32_t* tokens, const int32_t* positions,
                        const int32_t* seq_ids, int64_t n_outputs, const int32_t* output_rows,
                        const float* const* inputs, int64_t n_inputs) {
  if (!arena_) throw std::logic_error("graph not planned");
  if (n_tokens <= 0 || n_tokens > max_tokens_) throw std::out_of_range("batch size out of range");
  if (n_outputs <= 0 || n_outputs > max_outputs_) throw std::out_of_range("output count out of range");
  if (n_inputs != n_inputs_) throw std::invalid_argument("wrong number of inputs");
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (positions[t] < 0 || positions[t] >= n_ctx_) throw std::out_of_range("position outside the context");
    if (seq_ids[t] < 0 || seq_ids[t] >= n_seq_) throw std::out_of_range("sequence id out of range");
  }
  for (int64_t r = 0; r < n_outputs; ++r)
    if (output_rows[r] < 0 || output_rows[r] >= n_tokens) throw std::out_of_range("output row out of range");
  AllocationWatch watch;
  ctx_.kernels = kernels_;
  ctx_.graph = this;
  ctx_.pool = &pool_;
  ctx_.arena = arena_.get();
  ctx_.n_tokens = n_tokens;
  ctx_.n_outputs = n_outputs;
  ctx_.tokens = tokens;
  ctx_.positions = positions;
  ctx_.seq_ids = seq_ids;
  ctx_.output_rows = output_rows;
  ctx_.inputs = inputs;
  pool_.run(run_task, this);
  return reinterpret_cast<const float*>(data(tensors_[output_], arena_.get()));
}

}  // namespace ember
