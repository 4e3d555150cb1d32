"""Model: a GGUF file's weights (mmapped, zero copy), the forward graph built once, and the KV
cache of `n_seq` sequence slots. `eval` appends tokens to a sequence and returns logits;
`decode_batch` advances several sequences by one token in one graph run.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ember import _core
from ember.errors import ContextFullError, EmberError, EmberWarning
from ember.gguf import GGUFFile, open_gguf
from ember.gguf.types import GGMLType
from ember.models import architecture, tensor_shapes
from ember.models.blocks import Builder
from ember.models.pooling import file_pooling, is_reranker
from ember.sysinfo import checked_threads, physical_memory

DEFAULT_MAX_CTX = 4096
ENCODER_SLOTS = 16  # sequence slots of an encoder: texts embedded in one graph run
ACTIVATIONS = ("int8", "f32")
# The KV cache's types, by llama.cpp's names (-ctk / -ctv); each K and V row holds n_kv_head *
# head_dim elements: 4, 2 or 34/32 bytes each (Q8_0: 32 int8 and one F16 scale per block).
KV_CACHE_TYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0}
# llama.cpp's other cache types, named in the error that refuses them
_OTHER_CACHE_TYPES = ("bf16", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


class Model:
    """A loaded model: an opened GGUF file, or the path of one (names are resolved by engine.load).

    n_ctx: context length per sequence (default: the model's, capped at 4096; 0: the model's own,
        as llama.cpp's -c 0). Beyond the model's training context it warns (EmberWarning); a KV
        cache larger than the machine's memory is an EmberError naming the largest that fits.
    n_threads: compute threads (default: physical cores); see sysinfo.checked_threads for the
        limits (a warning past the physical cores, an error past 4 per CPU).
    n_seq: sequence slots sharing the weights (the server's parallel requests).
    n_batch: tokens per graph run; longer prompts are processed in chunks of this size.
    n_outputs: most rows of logits one run returns (logits="all" is chunked to fit).
    activations: "int8" (default): each matmul converts its activations to the weight type's
        8-bit block format and takes integer dot products, as llama.cpp does; "f32": weights
        are dequantized to F32 row by row and the activations are not rounded (several times
        slower; logits as close to a float32 reference as the accumulation order allows).
    embeddings: the graph returns the final hidden states (after the output norm) instead of
        logits, for engine.embed. Encoder architectures (BERT) always do; `is_encoder` says so,
        and `n_out` is the width of what eval returns (n_vocab, or the embedding length). An
        encoder's batch is its whole context and it has at least ENCODER_SLOTS sequence slots.
    rank: the graph ends in the file's classification head and returns each output row's class
        scores (a reranker, pooling type rank: a cross-encoder's on [CLS], a decoder's on the last
        token); default: as the file says (_reranker_file). `ranks` says which; `n_out` is then the number of classes.
        Its token-type embedding is a per-token input: `_run` takes each token's type.

    type_k, type_v: the KV cache's types for K and V rows (llama.cpp's -ctk / -ctv): "f16"
        (default), "q8_0" (about half the bytes; K and V rounded to 8 bits per block of 32) or
        "f32"; also as ggml type ids (llama-cpp-python's Llama(type_k=8)). See `kv_cache_type`.

    `kv_bytes_per_token` is what one token of one sequence takes in the KV cache.
    """

    def __init__(self, model: GGUFFile | str | Path, n_ctx: int | None = None, n_threads: int | None = None,
                 n_seq: int = 1, n_batch: int = 512, n_outputs: int | None = None, activations: str = "int8",
                 embeddings: bool = False, rank: bool | None = None, type_k: str | int | None = None,
                 type_v: str | int | None = None):
        _check_count("n_ctx", n_ctx, minimum=0)
        self.type_k, self.type_v = kv_cache_type(type_k, "type_k"), kv_cache_type(type_v, "type_v")
        for name, value in (("n_seq", n_seq), ("n_batch", n_batch), ("n_outputs", n_outputs)):
            _check_count(name, value)
        if activations not in ACTIVATIONS:
            raise EmberError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
        self.n_threads = checked_threads(n_threads)
        self.gguf = open_gguf(model) if isinstance(model, (str, Path)) else model
        arch = architecture(self.gguf.metadata.get("general.architecture"))
        self.hp = arch.hparams(self.gguf)
        self.n_vocab = self.hp.n_vocab
        self.n_ctx_train = self.hp.n_ctx_train
        self.activations = activations
        self.graph = _core.Graph(self.n_threads, float_activations=activations == "f32")
        self.is_encoder = bool(getattr(arch, "ENCODER", False))
        self.ranks = self._reranker_file() if rank is None else bool(rank)
        self.embeddings = embeddings or self.is_encoder or self.ranks
        builder = Builder(self.graph, self.gguf, self.hp, tensor_shapes(arch, self.hp),
                          n_ctx=context_length(n_ctx, self.n_ctx_train))
        builder.embeddings = self.embeddings
        builder.rank = self.ranks
        logits = builder.build(arch.build)
        if self.ranks and builder.n_classes is None:
            raise EmberError(f"ember cannot rerank with the {self.hp.arch} architecture")
        if self.embeddings and not (self.is_encoder or builder.hidden_output or self.ranks):
            raise EmberError(f"ember cannot take embeddings from the {self.hp.arch} architecture")
        self._keep = builder._keep
        self._token_types = builder.token_types  # [n_types, n_embd] rows of the token-type input, or None
        self.graph.set_output(logits)
        self.n_out = builder.n_classes if self.ranks else self.hp.n_embd if self.embeddings else self.n_vocab
        self.n_ctx = self._context_length(n_ctx, builder.max_positions)
        self.n_seq = int(n_seq)
        self.n_batch = int(min(n_batch, self.n_ctx))
        if self.is_encoder:  # a text's tokens all see each other: a text is one run, texts share runs
            self.n_batch = self.n_ctx
            self.n_seq = max(self.n_seq, ENCODER_SLOTS)
        # embeddings pool over every token of a batch: all its rows are outputs
        self.n_outputs = int(n_outputs or (self.n_batch if self.embeddings else max(self.n_seq, 32)))
        self._plan()
        if self.n_ctx > self.n_ctx_train:
            warnings.warn(EmberWarning(
                f"the context of {self.n_ctx} tokens is larger than the model's training context ({self.n_ctx_train}); "
                f"output past {self.n_ctx_train} tokens may degrade"), stacklevel=2)
        self._n_past = [0] * self.n_seq

    def _reranker_file(self) -> bool:
        """An encoder's file as is_reranker says; a decoder's (Qwen3-Reranker) only when it names rank
        pooling and has cls.output (its LM head's rows of the answers it scores)."""
        if self.is_encoder:
            return is_reranker(self.gguf)
        return file_pooling(self.gguf) == "rank" and "cls.output.weight" in self.gguf.tensors

    def _context_length(self, n_ctx: int | None, max_positions: int | None) -> int:
        """The context n_ctx asks for (`context_length`); at most the positions a learned position
        embedding has (the default is cut to them, a larger n_ctx is an error)."""
        context = int(context_length(n_ctx, self.n_ctx_train))
        if max_positions is not None and context > max_positions:
            if n_ctx is None:
                return max_positions
            raise EmberError(f"n_ctx {context} is more than the {max_positions} positions this model has embeddings "
                             f"for (position_embd.weight); use at most {max_positions}")
        return context

    def _plan(self) -> None:
        """Plan the arena and the KV cache, once it is known that they fit in this machine's memory."""
        types = dict(type_k=int(self.type_k), type_v=int(self.type_v))
        try:
            self.graph.plan(1, 1, 1, 1, **types)  # the cache of one token of one sequence: what each token costs
        except ValueError as exc:  # a cache type the attention layers cannot hold
            raise EmberError(f"{exc} (-ctk / -ctv, type_k / type_v)") from None
        per_token = self.kv_bytes_per_token = self.graph.kv_size
        need = per_token * self.n_ctx * self.n_seq
        available = physical_memory()
        if need > available:
            fits = available // max(1, per_token * self.n_seq)
            slots = f" x {self.n_seq} sequences" if self.n_seq > 1 else ""
            raise EmberError(f"a context of {self.n_ctx} tokens{slots} needs {_gib(need)} of KV cache, more than "
                             f"this machine's {_gib(available)} of memory; use a context of at most {fits} tokens")
        try:
            self.graph.plan(self.n_batch, min(self.n_outputs, self.n_batch), self.n_ctx, self.n_seq, **types)
        except MemoryError:
            raise EmberError(f"not enough memory for a batch of {self.n_batch} tokens and a context of "
                             f"{self.n_ctx} tokens; use smaller ones (-b / n_batch, -c / n_ctx)") from None

    # -- sequences ---------------------------------------------------------------------------

    def n_past(self, seq: int = 0) -> int:
        return self._n_past[seq]

    def truncate(self, n: int, seq: int = 0) -> None:
        """Forget cached positions >= n of a sequence (keep a shared prompt prefix)."""
        self._n_past[seq] = max(0, min(n, self._n_past[seq]))

    def reset(self, seq: int = 0) -> None:
        self._n_past[seq] = 0

    def save_sequence(self, seq: int = 0) -> bytes:
        """The KV cache of a sequence's cached positions, as bytes for `load_sequence`."""
        return self.graph.kv_save(seq, self._n_past[seq]).tobytes()

    def load_sequence(self, state: bytes, n_past: int, seq: int = 0) -> None:
        """Put back what `save_sequence` returned when the sequence held n_past positions."""
        if not 0 <= n_past <= self.n_ctx:
            raise EmberError(f"the saved state holds {n_past} positions, more than this context's {self.n_ctx}")
        try:
            self.graph.kv_load(seq, n_past, np.frombuffer(state, dtype=np.uint8))
        except ValueError:
            raise EmberError(f"the saved state ({len(state)} bytes for {n_past} positions) is not one of this "
                             "model's") from None
        self._n_past[seq] = n_past

    def copy_sequence(self, src: int, dst: int) -> None:
        """Make sequence dst a copy of sequence src (its cached prefix)."""
        n = self._n_past[src]
        self.graph.kv_copy(src, dst, n)
        self._n_past[dst] = n

    # -- evaluation --------------------------------------------------------------------------

    def eval(self, tokens: Sequence[int], seq: int = 0, logits="last") -> np.ndarray:
        """Append tokens to sequence `seq` and return float32 logits.

        logits="last": [n_vocab] of the last token; "all": [len(tokens), n_vocab]; a sequence of
        increasing indices into tokens (e.g. a range): [len(indices), n_vocab] for those tokens
        only, which spares the LM head and the copy for the others.
        """
        tokens = token_ids(tokens, self.n_vocab)
        if tokens.size == 0:
            raise EmberError("no tokens to evaluate")
        wanted = self._wanted_rows(logits, tokens.size)
        start = self._n_past[seq]
        if start + tokens.size > self.n_ctx:
            raise ContextFullError(
                f"{start + tokens.size} tokens do not fit in the context of {self.n_ctx} tokens"
                f" ({start} already used); use a larger context (-c/n_ctx, the model was trained"
                f" with {self.n_ctx_train}) or a shorter prompt")
        rows = []
        step = self.n_batch if wanted.size <= 1 else min(self.n_batch, self.graph_outputs)
        for begin in range(0, tokens.size, step):
            chunk = tokens[begin:begin + step]
            positions = np.arange(start + begin, start + begin + chunk.size, dtype=np.int32)
            out_rows = wanted[(wanted >= begin) & (wanted < begin + chunk.size)] - begin
            # A run returns at least one row: the last token's, dropped when not wanted.
            run_rows = out_rows if out_rows.size else np.array([chunk.size - 1])
            out = self._run(chunk, positions, np.full(chunk.size, seq, np.int32), run_rows.astype(np.int32))
            self._n_past[seq] = start + begin + chunk.size
            if out_rows.size:
                rows.append(out)
        if isinstance(logits, str) and logits == "last":
            return rows[-1][0]
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    @staticmethod
    def _wanted_rows(logits, n_tokens: int) -> np.ndarray:
        if isinstance(logits, str):
            if logits == "last":
                return np.array([n_tokens - 1])
            if logits == "all":
                return np.arange(n_tokens)
            raise ValueError("logits must be 'last', 'all' or a sequence of token indices")
        wanted = np.asarray(logits, dtype=np.int64).reshape(-1)
        if wanted.size == 0 or wanted[0] < 0 or wanted[-1] >= n_tokens or np.any(np.diff(wanted) <= 0):
            raise ValueError(f"logits indices must be increasing and within [0, {n_tokens})")
        return wanted

    def decode_batch(self, items: Sequence[tuple[int, int]]) -> np.ndarray:
        """One decode step for several sequences: items are (seq, token); returns [len(items), n_vocab]."""
        if not items:
            raise EmberError("empty batch")
        seqs = np.array([s for s, _ in items], dtype=np.int32)
        if len(set(seqs.tolist())) != len(seqs):
            raise EmberError("a sequence appears twice in one decode batch")
        for s in seqs:
            if self._n_past[s] + 1 > self.n_ctx:
                raise ContextFullError(f"sequence {s} has filled its context of {self.n_ctx} tokens")
        tokens = token_ids([t for _, t in items], self.n_vocab)
        positions = np.array([self._n_past[s] for s in seqs], dtype=np.int32)
        out = self._run(tokens, positions, seqs, np.arange(len(items), dtype=np.int32))
        for s in seqs:
            self._n_past[s] += 1
        return out

    @property
    def graph_outputs(self) -> int:
        return min(self.n_outputs, self.n_batch)

    def _run(self, tokens, positions, seq_ids, out_rows, token_types=None) -> np.ndarray:
        """One graph run; token_types (a reranker's: 0 for the query's tokens, 1 for the document's)
        default to 0."""
        if self._token_types is None:
            return self.graph.run(tokens, positions, seq_ids, out_rows)
        types = np.zeros(len(tokens), np.int64) if token_types is None else np.asarray(token_types, np.int64)
        if types.shape != (len(tokens),) or (types.size and not 0 <= types.min() <= types.max() < len(self._token_types)):
            raise EmberError(f"token types must be one per token, each in [0, {len(self._token_types)})")
        return self.graph.run(tokens, positions, seq_ids, out_rows, [self._token_types[types]])

    # -- information -------------------------------------------------------------------------

    def memory(self) -> dict:
        """Bytes of the weights (mapped from the file), the KV cache and the activation arena."""
        weights = sum(t.n_bytes for t in self.gguf.tensors.values())
        return {"weights": weights, "kv_cache": self.graph.kv_size, "arena": self.graph.arena_size,
                "total": weights + self.graph.kv_size + self.graph.arena_size}

    def close(self) -> None:
        self.graph = None
        self.gguf.close()


def context_length(n_ctx: int | None, n_ctx_train: int) -> int:
    """The context a request for n_ctx gets: None -> the model's, capped at DEFAULT_MAX_CTX;
    0 -> the model's own; anything else as given."""
    if n_ctx is None:
        return min(n_ctx_train, DEFAULT_MAX_CTX)
    return n_ctx_train if n_ctx == 0 else n_ctx


def kv_cache_type(value: str | int | None, name: str = "type_k") -> GGMLType:
    """The KV cache type `value` names: one of KV_CACHE_TYPES by name (any case) or by ggml type
    id; None is f16. Any other type is an EmberError naming the ones ember caches."""
    if value is None:
        return GGMLType.F16
    choices = ", ".join(KV_CACHE_TYPES)
    if isinstance(value, str):
        found = KV_CACHE_TYPES.get(value.strip().lower())
        if found is None:
            what = "a KV cache type ember does not implement" if value.strip().lower() in _OTHER_CACHE_TYPES else \
                "not a KV cache type"
            raise EmberError(f"{name} {value!r} is {what}; use one of {choices}")
        return found
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        for t in KV_CACHE_TYPES.values():
            if t == value:
                return t
        known = GGMLType(value).name.lower() if value in GGMLType._value2member_map_ else f"type id {value}"
        raise EmberError(f"{name} {known} is not a KV cache type ember implements; use one of {choices} "
                         f"(ids {', '.join(str(int(t)) for t in KV_CACHE_TYPES.values())})")
    raise EmberError(f"{name} must be a type name ({choices}) or a ggml type id, got {value!r}")


def kv_cache_type_name(t: GGMLType) -> str:
    return next(name for name, v in KV_CACHE_TYPES.items() if v == t)


def token_ids(tokens: Sequence[int], n_vocab: int) -> np.ndarray:
    """Token ids as int32, each checked to be an integer in [0, n_vocab): an EmberError otherwise."""
    if isinstance(tokens, (str, bytes)):
        raise EmberError(f"token ids must be a sequence of integers, not {type(tokens).__name__}")
    try:
        ids = np.asarray(tokens)
    except (ValueError, TypeError):
        raise EmberError("token ids must be a flat sequence of integers") from None
    ids = ids.reshape(-1)
    if ids.size and ids.dtype.kind not in "iu":
        items = tokens if isinstance(tokens, (list, tuple)) else ids.tolist()
        for t in items:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise EmberError(f"token ids must be integers, got {t!r}")
            if not 0 <= t < n_vocab:
                raise EmberError(f"token id {t} is outside the vocabulary [0, {n_vocab})")
    if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        bad = int(ids[(ids < 0) | (ids >= n_vocab)][0])
        raise EmberError(f"token id {bad} is outside the vocabulary [0, {n_vocab})")
    return ids.astype(np.int32)


def _check_count(name: str, value, minimum: int = 1) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise EmberError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise EmberError(f"{name} must be {'positive' if minimum == 1 else f'>= {minimum}'}, got {value}")


def _gib(n_bytes: int) -> str:
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}" if n_bytes < 2**70 else f"{n_bytes / 2**60:.3g} EiB"
    return f"{n_bytes / 2**30:.1f} GiB"


def planned_memory(path, n_ctx: int | None = None, type_k: str | int | None = None,
                   type_v: str | int | None = None) -> dict:
    """What a model would take in memory (bytes), by building its graph: weights mapped from the
    file, the KV cache for n_ctx tokens (of type_k / type_v) and the activation arena."""
    model = Model(path, n_ctx=n_ctx, n_threads=1, type_k=type_k, type_v=type_v)
    try:
        return {"n_ctx": model.n_ctx, "type_k": kv_cache_type_name(model.type_k),
                "type_v": kv_cache_type_name(model.type_v), **model.memory()}
    finally:
        model.close()
