"""`ember pull NAME` and `ember list`: registry models into the cache (ember.hub)."""

from __future__ import annotations

from ember.hub import REGISTRY, cache_dir, model_path, pull


def cli_pull(args) -> int:
    print(pull(args.name))
    return 0


def cli_list(args) -> int:
    rows = [("NAME", "SIZE", "CACHED", "DESCRIPTION")]
    for name, entry in REGISTRY.items():
        cached = "yes" if model_path(name).is_file() else "no"
        rows.append((name, f"{entry.size / 1e6:.0f} MB", cached, entry.description))
    widths = [max(len(row[col]) for row in rows) for col in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    print(f"cache: {cache_dir() / 'models'}")
    return 0
