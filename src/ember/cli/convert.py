"""`ember convert HF_DIR OUT.gguf`: a Hugging Face safetensors model as a GGUF file
(ember.convert)."""

from __future__ import annotations

from ember.convert import convert


def cli_convert(args) -> int:
    path = convert(args.hf_dir, args.output, args.outtype)
    print(f"wrote {path}")
    return 0
