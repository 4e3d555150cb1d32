"""A short seeded run of the GGUF mutation fuzzer (gguf_mutants.py; benchmarks/fuzz.py runs the
long one): 300 mutants of a tiny model, each opened with `ember info` and run for two tokens, and
not one crash, hang or traceback."""

from __future__ import annotations

import random

import pytest

from gguf_mutants import FAILURES, byte_mutant, fuzz, layout_of, write_seed

N_MUTANTS = 300
SEED = 19


def test_the_seed_model_runs(tmp_path):
    from gguf_mutants import classify

    seed = write_seed(tmp_path / "seed.gguf")
    assert classify(["run", "-m", str(seed), "-n", "2", "--temp", "0", "-t", "1", "--chat", "hi"])[0] == "ok"


def test_the_layout_covers_every_part_of_the_file(tmp_path):
    raw = write_seed(tmp_path / "seed.gguf").read_bytes()
    layout = layout_of(raw)
    assert list(layout.regions) == ["header", "metadata", "tensor infos", "tensor data"]
    assert layout.regions["tensor data"][1] == len(raw)
    roles = {role for _, _, role in layout.ints}
    assert {"count", "length", "type", "value", "float", "n_dims", "dim", "tensor_type", "offset"} <= roles
    rng = random.Random(0)
    changes = [byte_mutant(raw, layout, rng) for _ in range(200)]
    assert sum(data != raw for _, data in changes) > 190


@pytest.mark.slow
def test_mutants_never_crash_hang_or_print_a_traceback(tmp_path):
    results = fuzz(N_MUTANTS, SEED, tmp_path)
    assert results.n == N_MUTANTS
    assert results.counts["ok"] > 0.2 * N_MUTANTS and results.counts["error"] > 0.2 * N_MUTANTS
    failures = [f"{f['outcome']} on mutant {f['mutant']} ({f['change']}): "
                + " | ".join(d["stderr"][-600:] for d in f["detail"] if d["outcome"] not in ("ok", "error"))
                for f in results.failures]
    assert not failures, "\n".join(failures)
    assert all(results.counts[kind] == 0 for kind in FAILURES)
