"""Test-wide setup. Runs before any test module imports ember."""

import os
import signal
import sys
from pathlib import Path

# The amx kernel table is tested on every machine with AVX-512: natively where the CPU and the
# OS give the process AMX tiles, elsewhere through ember's emulator of the tile instructions
# (csrc/core/amx_emulator.h). Emulated amx is never the default table, so everything else runs
# as it would for a user. Child processes inherit the setting.
os.environ.setdefault("EMBER_EMULATE_AMX", "1")

# The tests' shared helpers (fake_llm.py, ember_server.py, paths.py, ...) live in this folder; the
# tests themselves in folders that mirror src/ember and csrc.
sys.path.insert(0, str(Path(__file__).resolve().parent))
# parity.py's own imports (converter_record.py, beside it in models/) resolve wherever a test imports
# models.parity from (the engine's and the encoders' tests take its randomize)
sys.path.insert(1, str(Path(__file__).resolve().parent / "models"))

# Tests press Ctrl-C at programs they start (a chat at a pseudo-terminal, a server). A test run
# started in the background of a non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored,
# and its children would inherit that too and never see the Ctrl-C; a person's terminal starts a
# foreground program with SIGINT at its default, so the children here start that way: Python's
# handler in this process becomes the default action in every program it executes.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402  (after the environment above: importing the core reads it)

from ember import _core  # noqa: E402


@pytest.fixture(params=_core.available_isas())
def isa(request):
    """A test that takes `isa` runs once on each kernel table this CPU runs (scalar, avx2, ...)."""
    previous = _core.isa()
    _core.set_isa(request.param)
    yield request.param
    _core.set_isa(previous)
