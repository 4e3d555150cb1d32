"""A mutation fuzzer for the model files ember opens: mutants of a tiny llama GGUF (tiny_gguf.py,
written with ember's own writer, random weights in several types), each opened with `ember info` and run for two
tokens with `ember run --chat` in a worker process.

Mutations (`mutant(seed_bytes, layout, rng)`), over every part of the file:
- header, metadata, tensor infos: an integer field (a count, a length, a type, a dimension,
  an offset, a value) set to an interesting value; random bytes or flipped bits; bytes inserted
  or deleted (shifting everything after); the file cut short;
- tensor data: random bytes, and NaN / Inf patterns in the float and block scales;
- meaning (rewritten with the writer, so the file stays well-formed): a metadata value replaced
  by an interesting one of any kind (zero, negative, huge, NaN, a string, an array), a key
  dropped, a tensor's type, shape or presence changed.

Outcomes: "ok" (it ran), "error" (a one-line `ember: error:`), and the failures: "crash" (the
worker died by a signal), "hang" (no answer within the timeout), "traceback" (an exception
escaped the command, or stderr held anything but warnings, timings and one error line).

    python -c "import gguf_mutants; gguf_mutants.main()"   # the worker (stdin: one path a line)
    results = fuzz(n_mutants=300, seed=0, folder=tmp)      # a run: counts and the failures
"""

from __future__ import annotations

import io
import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tiny_gguf.py

from tiny_gguf import DROP, tensor_shapes, tiny_metadata, write_tiny_model  # noqa: E402

from ember.gguf.types import GGMLType  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TIMEOUT = 60.0  # seconds one mutant may take (a template stops after 5, a run of two tokens takes ms)
MEMORY_CAP = 8 << 30  # the worker's address space: a runaway allocation is a MemoryError, not swap
COMMANDS = (["info", "{path}"], ["info", "{path}", "--memory", "--json"],
            ["run", "-m", "{path}", "-n", "2", "--temp", "0", "-t", "1", "--chat", "hi"],
            ["run", "-m", "{path}", "-n", "2", "-s", "1", "-t", "1", "-c", "64", "the cat"])
FAILURES = ("crash", "hang", "traceback")
_HARMLESS = ("ember: warning:", "ember: load time", "ember: prompt eval", "ember: generation", "ember: seed =")

V_UINT8, V_INT8, V_UINT16, V_INT16, V_UINT32, V_INT32, V_FLOAT32, V_BOOL, V_STRING, V_ARRAY = range(10)
V_UINT64, V_INT64, V_FLOAT64 = 10, 11, 12
_SCALAR_SIZE = {V_UINT8: 1, V_INT8: 1, V_UINT16: 2, V_INT16: 2, V_UINT32: 4, V_INT32: 4, V_FLOAT32: 4,
                V_BOOL: 1, V_UINT64: 8, V_INT64: 8, V_FLOAT64: 8}


# -- the seed and its layout ---------------------------------------------------------------------

SEED_TYPES = {"token_embd.weight": GGMLType.Q8_0, "blk.0.attn_q.weight": GGMLType.Q4_0,
              "blk.0.ffn_gate.weight": GGMLType.F16, "blk.1.ffn_up.weight": GGMLType.Q5_1,
              "blk.1.attn_output.weight": GGMLType.Q4_1, "output.weight": GGMLType.Q8_0}


def write_seed(path: Path, **changes) -> Path:
    """The tiny model with a chat template and weights of several types; `changes` as write_tiny_model's."""
    types = {**SEED_TYPES, **changes.pop("types", {})}
    for name in changes.get("shapes", {}):
        types.pop(name, None)  # a new shape gets F32 values
    return write_tiny_model(path, TEMPLATE, types=types, **changes)


@dataclass
class Layout:
    """Where the fields of a well-formed GGUF file are: (offset, width, role) for every integer and
    float, and the byte ranges of the header, metadata, tensor infos and tensor data."""

    ints: list[tuple[int, int, str]] = field(default_factory=list)
    regions: dict[str, tuple[int, int]] = field(default_factory=dict)
    data_offset: int = 0


def layout_of(raw: bytes) -> Layout:
    layout = Layout()
    n_tensors, n_kv = struct.unpack_from("<QQ", raw, 8)
    layout.ints += [(4, 4, "version"), (8, 8, "count"), (16, 8, "count")]
    pos = 24

    def string(role: str) -> None:
        nonlocal pos
        layout.ints.append((pos, 8, role))
        pos += 8 + struct.unpack_from("<Q", raw, pos)[0]

    def value(vtype: int) -> None:
        nonlocal pos
        if vtype == V_STRING:
            string("length")
        elif vtype == V_ARRAY:
            elem = struct.unpack_from("<I", raw, pos)[0]
            layout.ints.append((pos, 4, "type"))
            layout.ints.append((pos + 4, 8, "count"))
            n = struct.unpack_from("<Q", raw, pos + 4)[0]
            pos += 12
            if elem in (V_STRING, V_ARRAY):
                for _ in range(n):
                    value(elem)
            else:
                size = _SCALAR_SIZE[elem]
                for k in range(min(n, 64)):  # the first elements of numeric arrays
                    layout.ints.append((pos + k * size, size, "float" if elem in (V_FLOAT32, V_FLOAT64) else "value"))
                pos += n * size
        else:
            size = _SCALAR_SIZE[vtype]
            layout.ints.append((pos, size, "float" if vtype in (V_FLOAT32, V_FLOAT64) else "value"))
            pos += size

    for _ in range(n_kv):
        string("length")
        vtype = struct.unpack_from("<I", raw, pos)[0]
        layout.ints.append((pos, 4, "type"))
        pos += 4
        value(vtype)
    layout.regions["header"] = (0, 24)
    layout.regions["metadata"] = (24, pos)
    infos_start = pos
    for _ in range(n_tensors):
        string("length")
        n_dims = struct.unpack_from("<I", raw, pos)[0]
        layout.ints.append((pos, 4, "n_dims"))
        pos += 4
        layout.ints += [(pos + 8 * d, 8, "dim") for d in range(n_dims)]
        pos += 8 * n_dims
        layout.ints += [(pos, 4, "tensor_type"), (pos + 4, 8, "offset")]
        pos += 12
    layout.regions["tensor infos"] = (infos_start, pos)
    layout.data_offset = pos + (-pos % 32)
    layout.regions["tensor data"] = (layout.data_offset, len(raw))
    return layout


# -- mutations ---------------------------------------------------------------------------------

def _interesting(width: int, old: int, rng: random.Random) -> int:
    top = (1 << (8 * width)) - 1
    pool = [0, 1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 255, 256, 1023, 1024, 4096, 65535, 65536, 2**31 - 1, 2**31,
            2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, top, top - 1, old + 1, old - 1, old * 2, old // 2,
            old + rng.randint(-64, 64), old * rng.randint(2, 1000), rng.getrandbits(8 * width)]
    return rng.choice(pool) & top


def _interesting_float(rng: random.Random) -> float:
    return rng.choice([0.0, -0.0, -1.0, 1e-30, 1e30, 3.4e38, -3.4e38, float("nan"), float("inf"), float("-inf"),
                       1e-45, 65504.0, 2.0**64, rng.uniform(-10, 10)])


def _set_int(raw: bytearray, offset: int, width: int, value: int) -> None:
    raw[offset:offset + width] = value.to_bytes(width, "little")


def byte_mutant(raw: bytes, layout: Layout, rng: random.Random) -> tuple[str, bytes]:
    out = bytearray(raw)
    kind = rng.choice(["int", "int", "int", "float", "flip", "bytes", "truncate", "splice", "data", "nan"])
    if kind == "int":
        offset, width, role = rng.choice([f for f in layout.ints if f[2] != "float"])
        old = int.from_bytes(raw[offset:offset + width], "little")
        new = _interesting(width, old, rng)
        _set_int(out, offset, width, new)
        return f"{role} at byte {offset}: {old} -> {new}", bytes(out)
    if kind == "float":
        floats = [f for f in layout.ints if f[2] == "float"]
        offset, width, _ = rng.choice(floats)
        new = _interesting_float(rng)
        out[offset:offset + width] = struct.pack("<f" if width == 4 else "<d", new)
        return f"float at byte {offset} -> {new}", bytes(out)
    region = rng.choice(["header", "metadata", "metadata", "tensor infos", "tensor data"])
    lo, hi = layout.regions[region]
    at = rng.randrange(lo, max(lo + 1, hi))
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            k = rng.randrange(lo, max(lo + 1, hi))
            out[k] ^= 1 << rng.randrange(8)
        return f"bits flipped in the {region}", bytes(out)
    if kind in ("bytes", "data"):
        if kind == "data":
            lo, hi = layout.regions["tensor data"]
            at = rng.randrange(lo, hi)
        n = rng.choice([1, 2, 4, 8, 16, 64, 1024])
        fill = rng.choice([b"\x00", b"\xff", None])
        out[at:at + n] = fill * n if fill else bytes(rng.getrandbits(8) for _ in range(n))
        return f"{n} bytes overwritten at {at} ({region if kind == 'bytes' else 'tensor data'})", bytes(out[:len(raw)])
    if kind == "truncate":
        return f"cut at byte {at} ({region})", bytes(out[:at])
    if kind == "splice":
        n = rng.randint(1, 16)
        if rng.random() < 0.5:
            return f"{n} bytes deleted at {at} ({region})", bytes(out[:at] + out[at + n:])
        return f"{n} bytes inserted at {at} ({region})", bytes(out[:at] + bytes(rng.getrandbits(8) for _ in range(n))
                                                               + out[at:])
    # nan: NaN / Inf in F32 values, or in the f16 scale of Q8_0 blocks (34 bytes: d, then 32 x int8)
    lo, hi = layout.regions["tensor data"]
    patterns = [struct.pack("<f", float("nan")), struct.pack("<f", float("inf")), struct.pack("<f", -3.4e38),
                b"\x00\x7e", b"\x00\x7c", b"\x00\xfc", b"\xff\x7b"]
    for _ in range(rng.randint(1, 32)):
        pattern = rng.choice(patterns)
        k = rng.randrange(lo, hi - 4)
        k -= k % len(pattern)
        out[k:k + len(pattern)] = pattern
    return "NaN / Inf patterns in the tensor data", bytes(out)


def _interesting_value(rng: random.Random):
    return rng.choice([0, 1, -1, 3, 7, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**40, 10**9, 0.5, -2.5,
                       float("nan"), float("inf"), 1e-30, True, False, "", "llama", "x" * 1000, [1, 2], [0],
                       [], ["a", "b"], [[1], [2, 3]], np.zeros(3, np.float32), [2**40]])


def meaning_mutant(path: Path, rng: random.Random) -> str:
    """Rewrite the tiny model with one change of meaning; returns what was changed."""
    keys = [key for key, _, _ in tiny_metadata(TEMPLATE)] + [ "llama.vocab_size", "llama.rope.scaling.type",
                                    "llama.rope.scaling.factor", "llama.attention.key_length",
                                    "llama.attention.value_length", "llama.attention.sliding_window",
                                    "general.alignment", "general.architecture"]
    kind = rng.choice(["value", "value", "value", "drop", "type", "shape", "drop tensor"])
    shapes = tensor_shapes()
    name = rng.choice(list(shapes))
    metadata = {}
    if kind == "value":
        key = rng.choice(keys)
        value = _interesting_value(rng)
        if key == "general.alignment" and not (isinstance(value, int) and value > 0 and value & (value - 1) == 0):
            value = 64
        metadata[key] = value
        change = f"{key} = {value!r}"[:200]
    elif kind == "drop":
        key = rng.choice(keys)
        metadata[key] = DROP
        change = f"{key} dropped"
    elif kind == "type":
        types = [GGMLType.F32, GGMLType.F16, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q4_K,
                 GGMLType.Q6_K, GGMLType.I32, GGMLType.IQ4_NL, GGMLType.BF16]
        ggml_type = rng.choice(types)
        try:
            write_seed(path, types={name: ggml_type}, seed=rng.randrange(1 << 30))
        except Exception:  # noqa: BLE001 - a shape the type cannot hold: a different change
            ggml_type = GGMLType.F16
            write_seed(path, types={name: ggml_type}, seed=rng.randrange(1 << 30))
        return f"{name} stored as {ggml_type.name}"
    elif kind == "shape":
        shape = list(shapes[name])
        d = rng.randrange(len(shape))
        shape[d] = rng.choice([32, 64, 96, 128, 256, shape[d] * 2, 1])
        if rng.random() < 0.3:
            shape.append(rng.choice([1, 2]))
        write_seed(path, shapes={name: tuple(shape)}, seed=rng.randrange(1 << 30))
        return f"{name} shaped {shape}"
    else:
        write_seed(path, drop_tensors=(name,), seed=rng.randrange(1 << 30))
        return f"{name} dropped"
    try:
        write_seed(path, metadata=metadata, seed=rng.randrange(1 << 30))
    except Exception as error:  # noqa: BLE001 - the writer refuses some values (as it should)
        write_seed(path)
        return f"{change} (refused by the writer: {error}; the seed instead)"[:300]
    return change


# -- the worker ---------------------------------------------------------------------------------

def classify(argv: list[str]) -> tuple[str, str]:
    """Run one ember command in this process; its outcome and what it printed on stderr."""
    from ember.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    escaped = None
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
        except BaseException:  # noqa: BLE001 - what the fuzzer is looking for
            escaped = traceback.format_exc()
    text = err.getvalue()
    if escaped:
        return "traceback", text + escaped
    lines = [line for line in text.splitlines() if not line.startswith(_HARMLESS)]
    errors = [line for line in lines if line.startswith("ember: error: ")]
    if lines != errors or len(errors) > 1 or (code == 0) != (not errors):
        return "traceback", text
    return ("ok" if code == 0 else "error"), text


def main() -> None:
    """The worker: for each path on stdin, run every command; one JSON line per path on stdout."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, resource.getrlimit(resource.RLIMIT_AS)[1]))
    real_stdout = sys.stdout
    for line in sys.stdin:
        path = line.rstrip("\n")
        results = []
        for command in COMMANDS:
            outcome, stderr = classify([arg.replace("{path}", path) for arg in command])
            results.append({"command": command[0], "outcome": outcome, "stderr": stderr[-4000:]})
        real_stdout.write(json.dumps(results) + "\n")
        real_stdout.flush()


class Worker:
    """The worker process, restarted after a crash or a hang."""

    def __init__(self):
        self.process = None

    def ask(self, path: Path, timeout: float) -> tuple[str, list[dict]]:
        if self.process is None or self.process.poll() is not None:
            code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import gguf_mutants; gguf_mutants.main()"
            self.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            cwd=HERE.parent.parent, start_new_session=True)
            os.set_blocking(self.process.stderr.fileno(), False)
        self.process.stdin.write(f"{path}\n")
        self.process.stdin.flush()
        import select

        ready = select.select([self.process.stdout], [], [], timeout)[0]
        if not ready:
            self.stop()
            return "hang", []
        answer = self.process.stdout.readline()
        if not answer:
            code = self.process.wait()
            stderr = self._stderr()
            self.process = None
            return ("crash" if code < 0 else "traceback"), [{"command": "worker", "outcome": f"exit {code}",
                                                             "stderr": stderr[-4000:]}]
        results = json.loads(answer)
        stray = self._stderr()  # output that bypassed sys.stderr (native code, other threads)
        if stray.strip():
            results.append({"command": "stderr", "outcome": "traceback", "stderr": stray[-4000:]})
        worst = next((r["outcome"] for r in results if r["outcome"] in FAILURES), None)
        return worst or ("ok" if any(r["outcome"] == "ok" for r in results) else "error"), results

    def _stderr(self) -> str:
        try:
            return self.process.stderr.read() or ""
        except (OSError, TypeError):
            return ""

    def stop(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
            self.process = None


@dataclass
class Results:
    counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in ("ok", "error", *FAILURES)})
    by_kind: dict[str, int] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    slowest: list[tuple[float, str]] = field(default_factory=list)  # (seconds, change), the 5 slowest

    @property
    def n(self) -> int:
        return sum(self.counts.values())


def fuzz(n_mutants: int, seed: int, folder: Path, timeout: float = TIMEOUT, keep_failures: bool = True,
         progress=None) -> Results:
    """Mutate the seed model n_mutants times (reproducibly, from `seed`) and run each mutant."""
    folder.mkdir(parents=True, exist_ok=True)
    seed_path = write_seed(folder / "seed.gguf")
    raw = seed_path.read_bytes()
    layout = layout_of(raw)
    rng = random.Random(seed)
    worker = Worker()
    results = Results()
    start = time.monotonic()
    try:
        for i in range(n_mutants):
            path = folder / "mutant.gguf"
            if rng.random() < 0.35:
                description = meaning_mutant(path, rng)
                family = "meaning"
            else:
                description, data = byte_mutant(raw, layout, rng)
                path.write_bytes(data)
                family = "bytes"
            began = time.monotonic()
            outcome, detail = worker.ask(path, timeout)
            results.slowest = sorted(results.slowest + [(time.monotonic() - began, description)], reverse=True)[:5]
            results.counts[outcome] += 1
            results.by_kind[family] = results.by_kind.get(family, 0) + 1
            if outcome in FAILURES:
                kept = folder / f"failure-{i}.gguf"
                if keep_failures:
                    path.replace(kept)
                results.failures.append({"mutant": i, "outcome": outcome, "change": description,
                                         "file": str(kept), "detail": detail})
            if progress:
                progress(i + 1, results)
    finally:
        worker.stop()
    results.seconds = time.monotonic() - start
    return results
