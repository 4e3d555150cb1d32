"""SmolLM3: the LLaMA decoder with no rotary embedding in every 4th layer (NoPE: layer il rotates
its queries and keys unless (il + 1) % 4 == 0). The GGUF file has no key for it: llama.cpp fixes
the period for smollm3, and the converter refuses a model whose no_rope_layers differ from it."""

from __future__ import annotations

from ember.errors import EmberError
from ember.models import llama
from ember.models.blocks import Builder, HParams

HF_ARCHITECTURES = ("SmolLM3ForCausalLM",)
NOPE_PERIOD = 4
FEATURES = (f"NoPE (no rotary embedding) in every {NOPE_PERIOD}th layer",)


def uses_rope(il: int) -> bool:
    return (il + 1) % NOPE_PERIOD != 0


def build(b: Builder) -> int:
    return llama.build_decoder(b, neox=False, rope_layers=uses_rope)


def hparams(f) -> HParams:
    return HParams.from_gguf(f)


class Converter(llama.Converter):
    arch = "smollm3"

    def __init__(self, config: dict):
        super().__init__(config)
        interval = int(config.get("no_rope_layer_interval") or NOPE_PERIOD)
        flags = config.get("no_rope_layers") or [int((il + 1) % interval != 0) for il in range(self.n_layer)]
        if [bool(f) for f in flags] != [uses_rope(il) for il in range(self.n_layer)]:
            raise EmberError(f"SmolLM3 with rotary embeddings in layers other than all but every {NOPE_PERIOD}th "
                             "(config.json no_rope_layers) is not supported: GGUF files do not record them")
        if config.get("use_sliding_window"):
            raise EmberError("SmolLM3 with sliding-window attention (use_sliding_window) is not supported")
