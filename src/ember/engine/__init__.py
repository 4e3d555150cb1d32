"""The runtime: a model's graph and KV cache (runtime.py), sampling, the generation loop, and
load.py, the one place that turns a model name into model + tokenizer + chat template."""
