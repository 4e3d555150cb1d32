"""`ember info`: the facts of a model file, as text, with --tensors, and as JSON."""

from __future__ import annotations

import json
import sys
import types
from collections import Counter

import numpy as np
import pytest

from ember.cli.info import describe
from ember.cli.main import main
from ember.gguf import GGUFValueType, GGUFWriter, open_gguf
from ember.gguf.types import GGMLType
from ember.quant.reference import quantize

TOKENS = ["<s>", "</s>", "a", "b", "ab"]


@pytest.fixture
def tiny_model(tmp_path):
    """A llama-shaped file with every key `ember info` reports."""
    w = GGUFWriter(tmp_path / "tiny.gguf", "llama")
    w.add("general.name", "Tiny Test")
    w.add("general.file_type", 2)  # MOSTLY_Q4_0
    w.add("llama.context_length", 512)
    w.add("llama.embedding_length", 64)
    w.add("llama.block_count", 2)
    w.add("llama.feed_forward_length", 128)
    w.add("llama.attention.head_count", 4)
    w.add("llama.attention.head_count_kv", 2)
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "smollm")
    w.add("tokenizer.ggml.tokens", TOKENS)
    w.add("tokenizer.ggml.token_type", [1] * len(TOKENS), GGUFValueType.INT32)
    w.add("tokenizer.chat_template", "{{ messages }}")
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", quantize(rng.standard_normal((5, 64)), GGMLType.Q4_0), GGMLType.Q4_0)
    for layer in range(2):
        q = quantize(rng.standard_normal((64, 64)), GGMLType.Q4_0)
        w.add_tensor(f"blk.{layer}.attn_q.weight", q, GGMLType.Q4_0)
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(64, np.float32))
    w.add_tensor("output.weight", quantize(rng.standard_normal((5, 64)), GGMLType.Q8_0), GGMLType.Q8_0)
    return w.write()


def run(capsys, *argv):
    code = main(["info", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_describe_reports_the_model_facts(tiny_model):
    with open_gguf(tiny_model) as f:
        facts = describe(f)
    assert facts["architecture"] == "llama"
    assert facts["name"] == "Tiny Test"
    assert facts["parameters"] == 5 * 64 + 2 * (64 * 64 + 64) + 5 * 64
    assert facts["file_type"] == "Q4_0"
    assert facts["tensor_types"] == {"Q4_0": 3, "F32": 2, "Q8_0": 1}
    assert facts["tensor_count"] == 6
    assert (facts["context_length"], facts["embedding_length"], facts["layers"]) == (512, 64, 2)
    assert (facts["heads"], facts["kv_heads"], facts["head_dim"]) == (4, 2, 16)
    assert facts["feed_forward_length"] == 128
    assert (facts["vocab_size"], facts["tokenizer"], facts["tokenizer_pre"]) == (5, "gpt2", "smollm")
    assert facts["chat_template"] is True


def test_text_output_has_one_line_per_fact(capsys, tiny_model):
    code, out, err = run(capsys, tiny_model)
    assert code == 0 and err == ""
    lines = {line[:14].strip(): line[15:] for line in out.splitlines()}  # "label" padded to 14, value
    assert lines["architecture"] == "llama"
    assert lines["parameters"] == "8.96K (8960)"  # 5*64 + 2*(64*64 + 64) + 5*64
    assert lines["file type"] == "Q4_0"
    assert lines["tensors"] == "6: 3 Q4_0, 2 F32, 1 Q8_0"
    assert lines["context"] == "512"
    assert lines["heads"] == "4 (2 KV), head dim 16"
    assert lines["vocabulary"] == "5 tokens, BPE (gpt2), pre-tokenizer smollm"
    assert lines["chat template"] == "yes"


def test_tensors_lists_name_type_shape_and_offset(capsys, tiny_model):
    gguf = pytest.importorskip("gguf")
    code, out, _ = run(capsys, tiny_model, "--tensors")
    rows = [line.split() for line in out.split("\n\n")[1].splitlines()[1:]]
    reader = gguf.GGUFReader(tiny_model)
    assert code == 0
    assert [r[0] for r in rows] == [t.name for t in reader.tensors]
    assert [r[1] for r in rows] == [t.tensor_type.name for t in reader.tensors]
    assert [int(r[-1]) for r in rows] == [t.data_offset for t in reader.tensors]
    assert [" ".join(r[2:-1]) for r in rows] == [str(t.shape.tolist()) for t in reader.tensors]


def test_json_prints_the_same_facts(capsys, tiny_model):
    code, out, _ = run(capsys, tiny_model, "--json", "--tensors")
    report = json.loads(out)
    with open_gguf(tiny_model) as f:
        assert report["model"] == json.loads(json.dumps(describe(f)))
        assert report["tensors"][1] == {"name": "blk.0.attn_q.weight", "type": "Q4_0", "shape": [64, 64],
                                        "offset": f.tensors["blk.0.attn_q.weight"].offset}
    assert code == 0


def test_json_leaves_out_tensors_unless_asked(capsys, tiny_model):
    _, out, _ = run(capsys, tiny_model, "--json")
    assert set(json.loads(out)) == {"model"}


def test_a_malformed_file_is_one_line_and_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**63).to_bytes(8, "little") + bytes(8))
    code, out, err = run(capsys, bad)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("ember: error: ") and "more than the file can hold (at byte 8)" in err


def test_without_a_model_it_asks_for_one(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "needs a MODEL" in err


def test_system_comes_from_sysinfo(capsys, monkeypatch):
    fake = types.ModuleType("ember.sysinfo")
    fake.system_info = lambda: {"cpu": "Test CPU", "isa": "avx2"}
    monkeypatch.setitem(sys.modules, "ember.sysinfo", fake)
    code, out, _ = run(capsys, "--system", "--json")
    assert code == 0 and json.loads(out) == {"system": {"cpu": "Test CPU", "isa": "avx2"}}


def test_system_says_when_the_build_lacks_it(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ember.sysinfo", None)
    code, _, err = run(capsys, "--system")
    assert code == 2 and "not available in this build" in err


def test_memory_asks_the_runtime_for_the_plan(capsys, monkeypatch, tiny_model):
    calls = []
    fake = types.ModuleType("ember.engine.runtime")
    fake.planned_memory = lambda *args: calls.append(args) or {"weights_bytes": 3 << 20}
    monkeypatch.setitem(sys.modules, "ember.engine.runtime", fake)
    code, out, _ = run(capsys, tiny_model, "--memory")
    assert code == 0 and calls == [(tiny_model, None, None, None)]
    assert "weights_bytes      3.0 MiB" in out
    code, out, _ = run(capsys, tiny_model, "--memory", "-c", "64", "-ctk", "q8_0", "--cache-type-v", "f32")
    assert code == 0 and calls[1] == (tiny_model, 64, "q8_0", "f32")


@pytest.mark.model
def test_memory_of_a_q8_0_cache(capsys):
    """K and V rows of Q8_0 take 34 bytes per 32 elements, F16 rows 64: the cache is 17/32 the size."""
    memory = {}
    for flags in ([], ["-ctk", "q8_0", "-ctv", "q8_0"], ["-ctk", "q8_0"]):
        code, out, _ = run(capsys, "smollm2-135m", "--memory", "-c", "2048", "--json", *flags)
        assert code == 0
        memory[" ".join(flags)] = json.loads(out)["memory"]
    f16, q8, mixed = memory.values()
    assert (f16["type_k"], f16["type_v"], q8["type_k"], q8["type_v"]) == ("f16", "f16", "q8_0", "q8_0")
    assert q8["kv_cache"] * 32 == f16["kv_cache"] * 17
    assert mixed["kv_cache"] * 64 == f16["kv_cache"] * (17 + 32)
    assert q8["weights"] == f16["weights"] and q8["total"] < f16["total"]


@pytest.mark.parametrize("value, message", [
    ("q4_0", "type_k 'q4_0' is a KV cache type ember does not implement; use one of f32, f16, q8_0"),
    ("int8", "type_k 'int8' is not a KV cache type; use one of f32, f16, q8_0")])
def test_unsupported_cache_types_are_one_line_errors(capsys, tiny_model, value, message):
    code, _, err = run(capsys, tiny_model, "--memory", "-ctk", value)
    assert code == 2 and message in err and "Traceback" not in err


def test_memory_says_when_the_build_lacks_it(capsys, monkeypatch, tiny_model):
    monkeypatch.setitem(sys.modules, "ember.engine.runtime", types.ModuleType("ember.engine.runtime"))
    code, _, err = run(capsys, tiny_model, "--memory")
    assert code == 2 and "memory planning is not available in this build" in err


@pytest.mark.model
def test_registry_model_by_name(capsys):
    code, out, _ = run(capsys, "smollm2-135m", "--json")
    facts = json.loads(out)["model"]
    assert code == 0
    # SmolLM2-135M-Instruct: llama, 30 layers, 9 heads of 64 (3 KV heads), 576 wide, Q4_1 file
    assert (facts["architecture"], facts["file_type"]) == ("llama", "Q4_1")
    assert (facts["layers"], facts["heads"], facts["kv_heads"], facts["head_dim"]) == (30, 9, 3, 64)
    assert (facts["embedding_length"], facts["vocab_size"]) == (576, 49152)
    assert (facts["tokenizer"], facts["tokenizer_pre"], facts["chat_template"]) == ("gpt2", "smollm", True)


@pytest.mark.model
@pytest.mark.slow  # gguf.GGUFReader takes seconds
def test_registry_model_counts_match_the_gguf_reader(capsys):
    gguf = pytest.importorskip("gguf")
    from ember.hub import resolve_model

    _, out, _ = run(capsys, "smollm2-135m", "--json")
    facts = json.loads(out)["model"]
    reader = gguf.GGUFReader(resolve_model("smollm2-135m"))
    assert facts["parameters"] == sum(int(t.n_elements) for t in reader.tensors)
    assert facts["tensor_types"] == dict(Counter(t.tensor_type.name for t in reader.tensors))
    assert facts["vocab_size"] == len(reader.fields["tokenizer.ggml.tokens"].data)


def test_features_the_metadata_switches_on_are_named(capsys, tmp_path):
    w = GGUFWriter(tmp_path / "f.gguf", "llama")
    for key, value in {"embedding_length": 64, "attention.head_count": 4, "rope.dimension_count": 8,
                       "rope.scaling.type": "linear", "rope.scaling.factor": 4.0,
                       "attention.sliding_window": 128}.items():
        w.add(f"llama.{key}", value)
    code, out, _ = run(capsys, w.write())
    lines = {line[:14].strip(): line[15:] for line in out.splitlines()}
    assert code == 0
    assert lines["features"] == "partial rotary (8 of 16 dimensions), sliding window 128, RoPE scaling linear x4"


def test_a_file_without_features_shows_a_dash(capsys, tiny_model):
    _, out, _ = run(capsys, tiny_model)
    assert "features       -" in out.splitlines()


@pytest.mark.parametrize("arch, metadata, expected", [
    ("gemma2", {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "attention.sliding_window": 4096},
     "post-norms, attention soft-cap 50, sliding window 4096, logit soft-cap 30"),
    ("phi3", {"rope.scaling.attn_factor": 1.1902380714238083, "rope.scaling.original_context_length": 4096,
              "embedding_length": 3072, "attention.head_count": 24, "rope.dimension_count": 96},
     "fused QKV and gate-up, RoPE scaling longrope (attention factor 1.19, from 4096), "
     "partial rotary (96 of 128 dimensions)"),
    ("granite", {"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.0078125, "logit_scale": 8.0},
     "embedding x12, residual x0.22, attention scale 0.0078125, logits /8"),
    ("qwen3", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}, "per-head Q/K RMSNorm, RoPE scaling yarn x4"),
    # Gemma 2: even layers slide; Gemma 3: five of every six, and the query scale where the file has one
    ("gemma2", {"block_count": 26, "attention.sliding_window": 4096, "attn_logit_softcapping": 50.0},
     "post-norms, attention soft-cap 50, sliding window 4096 (13 of 26 layers)"),
    ("gemma3", {"block_count": 18, "attention.sliding_window": 512, "attention.scale": 0.0625},
     "post-norms, per-head Q/K RMSNorm, attention scale 0.0625, sliding layers' RoPE base 10000, "
     "sliding window 512 (15 of 18 layers)"),
    ("gemma3", {"block_count": 4, "attention.sliding_window": 8, "attention.sliding_window_pattern": [True, False] * 2,
                "rope.freq_base_swa": 20000.0},
     "post-norms, per-head Q/K RMSNorm, sliding layers' RoPE base 20000, sliding window 8 (2 of 4 layers)"),
    # YaRN with what the file says of it (Qwen3's 32768-token original context)
    ("qwen3", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32768,
               "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0},
     "per-head Q/K RMSNorm, RoPE scaling yarn x4 (from 32768, beta fast 32, beta slow 1)"),
    ("llama", {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0, "rope.scaling.attn_factor": 0.5},
     "RoPE scaling linear x2 (attention factor 0.5)"),
    # MLA (DeepSeek-V2-Lite): key_length is the cache row (512 latent + 64 rotary), a head is 128 + 64
    ("deepseek2", {"attention.key_length": 576, "attention.key_length_mla": 192, "rope.dimension_count": 64,
                   "embedding_length": 2048, "attention.head_count": 16},
     "multi-head latent attention, partial rotary (64 of 192 dimensions)"),
])
def test_an_architectures_own_features_are_named(capsys, tmp_path, arch, metadata, expected):
    w = GGUFWriter(tmp_path / "f.gguf", arch)
    for key, value in metadata.items():
        w.add(f"{arch}.{key}", value)
    code, out, _ = run(capsys, w.write())
    assert code == 0
    assert {line[:14].strip(): line[15:] for line in out.splitlines()}["features"] == expected


def test_llama3_rope_scaling_is_named_with_the_range_of_its_factors(capsys, tmp_path):
    # Llama 3.1's divisors (llama.cpp's converter writes them as rope_freqs.weight, no scaling type)
    w = GGUFWriter(tmp_path / "f.gguf", "llama")
    w.add_tensor("rope_freqs.weight", np.array([1.0, 1.0, 2.5, 8.0, 8.0], np.float32))
    code, out, _ = run(capsys, w.write())
    assert code == 0
    lines = {line[:14].strip(): line[15:] for line in out.splitlines()}
    assert lines["features"] == "RoPE scaling llama3 (rope_freqs.weight: factors 1 to 8)"


def test_unreadable_rope_freqs_are_named_without_factors(capsys, tmp_path):
    w = GGUFWriter(tmp_path / "f.gguf", "llama")
    w.add_tensor("rope_freqs.weight", np.array([1.0, np.nan], np.float32))
    code, out, _ = run(capsys, w.write())
    assert code == 0
    assert {line[:14].strip(): line[15:] for line in out.splitlines()}["features"] == "RoPE scaling llama3 (rope_freqs.weight)"
