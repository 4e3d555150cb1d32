"""DeepSeek-V2/V3 (deepseek2) against transformers: multi-head latent attention with plain Q (Lite)
and low-rank Q, YaRN with DeepSeek's mscale, dense layers; the file as llama.cpp's converter
writes it (attn_k_b / attn_v_b) and the older attn_kv_b form.

ember caches the latent c and the rotary key k_pe in F16 (not per-head K and V), so the
reference rounds those two to F16 where transformers computes them."""

import contextlib

import numpy as np
import pytest
import transformers
from parity import RTOL, TransformersParity, relative_error

from ember.convert import convert
from ember.engine.runtime import Model
from ember.gguf import GGUFWriter, open_gguf

# transformers' DeepSeek keeps head_dim = qk_rope_head_dim and uses num_key_value_heads = heads
SHAPE = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
         "qk_rope_head_dim": 8, "v_head_dim": 24, "max_position_embeddings": 256, "first_k_dense_replace": 3}
YARN = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}


class TestDeepseekV2(TransformersParity):
    model_class = "DeepseekV2ForCausalLM"
    configs = {
        # Lite: plain Q, no RoPE scaling, tied head
        "v2-lite": lambda: transformers.DeepseekV2Config(q_lora_rank=None, tie_word_embeddings=True, **SHAPE),
        # low-rank Q, YaRN (DeepSeek-V2's mscale = mscale_all_dim), untied head
        "v2-q-lora-yarn": lambda: transformers.DeepseekV2Config(q_lora_rank=48, rope_parameters=YARN,
                                                               tie_word_embeddings=False, **SHAPE),
    }

    @classmethod
    @contextlib.contextmanager
    def f16_cache(cls, model):
        with latents_in_f16(model, "apply_rotary_emb"):
            yield


class TestDeepseekV3(TestDeepseekV2):
    model_class = "DeepseekV3ForCausalLM"
    configs = {
        "v3-yarn": lambda: transformers.DeepseekV3Config(q_lora_rank=48, rope_parameters=YARN,
                                                         tie_word_embeddings=False, **SHAPE),
    }

    @classmethod
    @contextlib.contextmanager
    def f16_cache(cls, model):
        with latents_in_f16(model, "apply_rotary_pos_emb_interleave"):
            yield


@contextlib.contextmanager
def latents_in_f16(model, rotary: str):
    """The normalised latent (kv_a_layernorm's output) and the rotated shared key rounded to F16."""
    import torch

    module = __import__(type(model).__module__, fromlist=["_"])
    original = getattr(module, rotary)

    def rotate(q, k, *args, **kwargs):
        q, k = original(q, k, *args, **kwargs)
        return q, k.half().to(k.dtype)

    hooks = [layer.self_attn.kv_a_layernorm.register_forward_hook(lambda m, i, out: out.half().to(out.dtype))
             for layer in model.model.layers]
    setattr(module, rotary, rotate)
    try:
        with torch.no_grad():
            yield
    finally:
        setattr(module, rotary, original)
        for hook in hooks:
            hook.remove()


# -- the file's forms ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def v3_checkpoint(tmp_path_factory):
    """(HF folder, converted F32 file, token ids) of the V3 model."""
    import torch

    from parity import N_TOKENS, randomize

    config = TestDeepseekV3.configs["v3-yarn"]()
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    randomize(model)
    folder = tmp_path_factory.mktemp("deepseek-v3") / "hf"
    model.save_pretrained(folder, safe_serialization=True)
    tokens = np.random.default_rng(7).integers(0, config.vocab_size, N_TOKENS)
    return folder, convert(folder, folder.parent / "f32.gguf", "f32"), tokens


def write_kv_b_form(path, out):
    """The file as older converters wrote it: one attn_kv_b per layer [n_head * (nope + value) rows of
    rank], key_length / value_length the per-head sizes, no *_mla keys, a KV head per query head."""
    f = open_gguf(path)
    meta = dict(f.metadata)
    h = meta["deepseek2.attention.head_count"]
    nope_rope, value = meta.pop("deepseek2.attention.key_length_mla"), meta.pop("deepseek2.attention.value_length_mla")
    meta.update({"deepseek2.attention.key_length": nope_rope, "deepseek2.attention.value_length": value,
                 "deepseek2.attention.head_count_kv": h})
    writer = GGUFWriter(out, "deepseek2")
    for key, val in meta.items():
        if key != "general.architecture":
            writer.add(key, val)
    for name, t in f.tensors.items():
        if name.endswith("attn_v_b.weight"):
            continue
        values = np.asarray(t.data).view(np.float32).reshape(tuple(reversed(t.shape)))
        if name.endswith("attn_k_b.weight"):
            v_b = f.tensors[name.replace("attn_k_b", "attn_v_b")]
            v = np.asarray(v_b.data).view(np.float32).reshape(tuple(reversed(v_b.shape)))  # [h, value, rank]
            k = values.transpose(0, 2, 1)  # [h, nope, rank]
            values = np.concatenate([k, v], axis=1).reshape(-1, k.shape[2])
            name = name.replace("attn_k_b", "attn_kv_b")
        writer.add_tensor(name, lambda values=values: iter([values.view(np.uint8)]), t.type,
                          tuple(reversed(values.shape)))
    f.close()
    return writer.write()


def test_the_older_kv_b_form_gives_the_same_logits(v3_checkpoint, tmp_path):
    _, path, tokens = v3_checkpoint
    legacy = write_kv_b_form(path, tmp_path / "kv_b.gguf")
    assert "blk.0.attn_kv_b.weight" in open_gguf(legacy).tensors
    split = Model(path, n_ctx=64).eval(tokens.tolist(), logits="all")
    whole = Model(legacy, n_ctx=64).eval(tokens.tolist(), logits="all")
    assert relative_error(whole, split) <= RTOL


def test_the_kv_cache_holds_the_latent_and_the_rotary_key(v3_checkpoint):
    """kv_lora_rank + rope F16 values per token and layer: 80 bytes, against 2 * 4 heads * (24 + 16) * 2
    = 640 bytes for the per-head K and V the model would otherwise cache."""
    _, path, _ = v3_checkpoint
    model = Model(path, n_ctx=64)
    assert model.kv_bytes_per_token == SHAPE["num_hidden_layers"] * (32 + 8) * 2
    assert model.memory()["kv_cache"] == 64 * model.kv_bytes_per_token


def test_the_converter_writes_llama_cpps_keys(v3_checkpoint):
    _, path, _ = v3_checkpoint
    meta = open_gguf(path).metadata
    expected = {"attention.head_count_kv": 1, "attention.kv_lora_rank": 32, "attention.q_lora_rank": 48,
                "attention.key_length": 40, "attention.value_length": 32, "attention.key_length_mla": 24,
                "attention.value_length_mla": 24, "rope.dimension_count": 8, "leading_dense_block_count": 3,
                "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                "rope.scaling.original_context_length": 64}
    assert {k: meta[f"deepseek2.{k}"] for k in expected} == expected
    assert meta["deepseek2.rope.scaling.yarn_log_multiplier"] == pytest.approx(0.0707)
