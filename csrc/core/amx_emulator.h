// An emulator of the AMX tile instructions, so that the AMX kernels can be tested on CPUs
// without AMX. Each tile instruction raises SIGILL there; the handler decodes it, carries it out
// on a per-thread copy of the tile state (the 8 tiles and their configuration) and resumes after
// it. The semantics follow the Intel SDM, checks included: an instruction the hardware would
// refuse (an unconfigured tile, operand shapes that do not match) aborts with a message instead
// of computing something. Any other illegal instruction goes to the previous SIGILL handler.
//
// Enabled by EMBER_EMULATE_AMX=1 (the test suite sets it), and only where the CPU or the OS does
// not give the process AMX: on an AMX machine the same tests run the tiles natively.
#pragma once

namespace ember {

// Installs the SIGILL handler (once). False where it cannot work (not Linux on x86-64).
bool install_amx_emulator();

}  // namespace ember
