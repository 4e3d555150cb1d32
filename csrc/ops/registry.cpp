// Fills this ISA's kernel table: ops and the kernels of every tensor type.
#include <stdexcept>
#include <string>

#include "core/kernels.h"

namespace ember {
namespace EMBER_ISA_NS {

void register_kernels(KernelTable& t) {
  t.isa = EMBER_STRINGIFY(EMBER_ISA_NS);
#define EMBER_CALL_REGISTRAR_(fn) fn(t);
  EMBER_KERNEL_REGISTRARS(EMBER_CALL_REGISTRAR_)
#undef EMBER_CALL_REGISTRAR_
  for (int op = 0; op < kOpCount; ++op)
    if (!t.ops[op])
      throw std::logic_error(std::string("no kernel registers op ") + kOpNames[op] + " in the " + t.isa + " table");
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
