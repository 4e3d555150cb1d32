"""StarCoder 2: the pre-norm decoder with LayerNorm (weight and bias), rotary attention (GQA,
NeoX layout) with biases on every projection, and a GELU (tanh) MLP with biases; the LM head is
tied to the embedding unless the file has output.weight. Hugging Face's sliding_window is not
written by llama.cpp's converter and so not by ember's: both attend to the whole context."""

from __future__ import annotations

from typing import Any, ClassVar

from ember.errors import EmberError
from ember.models.blocks import Builder, HParams
from ember.models.hf import DECODER_LAYER, DecoderConverter, get

HF_ARCHITECTURES = ("Starcoder2ForCausalLM",)
FEATURES = ("LayerNorm with bias", "GELU MLP", "biases")


def build(b: Builder) -> int:
    g = b.g
    x = g.get_rows(b.weight("token_embd.weight"))
    for il in range(b.hp.n_layer):
        p = f"blk.{il}"
        h = b.layer_norm(x, f"{p}.attn_norm")
        q, k = b.rope_qk(b.linear(h, f"{p}.attn_q"), b.linear(h, f"{p}.attn_k"), True)
        v = b.linear(h, f"{p}.attn_v")
        x = g.add(x, b.linear(b.attention(q, k, v, window=b.hp.sliding_window), f"{p}.attn_output"))
        h = b.layer_norm(x, f"{p}.ffn_norm")
        x = g.add(x, b.linear(g.gelu(b.linear(h, f"{p}.ffn_up")), f"{p}.ffn_down"))
    x = b.layer_norm(g.select_outputs(x), "output_norm")
    return b.lm_head(x)


def hparams(f) -> HParams:
    return HParams.from_gguf(f, default_eps_key="attention.layer_norm_epsilon")


class Converter(DecoderConverter):
    arch = "starcoder2"
    layer_names: ClassVar[dict[str, str]] = {
        **{k: v for k, v in DECODER_LAYER.items() if not k.startswith("mlp.")},
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    }

    def __init__(self, config: dict):
        super().__init__(config)
        activation = config.get("hidden_act", "gelu_pytorch_tanh")
        if activation not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
            raise EmberError(f"StarCoder 2 with activation {activation!r} is not supported (ember runs tanh GELU)")

    def metadata(self) -> dict[str, Any]:
        a = self.arch
        meta = super().metadata()
        for key in ("vocab_size", "rope.dimension_count", "attention.layer_norm_rms_epsilon"):
            del meta[f"{a}.{key}"]
        meta[f"{a}.attention.layer_norm_epsilon"] = float(get(self.config, "norm_epsilon", default=1e-5))
        return meta
