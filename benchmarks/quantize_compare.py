"""`ember quantize` beside llama.cpp's `llama-quantize`: same float input, same preset; are the
outputs the same tensor for tensor, and how long does each take?

    python benchmarks/quantize_compare.py [--models smollm2-135m] [--presets Q4_0,Q8_0,Q4_K_M]
        [--float f32|f16|none] [-t 2] [--rounds 1] [--work-dir DIR] [--json FILE]

Each registry model is first dequantized (ember's numpy reference) to an F32 file, or with
--float f16 to F16 (1-D tensors stay F32, as in converted models), in --work-dir; with
--float none the registry file itself is the input (both tools --allow-requantize). Both tools then
quantize that file with every preset, alternately (ember, llama.cpp, ember, ...), --rounds times;
the time is the median wall time of the whole command. The outputs are compared byte for byte
(ember writes keys and tensors in llama-quantize's order) and tensor by tensor:
same type and identical bytes, and where the bytes differ, each tool's reconstruction error
(RMS of dequantized - input over RMS of input). llama-quantize is looked up in $LLAMA_CPP_BIN or
on PATH.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from runner import (
    MissingBinary,
    ember_command,
    ember_version,
    llama_binary,
    llama_version,
    machine_summary,
    run_measured,
)


def make_float_model(source: Path, out: Path, float_type: str) -> Path:
    """The registry model with every tensor dequantized: F32, or F16 for tensors of 2+ dimensions."""
    from ember.gguf import GGUFValueType, GGUFWriter, open_gguf
    from ember.gguf.types import GGMLType
    from ember.quant.reference import dequantize_tensor

    if out.exists():
        return out
    with open_gguf(source) as gguf:
        writer = GGUFWriter(out)
        for key, value in gguf.metadata.items():
            writer.add(key, value, gguf.metadata_types[key])
        writer.add("general.file_type", 0 if float_type == "f32" else 1, GGUFValueType.UINT32)
        for name, info in gguf.tensors.items():
            as_f16 = float_type == "f16" and len(info.shape) > 1
            dtype = np.float16 if as_f16 else np.float32
            writer.add_tensor(name, (lambda i=info, d=dtype: [dequantize_tensor(i).astype(d)]),
                              GGMLType.F16 if as_f16 else GGMLType.F32, info.shape)
        writer.write()
    return out


def compare_outputs(ember_path: Path, llama_path: Path, float_path: Path) -> dict:
    """Tensor-by-tensor comparison of two quantized files made from the same float file."""
    from ember.gguf import open_gguf
    from ember.quant.reference import dequantize_tensor

    same, differ, type_mismatch, errors = 0, [], [], []
    with open_gguf(ember_path) as ours, open_gguf(llama_path) as theirs, open_gguf(float_path) as source:
        if set(ours.tensors) != set(theirs.tensors):
            return {"error": "different tensor names"}
        for name, mine in ours.tensors.items():
            other = theirs.tensors[name]
            if mine.type != other.type:
                type_mismatch.append(f"{name}: {mine.type.name} vs {other.type.name}")
            elif np.array_equal(mine.data, other.data):
                same += 1
            else:
                x = dequantize_tensor(source.tensors[name]).astype(np.float64)
                scale = np.sqrt((x ** 2).mean())
                err = [float(np.sqrt(((dequantize_tensor(t) - x) ** 2).mean()) / scale) for t in (mine, other)]
                differ.append(name)
                errors.append({"tensor": name, "type": mine.type.name, "ember": err[0], "llama.cpp": err[1]})
        meta_same = ours.metadata.get("general.file_type") == theirs.metadata.get("general.file_type")
    return {"identical": same, "different": differ, "type_mismatch": type_mismatch, "errors": errors,
            "n_tensors": len(ours.tensors), "file_type_equal": meta_same}


def quantize_commands(source: Path, out_dir: Path, preset: str, threads: int,
                      requantize: bool) -> dict[str, tuple[list[str], Path]]:
    stem = source.stem
    ours, theirs = out_dir / f"{stem}-ember-{preset}.gguf", out_dir / f"{stem}-llama-{preset}.gguf"
    flag = ["--allow-requantize"] if requantize else []
    return {"ember": ([*ember_command(), "quantize", str(source), str(ours), preset, "-t", str(threads), *flag], ours),
            "llama.cpp": ([llama_binary("llama-quantize"), *flag, str(source), str(theirs), preset, str(threads)],
                          theirs)}


def run_preset(float_path: Path, out_dir: Path, preset: str, args) -> dict:
    commands = quantize_commands(float_path, out_dir, preset, args.threads, args.float_type == "none")
    seconds = {engine: [] for engine in commands}
    for _ in range(args.rounds):
        for engine, (cmd, _) in commands.items():
            run = run_measured(cmd)
            if not run.ok:
                return {"error": f"{engine}: {run.error()}"}
            seconds[engine].append(run.seconds)
    result = compare_outputs(commands["ember"][1], commands["llama.cpp"][1], float_path)
    result["files_identical"] = filecmp.cmp(commands["ember"][1], commands["llama.cpp"][1], shallow=False)
    result["seconds"] = {engine: statistics.median(s) for engine, s in seconds.items()}
    result["all_seconds"] = seconds
    return result


def llama_cpp_version() -> str:
    """llama-quantize has no --version; its sibling llama-bench says which build it is."""
    try:
        return llama_version(str(Path(llama_binary("llama-quantize")).with_name("llama-bench")))
    except MissingBinary:
        return "unknown"


def table_row(model: str, preset: str, r: dict) -> str:
    if "error" in r:
        return f"| {model} | {preset} | {r['error']} | | | | |"
    identical = f"{r['identical']}/{r['n_tensors']}"
    worst = max((e["ember"] / e["llama.cpp"] - 1 for e in r["errors"]), default=0.0)
    worst_cell = f"{100 * worst:+.3f}%" if r["errors"] else "-"
    s = r["seconds"]
    return (f"| {model} | {preset} | {'yes' if r['files_identical'] else 'no'} | {identical} | "
            f"{len(r['type_mismatch'])} | {worst_cell} | "
            f"{s['ember']:.2f} / {s['llama.cpp']:.2f} = {s['ember'] / s['llama.cpp']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m", help="registry names, comma-separated")
    parser.add_argument("--presets", default="Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q4_K_M,Q5_K_M,Q6_K")
    parser.add_argument("--float", dest="float_type", choices=["f32", "f16", "none"], default="f32")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None, help="where the float and quantized files go")
    parser.add_argument("--llama-commit", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from ember.hub import resolve_model

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="quantize-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    header = [f"machine: {machine_summary()}", f"ember: {ember_version()}",
              f"llama.cpp: {llama_cpp_version()}"
              + (f", commit {args.llama_commit}" if args.llama_commit else ""),
              ("input: the registry files (requantized)" if args.float_type == "none" else
               f"input: registry models dequantized to {args.float_type.upper()}")
              + f", -t {args.threads}, {args.rounds} round(s)"]
    results = {}
    for model in args.models.split(","):
        if args.float_type == "none":
            float_path = resolve_model(model)
        else:
            print(f"{model}: writing the {args.float_type} input...", file=sys.stderr, flush=True)
            float_path = make_float_model(resolve_model(model), work / f"{model}-{args.float_type}.gguf",
                                          args.float_type)
        for preset in args.presets.split(","):
            print(f"{model} {preset}...", file=sys.stderr, flush=True)
            results[f"{model} {preset}"] = run_preset(float_path, work, preset, args)
    columns = ("| model | preset | same file | identical tensors | type mismatches | worst error vs llama.cpp "
               "(differing tensors) | seconds ember / llama.cpp |")
    lines = [*header, "", columns, "|---|---|---|---|---|---|---|"]
    lines += [table_row(*key.split(" "), r) for key, r in results.items()]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"header": header, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
