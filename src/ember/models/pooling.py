"""What a file says about pooling: `<arch>.pooling_type` (llama.cpp's enum: 0 none, 1 mean, 2 CLS,
3 last, 4 rank) and whether the model is a reranker, whose graph ends in a classification head.

llama.cpp's converter writes no pooling type for a sequence-classification checkpoint (llama.cpp
is told `--reranking`); it keeps the classifier as `cls.output` (and RoBERTa's dense layer as
`cls`). A file that names no pooling and carries such a head is a reranker too.
"""

from __future__ import annotations

from ember.errors import EmberError
from ember.gguf.metadata import int_key

POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
POOLING_IDS = {name: value for value, name in POOLING_TYPES.items()}  # what a converter writes
CLASSIFIER_TENSORS = ("cls.output.weight", "cls.weight")


def file_pooling(gguf) -> str | None:
    """The pooling the file names (<arch>.pooling_type), or None when it names none."""
    arch = gguf.metadata.get("general.architecture")
    value = int_key(gguf.metadata, f"{arch}.pooling_type", None, minimum=0)
    if value is None:
        return None
    if value not in POOLING_TYPES:
        raise EmberError(f"unknown pooling type {value} ({arch}.pooling_type); ember knows "
                         + ", ".join(f"{k} ({v})" for k, v in POOLING_TYPES.items()))
    return POOLING_TYPES[value]


def is_reranker(gguf) -> bool:
    """Rank pooling: the file says so, or it names no pooling and has a classification head."""
    pooling = file_pooling(gguf)
    if pooling is not None:
        return pooling == "rank"
    return any(name in gguf.tensors for name in CLASSIFIER_TENSORS)
