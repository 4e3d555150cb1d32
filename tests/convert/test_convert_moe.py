"""`ember convert` of mixture-of-experts checkpoints (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): the
checkpoint's one matrix per expert stacked into the 3-D blk.N.ffn_{gate,up,down}_exps, the routers
kept F32, the expert keys written. Oracles: the `gguf` package (its reader and llama.cpp's tensor
name map) and the safetensors package; llama.cpp's own converter is compared on the same models
in the architectures' tests (tests/models/parity.py: its recorded output always, the converter
itself where EMBER_LLAMA_CPP names a llama.cpp source tree).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from ember.convert.hf_to_gguf import convert  # noqa: E402

COMMON = dict(vocab_size=160, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128)
MODELS = {
    "mixtral": ("llama", "MixtralForCausalLM",
                lambda: transformers.MixtralConfig(**COMMON, intermediate_size=96, num_local_experts=4,
                                                   num_experts_per_tok=2)),
    "qwen2moe": ("qwen2moe", "Qwen2MoeForCausalLM",
                 lambda: transformers.Qwen2MoeConfig(**COMMON, intermediate_size=96, moe_intermediate_size=32,
                                                     shared_expert_intermediate_size=64, num_experts=4,
                                                     num_experts_per_tok=2)),
    "qwen3moe": ("qwen3moe", "Qwen3MoeForCausalLM",
                 lambda: transformers.Qwen3MoeConfig(**COMMON, intermediate_size=96, moe_intermediate_size=32,
                                                     num_experts=4, num_experts_per_tok=2, head_dim=32,
                                                     norm_topk_prob=True)),
    "olmoe": ("olmoe", "OlmoeForCausalLM",
              lambda: transformers.OlmoeConfig(**{**COMMON, "num_key_value_heads": 4}, intermediate_size=32,
                                               num_experts=4, num_experts_per_tok=2, pad_token_id=0,
                                               eos_token_id=1, bos_token_id=2)),
}
EXPERT_NAMES = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> (HF folder, gguf reader of ember's F32 file, config)."""
    out = {}
    for name, (_, model_class, config) in MODELS.items():
        root = tmp_path_factory.mktemp(name)
        torch.manual_seed(0)
        model = getattr(transformers, model_class)(config()).eval()
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0.0, 0.1)
        model.save_pretrained(root / "hf", safe_serialization=True)
        out[name] = (root / "hf", gguf.GGUFReader(convert(root / "hf", root / "f32.gguf", "f32")), model.config)
    return out


def hf_tensors(path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(path / "model.safetensors")


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


@pytest.mark.parametrize("name", list(MODELS))
def test_experts_are_stacked_in_expert_order(name, converted):
    hf_dir, reader, config = converted[name]
    tensors = {t.name: t for t in reader.tensors}
    hf = hf_tensors(hf_dir)
    n_expert = field(reader, f"{MODELS[name][0]}.expert_count")
    for layer in range(config.num_hidden_layers):
        for hf_kind, kind in EXPERT_NAMES.items():
            parts = [hf.get(f"model.layers.{layer}.{module}.experts.{e}.{hf_kind}.weight")
                     for module in ("block_sparse_moe", "mlp") for e in range(n_expert)]
            parts = [p for p in parts if p is not None]
            if not parts:
                continue
            t = tensors[f"blk.{layer}.ffn_{kind}_exps.weight"]
            assert [int(d) for d in t.shape] == [parts[0].shape[1], parts[0].shape[0], n_expert]
            np.testing.assert_array_equal(np.asarray(t.data).reshape(n_expert, *parts[0].shape), np.stack(parts))


@pytest.mark.parametrize("name", list(MODELS))
def test_tensor_names_are_the_ones_llama_cpp_maps_to(name, converted):
    hf_dir, reader, config = converted[name]
    arch = MODELS[name][0]
    name_map = gguf.get_tensor_name_map(_arch_enum(arch), config.num_hidden_layers)
    expected = set()
    for hf_name in hf_tensors(hf_dir):
        parts = hf_name.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():  # one expert's matrix
            i = parts.index("experts")
            hf_name = ".".join(parts[:i + 1] + parts[i + 2:])
            if parts[i - 1] == "block_sparse_moe":  # Mixtral: llama.cpp maps the merged name
                hf_name = f"layers.{parts[2]}.feed_forward.experts.{parts[i + 2]}.weight"
        expected.add(name_map.get_name(hf_name, try_suffixes=(".weight", ".bias")))
    assert None not in expected
    assert {t.name for t in reader.tensors} == expected


def _arch_enum(arch: str):
    return next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)


@pytest.mark.parametrize("name", list(MODELS))
def test_routers_stay_f32_when_the_experts_are_q8_0(name, converted, tmp_path):
    hf_dir, _, _ = converted[name]
    reader = gguf.GGUFReader(convert(hf_dir, tmp_path / "q8_0.gguf", "q8_0"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == gguf.GGMLQuantizationType.F32
    assert types["blk.0.ffn_up_exps.weight"] == gguf.GGMLQuantizationType.Q8_0
    if "blk.0.ffn_gate_inp_shexp.weight" in types:
        assert types["blk.0.ffn_gate_inp_shexp.weight"] == gguf.GGMLQuantizationType.F32


@pytest.mark.parametrize("name", list(MODELS))
def test_expert_keys(name, converted):
    _, reader, config = converted[name]
    arch = MODELS[name][0]
    assert field(reader, f"{arch}.expert_count") == getattr(config, "num_local_experts", None) or config.num_experts
    assert field(reader, f"{arch}.expert_used_count") == config.num_experts_per_tok
    if hasattr(config, "moe_intermediate_size"):
        assert field(reader, f"{arch}.expert_feed_forward_length") == config.moe_intermediate_size
    if name == "qwen2moe":
        assert field(reader, f"{arch}.expert_shared_feed_forward_length") == config.shared_expert_intermediate_size


@pytest.mark.parametrize("name", list(MODELS))
def test_stacked_experts_convert_to_the_same_tensors(name, converted, tmp_path):
    """The experts as transformers >= 5 holds them in memory (one gate_up_proj [experts, 2 * rows,
    hidden] and one down_proj per layer), saved as they are: the file of the one-matrix-per-expert
    checkpoint, tensor for tensor."""
    import shutil

    from safetensors.torch import save_file

    hf_dir, reader, _ = converted[name]
    stacked = tmp_path / "hf"
    stacked.mkdir()
    shutil.copy(hf_dir / "config.json", stacked)
    state = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).state_dict()
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    save_file({k: t.contiguous() for k, t in state.items()}, str(stacked / "model.safetensors"))
    ours = {t.name: t for t in gguf.GGUFReader(convert(stacked, tmp_path / "stacked.gguf", "f32")).tensors}
    theirs = {t.name: t for t in reader.tensors}
    assert set(ours) == set(theirs)
    for tensor_name, t in theirs.items():
        assert list(ours[tensor_name].shape) == list(t.shape)
        np.testing.assert_array_equal(np.asarray(ours[tensor_name].data), np.asarray(t.data))


def test_a_stacked_expert_tensor_of_the_wrong_rank_is_an_error():
    from ember.errors import EmberError
    from ember.models.hf import stacked_experts

    with pytest.raises(EmberError, match="gate_up_proj has shape"):
        stacked_experts("model.layers.0.mlp.experts.gate_up_proj", (4, 63, 64))
    assert stacked_experts("model.layers.0.mlp.experts.0.up_proj.weight", (32, 64)) is None
