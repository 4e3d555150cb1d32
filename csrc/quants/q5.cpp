// Kernels for Q5 are not written yet: the type has no entry in the kernel table.
#include "core/kernels.h"

namespace ember {
namespace EMBER_ISA_NS {

void register_q5(KernelTable&) {}

}  // namespace EMBER_ISA_NS
}  // namespace ember
