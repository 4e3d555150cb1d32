"""DeepSeek-V2/V3 (deepseek2) against transformers: multi-head latent attention with plain Q (Lite)
and low-rank Q, YaRN with DeepSeek's mscale, dense layers; the file as llama.cpp's converter
writes it (attn_k_b / attn_v_b) and the older attn_kv_b form. Mixtures of experts after a leading
dense layer, with shared experts: V2's softmax routing (greedy, and group-limited with groups
scored by their best expert) and V3's sigmoid routing with the score-correction bias
(e_score_correction_bias, random like every weight), groups scored by their two best experts,
normalised and scaled weights; the checkpoint's experts one matrix each or stacked.

ember caches the latent c and the rotary key k_pe in F16 (not per-head K and V), so the
reference rounds those two to F16 where transformers computes them."""

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import transformers
from parity import RTOL, TransformersParity, relative_error

from ember.convert import convert
from ember.engine.runtime import Model
from ember.gguf import GGUFWriter, open_gguf
from ember.models import features
from ember.models.deepseek2 import Converter

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


# 16 routed experts in 4 groups, 4 per token, after one dense layer
MOE = {**SHAPE, "first_k_dense_replace": 1, "n_routed_experts": 16, "num_experts_per_tok": 4,
       "moe_intermediate_size": 32}


class TestDeepseekV2Moe(TestDeepseekV2):
    mixture_of_experts = True
    configs = {
        # Lite: plain Q, greedy top 4 of the softmax, two shared experts, weights unscaled
        "v2-lite-moe": lambda: transformers.DeepseekV2Config(
            q_lora_rank=None, tie_word_embeddings=True, n_shared_experts=2, topk_method="greedy", n_group=1,
            topk_group=1, scoring_func="softmax", **MOE),
        # V2: low-rank Q, YaRN, the best 2 of 4 groups (each scored by its best expert), weights scaled
        "v2-moe-groups": lambda: transformers.DeepseekV2Config(
            q_lora_rank=48, rope_parameters=YARN, tie_word_embeddings=False, n_shared_experts=1,
            topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=2.0,
            scoring_func="softmax", **MOE),
    }


    def test_ember_info_names_the_routing(self, tiny, config_name):
        expected = {
            "v2-lite-moe": ["multi-head latent attention", "mixture of experts: 4 of 16 per token, 2 shared",
                            "softmax routing", "1 leading dense layer"],
            "v2-moe-groups": ["multi-head latent attention", "mixture of experts: 4 of 16 per token, 1 shared",
                              "softmax routing", "the best 2 of 4 expert groups (a group scored by its best expert)",
                              "1 leading dense layer"],
        }
        assert features(tiny[0].gguf.metadata)[:len(expected[config_name])] == expected[config_name]


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


class TestDeepseekV3Moe(TestDeepseekV3):
    mixture_of_experts = True
    configs = {
        # V3: sigmoid scores plus the correction bias choose among the best 2 of 4 groups (each scored
        # by its two best experts); weights normalised and scaled by 2.5; one shared expert
        "v3-moe": lambda: transformers.DeepseekV3Config(
            q_lora_rank=48, rope_parameters=YARN, tie_word_embeddings=False, n_shared_experts=1, n_group=4,
            topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, scoring_func="sigmoid",
            topk_method="noaux_tc", **MOE),
    }

    def test_ember_info_names_the_routing(self, tiny, config_name):
        assert features(tiny[0].gguf.metadata)[:5] == [
            "multi-head latent attention", "mixture of experts: 4 of 16 per token, 1 shared",
            "sigmoid routing with a score-correction bias",
            "the best 2 of 4 expert groups (a group scored by its two best experts)", "1 leading dense layer"]

    def test_the_score_correction_bias_changes_the_choice(self, tiny, tmp_path):
        """Without exp_probs_b (zeros in its place) ember's logits leave the reference's bound: the
        bias the checkpoint holds is random, and the parity above depends on it."""
        from parity import rewritten

        model, reference, _, tokens = tiny
        biases = {name: np.zeros(t.shape, np.float32) for name, t in model.gguf.tensors.items()
                  if name.endswith("exp_probs_b.bias")}
        assert len(biases) == SHAPE["num_hidden_layers"] - 1
        assert all(np.abs(np.asarray(model.gguf.tensors[name].data).view(np.float32)).max() > 0.01 for name in biases)
        unbiased = Model(rewritten(model.gguf.path, tmp_path / "unbiased.gguf", tensors=biases), n_ctx=64)
        try:
            assert relative_error(unbiased.eval(tokens.tolist(), logits="all"), reference) > 10 * RTOL
        finally:
            unbiased.close()


    def test_stacked_experts_convert_to_the_same_file(self, tiny, tmp_path):
        """A checkpoint holding each layer's experts as transformers >= 5 does in memory (gate_up_proj
        [experts, 2 * rows, hidden] and down_proj) converts to the tensors of the one-matrix-per-expert
        checkpoint save_pretrained writes."""
        import shutil

        import torch
        from safetensors.torch import save_file

        hf_dir = Path(tiny[0].gguf.path).parent / "hf"
        stacked = tmp_path / "stacked"
        stacked.mkdir()
        shutil.copy(hf_dir / "config.json", stacked)
        state = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).state_dict()
        assert "model.layers.1.mlp.experts.gate_up_proj" in state
        save_file({name: t.contiguous() for name, t in state.items()}, str(stacked / "model.safetensors"))
        ours, theirs = open_gguf(convert(stacked, tmp_path / "stacked.gguf", "f32")), open_gguf(tiny[0].gguf.path)
        assert set(ours.tensors) == set(theirs.tensors)
        for name, t in theirs.tensors.items():
            assert ours.tensors[name].shape == t.shape and np.array_equal(ours.tensors[name].data, t.data), name


    def test_an_fp8_checkpoint_converts_to_its_dequantized_values(self, tiny, tmp_path):
        """DeepSeek-V3's own form: every matrix F8_E4M3 with F32 factors per 32 x 32 block in
        NAME_scale_inv (blocks cut short at the edges: 112, 40 and 24 rows), quantization_config
        naming the block. It converts to what the float32 checkpoint of torch's dequantization
        (float8_e4m3fn to float32, times the block's factor) converts to, tensor for tensor."""
        import torch
        from safetensors.torch import load_file, save_file

        hf_dir, block = Path(tiny[0].gguf.path).parent / "hf", 32
        fp8, plain = tmp_path / "fp8", tmp_path / "plain"
        stored, dequantized = {}, {}
        for name, t in load_file(str(hf_dir / "model.safetensors")).items():
            if t.ndim != 2 or "norm" in name or "embed" in name:
                stored[name] = dequantized[name] = t
                continue
            grid = [-(-n // block) for n in t.shape]
            padded = torch.zeros(grid[0] * block, grid[1] * block)
            padded[:t.shape[0], :t.shape[1]] = t
            factors = padded.reshape(grid[0], block, grid[1], block).abs().amax((1, 3)) / 448 + 1e-12
            spread = factors.repeat_interleave(block, 0).repeat_interleave(block, 1)[:t.shape[0], :t.shape[1]]
            values = (t / spread).to(torch.float8_e4m3fn)
            stored[name], stored[name + "_scale_inv"] = values, factors.float()
            dequantized[name] = values.float() * spread
        config = json.loads((hf_dir / "config.json").read_text())
        for folder, tensors, extra in ((fp8, stored, {"quantization_config": {
                "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [block, block]}}), (plain, dequantized, {})):
            folder.mkdir()
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
            (folder / "config.json").write_text(json.dumps(config | extra))
        ours, theirs = (open_gguf(convert(d, tmp_path / f"{d.name}.gguf", "f32")) for d in (fp8, plain))
        assert set(ours.tensors) == set(theirs.tensors)
        for name, t in theirs.tensors.items():
            assert np.array_equal(ours.tensors[name].data, t.data), name
        assert not np.array_equal(theirs.tensors["blk.1.ffn_up_exps.weight"].data, tiny[0].gguf.tensors[
            "blk.1.ffn_up_exps.weight"].data)  # the values did go through FP8


def test_the_converter_writes_llama_cpps_expert_keys(tmp_path):
    meta = Converter(TestDeepseekV3Moe.configs["v3-moe"]().to_dict()).metadata()
    expected = {"expert_count": 16, "expert_used_count": 4, "expert_shared_count": 1, "expert_feed_forward_length": 32,
                "leading_dense_block_count": 1, "expert_group_count": 4, "expert_group_used_count": 2,
                "expert_gating_func": 2, "expert_weights_scale": 2.5, "expert_weights_norm": True}
    assert {k: meta[f"deepseek2.{k}"] for k in expected} == expected


def test_v3_routes_by_sigmoid_where_its_config_names_no_scoring_function():
    config = TestDeepseekV3Moe.configs["v3-moe"]().to_dict() | {"architectures": ["DeepseekV3ForCausalLM"]}
    del config["scoring_func"]
    assert Converter(config).metadata()["deepseek2.expert_gating_func"] == 2
    config["architectures"] = ["DeepseekV2ForCausalLM"]  # V2 files name none: llama.cpp reads softmax
    assert "deepseek2.expert_gating_func" not in Converter(config).metadata()


def test_greedy_v2_routing_uses_every_group():
    """topk_method "greedy" ignores n_group / topk_group; the file says all groups are usable."""
    config = TestDeepseekV2Moe.configs["v2-moe-groups"]().to_dict() | {"topk_method": "greedy"}
    meta = Converter(config).metadata()
    assert meta["deepseek2.expert_group_count"] == meta["deepseek2.expert_group_used_count"] == 4


def test_multi_token_prediction_layers_are_left_out():
    converter = Converter(TestDeepseekV3Moe.configs["v3-moe"]().to_dict())
    assert converter.gguf_name("model.layers.3.eh_proj.weight") is None
    assert converter.expert("model.layers.3.mlp.experts.0.up_proj.weight") is None
    assert converter.gguf_name("model.layers.2.mlp.gate.e_score_correction_bias") == "blk.2.exp_probs_b.bias"


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
