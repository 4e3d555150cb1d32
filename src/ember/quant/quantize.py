"""`ember quantize`: a GGUF model re-encoded with one of llama.cpp's quantization presets.

    ember quantize model-f16.gguf model-q4_k_m.gguf Q4_K_M [-t THREADS] [--allow-requantize]

Which tensor gets which type follows llama-quantize (ember.quantize_presets); the blocks are
ggml's reference quantizers', bit for bit, computed by the C++ core on all threads
(`_core.convert_rows`). Metadata is copied, with general.file_type set to the preset and
general.quantization_version to ggml's; keys and tensors are written in llama-quantize's order,
so from the same input both tools write the same bytes. The output is written tensor by tensor, a slab of rows
at a time, under a temporary name that only replaces OUT once it is complete: a failure (a full
disk, Ctrl-C) leaves no partial file behind.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ember.errors import EmberError
from ember.gguf import GGUFFile, GGUFValueType, GGUFWriter, TensorInfo, open_gguf
from ember.gguf.split import SPLIT_KEYS
from ember.gguf.types import GGMLType, tensor_bytes
from ember.quant.presets import (
    ModelShape,
    Preset,
    llama_order,
    preset_by_name,
    tensor_types,
)
from ember.sysinfo import checked_threads

T = GGMLType
QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION: the block layouts written here
# Tensor types the core can read back to F32 (the sources a tensor can be quantized from).
SOURCE_TYPES = {T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K,
                T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS}
FLOAT_TYPES = {T.F32, T.F16, T.BF16}
QUANTIZATION_VERSION_KEY, FILE_TYPE_KEY = "general.quantization_version", "general.file_type"
_SLAB_VALUES = 1 << 22  # values converted per call into the core: bounds memory, feeds the bar


class WriteError(EmberError):
    """The output could not be written (disk full, permissions)."""

    exit_code = 1


@dataclass
class QuantizeResult:
    output: Path
    preset: str
    input_bytes: int
    output_bytes: int
    types: dict[str, int]  # output tensor type name -> how many tensors have it
    seconds: float


def quantize_file(source: str | os.PathLike, output: str | os.PathLike, preset_name: str,
                  n_threads: int | None = None, allow_requantize: bool = False,
                  progress: Callable[[str, int, int], None] | None = None) -> QuantizeResult:
    """Quantize the GGUF file `source` to `output` with the preset `preset_name` (e.g. "Q4_K_M").

    `progress(tensor name, values done, values total)` is called as the work advances.
    """
    start = time.perf_counter()
    n_threads = checked_threads(n_threads)
    preset = preset_by_name(preset_name)
    source, output = Path(source), Path(output)
    _check_paths(source, output)
    with open_gguf(source) as gguf:
        types = output_types(gguf, preset)
        _check_sources(gguf, types, allow_requantize, source)
        writer = _writer(gguf, output, preset)
        _add_tensors(writer, gguf, types, n_threads, _Tracker(gguf, types, progress))
        _check_space(output, _expected_size(gguf, types))
        try:
            writer.write()
        except OSError as exc:
            raise WriteError(f"cannot write {output}: {exc.strerror or exc}") from None
        input_bytes = gguf.size
    counts = Counter(t.name for t in types.values())
    return QuantizeResult(output, preset.name, input_bytes, output.stat().st_size,
                          dict(sorted(counts.items(), key=lambda kv: -kv[1])), time.perf_counter() - start)


def output_types(gguf: GGUFFile, preset: Preset) -> dict[str, GGMLType]:
    """The type each tensor of `gguf` gets under `preset`."""
    tensors = {name: (info.type, info.shape) for name, info in gguf.tensors.items()}
    return tensor_types(tensors, preset, _model_shape(gguf))


def _model_shape(gguf: GGUFFile) -> ModelShape:
    def first(value, default=0):
        if value is None:
            return default
        return int(value[0]) if isinstance(value, (list, np.ndarray)) else int(value)
    n_head = first(gguf.field("attention.head_count", None))
    return ModelShape(arch=gguf.arch or "", n_layer=first(gguf.field("block_count", None)), n_head=n_head,
                      n_head_kv=first(gguf.field("attention.head_count_kv", None), n_head),
                      n_expert=first(gguf.field("expert_count", None)))


def _check_paths(source: Path, output: Path) -> None:
    if not source.is_file():
        raise EmberError(f"{source}: no such file")
    if output.is_dir():
        raise EmberError(f"output {output} is a directory; give a file name")
    if output.resolve() == source.resolve() or (output.exists() and os.path.samefile(output, source)):
        raise EmberError(f"output {output} is the input file; choose another output path")


def _check_sources(gguf: GGUFFile, types: dict[str, GGMLType], allow_requantize: bool, source: Path) -> None:
    changed = [info for name, info in gguf.tensors.items() if types[name] != info.type]
    unreadable = sorted({info.type.name for info in changed if info.type not in SOURCE_TYPES})
    if unreadable:
        raise EmberError(f"{source.name} has {', '.join(unreadable)} tensors, which ember cannot quantize from")
    quantized = sorted({info.type.name for info in changed if info.type not in FLOAT_TYPES})
    if quantized and not allow_requantize:
        raise EmberError(f"{source.name} is already quantized ({', '.join(quantized)} tensors); quantizing "
                         "it again loses quality, pass --allow-requantize to do it anyway")


def _writer(gguf: GGUFFile, output: Path, preset: Preset) -> GGUFWriter:
    """Metadata as llama-quantize writes it: the input's keys in order, split keys dropped, the
    quantization version and file type last."""
    writer = GGUFWriter(output)
    for key, value in gguf.metadata.items():
        if key not in SPLIT_KEYS and key not in (QUANTIZATION_VERSION_KEY, FILE_TYPE_KEY):
            writer.add(key, value, gguf.metadata_types[key])
    writer.add(QUANTIZATION_VERSION_KEY, QUANTIZATION_VERSION, GGUFValueType.UINT32)
    writer.add(FILE_TYPE_KEY, preset.file_type, GGUFValueType.UINT32)
    return writer


def _add_tensors(writer: GGUFWriter, gguf: GGUFFile, types: dict[str, GGMLType], n_threads: int,
                 tracker: _Tracker) -> None:
    """Each tensor as it is (same type) or converted while the file is written, in llama-quantize's
    order (so that its files and ember's are identical)."""
    for name in llama_order(gguf.tensors):
        info = gguf.tensors[name]
        data = info.data if types[name] == info.type else _converted(info, types[name], n_threads, tracker)
        writer.add_tensor(name, data, types[name], info.shape)


def _converted(info: TensorInfo, dst: GGMLType, n_threads: int, tracker: _Tracker) -> Callable[[], Iterator]:
    """The tensor's bytes in `dst`, produced a slab of rows at a time while the file is written."""
    from ember import _core

    def slabs() -> Iterator[np.ndarray]:
        n_per_row = info.shape[0]
        rows = info.data.reshape(-1, tensor_bytes(info.type, (n_per_row,)))
        step = max(1, _SLAB_VALUES // n_per_row)
        tracker.begin(info.name)
        for first in range(0, len(rows), step):
            slab = rows[first:first + step]
            yield _core.convert_rows(int(info.type), slab, int(dst), n_per_row, n_threads)
            tracker.advance(len(slab) * n_per_row)
    return slabs


def _expected_size(gguf: GGUFFile, types: dict[str, GGMLType]) -> int:
    return gguf.data_offset + sum(tensor_bytes(types[name], info.shape) + gguf.alignment
                                  for name, info in gguf.tensors.items())


def _check_space(output: Path, n_bytes: int) -> None:
    try:
        free = shutil.disk_usage(output.resolve().parent).free
    except OSError:
        return  # the write itself will say what is wrong
    if free < n_bytes:
        raise WriteError(f"not enough disk space for {output}: it needs {n_bytes / 2**20:.1f} MiB, "
                         f"{free / 2**20:.1f} MiB are free")


class _Tracker:
    """Counts the values converted so far (copied tensors cost nothing) for a progress callback."""

    def __init__(self, gguf: GGUFFile, types: dict[str, GGMLType], progress):
        self.total = sum(info.n_elements for name, info in gguf.tensors.items() if types[name] != info.type)
        self.done, self.name, self.progress = 0, "", progress

    def begin(self, name: str) -> None:
        self.name = name
        self._report()

    def advance(self, n_values: int) -> None:
        self.done += n_values
        self._report()

    def _report(self) -> None:
        if self.progress:
            self.progress(self.name, self.done, self.total)
