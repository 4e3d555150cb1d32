"""Quantization: numpy reference (de)quantizers (the oracle), llama.cpp's presets, and
`ember quantize`'s file rewriting."""
