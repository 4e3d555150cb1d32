// Kernels for Q6_K are not written yet: the type has no entry in the kernel table.
#include "core/kernels.h"

namespace ember {
namespace EMBER_ISA_NS {

void register_q6_k(KernelTable&) {}

}  // namespace EMBER_ISA_NS
}  // namespace ember
