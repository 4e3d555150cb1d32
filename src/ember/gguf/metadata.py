"""Metadata values read as the kind they must be: an integer key holding an array, a string, a
float or a bool, a float that is NaN, a count out of range, is a GGUFError naming the key and
what the file holds, never a TypeError or a nonsense value further on.

The reader gives ints, floats, bools and strs for scalars, numpy arrays for numeric arrays,
StringArray for arrays of strings (see reader.py); these check one value each.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ember.errors import GGUFError
from ember.gguf.strings import StringArray

INT32_MAX = 2**31 - 1
REQUIRED = object()  # the default of a key that must be present


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (bool, np.bool_)):
        return "a bool"
    if isinstance(value, (list, tuple, np.ndarray)) or hasattr(value, "__len__"):
        return "an array"
    return type(value).__name__


def _integer(key: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise GGUFError(f"metadata key {key} must be an integer, the file has {_kind(value)} ({_shown(value)})")
    return int(value)


def _shown(value: Any) -> str:
    if isinstance(value, np.ndarray):
        text = repr(value[:8].tolist())[:-1] + (", ...]" if value.size > 8 else "]")
    elif isinstance(value, (list, tuple)):
        text = repr(list(value[:8]))[:-1] + (", ...]" if len(value) > 8 else "]")
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def int_key(metadata: Mapping[str, Any], key: str, default: Any = REQUIRED, *, minimum: int = 1,
            maximum: int = INT32_MAX, per_layer: bool = False) -> int:
    """An integer metadata value in [minimum, maximum]. per_layer: an array of one value per layer
    is accepted when all its values are equal (ember runs uniform layers)."""
    value = metadata.get(key)
    if value is None:
        if default is REQUIRED:
            raise GGUFError(f"metadata key {key} is missing from the model file")
        return default
    if per_layer and isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        values = set(value.tolist())
        if len(values) != 1:
            raise GGUFError(f"metadata key {key} differs between layers ({_shown(value)}), "
                            "which ember does not support")
        value = values.pop()
    number = _integer(key, value)
    if not minimum <= number <= maximum:
        raise GGUFError(f"metadata key {key} is {number}, outside [{minimum}, {maximum}]")
    return number


def float_key(metadata: Mapping[str, Any], key: str, default: float, *, positive: bool = False,
              non_negative: bool = False) -> float:
    """A finite number (integer or float) from the metadata, or default when absent."""
    value = metadata.get(key)
    if value is None:
        return float(default)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise GGUFError(f"metadata key {key} must be a number, the file has {_kind(value)} ({_shown(value)})")
    number = float(value)
    if not math.isfinite(number) or (positive and number <= 0) or (non_negative and number < 0):
        need = " > 0" if positive else " >= 0" if non_negative else ""
        raise GGUFError(f"metadata key {key} is {number}; it must be finite{need}")
    return number


def string_key(metadata: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = metadata.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise GGUFError(f"metadata key {key} must be a string, the file has {_kind(value)} ({_shown(value)})")
    return value


def bool_key(metadata: Mapping[str, Any], key: str, default: bool) -> bool:
    """A flag: a bool, or an integer 0 / 1 as some converters write it."""
    value = metadata.get(key)
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise GGUFError(f"metadata key {key} must be a bool, the file has {_kind(value)} ({_shown(value)})")


def numeric_array_key(metadata: Mapping[str, Any], key: str, kinds: str = "iuf") -> np.ndarray | None:
    """A 1-D array of numbers (numpy dtype kind in `kinds`: i, u for integers, f for floats), or None."""
    value = metadata.get(key)
    if value is None:
        return None
    array = np.asarray(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if array is None or array.ndim != 1 or (array.size and array.dtype.kind not in kinds):
        wanted = "integers" if "f" not in kinds else "numbers"
        raise GGUFError(f"metadata key {key} must be an array of {wanted}, the file has {_kind(value)} "
                        f"({_shown(value)})")
    return array


def string_array_key(metadata: Mapping[str, Any], key: str) -> StringArray | list[str] | None:
    """An array of strings (a StringArray, or a list of str), or None."""
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, StringArray) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
        return value
    raise GGUFError(f"metadata key {key} must be an array of strings, the file has {_kind(value)} ({_shown(value)})")
