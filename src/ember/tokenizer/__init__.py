"""Tokenizers from a GGUF vocabulary (BPE, SentencePiece), token-for-token llama.cpp's, and chat
templates in a sandbox."""

from ember.tokenizer.tokenizer import StreamDecoder, Tokenizer

__all__ = ["StreamDecoder", "Tokenizer"]
