"""An architecture's forward pass against transformers (CPU torch): a tiny random model made
here, saved as safetensors, converted by `ember convert` to F32 and run by ember, gives the
logits transformers gives on a 40-token input, in one pass and token by token through the
KV cache.

What is asserted: max |ember - reference| <= 1e-4 * max |reference| over all 40 x n_vocab
logits, the reference being transformers run in float64. ember keeps its KV cache in F16 (as
llama.cpp does by default), so the reference rounds K and V to F16 at the point ember caches
them (after RoPE and the Q/K norms), through a registered attention function; nothing else of
transformers is changed. Against plain transformers (float64, no rounding) the bound is 1e-3:
the F16 cache alone moves the logits by 1.5e-4 to 5.5e-4 of their maximum on these models.
Every parameter, biases and norms included, is drawn at random, so a weight the converter drops
or misplaces changes the logits.

An architecture's test file (tests/models/test_<arch>.py) subclasses `TransformersParity` with
its Hugging Face model class and a few configurations that switch on every feature of the family;
tests/models/conftest.py runs each test once per configuration.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ember.convert import convert  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402

N_TOKENS = 40
RTOL = 1e-4
RTOL_PLAIN = 1e-3
WEIGHT_STD = 0.05
F16_KV = "ember_f16_kv"


def register_f16_kv_attention() -> None:
    """sdpa attention whose K and V are rounded to F16 first, as ember's KV cache stores them."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, *args, **kwargs):
        key, value = key.half().to(key.dtype), value.half().to(value.dtype)
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(F16_KV, attention)
    AttentionMaskInterface.register(F16_KV, sdpa_mask)


def randomize(model, norm_offset: float = 1.0) -> None:
    """Every parameter random: weights and biases N(0, s^2); norm scales norm_offset + N(0, s^2)
    (Gemma stores the offset from 1: norm_offset 0); s = WEIGHT_STD."""
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * WEIGHT_STD)
            is_norm = "norm" in name or ".ln_" in name
            if is_norm and name.endswith("weight"):
                param.add_(norm_offset)


def relative_error(got: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(got - reference).max() / np.abs(reference).max())


def build_tiny(case: type, config_name: str, tmp_path_factory):
    """For one configuration of a TransformersParity subclass: (ember Model on the converted F32
    file, float64 reference logits with F16 K/V, plain float64 reference logits, token ids)."""
    config = case.configs[config_name]()
    torch.manual_seed(0)
    model = getattr(transformers, case.model_class)(config).eval()
    randomize(model, case.norm_offset)
    hf_dir = tmp_path_factory.mktemp(config_name) / "hf"
    model.save_pretrained(hf_dir, safe_serialization=True)
    gguf_path = convert(hf_dir, hf_dir.parent / f"{config_name}-f32.gguf", "f32")

    tokens = np.random.default_rng(7).integers(0, config.vocab_size, N_TOKENS)
    ids = torch.tensor(tokens)[None]
    register_f16_kv_attention()
    with torch.no_grad():
        model.double()
        model.set_attn_implementation("sdpa")
        plain = model(ids).logits[0].numpy()
        model.set_attn_implementation(F16_KV)
        reference = model(ids).logits[0].numpy()
    return Model(gguf_path, n_ctx=64, n_threads=2), reference, plain, tokens


class TransformersParity:
    """The shared tests; a subclass sets `model_class` (a transformers class name), `configs`
    ({name: () -> config}) and, where the family stores norms as offsets from 1, `norm_offset`;
    the `tiny` fixture (tests/models/conftest.py) builds each configuration once."""

    model_class: str = ""
    configs: dict = {}
    norm_offset: float = 1.0

    def test_one_pass_logits_equal_transformers(self, tiny):
        model, reference, _, tokens = tiny
        model.reset()
        logits = model.eval(tokens.tolist(), logits="all")
        assert logits.shape == reference.shape
        assert relative_error(logits, reference) <= RTOL

    def test_token_by_token_logits_through_kv_cache_equal_transformers(self, tiny):
        model, reference, _, tokens = tiny
        model.reset()
        logits = np.stack([model.eval([int(t)], logits="last") for t in tokens])
        assert relative_error(logits, reference) <= RTOL

    def test_logits_near_transformers_without_f16_rounding(self, tiny):
        model, _, plain, tokens = tiny
        model.reset()
        logits = model.eval(tokens.tolist(), logits="all")
        assert relative_error(logits, plain) <= RTOL_PLAIN
        assert (logits.argmax(axis=1) == plain.argmax(axis=1)).mean() >= 0.95
