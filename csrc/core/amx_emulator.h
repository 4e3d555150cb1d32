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
#include <atomic>

namespace ember {

// Puts the SIGILL handler in place, or back in front where a handler installed later has taken
// SIGILL (Python's faulthandler, which pytest enables after ember is imported): that one
// becomes the handler for illegal instructions that are not tile instructions. False where the
// emulator cannot work (not Linux on x86-64).
bool install_amx_emulator();

// Whether the emulator has been installed: tile_load_config then calls install_amx_emulator
// first, so the tiles of a kernel always reach the emulator's handler.
extern std::atomic<bool> amx_emulating;

}  // namespace ember
