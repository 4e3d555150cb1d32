"""The long run of the GGUF mutation fuzzer (tests/fuzz/gguf_mutants.py; tests/fuzz/test_fuzz.py
runs 300 mutants in CI): N mutants of a tiny llama model, each opened with `ember info` and run
for two tokens with `ember run` in a worker process; prints the outcomes as markdown.

    python benchmarks/fuzz.py --mutants 10000 --seed 1 --folder /tmp/ember-fuzz

A failure (crash: the worker died by a signal; hang: no answer within --timeout; traceback: an
exception escaped, or stderr was more than one error line) is kept as failure-N.gguf in the
folder, with what was changed, so it can be run again by hand.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

from gguf_mutants import FAILURES, TIMEOUT, fuzz  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/ember-fuzz"))
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds a mutant may take")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    started = time.strftime("%Y-%m-%d %H:%M")

    def progress(done: int, results) -> None:
        if done % 500 == 0:
            print(f"  {done} mutants: {results.counts}", file=sys.stderr, flush=True)

    results = fuzz(args.mutants, args.seed, args.folder, timeout=args.timeout, progress=progress)
    print(f"## GGUF mutation fuzzing ({started}, {platform.machine()}, Python {platform.python_version()})\n")
    print(f"{results.n} mutants from seed {args.seed} ({results.by_kind.get('bytes', 0)} byte-level, "
          f"{results.by_kind.get('meaning', 0)} rewritten), {results.seconds:.0f} s\n")
    print("| outcome | mutants |\n|---|---:|")
    for outcome, count in results.counts.items():
        print(f"| {outcome} | {count} |")
    print("\nslowest mutants: " + "; ".join(f"{s:.1f} s ({change})" for s, change in results.slowest))
    for failure in results.failures:
        print(f"\n- {failure['outcome']}: mutant {failure['mutant']}, {failure['change']} ({failure['file']})")
        for detail in failure["detail"]:
            if detail["outcome"] not in ("ok", "error"):
                print("      " + detail["stderr"][-800:].replace("\n", "\n      "))
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "counts": results.counts, "by_kind": results.by_kind,
                                         "seconds": results.seconds, "failures": results.failures}, indent=2))
    return 1 if any(results.counts[kind] for kind in FAILURES) else 0


if __name__ == "__main__":
    raise SystemExit(main())
