"""`ember rerank`: documents scored against a query by a cross-encoder, best first, one JSON line each.

    ember rerank -m reranker.gguf "the query" "first document" "second document"
    ember rerank -m reranker.gguf "the query" -f documents.txt     # a document per line ("-": stdin)

Each line is llama-server's result, {"index": i, "relevance_score": s}; --top-n keeps the best N.
"""

from __future__ import annotations

import json

from ember.cli.embed import _texts


def cli_rerank(args) -> int:
    from ember.api.llm import LLM
    from ember.cli.main import batch_size
    from ember.hub import resolve_model

    documents = _texts(args, what="documents to rerank")
    llm = LLM(resolve_model(args.model), n_ctx=args.ctx_size, n_threads=args.threads, n_batch=batch_size(args),
              activations=args.activations, use_mmap=args.mmap, use_mlock=args.mlock, huge_pages=args.huge_pages)
    try:
        for result in llm.rerank(args.query, documents, top_n=args.top_n):
            print(json.dumps(result))
    finally:
        llm.close()
    return 0
