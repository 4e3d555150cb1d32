"""Hugging Face safetensors checkpoints -> GGUF, named and laid out as llama.cpp's converter
writes them: the checkpoint reader, the architecture mappings (beside each model, in
ember.models) and the vocabulary."""

from ember.convert.hf_to_gguf import convert

__all__ = ["convert"]
