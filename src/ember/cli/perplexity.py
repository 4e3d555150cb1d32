"""`ember perplexity -f FILE`: perplexity with llama.cpp's method (ember.engine.perplexity)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from ember.cli.main import batch_size
from ember.engine.load import load
from ember.engine.perplexity import chunk_count, perplexity
from ember.errors import EmberError


def cli_perplexity(args) -> int:
    try:
        with open(args.file, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise EmberError(f"cannot read {args.file}: {exc.strerror}") from None
    n_batch = batch_size(args, default=args.ctx_size or 2048)  # the logits of every token of a batch are kept
    loaded = load(args.model, n_ctx=args.ctx_size, n_threads=args.threads, n_batch=n_batch, n_outputs=n_batch,
                  activations=args.activations, use_mmap=args.mmap, use_mlock=args.mlock, huge_pages=args.huge_pages,
                  type_k=args.cache_type_k, type_v=args.cache_type_v)
    model, tokenizer = loaded.model, loaded.tokenizer
    n_ctx = model.n_ctx  # -c 0: the model's own
    tokens = tokenizer.encode(text, add_special=True)
    bos = tokenizer.bos_id if tokenizer.add_bos else None
    print(f"perplexity: {len(tokens)} tokens, {chunk_count(len(tokens), n_ctx)} chunks of {n_ctx}", file=sys.stderr)
    result = perplexity(model, tokens, n_ctx, bos, args.chunks, None if args.json else _progress_bar)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.ppl_error:.5f}")
    return 0


def _progress_bar(done: int, total: int, ppl: float, seconds: float) -> None:
    width = 30
    filled = width * done // total
    eta = seconds / done * (total - done)
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks  PPL {ppl:.4f}  ETA {eta:.0f}s",
          end="" if done < total else "\n", file=sys.stderr, flush=True)
