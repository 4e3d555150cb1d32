"""`ember quantize IN OUT TYPE`: re-encode a GGUF file with one of llama.cpp's presets
(ember.quant.quantize)."""

from __future__ import annotations

import sys
from typing import Callable, TextIO

from ember.hub import resolve_model
from ember.quant.presets import preset_by_name
from ember.quant.quantize import quantize_file


def cli_quantize(args) -> int:
    preset_by_name(args.type)  # an unknown type fails before anything is read or pulled
    source = resolve_model(args.input)
    bar = progress_bar() if sys.stderr.isatty() else None
    result = quantize_file(source, args.output, args.type, n_threads=args.threads,
                           allow_requantize=args.allow_requantize, progress=bar)
    kinds = ", ".join(f"{n} {name}" for name, n in result.types.items())
    print(f"quantized {source.name} to {result.preset}: {result.input_bytes / 2**20:.1f} MiB -> "
          f"{result.output_bytes / 2**20:.1f} MiB ({kinds}) in {result.seconds:.1f} s -> {result.output}",
          file=sys.stderr)
    return 0


def progress_bar(stream: TextIO = sys.stderr, width: int = 30) -> Callable[[str, int, int], None]:
    """A one-line progress bar, redrawn in place: [#####.....]  50%  blk.3.ffn_down.weight."""
    def draw(name: str, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        filled = int(width * fraction)
        line = f"[{'#' * filled}{'.' * (width - filled)}] {100 * fraction:3.0f}%  {name}"
        stream.write(f"\r{line:<{width + 60}}")
        if done >= total:
            stream.write("\n")
        stream.flush()
    return draw
