"""Each architecture's forward pass equals transformers' (CPU torch): a tiny random model made
here, saved as safetensors, converted by `ember convert` to F32 and run by ember, gives the
logits transformers gives on a 40-token input, in one pass and token by token through the
KV cache.

What is asserted: max |ember - reference| <= 1e-4 * max |reference| over all 40 x n_vocab
logits, the reference being transformers run in float64. ember keeps its KV cache in F16 (as
llama.cpp does by default), so the reference rounds K and V to F16 at the point ember caches
them (after RoPE and the Q/K norms), through a registered attention function; nothing else of
transformers is changed. Against plain transformers (float64, no rounding) the bound is 1e-3:
the F16 cache alone moves the logits by 1.5e-4 to 5.5e-4 of their maximum on these models.

The configurations exercise GQA (fewer KV heads than heads), tied and untied embeddings, bias
terms (Qwen2's Q/K/V, Llama's attention_bias and mlp_bias), linear and Llama 3 RoPE scaling,
head_dim != hidden/heads, and Gemma 3's sliding window (8, shorter than the input) mixed with
global layers. Every parameter, biases and norms included, is drawn at random, so a weight the
converter drops or misplaces changes the logits.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ember.convert.hf_to_gguf import convert  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402

N_TOKENS = 40
RTOL = 1e-4
RTOL_PLAIN = 1e-3
WEIGHT_STD = 0.05
F16_KV = "ember_f16_kv"

CONFIGS = {
    # GQA, untied LM head, linear RoPE scaling
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        tie_word_embeddings=False),
    # tied LM head, biases on attention and MLP, Llama 3 RoPE scaling, head_dim != hidden/heads
    "llama-bias-llama3-rope": lambda: transformers.LlamaConfig(
        vocab_size=320, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16}),
    # Q/K/V biases, GQA, tied LM head
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=384, hidden_size=128, intermediate_size=320, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True),
    # sliding window 8 < 40 tokens on layers 0, 1, 3; global layer 2 with linear RoPE scaling;
    # query_pre_attn_scalar != head_dim
    "gemma3": lambda: transformers.Gemma3TextConfig(
        vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=48, query_pre_attn_scalar=64,
        max_position_embeddings=256, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    # learned positions, fused QKV, tied LM head
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=384, n_embd=128, n_layer=3, n_head=4, n_positions=128),
}
MODEL_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
                 "gpt2": "GPT2LMHeadModel"}


def _register_f16_kv_attention():
    """sdpa attention whose K and V are rounded to F16 first, as ember's KV cache stores them."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, *args, **kwargs):
        key, value = key.half().to(key.dtype), value.half().to(value.dtype)
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(F16_KV, attention)
    AttentionMaskInterface.register(F16_KV, sdpa_mask)


def _randomize(model, gemma_norms: bool) -> None:
    """Every parameter random: weights and biases N(0, s^2); norm scales 1 + N(0, s^2) (Gemma
    stores the offset from 1, so there just N(0, s^2)); s = WEIGHT_STD."""
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * WEIGHT_STD)
            is_norm = "norm" in name or ".ln_" in name
            if is_norm and name.endswith("weight") and not gemma_norms:
                param.add_(1.0)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory):
    """(ember Model on the converted F32 file, float64 reference logits with F16 K/V, plain float64
    reference logits, token ids)."""
    name = request.param
    arch = name.split("-")[0]
    config = CONFIGS[name]()
    torch.manual_seed(0)
    model = getattr(transformers, MODEL_CLASSES[arch])(config).eval()
    _randomize(model, gemma_norms=arch == "gemma3")
    hf_dir = tmp_path_factory.mktemp(name) / "hf"
    model.save_pretrained(hf_dir, safe_serialization=True)
    gguf_path = convert(hf_dir, hf_dir.parent / f"{name}-f32.gguf", "f32")

    tokens = np.random.default_rng(7).integers(0, config.vocab_size, N_TOKENS)
    ids = torch.tensor(tokens)[None]
    _register_f16_kv_attention()
    with torch.no_grad():
        model.double()
        model.set_attn_implementation("sdpa")
        plain = model(ids).logits[0].numpy()
        model.set_attn_implementation(F16_KV)
        reference = model(ids).logits[0].numpy()
    ember_model = Model(gguf_path, n_ctx=64, n_threads=2)
    yield ember_model, reference, plain, tokens
    ember_model.close()


def _relative_error(got: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(got - reference).max() / np.abs(reference).max())


def test_one_pass_logits_equal_transformers(tiny):
    model, reference, _, tokens = tiny
    model.reset()
    logits = model.eval(tokens.tolist(), logits="all")
    assert logits.shape == reference.shape
    assert _relative_error(logits, reference) <= RTOL


def test_token_by_token_logits_through_kv_cache_equal_transformers(tiny):
    model, reference, _, tokens = tiny
    model.reset()
    logits = np.stack([model.eval([int(t)], logits="last") for t in tokens])
    assert _relative_error(logits, reference) <= RTOL


def test_logits_near_transformers_without_f16_rounding(tiny):
    model, _, plain, tokens = tiny
    model.reset()
    logits = model.eval(tokens.tolist(), logits="all")
    assert _relative_error(logits, plain) <= RTOL_PLAIN
    assert (logits.argmax(axis=1) == plain.argmax(axis=1)).mean() >= 0.95
