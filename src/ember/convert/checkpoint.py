"""A Hugging Face model directory: config.json and the safetensors files its weights are in.

    ckpt = open_checkpoint("SmolLM2-135M")              # reads config.json only
    ckpt.config["hidden_size"], ckpt.architecture
    t = ckpt.tensors["model.embed_tokens.weight"]     # maps the weights on first use
    t.dtype, t.shape, t.rows(0, 64)                   # float32 copy of rows [0, 64)

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and [begin, end) byte range after the header, then the data. Every file is
memory-mapped; a tensor's values are converted to float32 a slab of rows at a time, so nothing
is read whole and nothing is held twice.

FP8 checkpoints (DeepSeek-V3 and R1: config quantization_config {"quant_method": "fp8",
"weight_block_size": [128, 128]}) store a matrix as F8_E4M3 values and, beside it, `NAME_scale_inv`
(F32, one factor per block of rows x columns); the matrix reads as value x factor of its block,
and the factors are no tensor of their own.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ember.errors import EmberError

# safetensors dtype -> numpy dtype of the stored values (BF16 as its raw 16-bit pattern)
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8"),
           "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
           "U8": np.dtype("u1"), "BOOL": np.dtype("?"), "F8_E4M3": np.dtype("u1")}
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64", "F8_E4M3")
SCALE_SUFFIX = "_scale_inv"


def _e4m3_values() -> np.ndarray:
    """float32 of each F8_E4M3 (e4m3fn) byte: sign, 4 exponent bits (bias 7), 3 mantissa bits;
    exponent 0 is subnormal, S.1111.111 is NaN, there is no infinity."""
    byte = np.arange(256)
    exponent, mantissa = (byte >> 3) & 15, byte & 7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    values = np.where(byte & 128, -magnitude, magnitude).astype(np.float32)
    values[[127, 255]] = np.nan
    return values


_E4M3 = _e4m3_values()
_MAX_HEADER = 100 << 20


@dataclass(eq=False)
class SafeTensor:
    name: str
    dtype: str  # "F32", "F16", "BF16", "F64" (integer buffers are listed but cannot be read as weights)
    shape: tuple[int, ...]
    raw: np.ndarray  # the stored values (read-only, mapped), numpy shape
    scale: SafeTensor | None = None  # an F8_E4M3 matrix's block factors (NAME_scale_inv) ...
    block: tuple[int, int] = (128, 128)  # ... one per block of rows x columns

    @property
    def is_float(self) -> bool:
        return self.dtype in _FLOAT_DTYPES

    def rows(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) along the first axis as float32 (a copy); a scalar as shape (1,)."""
        if not self.is_float:
            raise EmberError(f"tensor {self.name} has dtype {self.dtype}; ember converts floating-point weights")
        raw = self.raw.reshape(1) if not self.shape else self.raw[start:stop]
        if self.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        if self.dtype == "F8_E4M3":
            values = _E4M3[raw]
            return values if self.scale is None else values * self._block_factors(start, start + len(values))
        return raw.astype(np.float32)

    def _block_factors(self, start: int, stop: int) -> np.ndarray:
        """The scale factor of each value of rows [start, stop), its block's."""
        scale = self.scale.numpy()
        return scale[np.arange(start, stop) // self.block[0]][:, np.arange(self.shape[1]) // self.block[1]]

    def numpy(self) -> np.ndarray:
        """All values as float32."""
        return self.rows(0, None)


@dataclass
class Checkpoint:
    path: Path
    config: dict

    @property
    def architecture(self) -> str | None:
        names = self.config.get("architectures") or [None]
        return names[0]

    @cached_property
    def tensors(self) -> dict[str, SafeTensor]:
        tensors: dict[str, SafeTensor] = {}
        for file in _safetensors_files(self.path):
            for tensor in read_safetensors(file):
                if tensor.name in tensors:
                    raise EmberError(f"tensor {tensor.name} appears in two safetensors files")
                tensors[tensor.name] = tensor
        block = self.fp8_block
        for name in [n for n in tensors if n.endswith(SCALE_SUFFIX)]:
            weight = tensors.get(name.removesuffix(SCALE_SUFFIX))
            if weight is not None and weight.dtype == "F8_E4M3":
                weight.scale, weight.block = _checked_scale(tensors.pop(name), weight, block), block
        return tensors

    @property
    def fp8_block(self) -> tuple[int, int]:
        """quantization_config's weight_block_size (rows, columns of one scale factor's block)."""
        quant = self.config.get("quantization_config") or {}
        block = quant.get("weight_block_size", [128, 128]) if isinstance(quant, dict) else [128, 128]
        if (not isinstance(block, list) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise EmberError(f"config.json quantization_config weight_block_size is {block!r}, not [rows, columns]")
        return block[0], block[1]


def _checked_scale(scale: SafeTensor, weight: SafeTensor, block: tuple[int, int]) -> SafeTensor:
    """An FP8 matrix's block factors: F32 or BF16, one per block of the matrix."""
    if len(weight.shape) != 2:
        raise EmberError(f"{weight.name} has shape {list(weight.shape)}; ember reads FP8 block factors of matrices")
    expected = tuple(-(-n // b) for n, b in zip(weight.shape, block))
    if scale.dtype not in ("F32", "BF16") or tuple(scale.shape) != expected:
        raise EmberError(f"{scale.name} ({scale.dtype}, shape {list(scale.shape)}) is not the F32 {list(expected)} "
                         f"factors of the {list(weight.shape)} matrix {weight.name} in {block[0]}x{block[1]} blocks")
    return scale


def open_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    if not path.is_dir():
        raise EmberError(f"{path} is not a directory (expected a Hugging Face model folder)")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise EmberError(f"{path} has no config.json; is it a Hugging Face model folder?")
    return Checkpoint(path, read_json(config_path))


def read_json(path: Path) -> dict:
    """A JSON file holding an object; EmberError naming the file otherwise."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EmberError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise EmberError(f"{path} does not hold a JSON object")
    return value


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise EmberError(f"{index} has no weight_map")
        files = [path / name for name in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise EmberError(f"{path} lacks the weight files its index names: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        other = [f.name for f in path.glob("*.bin")] + [f.name for f in path.glob("*.pth")]
        hint = f" (found {other[0]}: only safetensors weights can be converted)" if other else ""
        raise EmberError(f"{path} has no .safetensors weights{hint}")
    return files


def read_safetensors(file: Path) -> list[SafeTensor]:
    """The tensors of one safetensors file, mapped; raises EmberError if the header is invalid."""
    with open(file, "rb") as f:
        size = f.seek(0, 2)
        if size < 8:
            raise EmberError(f"{file}: not a safetensors file (too short)")
        f.seek(0)
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(_MAX_HEADER, size - 8):
            raise EmberError(f"{file}: header length {header_len} is out of bounds")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EmberError(f"{file}: header is not valid JSON ({exc})") from None
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + header_len else b""
    data = np.frombuffer(mapped, np.uint8)[8 + header_len:]
    if not isinstance(header, dict):
        raise EmberError(f"{file}: header is not a JSON object")
    return [_tensor(file, name, info, data) for name, info in header.items() if name != "__metadata__"]


def _tensor(file: Path, name: str, info, data: np.ndarray) -> SafeTensor:
    if not isinstance(info, dict):
        raise EmberError(f"{file}: tensor {name} has no dtype/shape/offsets")
    dtype = info.get("dtype")
    if dtype not in _DTYPES:
        raise EmberError(f"{file}: tensor {name} has dtype {dtype}; ember converts F32, F16, BF16, F64 and F8_E4M3 weights")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)):
        raise EmberError(f"{file}: tensor {name} has a malformed shape or data_offsets")
    begin, end = offsets
    n_bytes = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
    if not 0 <= begin <= end <= data.size or end - begin != n_bytes:
        raise EmberError(f"{file}: tensor {name} data [{begin}, {end}) does not fit its shape {shape} "
                         f"or the file ({data.size} bytes of data)")
    raw = data[begin:end].view(_DTYPES[dtype]).reshape(shape)
    return SafeTensor(name, dtype, tuple(shape), raw)
