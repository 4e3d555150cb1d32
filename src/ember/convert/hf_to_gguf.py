"""`ember convert HF_DIR OUT.gguf --outtype f32|f16|bf16|q8_0`: a Hugging Face safetensors model
(of a class an architecture in ember.models converts: LlamaForCausalLM, Olmo2ForCausalLM, ...) to a GGUF file with
the metadata keys and tensor names llama.cpp uses, so ember and llama.cpp both run it. Mixtures of experts:
the checkpoint's one tensor per expert, or its stacked experts as transformers >= 5 holds them
(gate_up_proj, down_proj), become one 3-D tensor per layer and projection (ffn_*_exps). FP8
checkpoints (DeepSeek-V3, R1) are read dequantized (convert/checkpoint.py).

Tensor types follow llama.cpp's converter: 1-D tensors, norms and GPT-2's position embedding
stay F32; every other weight gets the output type, except Q8_0 rows whose length is not a
multiple of 32, which fall back to F16. Tensors are streamed: each is read from the mapped
safetensors file, changed (see ember.convert_arch), quantized a slab of rows at a time and
written before the next is touched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ember.convert.checkpoint import SafeTensor, open_checkpoint, read_json
from ember.convert.vocab import vocab_metadata
from ember.errors import EmberError
from ember.gguf import GGUFWriter
from ember.gguf.types import TYPES, GGMLType
from ember.models import converter_for
from ember.quant.reference import quantize

OUTTYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16, "q8_0": GGMLType.Q8_0}
# general.file_type (llama.cpp's LlamaFileType) of each output type
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}
QUANTIZATION_VERSION = 2
_SLAB_VALUES = 1 << 18  # values read and quantized at a time (bounds the temporaries)


@dataclass
class PlannedTensor:
    name: str
    type: GGMLType
    shape: tuple[int, ...]  # numpy order
    chunks: Callable[[], Iterator[np.ndarray]]  # the tensor's bytes, a slab at a time


def convert(hf_dir: str | Path, output: str | Path, outtype: str = "f16") -> Path:
    """Convert the Hugging Face model folder `hf_dir` to the GGUF file `output`; returns its path."""
    if outtype not in OUTTYPES:
        raise EmberError(f"unknown output type {outtype!r} (choose {', '.join(OUTTYPES)})")
    ckpt = open_checkpoint(hf_dir)
    converter = converter_for(ckpt.architecture, ckpt.config)
    if hasattr(converter, "read_folder"):  # optional: what the folder says beyond config.json
        converter.read_folder(ckpt.path)
    writer = GGUFWriter(output, converter.arch)
    writer.add("general.type", "model")
    writer.add("general.name", ckpt.path.resolve().name)
    for key, value in converter.metadata().items():
        writer.add(key, value)
    writer.add("general.file_type", FILE_TYPES[outtype])
    writer.add("general.quantization_version", QUANTIZATION_VERSION)
    for key, value in pooling_metadata(ckpt.path, converter.arch).items():
        writer.add(key, value)
    for key, value in vocab_metadata(ckpt.path, converter.arch, ckpt.config).items():
        writer.add(key, value)
    for tensor in plan_tensors(ckpt, converter, OUTTYPES[outtype]):
        writer.add_tensor(tensor.name, tensor.chunks, tensor.type, tuple(reversed(tensor.shape)))
    return writer.write()


# sentence-transformers pooling modes -> llama.cpp's pooling types (<arch>.pooling_type)
_POOLING = {"mean": 1, "cls": 2, "lasttoken": 3}


def pooling_metadata(path: Path, arch: str) -> dict[str, int]:
    """<arch>.pooling_type from a sentence-transformers folder (modules.json names a Pooling module
    whose config.json says how), as llama.cpp's converter reads it; {} for a plain checkpoint."""
    modules = path / "modules.json"
    if not modules.is_file():
        return {}
    try:
        listed = json.loads(modules.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EmberError(f"cannot read {modules}: {exc}") from None
    listed = listed if isinstance(listed, list) else []
    folder = next((m.get("path", "") for m in listed
                   if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling")), None)
    if folder is None:
        return {}
    config = read_json(path / folder / "config.json")
    for mode, flag in (("mean", "pooling_mode_mean_tokens"), ("cls", "pooling_mode_cls_token"),
                       ("lasttoken", "pooling_mode_lasttoken")):
        if config.get(flag):
            return {f"{arch}.pooling_type": _POOLING[mode]}
    if config.get("pooling_mode") in _POOLING:
        return {f"{arch}.pooling_type": _POOLING[config["pooling_mode"]]}
    raise EmberError(f"{path / folder / 'config.json'}: only mean, CLS and last-token pooling are supported")


def plan_tensors(ckpt, converter, outtype: GGMLType) -> list[PlannedTensor]:
    extra = converter.extra_tensors()
    if hasattr(converter, "merged_tensors"):  # optional (hf.py): tensors made of several of the checkpoint's
        extra += converter.merged_tensors(ckpt.tensors)
    planned = [_planned_array(name, values, outtype) for name, values in extra]
    split = getattr(converter, "split", None)  # converters over DecoderConverter have it
    experts: dict[str, dict[int, SafeTensor]] = {}
    for hf_name, source in ckpt.tensors.items():
        expert = converter.expert(hf_name) if hasattr(converter, "expert") else None
        if expert is not None:
            name, index = expert
            experts.setdefault(name, {})[index] = source
            continue
        parts = split(hf_name, tuple(source.shape)) if split else None
        if parts is not None:
            planned.extend(_planned_part(name, source, part, shape, outtype) for name, part, shape in parts)
            continue
        name = converter.gguf_name(hf_name)
        if name is not None:
            planned.append(_planned_tensor(name, hf_name, source, converter, outtype))
    planned.extend(_planned_experts(name, sources, outtype) for name, sources in experts.items())
    names = [t.name for t in planned]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise EmberError(f"two checkpoint tensors map to {duplicate}")
    if "token_embd.weight" not in names:
        raise EmberError(f"{ckpt.path} has no token embedding tensor; is the checkpoint complete?")
    return planned


def tensor_type(name: str, shape: tuple[int, ...], outtype: GGMLType) -> GGMLType:
    """llama.cpp's choice: F32 for 1-D tensors, norms, biases, position embeddings and the expert
    routers; else outtype."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return GGMLType.F32
    if name == "position_embd.weight" or name.endswith(("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")):
        return GGMLType.F32
    if shape[-1] % TYPES[outtype].block_size:
        return GGMLType.F16  # Q8_0 needs rows of whole 32-value blocks
    return outtype


def _planned_tensor(name: str, hf_name: str, source: SafeTensor, converter, outtype: GGMLType) -> PlannedTensor:
    if not source.is_float:
        raise EmberError(f"tensor {hf_name} has dtype {source.dtype}; ember converts floating-point weights")
    shape = converter.shape_after(hf_name, source.shape)
    kind = tensor_type(name, shape, outtype)
    if converter.transforms(hf_name):
        # the change needs the whole tensor (it permutes or transposes rows): read it once, here
        def chunks():
            values = converter.transform(hf_name, source.numpy())
            return _slabs(lambda start, stop: values[start:stop], shape, kind)
    else:
        def chunks():
            return _slabs(source.rows, shape, kind)
    return PlannedTensor(name, kind, shape, chunks)


def _planned_part(name: str, source: SafeTensor, part: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...],
                  outtype: GGMLType) -> PlannedTensor:
    """One of the tensors a checkpoint tensor is split into (DeepSeek's kv_b_proj: attn_k_b and attn_v_b)."""
    if not source.is_float:
        raise EmberError(f"tensor {source.name} has dtype {source.dtype}; ember converts floating-point weights")
    kind = tensor_type(name, shape, outtype)

    def chunks():
        values = np.ascontiguousarray(part(source.numpy()))
        return _slabs(lambda start, stop: values[start:stop], shape, kind)

    return PlannedTensor(name, kind, shape, chunks)


def _planned_experts(name: str, sources: dict[int, SafeTensor], outtype: GGMLType) -> PlannedTensor:
    """One expert matrix per checkpoint tensor, stacked into the 3-D GGUF tensor (numpy order
    [expert, rows, row length]), read and converted one expert at a time."""
    n_expert = len(sources)
    if sorted(sources) != list(range(n_expert)):
        missing = sorted(set(range(max(sources) + 1)) - set(sources))
        raise EmberError(f"the checkpoint lacks expert {missing[0]} of {name}")
    shapes = {tuple(t.shape) for t in sources.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise EmberError(f"the experts of {name} are not matrices of one shape ({sorted(shapes)})")
    for t in sources.values():
        if not t.is_float:
            raise EmberError(f"tensor {t.name} has dtype {t.dtype}; ember converts floating-point weights")
    shape = next(iter(shapes))
    kind = tensor_type(name, (n_expert, *shape), outtype)

    def chunks():
        for index in range(n_expert):
            yield from _slabs(sources[index].rows, shape, kind)

    return PlannedTensor(name, kind, (n_expert, *shape), chunks)


def _planned_array(name: str, values: np.ndarray, outtype: GGMLType) -> PlannedTensor:
    kind = tensor_type(name, values.shape, outtype)
    return PlannedTensor(name, kind, values.shape, lambda: _slabs(lambda a, b: values[a:b], values.shape, kind))


def _slabs(read_rows: Callable[[int, int], np.ndarray], shape: tuple[int, ...], kind: GGMLType) -> Iterator[np.ndarray]:
    """The tensor's bytes in `kind`, converted a slab of rows (first numpy axis) at a time."""
    n_rows = shape[0] if shape else 1
    row_values = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    step = max(1, _SLAB_VALUES // max(1, row_values))
    for start in range(0, n_rows, step):
        yield quantize(read_rows(start, start + step), kind)
