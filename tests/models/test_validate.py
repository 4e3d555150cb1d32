"""A model file is checked when it is opened (models/validate.py): every hyper-parameter the graph
relies on, every weight's shape and type; a mismatch is a GGUFError naming the key or the tensor,
never a crash, a traceback from the graph builder, or a model that runs on nonsense."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ember import _core
from ember.engine.runtime import Model
from ember.errors import GGUFError
from ember.gguf import open_gguf
from ember.gguf.types import GGMLType
from ember.models import llama
from ember.models.blocks import Builder, HParams
from ember.models.validate import CheckedGraph
from paths import REPO
from tiny_gguf import DROP, N_EMBD, N_HEAD, TOKENS, write_tiny_model

N_VOCAB = len(TOKENS)


def load(tmp_path, **changes) -> Model:
    return Model(write_tiny_model(tmp_path / "m.gguf", **changes), n_threads=1)


def test_the_unchanged_tiny_model_loads_and_runs(tmp_path):
    model = load(tmp_path)
    assert model.eval([1, 2, 3]).shape == (model.n_vocab,)


@pytest.mark.parametrize("key, value, match", [
    ("llama.attention.head_count", 0, r"llama\.attention\.head_count is 0, outside \[1, "),
    ("llama.attention.head_count", DROP, "llama.attention.head_count is missing"),
    ("llama.attention.head_count_kv", 3, r"head_count \(4\) is not a multiple of llama\.attention\.head_count_kv \(3\)"),
    ("llama.attention.head_count_kv", 8, r"head_count_kv is 8, outside \[1, 4\]"),
    ("llama.attention.head_count", [4, 2], r"llama\.attention\.head_count differs between layers"),
    ("llama.embedding_length", 63, r"embedding_length \(63\) is not a multiple of llama\.attention\.head_count"),
    ("llama.embedding_length", -1, "llama.embedding_length is -1"),
    ("llama.rope.dimension_count", 7, "llama.rope.dimension_count is 7; it must be even"),
    ("llama.rope.dimension_count", 64, r"llama\.rope\.dimension_count is 64, outside \[1, 16\]"),
    ("llama.attention.value_length", 8, r"key_length \(16\) and llama\.attention\.value_length \(8\) differ"),
    ("llama.context_length", [1, 2], r"llama\.context_length must be an integer, the file has an array \(\[1, 2\]\)"),
    ("llama.context_length", "512", "llama.context_length must be an integer, the file has a string"),
    ("llama.context_length", 2.5, "llama.context_length must be an integer, the file has float"),
    ("llama.block_count", True, "llama.block_count must be an integer, the file has a bool"),
    ("llama.rope.freq_base", -1.0, r"llama\.rope\.freq_base is -1\.0; it must be finite > 0"),
    ("llama.rope.freq_base", float("inf"), "llama.rope.freq_base is inf; it must be finite"),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), "layer_norm_rms_epsilon is nan"),
    ("llama.rope.scaling.type", ["linear"], "llama.rope.scaling.type must be a string"),
    ("llama.rope.scaling.type", "dynamic", (r"RoPE scaling type 'dynamic' \(llama\.rope\.scaling\.type\) is not "
                                            "supported; ember supports none, linear, yarn, longrope")),
    ("llama.rope.scaling.original_context_length", 0, r"original_context_length is 0, outside \[1, "),
    ("llama.rope.scaling.attn_factor", 0.0, r"llama\.rope\.scaling\.attn_factor is 0\.0; it must be finite > 0"),
    ("llama.rope.scaling.yarn_beta_fast", float("nan"), "llama.rope.scaling.yarn_beta_fast is nan"),
    ("llama.vocab_size", 100_000, r"the vocabulary has 100000 tokens \(llama\.vocab_size\) but tokenizer\.ggml"),
    ("general.architecture", ["llama"], "unsupported architecture"),
])
def test_a_bad_hyper_parameter_is_an_error_naming_its_key(tmp_path, key, value, match):
    with pytest.raises(GGUFError, match=match):
        load(tmp_path, metadata={key: value})


@pytest.mark.parametrize("metadata, match", [
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 0.5},
     r"llama\.rope\.scaling\.factor is 0\.5; YaRN scaling needs a factor >= 1"),
    ({"llama.rope.scaling.type": "longrope"}, "tensor rope_factors_short.weight is missing"),
])
def test_a_rope_scaling_the_file_cannot_run_is_an_error_naming_it(tmp_path, metadata, match):
    with pytest.raises(GGUFError, match=match):
        load(tmp_path, metadata=metadata)


def as_architecture(tmp_path, arch: str, metadata: dict) -> Model:
    """The tiny llama model's file under another architecture's name and keys, with `metadata` added."""
    from ember.gguf import GGUFWriter

    source = open_gguf(write_tiny_model(tmp_path / "llama.gguf"))
    writer = GGUFWriter(tmp_path / f"{arch}.gguf", arch)
    for key, value in source.metadata.items():
        if key != "general.architecture" and not key.startswith("GGUF."):
            writer.add(arch + key[len("llama"):] if key.startswith("llama.") else key, value)
    for key, value in metadata.items():
        writer.add(f"{arch}.{key}", value)
    for name, t in source.tensors.items():
        writer.add_tensor(name, np.array(t.data), t.type, t.shape)
    return Model(writer.write(), n_threads=1)


@pytest.mark.parametrize("arch, metadata, match", [
    ("granite", {"logit_scale": 0.0}, r"granite\.logit_scale is 0\.0; it must be finite > 0"),
    ("granite", {"residual_scale": float("nan")}, "granite.residual_scale is nan"),
    ("granite", {"embedding_scale": "12"}, "granite.embedding_scale must be a number"),
    ("gemma2", {"attn_logit_softcapping": -50.0}, r"gemma2\.attn_logit_softcapping is -50\.0"),
    ("phi3", {"rope.scaling.attn_factor": float("inf")}, "phi3.rope.scaling.attn_factor is inf"),
])
def test_an_architectures_own_bad_hyper_parameter_is_an_error_naming_it(tmp_path, arch, metadata, match):
    with pytest.raises(GGUFError, match=match):
        as_architecture(tmp_path, arch, metadata)


@pytest.mark.parametrize("changes, match", [
    ({"shapes": {"blk.0.attn_q.weight": (32, 64)}},
     r"tensor blk\.0\.attn_q\.weight has shape \[32, 64\], but the llama metadata .* makes it \[64, 64\]"),
    ({"shapes": {"blk.1.ffn_down.weight": (128, 32)}}, r"tensor blk\.1\.ffn_down\.weight has shape \[128, 32\]"),
    ({"shapes": {"output_norm.weight": (65,)}}, r"tensor output_norm\.weight has shape \[65\]"),
    ({"metadata": {"llama.embedding_length": 32, "llama.rope.dimension_count": 8}},
     rf"tensor token_embd\.weight has shape \[64, {N_VOCAB}\], but .* makes it \[32, {N_VOCAB}\]"),
    ({"shapes": {"token_embd.weight": (64, 300)}},
     rf"the vocabulary has {N_VOCAB} tokens \(tokenizer\.ggml\.tokens\) but token_embd\.weight has 300"),
    ({"shapes": {"output.weight": (64, N_VOCAB - 1)}}, f"but output.weight has {N_VOCAB - 1}"),
    ({"drop_tensors": ("blk.1.attn_v.weight",)}, "tensor blk.1.attn_v.weight is missing"),
])
def test_a_tensor_that_does_not_fit_the_metadata_is_an_error_naming_it(tmp_path, changes, match):
    with pytest.raises(GGUFError, match=match):
        load(tmp_path, **changes)


@pytest.mark.parametrize("ggml_type", [GGMLType.Q8_1, GGMLType.I32, GGMLType.MXFP4])
def test_a_weight_of_a_type_without_kernels_is_refused(tmp_path, ggml_type):
    with pytest.raises(GGUFError, match=rf"tensor blk\.0\.attn_q\.weight is of type {ggml_type.name}, "
                                        "which ember cannot compute with"):
        load(tmp_path, types={"blk.0.attn_q.weight": ggml_type})


def test_a_q8_1_weight_is_a_one_line_error_not_a_crash(tmp_path):
    # Q8_1 has no matmul kernel: the core used to call a null function pointer (SIGSEGV).
    path = write_tiny_model(tmp_path / "q81.gguf", types={"blk.0.attn_q.weight": GGMLType.Q8_1})
    result = subprocess.run([sys.executable, "-m", "ember", "run", "-m", str(path), "-n", "2", "hi"],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "ember: error: tensor blk.0.attn_q.weight is of type Q8_1, which ember cannot compute with "
        f"(weights may be {', '.join(sorted(_core.types_with_kernels()))})"]


def test_the_graph_refusing_an_op_is_a_gguf_error_naming_the_weights(tmp_path):
    # With no table of expected shapes, the core's own checks still catch the misfit tensor, and
    # the error names it and its shape instead of "matmul: inner dimensions differ".
    with open_gguf(write_tiny_model(tmp_path / "m.gguf", shapes={"blk.0.attn_q.weight": (32, 64)})) as f:
        builder = Builder(_core.Graph(1), f, HParams.from_gguf(f), shapes={})
        with pytest.raises(GGUFError, match=r"tensor blk\.0\.attn_q\.weight \(F32 \[32, 64\]\) does not fit "
                                            r"the llama graph \(matmul: inner dimensions differ\)"):
            builder.build(llama.build)


def test_an_op_on_computed_values_names_the_weights_behind_them(tmp_path):
    with open_gguf(write_tiny_model(tmp_path / "m.gguf")) as f:
        builder = Builder(_core.Graph(1), f, HParams.from_gguf(f))
        h = builder.g.get_rows(builder.weight("token_embd.weight"))
        narrow = builder.g.matmul(builder.weight("blk.0.attn_k.weight"), h)  # 32 wide
        with pytest.raises(GGUFError, match=rf"tensors token_embd\.weight \(F32 \[64, {N_VOCAB}\]\), "
                                            r"blk\.0\.attn_k\.weight \(F32 \[64, 32\]\) do not fit the llama graph "
                                            r"\(add: element-wise op: column counts differ\)"):
            builder.g.add(h, narrow)


def test_a_failing_build_function_is_a_gguf_error(tmp_path):
    def build(b):
        return int(b.f.metadata["tokenizer.ggml.tokens"][:2])  # an architecture file tripping on odd metadata

    with open_gguf(write_tiny_model(tmp_path / "m.gguf")) as f:
        builder = Builder(_core.Graph(1), f, HParams.from_gguf(f))
        with pytest.raises(GGUFError, match="the llama graph cannot be built from this file: TypeError: "):
            builder.build(build)


def test_values_carry_the_weights_behind_them_but_are_plain_tensor_ids(tmp_path):
    with open_gguf(write_tiny_model(tmp_path / "m.gguf")) as f:
        graph = _core.Graph(1)
        checked = CheckedGraph(graph, f.tensors, "llama")
        w = checked.named_weight("output_norm.weight", int(GGMLType.F32), N_EMBD, 1, f.tensors["output_norm.weight"].data)
        assert w == 0 and w.weights == ("output_norm.weight",) and w.is_weight
        x = checked.input(N_EMBD)
        y = checked.rms_norm(x, w)
        assert y.weights == ("output_norm.weight",) and not y.is_weight
        assert checked.scale(y, 2.0).weights == ("output_norm.weight",)
        assert graph.arena_size == checked.arena_size == 0


def test_learned_positions_bound_the_context(tmp_path):
    # GPT-2-style files read position_embd.weight by position: the context cannot outgrow it
    # (a run past its rows used to fail in the core mid-generation).
    pytest.importorskip("transformers")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from ember.convert.hf_to_gguf import convert

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    hf_dir = tmp_path / "gpt2"
    GPT2LMHeadModel(config).save_pretrained(hf_dir)
    path = convert(hf_dir, tmp_path / "gpt2.gguf", "f32")
    assert Model(path, n_threads=1).n_ctx == 32
    with pytest.raises(Exception, match="n_ctx 33 is more than the 32 positions this model has embeddings for"):
        Model(path, n_ctx=33, n_threads=1)


def test_head_counts_per_layer_are_accepted_when_equal(tmp_path):
    model = load(tmp_path, metadata={"llama.attention.head_count": np.full(2, N_HEAD, np.int32),
                                     "llama.feed_forward_length": [128, 128]})
    assert model.hp.n_head == N_HEAD and model.hp.n_ff == 128
