"""Test-wide setup. Runs before any test module imports ember."""

import os

# The amx kernel table is tested on every machine with AVX-512: natively where the CPU and the
# OS give the process AMX tiles, elsewhere through ember's emulator of the tile instructions
# (csrc/core/amx_emulator.h). Emulated amx is never the default table, so everything else runs
# as it would for a user. Child processes inherit the setting.
os.environ.setdefault("EMBER_EMULATE_AMX", "1")
