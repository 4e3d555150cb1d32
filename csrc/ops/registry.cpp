// Fills this ISA's kernel table: ops and the kernels of every tensor type.
#include "core/kernels.h"

namespace ember {
namespace EMBER_ISA_NS {

void register_elementwise_ops(KernelTable& t);
void register_norm_ops(KernelTable& t);
void register_rope_ops(KernelTable& t);
void register_get_rows_ops(KernelTable& t);
void register_attention_ops(KernelTable& t);
void register_matmul_ops(KernelTable& t);
void register_matmul_id_ops(KernelTable& t);
void register_routing_ops(KernelTable& t);

void register_ops(KernelTable& t) {
  register_elementwise_ops(t);
  register_norm_ops(t);
  register_rope_ops(t);
  register_get_rows_ops(t);
  register_attention_ops(t);
  register_matmul_ops(t);
  register_matmul_id_ops(t);
  register_routing_ops(t);
}

void register_kernels(KernelTable& t) {
  t.isa = EMBER_STRINGIFY(EMBER_ISA_NS);
  register_ops(t);
  register_float_types(t);
  register_q8(t);
  register_q4(t);
  register_q5(t);
  register_q8_k(t);
  register_q2_k(t);
  register_q3_k(t);
  register_q4_k(t);
  register_q5_k(t);
  register_q6_k(t);
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
