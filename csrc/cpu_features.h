// Runtime CPU feature detection and the choice of kernel table.
#pragma once
#include <string>
#include <vector>

#include "core/kernels.h"

namespace ember {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512vnni = false,
       avx512bf16 = false;
  bool avx_vnni = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  bool amx_granted = false;  // the OS allowed this process to use the AMX tile state
  bool amx_emulated = false;  // no AMX here; EMBER_EMULATE_AMX=1 runs the tiles in the emulator
};

const CpuFeatures& cpu_features();
// The tables this build compiled, best last.
std::vector<std::string> built_isas();
// ISAs this CPU can run, best last (always starts with "scalar"); "amx" also when emulated.
std::vector<std::string> available_isas();
// The table in use for new graphs. Initially the best available that is not emulated, or
// EMBER_ISA when set.
const KernelTable& active_kernels();
// Selects the table for new graphs; throws std::invalid_argument for an unknown or unsupported ISA.
void set_active_isa(const std::string& isa);

}  // namespace ember
