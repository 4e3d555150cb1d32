"""The fuzzer's module (gguf_mutants.py) is imported by the tests beside it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
