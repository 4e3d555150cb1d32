"""`ember info MODEL`: what a GGUF file holds; `--tensors` lists them, `--json` for machines.

`--system` describes the machine (ember.sysinfo) and `--memory` the memory a model will use
(ember.runtime); both come from parts of ember that may be missing from a build.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.gguf import GGUFFile, StringArray, open_gguf
from ember.gguf.types import file_type_name

TOKENIZER_KINDS = {"gpt2": "BPE", "llama": "SentencePiece", "bert": "WordPiece", "t5": "Unigram",
                   "rwkv": "RWKV", "plamo2": "PLaMo-2"}


def cli_info(args) -> int:
    report: dict[str, Any] = {}
    if args.system:
        report["system"] = _system_info()
    if args.model:
        path = _resolve(args.model)
        with open_gguf(path) as f:
            report["model"] = describe(f, getattr(args, "chat_template", None))
            if args.tensors:
                report["tensors"] = list_tensors(f)
        if args.memory:
            report["memory"] = _planned_memory(path, getattr(args, "ctx_size", None), args.cache_type_k,
                                               args.cache_type_v)
    elif not args.system:
        raise EmberError("ember info needs a MODEL (-m: registry name, .gguf path or ORG/REPO[:QUANT]), or --system")
    elif args.tensors or args.memory:
        raise EmberError("--tensors and --memory need a MODEL")
    print(json.dumps(report, indent=2, default=_json_value) if args.json else render(report))
    return 0


def describe(f: GGUFFile, chat_template: str | None = None) -> dict[str, Any]:
    """The facts `ember info` shows about a model file, as plain JSON-able values (whatever the
    file holds: a value of an unexpected kind is shown as it is, in short; chat_template: the
    --chat-template given, which decides the chat format reported)."""
    from ember.engine.load import chat_template_source
    from ember.models import features

    field = lambda name: _fact(f.field(name, None)) if isinstance(f.arch, str) else None  # noqa: E731
    heads = field("attention.head_count")
    embedding = field("embedding_length")
    head_dim = field("attention.key_length")
    if head_dim is None and isinstance(heads, int) and isinstance(embedding, int) and heads:
        head_dim = embedding // heads
    tokens = f.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens) if isinstance(tokens, (StringArray, list, np.ndarray)) else None
    file_type = f.get("general.file_type")
    histogram = Counter(t.type.name for t in f.tensors.values())
    return {
        "path": str(f.path),
        "file_size": f.size,
        "gguf_version": f.version,
        "architecture": _fact(f.arch),
        "features": features(f.metadata, f.tensors),
        "name": _fact(f.get("general.name")),
        "parameters": sum(t.n_elements for t in f.tensors.values()),
        "file_type": file_type_name(int(file_type)) if isinstance(file_type, int) else _fact(file_type),
        "tensor_count": len(f.tensors),
        "tensor_types": dict(histogram.most_common()),
        "context_length": field("context_length"),
        "embedding_length": embedding,
        "layers": field("block_count"),
        "heads": heads,
        "kv_heads": field("attention.head_count_kv"),
        "head_dim": head_dim,
        "feed_forward_length": field("feed_forward_length"),
        "vocab_size": n_tokens if n_tokens is not None else field("vocab_size"),
        "tokenizer": _fact(f.get("tokenizer.ggml.model")),
        "tokenizer_pre": _fact(f.get("tokenizer.ggml.pre")),
        "chat_template": "tokenizer.chat_template" in f.metadata,
        "chat_format": chat_template_source(f.metadata, chat_template)[1],
        "files": [str(p) for p in f.paths],
    }


def list_tensors(f: GGUFFile) -> list[dict[str, Any]]:
    return [{"name": t.name, "type": t.type.name, "shape": list(t.shape), "offset": t.offset}
            for t in f.tensors.values()]


# ---------------------------------------------------------------------- text output

def render(report: dict[str, Any]) -> str:
    sections = []
    if "model" in report:
        sections.append(_render_model(report["model"]))
    if "tensors" in report:
        sections.append(_render_tensors(report["tensors"]))
    if "memory" in report:
        sections.append(_render_mapping("memory", report["memory"]))
    if "system" in report:
        sections.append(_render_mapping("system", report["system"]))
    return "\n\n".join(sections)


def _render_model(m: dict[str, Any]) -> str:
    types = ", ".join(f"{n} {name}" for name, n in m["tensor_types"].items())
    rows = [
        ("model", f"{m['path']} ({_human_bytes(m['file_size'])}, GGUF v{m['gguf_version']})"),
        ("architecture", m["architecture"]),
        ("features", ", ".join(m["features"]) or None),
        ("name", m["name"]),
        ("parameters", _human_count(m["parameters"])),
        ("file type", m["file_type"]),
        ("tensors", f"{m['tensor_count']}: {types}" if types else "0"),
        ("context", m["context_length"]),
        ("embedding", m["embedding_length"]),
        ("layers", m["layers"]),
        ("heads", _heads(m)),
        ("feed forward", m["feed_forward_length"]),
        ("vocabulary", _vocabulary(m)),
        ("chat template", "yes" if m["chat_template"] else "no"),
        ("chat format", m["chat_format"]),
    ]
    if len(m["files"]) > 1:
        rows.insert(1, ("split", f"{len(m['files'])} files: {m['files'][0]} ..."))
    return "\n".join(f"{label:<14} {'-' if value is None else value}" for label, value in rows)


def _heads(m: dict[str, Any]) -> str | None:
    if m["heads"] is None:
        return None
    text = str(m["heads"])
    if m["kv_heads"] is not None:
        text += f" ({m['kv_heads']} KV)"
    if m["head_dim"] is not None:
        text += f", head dim {m['head_dim']}"
    return text


def _vocabulary(m: dict[str, Any]) -> str | None:
    if m["vocab_size"] is None:
        return None
    text = f"{m['vocab_size']} tokens"
    if m["tokenizer"]:
        kind = TOKENIZER_KINDS.get(m["tokenizer"]) if isinstance(m["tokenizer"], str) else None
        text += f", {kind} ({m['tokenizer']})" if kind else f", {m['tokenizer']}"
    if m["tokenizer_pre"]:
        text += f", pre-tokenizer {m['tokenizer_pre']}"
    return text


def _render_tensors(tensors: list[dict[str, Any]]) -> str:
    width = max([len("name")] + [len(t["name"]) for t in tensors])
    lines = [f"{'name':<{width}}  {'type':<7} {'shape':<24} offset"]
    for t in tensors:
        shape = "[" + ", ".join(str(d) for d in t["shape"]) + "]"
        lines.append(f"{t['name']:<{width}}  {t['type']:<7} {shape:<24} {t['offset']}")
    return "\n".join(lines)


def _render_mapping(title: str, values: dict[str, Any]) -> str:
    lines = [f"{title}:"]
    for key, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool) and "bytes" in key:
            value = _human_bytes(value)
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        lines.append(f"  {key:<18} {value}")
    return "\n".join(lines)


def _human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit} ({n})"
    return str(n)


def _human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _fact(value: Any) -> Any:
    """A metadata value as `describe` reports it: a number, string or short list as it is; an
    array of another length or kind as a short description (a hostile file can put anything anywhere)."""
    value = _plain(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list) and len(value) <= 64 and all(isinstance(v, (bool, int, float, str)) for v in value):
        return value
    return f"<array of {len(value)}>" if hasattr(value, "__len__") else f"<{type(value).__name__}>"


def _json_value(value: Any) -> Any:
    plain = _plain(value)
    return str(value) if plain is value else plain


def _plain(value: Any) -> Any:
    """numpy scalars and arrays -> Python values (for JSON and for printing)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return value


# ---------------------------------------------------------------------- other parts of ember

def _resolve(model: str) -> Path:
    from ember.hub import resolve_model
    return resolve_model(model)


def _system_info() -> dict[str, Any]:
    try:
        from ember.sysinfo import system_info
        return system_info()
    except ImportError as exc:
        raise EmberError(f"system information is not available in this build ({exc})") from None


def _planned_memory(path: Path, n_ctx: int | None, type_k: str | None = None,
                    type_v: str | None = None) -> dict[str, Any]:
    try:
        from ember.engine.runtime import planned_memory
    except ImportError as exc:
        raise EmberError(f"memory planning is not available in this build ({exc})") from None
    return planned_memory(path, n_ctx, type_k, type_v)
