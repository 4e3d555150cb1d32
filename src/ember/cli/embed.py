"""`ember embed`: the embeddings of texts, one JSON line per text on stdout.

    ember embed -m model.gguf "first text" "second text"
    ember embed -m model.gguf -f texts.txt          # a text per line ("-": stdin, also the default)

Each line is {"index": i, "n_tokens": n, "embedding": [...]}. All texts go through the runtime
together, packed into as few graph runs as fit.
"""

from __future__ import annotations

import json
import sys

from ember.errors import EmberError


def cli_embed(args) -> int:
    from ember.api.llm import LLM
    from ember.cli.main import batch_size
    from ember.hub import resolve_model

    texts = _texts(args)
    llm = LLM(resolve_model(args.model), n_ctx=args.ctx_size, n_threads=args.threads, n_batch=batch_size(args),
              activations=args.activations, use_mmap=args.mmap, use_mlock=args.mlock, huge_pages=args.huge_pages,
              pooling=args.pooling)
    try:
        llm.embedder.normalize = not args.no_normalize
        for index, found in enumerate(llm.embeddings(texts, truncate=args.truncate)):
            print(json.dumps({"index": index, "n_tokens": found.n_tokens, "embedding": found.vector.tolist()}))
    finally:
        llm.close()
    return 0


def _texts(args, stdin=None, what: str = "text to embed") -> list[str]:
    """TEXT arguments, else the lines of -f FILE (or of stdin when no text is given); empty lines skipped."""
    if args.texts and args.file is not None:
        raise EmberError("give the texts as arguments or with -f, not both")
    if args.texts:
        return list(args.texts)
    if args.file in (None, "-"):
        stdin = stdin or sys.stdin
        if args.file is None and stdin.isatty():
            raise EmberError("no text: give TEXT arguments, -f FILE, or pipe texts on stdin (one a line)")
        lines = stdin.read().splitlines()
    else:
        try:
            with open(args.file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise EmberError(f"cannot read {args.file}: {getattr(error, 'strerror', None) or error}") from None
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise EmberError(f"no {what}")
    return texts
