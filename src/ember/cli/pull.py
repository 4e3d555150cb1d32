"""`ember pull NAME`, `ember list` and `ember rm NAME`: registry and Hugging Face models in their
caches (ember.hub)."""

from __future__ import annotations

from ember.hub import REGISTRY, cache_dir, cached_models, hf_cache_dir, model_path, pull, remove


def cli_pull(args) -> int:
    print(pull(args.name))
    return 0


def cli_list(args) -> int:
    rows = [("NAME", "SIZE", "CACHED", "DESCRIPTION")]
    for name, entry in REGISTRY.items():
        cached = "yes" if model_path(name).is_file() else "no"
        rows.append((name, _size(entry.size), cached, entry.description))
    for model in cached_models():
        if model.name not in REGISTRY:
            rows.append((model.name, _size(model.size), "yes", model.description))
    widths = [max(len(row[col]) for row in rows) for col in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    print(f"cache: {cache_dir() / 'models'}")
    print(f"Hugging Face cache: {hf_cache_dir()}")
    return 0


def cli_rm(args) -> int:
    for path in remove(args.name):
        print(f"removed {path}")
    return 0


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.1f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:.0f} MB" if n_bytes >= 1e7 \
        else f"{n_bytes / 1e6:.1f} MB"
