"""GPT-2 against transformers: learned positions, fused QKV, LayerNorm with biases, tied LM head."""

import transformers
from parity import TransformersParity


class TestGPT2(TransformersParity):
    model_class = "GPT2LMHeadModel"
    configs = {
        # n_ctx: llama.cpp's GPT-2 converter reads the context from it
        "gpt2": lambda: transformers.GPT2Config(vocab_size=384, n_embd=128, n_layer=3, n_head=4, n_positions=128,
                                                n_ctx=128),
    }
