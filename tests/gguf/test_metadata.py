"""Metadata values read as the kind they must be (gguf/metadata.py): anything else is a GGUFError
naming the key and showing, in short, what the file holds."""

from __future__ import annotations

import numpy as np
import pytest

from ember.errors import GGUFError
from ember.gguf.metadata import bool_key, float_key, int_key, numeric_array_key, string_array_key, string_key
from ember.gguf.strings import StringArray, string_table

META = {"n": 7, "big": 2**40, "neg": -3, "f": 0.25, "nan": float("nan"), "s": "text", "b": True,
        "arr": np.arange(100, dtype=np.int32), "layers": np.full(3, 5, np.uint32), "mixed": np.array([1, 2]),
        "floats": np.array([0.5, 1.5], np.float32), "strs": StringArray(*string_table(["a", "b"]))}


def test_values_of_the_right_kind_are_read():
    assert int_key(META, "n") == 7 and int_key(META, "missing", 3) == 3 and int_key(META, "layers", per_layer=True) == 5
    assert float_key(META, "f", 1.0) == 0.25 and float_key(META, "n", 1.0) == 7.0 and float_key(META, "x", 2.0) == 2.0
    assert string_key(META, "s") == "text" and string_key(META, "x", "d") == "d"
    assert bool_key(META, "b", False) is True and bool_key({"k": 0}, "k", True) is False
    assert numeric_array_key(META, "floats").tolist() == [0.5, 1.5]
    assert numeric_array_key({"k": [1, 2]}, "k", "iu").tolist() == [1, 2]
    assert list(string_array_key(META, "strs")) == ["a", "b"] and string_array_key({"k": ["x"]}, "k") == ["x"]


@pytest.mark.parametrize("read, match", [
    (lambda: int_key(META, "missing"), "metadata key missing is missing from the model file"),
    (lambda: int_key(META, "arr"), r"arr must be an integer, the file has an array \(\[0, 1, 2, 3, 4, 5, 6, 7, \.\.\.\]\)"),
    (lambda: int_key(META, "s"), "s must be an integer, the file has a string"),
    (lambda: int_key(META, "b"), "b must be an integer, the file has a bool"),
    (lambda: int_key(META, "f"), "f must be an integer, the file has float"),
    (lambda: int_key(META, "big"), r"big is 1099511627776, outside \[1, 2147483647\]"),
    (lambda: int_key(META, "neg", minimum=0), r"neg is -3, outside \[0, "),
    (lambda: int_key(META, "mixed", per_layer=True), r"mixed differs between layers \(\[1, 2\]\)"),
    (lambda: float_key(META, "nan", 1.0), "nan is nan; it must be finite"),
    (lambda: float_key(META, "neg", 1.0, positive=True), "neg is -3.0; it must be finite > 0"),
    (lambda: float_key(META, "s", 1.0), "s must be a number, the file has a string"),
    (lambda: string_key(META, "n"), "n must be a string, the file has int"),
    (lambda: bool_key(META, "n", True), "n must be a bool, the file has int"),
    (lambda: bool_key(META, "arr", True), "arr must be a bool, the file has an array"),
    (lambda: numeric_array_key(META, "s"), "s must be an array of numbers, the file has a string"),
    (lambda: numeric_array_key(META, "floats", "iu"), "floats must be an array of integers"),
    (lambda: numeric_array_key(META, "strs"), "strs must be an array of numbers, the file has an array"),
    (lambda: string_array_key(META, "arr"), "arr must be an array of strings, the file has an array"),
    (lambda: string_array_key({"k": ["a", 1]}, "k"), "k must be an array of strings"),
])
def test_a_value_of_another_kind_is_an_error_naming_the_key(read, match):
    with pytest.raises(GGUFError, match=match):
        read()
