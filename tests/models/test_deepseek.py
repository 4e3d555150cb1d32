"""DeepSeek-V1 MoE (deepseek) against transformers' pieces: transformers has no class for it (the
checkpoints run remote code), so the reference is its LLaMA decoder with the MLP of each layer
after first_k_dense_replace replaced by transformers' DeepSeek-V2 mixture of experts, which is
DeepSeek-MoE's (softmax top-k over a linear router, weights not normalised nor scaled, shared
experts added). The checkpoint is written as DeepSeek-MoE 16B's is: DeepseekForCausalLM, its
config keys, one matrix per expert (model.layers.N.mlp.experts.E.*_proj, mlp.gate, mlp.shared_experts.*)."""

import json
import re

import torch
import transformers
from parity import TransformersParity, randomize
from safetensors.torch import load_file, save_file

from ember.models import features

MOE_KEYS = {"n_routed_experts": 8, "num_experts_per_tok": 3, "n_shared_experts": 2, "moe_intermediate_size": 32,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "norm_topk_prob": False, "scoring_func": "softmax",
            "topk_method": "greedy"}
STACKED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
PER_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def config(**kwargs):
    return transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6, architectures=["DeepseekForCausalLM"], **MOE_KEYS, **kwargs)


class TestDeepseek(TransformersParity):
    model_class = "DeepseekForCausalLM"
    mixture_of_experts = True
    configs = {
        "deepseek-moe": lambda: config(num_key_value_heads=4, tie_word_embeddings=False),
        "deepseek-moe-gqa-tied": lambda: config(num_key_value_heads=2, tie_word_embeddings=True),
    }

    def test_ember_info_names_the_experts(self, tiny):
        assert features(tiny[0].gguf.metadata) == [
            "mixture of experts: 3 of 8 per token, 2 shared", "softmax routing", "1 leading dense layer"]

    @classmethod
    def make_model(cls, config):
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

        model = transformers.LlamaForCausalLM(config)
        moe_config = transformers.DeepseekV2Config(
            hidden_size=config.hidden_size, moe_intermediate_size=config.moe_intermediate_size,
            n_routed_experts=config.n_routed_experts, num_experts_per_tok=config.num_experts_per_tok,
            n_shared_experts=config.n_shared_experts, topk_method="greedy", routed_scaling_factor=1.0)
        moe_config._experts_implementation = getattr(config, "_experts_implementation", None) or "eager"
        for layer in model.model.layers[config.first_k_dense_replace:]:
            layer.mlp = DeepseekV2Moe(moe_config)
        return model

    @classmethod
    def save_model(cls, model, hf_dir):
        hf_dir.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for name, t in model.state_dict().items():
            match = STACKED.match(name)
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            if match is None:
                tensors[name] = t.contiguous()
                continue
            prefix, kind = match.groups()
            parts = {"gate_proj": t[:, :t.shape[1] // 2], "up_proj": t[:, t.shape[1] // 2:]} \
                if kind == "gate_up_proj" else {"down_proj": t}
            for part, values in parts.items():
                for e in range(values.shape[0]):
                    tensors[f"{prefix}.{e}.{part}.weight"] = values[e].contiguous()
        save_file(tensors, str(hf_dir / "model.safetensors"))
        meta = model.config.to_dict() | {"model_type": "deepseek", "architectures": ["DeepseekForCausalLM"]}
        (hf_dir / "config.json").write_text(json.dumps(meta))

    @classmethod
    def load_model(cls, hf_dir, dtype=torch.float32, experts_implementation="eager"):
        meta = json.loads((hf_dir / "config.json").read_text())
        c = transformers.LlamaConfig(**{k: v for k, v in meta.items() if k not in ("model_type", "transformers_version")})
        c._experts_implementation = experts_implementation
        model = cls.make_model(c)
        stored = load_file(str(hf_dir / "model.safetensors"))
        state = {}
        for name, t in stored.items():
            match = PER_EXPERT.match(name)
            if match is None:
                state[name] = t
        for name in model.state_dict():
            match = STACKED.match(name)
            if match is not None:
                prefix, kind = match.groups()
                parts = ("gate_proj", "up_proj") if kind == "gate_up_proj" else ("down_proj",)
                n = c.n_routed_experts
                state[name] = torch.stack([torch.cat([stored[f"{prefix}.{e}.{p}.weight"] for p in parts]) for e in range(n)])
        if c.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model.load_state_dict(state, strict=True)
        return model.to(dtype)


def test_the_reference_routes_as_deepseek_moe():
    """The reference's MoE block is DeepSeek-MoE's: the top 3 softmax scores as weights (not
    normalised), plus the shared experts."""
    torch.manual_seed(0)
    model = TestDeepseek.make_model(config(num_key_value_heads=4)).eval()
    randomize(model)
    block = model.model.layers[1].mlp
    x = torch.randn(5, 64)
    with torch.no_grad():
        probs = torch.softmax(x @ block.gate.weight.T, dim=-1)
        weights, ids = probs.topk(3, dim=-1)
        expected = block.shared_experts(x)
        experts = block.experts
        for t in range(5):
            for w, e in zip(weights[t], ids[t]):
                gate, up = (experts.gate_up_proj[e] @ x[t]).chunk(2)
                expected[t] += w * (experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up))
        assert torch.allclose(block(x[None])[0], expected, atol=1e-5)
