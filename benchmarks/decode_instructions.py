"""Instructions the C++ core executes for a short greedy decode, counted by valgrind's callgrind.

Counts the instructions executed inside the extension module (ember._core: building and planning
the graph, then every op and kernel of the runs), on one thread, so the figure is deterministic
and immune to the machine's load: two builds compared with it differ only where their code does. Valgrind has no AVX-512, so the ISAs measured are
avx2 and scalar. Prints one line per model and ISA: the prompt and decode token counts, the
instructions (Ir) of the prefill plus the decode steps, and the greedy tokens (which must agree
between the builds compared).

    python benchmarks/decode_instructions.py --models smollm2-135m --isas avx2,scalar
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPT = [1, 504, 3458, 282, 260, 1690, 314]  # token ids; any in every registry model's vocabulary


def decode(model_name: str, n_steps: int) -> list[int]:
    """Prefill PROMPT, then n_steps greedy decode steps; returns the tokens decoded."""
    import numpy as np

    from ember.engine.runtime import Model
    from ember.hub import resolve_model

    model = Model(str(resolve_model(model_name)), n_ctx=len(PROMPT) + n_steps + 1, n_threads=1)
    logits = model.eval(PROMPT)
    tokens = []
    for _ in range(n_steps):
        tokens.append(int(np.argmax(logits)))
        logits = model.eval([tokens[-1]])
    model.close()
    return tokens


def count(model_name: str, isa: str, n_steps: int) -> dict:
    """Runs decode() under callgrind with EMBER_ISA=isa; returns the instructions and tokens."""
    with tempfile.TemporaryDirectory() as tmp:
        out, tokens = Path(tmp) / "callgrind.out", Path(tmp) / "tokens.json"
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__, "--inner",
                   "--models", model_name, "--steps", str(n_steps), "--tokens-out", str(tokens)]
        env = dict(os.environ, EMBER_ISA=isa, EMBER_EMULATE_AMX="0")
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return {"model": model_name, "isa": isa, "prompt": len(PROMPT), "steps": n_steps,
                "instructions": instructions_in(out, "ember/_core."), "tokens": json.loads(tokens.read_text())}


def instructions_in(callgrind_out: Path, object_name: str) -> int:
    """The instructions (self cost, Ir) a callgrind profile charges to the objects (shared
    libraries) whose path contains object_name."""
    names: dict[str, str] = {}  # compressed "(id)" -> object path
    counting = skip_call_cost = False
    total = 0
    for line in callgrind_out.read_text().splitlines():
        if line.startswith(("ob=", "cob=")):  # the two share the compressed names
            m = re.match(r"c?ob=(\(\d+\))?\s*(.*)", line)
            if m.group(2):
                names[m.group(1)] = m.group(2)
            if line.startswith("ob="):
                counting = object_name in names.get(m.group(1), m.group(2))
        elif line.startswith("calls="):
            skip_call_cost = True  # the next cost line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            if skip_call_cost:
                skip_call_cost = False
            elif counting:
                fields = line.split()
                total += int(fields[1]) if len(fields) > 1 else 0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m", help="registry names or .gguf paths, comma-separated")
    parser.add_argument("--isas", default="avx2,scalar")
    parser.add_argument("--steps", type=int, default=8, help="decode steps after the prompt")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tokens-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        Path(args.tokens_out).write_text(json.dumps(decode(args.models, args.steps)))
        return
    for model_name in args.models.split(","):
        for isa in args.isas.split(","):
            r = count(model_name, isa, args.steps)
            print(f"{r['model']} {r['isa']}: prompt {r['prompt']} + {r['steps']} decode steps, "
                  f"{r['instructions']:,} instructions, tokens {r['tokens']}", flush=True)


if __name__ == "__main__":
    main()
