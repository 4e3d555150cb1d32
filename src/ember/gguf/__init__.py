"""GGUF files: the format's constants, the one table of tensor types, an mmap reader that
validates every size and offset (joining the parts of split models), and a writer."""

from ember.gguf.format import GGUFValueType
from ember.gguf.reader import GGUFFile, TensorInfo
from ember.gguf.split import open_gguf
from ember.gguf.strings import StringArray
from ember.gguf.writer import GGUFWriter

__all__ = ["GGUFFile", "GGUFValueType", "GGUFWriter", "StringArray", "TensorInfo", "open_gguf"]
