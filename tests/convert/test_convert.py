"""`ember convert`: Hugging Face safetensors folders -> GGUF files laid out the way llama.cpp's
converter lays them out. Oracles: the `gguf` package (llama.cpp's gguf-py: its reader, its map
from Hugging Face tensor names to GGUF names, its metadata key names, its quantizers and its
SpecialVocab reader of special tokens), the safetensors package, `tokenizers`, sentencepiece,
and the row permutation llama.cpp applies to LLaMA's Q/K weights written out index by index.
Tiny random models are made here with transformers.
"""

from __future__ import annotations

import json
import struct
import tracemalloc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
safetensors = pytest.importorskip("safetensors")

from ember import cli  # noqa: E402
from ember.convert.hf_to_gguf import convert  # noqa: E402
from ember.convert.vocab import pre_tokenizer_name  # noqa: E402
from ember.errors import EmberError  # noqa: E402

GGUF_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
             "gemma3": gguf.MODEL_ARCH.GEMMA3, "gpt2": gguf.MODEL_ARCH.GPT2}


def _config(arch: str, **overrides):
    if arch == "llama":
        base = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 50000.0})
        return transformers.LlamaConfig(**{**base, **overrides})
    if arch == "qwen2":
        base = dict(vocab_size=160, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    tie_word_embeddings=True)
        return transformers.Qwen2Config(**{**base, **overrides})
    if arch == "gemma3":
        base = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
                    max_position_embeddings=128, sliding_window=16,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"])
        return transformers.Gemma3TextConfig(**{**base, **overrides})
    base = dict(vocab_size=160, n_embd=64, n_layer=2, n_head=4, n_positions=96, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Config(**{**base, **overrides})


MODEL_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
                 "gpt2": "GPT2LMHeadModel"}


def _save(path, arch: str, dtype=torch.float32, **overrides):
    """A tiny random `arch` model saved as safetensors in `path`; returns the model."""
    torch.manual_seed(0)
    model = getattr(transformers, MODEL_CLASSES[arch])(_config(arch, **overrides)).eval()
    with torch.no_grad():
        for param in model.parameters():  # biases and norms random too
            param.normal_(0.0, 0.1)
    model.to(dtype).save_pretrained(path, safe_serialization=True)
    return model


def _hf_tensors(path) -> dict[str, np.ndarray]:
    """Every tensor of a saved folder as float32, read with the safetensors package."""
    from safetensors.torch import load_file

    out = {}
    for file in sorted(path.glob("*.safetensors")):
        out.update({name: t.float().numpy() for name, t in load_file(file).items()})
    return out


def _gguf_tensors(reader) -> dict[str, np.ndarray]:
    """GGUF tensors as float32 in numpy order, dequantized by the gguf package."""
    return {t.name: gguf.dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))
            for t in reader.tensors}


def _field(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """arch -> (HF folder, GGUFReader of its F32 conversion, the transformers model)."""
    out = {}
    for arch in GGUF_ARCH:
        root = tmp_path_factory.mktemp(arch)
        model = _save(root / "hf", arch)
        out[arch] = (root / "hf", gguf.GGUFReader(convert(root / "hf", root / "f32.gguf", "f32")), model)
    return out


# -- layout: names, metadata, tensor values ---------------------------------------------------

@pytest.mark.parametrize("arch", sorted(GGUF_ARCH))
def test_tensor_names_are_the_ones_llama_cpp_maps_to(arch, converted):
    hf_dir, reader, model = converted[arch]
    n_layer = model.config.num_hidden_layers
    name_map = gguf.get_tensor_name_map(GGUF_ARCH[arch], n_layer)
    tied = model.config.tie_word_embeddings
    expected = {name_map.get_name(name, try_suffixes=(".weight", ".bias"))
                for name in _hf_tensors(hf_dir) if not (tied and name == "lm_head.weight")}
    assert None not in expected
    assert {t.name for t in reader.tensors} == expected


@pytest.mark.parametrize("arch", sorted(GGUF_ARCH))
def test_hyperparameters_are_written_under_llama_cpp_keys(arch, converted):
    _, reader, model = converted[arch]
    c = model.config
    keys = gguf.Keys.LLM
    assert _field(reader, "general.architecture") == arch
    assert _field(reader, keys.BLOCK_COUNT.format(arch=arch)) == c.num_hidden_layers
    assert _field(reader, keys.EMBEDDING_LENGTH.format(arch=arch)) == c.hidden_size
    assert _field(reader, keys.CONTEXT_LENGTH.format(arch=arch)) == c.max_position_embeddings
    assert _field(reader, gguf.Keys.Attention.HEAD_COUNT.format(arch=arch)) == c.num_attention_heads
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.ALL_F32
    if arch == "gpt2":
        assert _field(reader, keys.FEED_FORWARD_LENGTH.format(arch=arch)) == 4 * c.n_embd
        assert _field(reader, gguf.Keys.Attention.LAYERNORM_EPS.format(arch=arch)) == np.float32(c.layer_norm_epsilon)
    else:
        assert _field(reader, keys.FEED_FORWARD_LENGTH.format(arch=arch)) == c.intermediate_size
        assert _field(reader, gguf.Keys.Attention.HEAD_COUNT_KV.format(arch=arch)) == c.num_key_value_heads
        assert _field(reader, gguf.Keys.Attention.LAYERNORM_RMS_EPS.format(arch=arch)) == np.float32(c.rms_norm_eps)


def test_llama_rope_base_and_dimensions(converted):
    _, reader, model = converted["llama"]
    assert _field(reader, gguf.Keys.Rope.FREQ_BASE.format(arch="llama")) == 50000.0
    assert _field(reader, gguf.Keys.Rope.DIMENSION_COUNT.format(arch="llama")) == 16
    assert _field(reader, gguf.Keys.LLM.VOCAB_SIZE.format(arch="llama")) == 160


def _normal_rope_rows(n_head: int, head_dim: int) -> np.ndarray:
    """Row order that turns rotate-half RoPE (HF) into rotate-adjacent-pairs RoPE (GGUF llama):
    within each head, GGUF row 2i is HF row i and GGUF row 2i+1 is HF row i + head_dim/2."""
    half = head_dim // 2
    return np.array([h * head_dim + i + j * half for h in range(n_head) for i in range(half) for j in (0, 1)])


def test_llama_q_and_k_rows_are_permuted_for_the_normal_rope_layout(converted):
    hf_dir, reader, _ = converted["llama"]
    hf, ours = _hf_tensors(hf_dir), _gguf_tensors(reader)
    np.testing.assert_array_equal(ours["blk.1.attn_q.weight"],
                                  hf["model.layers.1.self_attn.q_proj.weight"][_normal_rope_rows(4, 16)])
    np.testing.assert_array_equal(ours["blk.1.attn_k.weight"],
                                  hf["model.layers.1.self_attn.k_proj.weight"][_normal_rope_rows(2, 16)])
    np.testing.assert_array_equal(ours["blk.1.attn_v.weight"], hf["model.layers.1.self_attn.v_proj.weight"])


def test_untied_llama_keeps_its_lm_head(converted):
    hf_dir, reader, _ = converted["llama"]
    np.testing.assert_array_equal(_gguf_tensors(reader)["output.weight"], _hf_tensors(hf_dir)["lm_head.weight"])


def test_qwen2_keeps_row_order_and_qkv_biases(converted):
    hf_dir, reader, _ = converted["qwen2"]
    hf, ours = _hf_tensors(hf_dir), _gguf_tensors(reader)
    for proj, name in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
        for kind in ("weight", "bias"):
            np.testing.assert_array_equal(ours[f"blk.0.{name}.{kind}"], hf[f"model.layers.0.self_attn.{proj}.{kind}"])
    assert "output.weight" not in ours  # tied: the graph reads token_embd.weight


def test_gemma3_norm_weights_are_stored_plus_one(converted):
    hf_dir, reader, _ = converted["gemma3"]
    hf, ours = _hf_tensors(hf_dir), _gguf_tensors(reader)
    pairs = {"output_norm.weight": "model.norm.weight",
             "blk.2.attn_norm.weight": "model.layers.2.input_layernorm.weight",
             "blk.2.post_attention_norm.weight": "model.layers.2.post_attention_layernorm.weight",
             "blk.2.ffn_norm.weight": "model.layers.2.pre_feedforward_layernorm.weight",
             "blk.2.post_ffw_norm.weight": "model.layers.2.post_feedforward_layernorm.weight",
             "blk.2.attn_q_norm.weight": "model.layers.2.self_attn.q_norm.weight",
             "blk.2.attn_k_norm.weight": "model.layers.2.self_attn.k_norm.weight"}
    for ours_name, hf_name in pairs.items():
        np.testing.assert_array_equal(ours[ours_name], hf[hf_name] + np.float32(1))
    np.testing.assert_array_equal(ours["blk.2.attn_q.weight"], hf["model.layers.2.self_attn.q_proj.weight"])


def test_gemma3_sliding_window_layers_and_rope_bases(converted):
    _, reader, _ = converted["gemma3"]
    attention, rope = gguf.Keys.Attention, gguf.Keys.Rope
    assert _field(reader, attention.SLIDING_WINDOW.format(arch="gemma3")) == 16
    assert _field(reader, attention.SLIDING_WINDOW_PATTERN.format(arch="gemma3")) == [True, False, True]
    assert _field(reader, rope.FREQ_BASE.format(arch="gemma3")) == 1_000_000.0
    assert _field(reader, rope.FREQ_BASE_SWA.format(arch="gemma3")) == 10_000.0
    assert _field(reader, attention.KEY_LENGTH.format(arch="gemma3")) == 32


def test_gpt2_conv1d_weights_are_transposed_and_qkv_stays_fused(converted):
    hf_dir, reader, _ = converted["gpt2"]
    hf, ours = _hf_tensors(hf_dir), _gguf_tensors(reader)
    for gguf_name, hf_name in (("attn_qkv", "attn.c_attn"), ("attn_output", "attn.c_proj"),
                               ("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj")):
        np.testing.assert_array_equal(ours[f"blk.1.{gguf_name}.weight"], hf[f"transformer.h.1.{hf_name}.weight"].T)
        np.testing.assert_array_equal(ours[f"blk.1.{gguf_name}.bias"], hf[f"transformer.h.1.{hf_name}.bias"])
    assert ours["blk.1.attn_qkv.weight"].shape == (3 * 64, 64)
    np.testing.assert_array_equal(ours["position_embd.weight"], hf["transformer.wpe.weight"])


# -- output types ------------------------------------------------------------------------------

OUTTYPES = {"f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
            "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
            "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0)}


@pytest.mark.parametrize("outtype", sorted(OUTTYPES))
def test_outtype_quantizes_matrices_like_gguf_and_keeps_vectors_f32(outtype, converted, tmp_path):
    # qwen2 here has 80-wide FFN rows: not whole Q8_0 blocks, so Q8_0 falls back to F16 for ffn_down
    hf_dir, _, _ = converted["qwen2"]
    reader = gguf.GGUFReader(convert(hf_dir, tmp_path / f"{outtype}.gguf", outtype))
    quant_type, file_type = OUTTYPES[outtype]
    hf = _hf_tensors(hf_dir)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, 2)
    by_name = {name_map.get_name(n, try_suffixes=(".weight", ".bias")): v for n, v in hf.items()}
    assert _field(reader, "general.file_type") == file_type
    for tensor in reader.tensors:
        values = by_name[tensor.name]
        if values.ndim == 1:
            expected_type = gguf.GGMLQuantizationType.F32
        elif outtype == "q8_0" and values.shape[-1] % 32:
            expected_type = gguf.GGMLQuantizationType.F16
        else:
            expected_type = quant_type
        assert tensor.tensor_type == expected_type, tensor.name
        expected = gguf.quants.quantize(values, expected_type)
        assert np.asarray(tensor.data).tobytes() == expected.tobytes(), tensor.name
    assert any(t.tensor_type == gguf.GGMLQuantizationType.F16 for t in reader.tensors) == (outtype != "bf16")


def test_q8_0_file_runs_close_to_the_f32_file(converted, tmp_path):
    from ember.engine.runtime import Model

    hf_dir, _, _ = converted["llama"]
    tokens = list(range(3, 43))
    f32 = Model(convert(hf_dir, tmp_path / "f32.gguf", "f32"), n_ctx=64, n_threads=2).eval(tokens, logits="all")
    q8 = Model(convert(hf_dir, tmp_path / "q8.gguf", "q8_0"), n_ctx=64, n_threads=2).eval(tokens, logits="all")
    assert np.abs(q8 - f32).max() <= 0.05 * np.abs(f32).max()


# -- reading checkpoints ------------------------------------------------------------------------

def test_bf16_and_f16_checkpoints_convert_to_their_exact_values(tmp_path):
    for dtype in (torch.bfloat16, torch.float16):
        folder = tmp_path / str(dtype)
        _save(folder, "llama", dtype=dtype)
        ours = _gguf_tensors(gguf.GGUFReader(convert(folder, tmp_path / f"{dtype}.gguf", "f32")))
        np.testing.assert_array_equal(ours["token_embd.weight"], _hf_tensors(folder)["model.embed_tokens.weight"])


def test_every_f8_e4m3_byte_reads_as_torch_reads_it(tmp_path):
    from safetensors.torch import save_file

    from ember.convert.checkpoint import read_safetensors

    raw = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    save_file({"w": raw.view(torch.float8_e4m3fn)}, str(tmp_path / "f8.safetensors"))
    (t,) = read_safetensors(tmp_path / "f8.safetensors")
    assert t.dtype == "F8_E4M3" and t.is_float
    np.testing.assert_array_equal(t.numpy(), raw.view(torch.float8_e4m3fn).float().numpy())  # NaN where torch's


def test_fp8_block_factors_of_the_wrong_shape_are_refused(tmp_path):
    from safetensors.torch import save_file

    from ember.convert.checkpoint import open_checkpoint

    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"weight_block_size": [128, 128]}}))
    save_file({"w": torch.zeros(300, 200).to(torch.float8_e4m3fn), "w_scale_inv": torch.ones(2, 2)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(EmberError, match=r"w_scale_inv .* is not the F32 \[3, 2\] factors"):
        open_checkpoint(tmp_path).tensors


def test_sharded_checkpoint_converts_like_a_single_file(tmp_path):
    model = _save(tmp_path / "one", "llama")
    model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    one = _gguf_tensors(gguf.GGUFReader(convert(tmp_path / "one", tmp_path / "one.gguf", "f32")))
    sharded = _gguf_tensors(gguf.GGUFReader(convert(tmp_path / "sharded", tmp_path / "sharded.gguf", "f32")))
    assert one.keys() == sharded.keys()
    for name in one:
        np.testing.assert_array_equal(one[name], sharded[name])


def test_original_gpt2_checkpoint_names_and_mask_buffers(converted, tmp_path):
    # openai-community/gpt2 names its tensors without "transformer." and stores attention-mask buffers
    from safetensors.numpy import load_file, save_file

    hf_dir, reference, _ = converted["gpt2"]
    tensors = {name.removeprefix("transformer."): values
               for name, values in load_file(hf_dir / "model.safetensors").items()}
    tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 96, 96), dtype=bool))
    tensors["h.0.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
    ours = _gguf_tensors(gguf.GGUFReader(convert(tmp_path, tmp_path / "out.gguf", "f32")))
    expected = _gguf_tensors(reference)
    assert ours.keys() == expected.keys()
    np.testing.assert_array_equal(ours["blk.0.attn_qkv.weight"], expected["blk.0.attn_qkv.weight"])


def test_convert_streams_tensors_without_holding_the_model(tmp_path):
    # 2 x 8 MiB of embeddings (untied) plus small layers: converting must never hold them at once
    _save(tmp_path / "hf", "llama", vocab_size=8192, hidden_size=256, intermediate_size=256,
          num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
    checkpoint_bytes = sum(f.stat().st_size for f in (tmp_path / "hf").glob("*.safetensors"))
    tracemalloc.start()
    try:
        convert(tmp_path / "hf", tmp_path / "out.gguf", "f16")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < checkpoint_bytes / 3


# -- tokenizer metadata ---------------------------------------------------------------------

_TEXT = ["The quick brown fox jumps over the lazy dog.", "ember runs GGUF models on the CPU, fast!",
         "def convert(hf_dir, output):\n    return 42\n", "Hello, world! 12345 hello again."] * 10
_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}"


def _byte_level_tokenizer(folder, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(_TEXT, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_tokens(["hello world"])  # an added token that is not special
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|im_start|>", "add_bos_token": False,
         "chat_template": _TEMPLATE}))


def test_byte_level_bpe_vocabulary_from_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer

    _save(tmp_path, "qwen2", vocab_size=320)
    _byte_level_tokenizer(tmp_path, 300)
    reader = gguf.GGUFReader(convert(tmp_path, tmp_path / "out.gguf", "f32"))
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    special = gguf.SpecialVocab(tmp_path, load_merges=True)

    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    n_real = tok.get_vocab_size(with_added_tokens=True)
    assert len(tokens) == 320  # padded to the model's vocab_size
    assert tokens[:n_real] == [tok.id_to_token(i) for i in range(n_real)]
    assert tokens[n_real:] == [f"[PAD{i}]" for i in range(n_real, 320)]
    added = {t.content: (i, t.special) for i, t in tok.get_added_tokens_decoder().items()}
    expected_types = [gguf.TokenType.NORMAL] * n_real + [gguf.TokenType.UNUSED] * (320 - n_real)
    for content, (i, is_special) in added.items():
        expected_types[i] = gguf.TokenType.CONTROL if is_special else gguf.TokenType.USER_DEFINED
    assert types == expected_types
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert _field(reader, "tokenizer.ggml.merges") == special.merges
    assert _field(reader, "tokenizer.ggml.bos_token_id") == special.special_token_ids["bos"]
    assert _field(reader, "tokenizer.ggml.eos_token_id") == special.special_token_ids["eos"]
    assert special.special_token_ids["bos"] == added["<|endoftext|>"][0]
    assert special.special_token_ids["eos"] == added["<|im_start|>"][0]
    assert _field(reader, "tokenizer.ggml.add_bos_token") is special.add_special_token["bos"] is False
    assert _field(reader, "tokenizer.chat_template") == _TEMPLATE


def test_converted_vocabulary_tokenizes_like_the_source_tokenizer(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    from ember.gguf import open_gguf
    from ember.tokenizer.tokenizer import Tokenizer

    _save(tmp_path, "qwen2", vocab_size=320)
    _byte_level_tokenizer(tmp_path, 300)
    with open_gguf(convert(tmp_path, tmp_path / "out.gguf", "f32")) as f:
        ours = Tokenizer.from_gguf(f)
        source = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
        for text in ["The quick brown fox", "  def convert(x):\n\treturn 12345!", "hello world, Hello World"]:
            assert ours.encode(text, add_special=False) == source.encode(text, add_special_tokens=False).ids


# tokenizer.json pre_tokenizer sections, verbatim from the models' files
_LLAMA3_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                                           " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
_QWEN2_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                                           " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
_SMOLLM_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


@pytest.mark.parametrize("pre, name", [(_LLAMA3_PRE, "llama-bpe"), (_QWEN2_PRE, "qwen2"), (_SMOLLM_PRE, "smollm"),
                                       ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, "gpt-2")])
def test_pre_tokenizer_gets_the_llama_cpp_name(pre, name):
    assert pre_tokenizer_name(pre) == name


def test_unknown_pre_tokenizer_is_refused():
    with pytest.raises(EmberError, match="pre-tokenizer not recognised"):
        pre_tokenizer_name({"type": "Whitespace"})


def _proto_field(number: int, wire: int, payload: bytes) -> bytes:
    key = bytes([number << 3 | wire])
    if wire == 2:
        return key + bytes([len(payload)]) + payload
    return key + payload


def _piece(text: str, score: float, kind: int | None) -> bytes:
    body = _proto_field(1, 2, text.encode()) + _proto_field(2, 5, struct.pack("<f", score))
    return body + (_proto_field(3, 0, bytes([kind])) if kind is not None else b"")


def test_sentencepiece_model_is_read_without_the_sentencepiece_package(tmp_path):
    # ModelProto { pieces = 1 } with SentencePiece { piece = 1, score = 2, type = 3 }; other fields skipped
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("<0x41>", 0.0, 6), ("\u2581the", -1.5, None),
              ("<extra>", 0.0, 4), ("xyz", -9.0, 5)]
    proto = b"".join(_proto_field(1, 2, _piece(*p)) for p in pieces) + _proto_field(2, 2, b"\x08\x01")
    _save(tmp_path, "llama", vocab_size=8)
    (tmp_path / "tokenizer.model").write_bytes(proto)
    reader = gguf.GGUFReader(convert(tmp_path, tmp_path / "out.gguf", "f32"))
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    assert _field(reader, "tokenizer.ggml.tokens") == ["<unk>", "<s>", "</s>", "<0x41>", "\u2581the", "<extra>", "xyz",
                                                        "[PAD7]"]
    assert _field(reader, "tokenizer.ggml.scores") == pytest.approx([0, 0, 0, 0, -1.5, 0, -9, -10000])
    t = gguf.TokenType  # USER_DEFINED pieces count as NORMAL, as in llama.cpp
    assert _field(reader, "tokenizer.ggml.token_type") == [t.UNKNOWN, t.CONTROL, t.CONTROL, t.BYTE, t.NORMAL,
                                                            t.NORMAL, t.UNUSED, t.UNUSED]


def test_sentencepiece_vocabulary_matches_sentencepiece(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    (tmp_path / "text.txt").write_text("\n".join(_TEXT))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "text.txt"), model_prefix=str(tmp_path / "tokenizer"),
                                   vocab_size=400, model_type="bpe", byte_fallback=True,
                                   user_defined_symbols=["<tool>"], minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    _save(tmp_path, "gemma3", vocab_size=processor.vocab_size(), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    reader = gguf.GGUFReader(convert(tmp_path, tmp_path / "out.gguf", "f32"))

    n = processor.vocab_size()
    t = gguf.TokenType
    expected_types = [t.UNKNOWN if processor.IsUnknown(i) else t.CONTROL if processor.IsControl(i)
                      else t.UNUSED if processor.IsUnused(i) else t.BYTE if processor.IsByte(i) else t.NORMAL
                      for i in range(n)]
    assert _field(reader, "tokenizer.ggml.tokens") == [processor.IdToPiece(i) for i in range(n)]
    assert _field(reader, "tokenizer.ggml.scores") == [processor.GetScore(i) for i in range(n)]
    assert _field(reader, "tokenizer.ggml.token_type") == expected_types
    assert _field(reader, "tokenizer.ggml.pre") == "default"
    assert _field(reader, "tokenizer.ggml.add_space_prefix") is False
    assert _field(reader, "tokenizer.ggml.bos_token_id") == 1
    assert _field(reader, "tokenizer.ggml.eos_token_id") == 2


def test_byte_fallback_tokenizer_json_becomes_a_llama_vocabulary_like_gguf_reads_it(tmp_path):
    # a SentencePiece-style BPE exported to tokenizer.json (TinyLlama's layout), no tokenizer.model
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_pieces = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(_TEXT, trainers.BpeTrainer(vocab_size=320, show_progress=False,
                                                       special_tokens=["<unk>", "<s>", "</s>", *byte_pieces]))
    tok.add_special_tokens(["<|tool|>"])
    tok.add_tokens(["plain added"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    _save(tmp_path, "llama", vocab_size=n_vocab)
    reader = gguf.GGUFReader(convert(tmp_path, tmp_path / "out.gguf", "f32"))

    expected = list(gguf.vocab.LlamaHfVocab(tmp_path).all_tokens())
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    assert _field(reader, "tokenizer.ggml.tokens") == [text.decode() for text, _, _ in expected]
    assert _field(reader, "tokenizer.ggml.scores") == [score for _, score, _ in expected]
    assert _field(reader, "tokenizer.ggml.token_type") == [kind for _, _, kind in expected]
    assert _field(reader, "tokenizer.ggml.bos_token_id") == 1
    assert _field(reader, "tokenizer.ggml.add_bos_token") is True


def test_folder_without_tokenizer_gets_no_vocabulary(converted):
    _, reader, _ = converted["llama"]
    assert _field(reader, "tokenizer.ggml.model") == "none"
    assert _field(reader, "tokenizer.ggml.tokens") is None


# -- errors and the command line ---------------------------------------------------------------

def test_cli_converts_a_folder(converted, tmp_path, capsys):
    hf_dir, reference, _ = converted["gpt2"]
    out = tmp_path / "cli.gguf"
    assert cli.main(["convert", str(hf_dir), str(out), "--outtype", "f32"]) == 0
    assert str(out) in capsys.readouterr().out
    assert [t.name for t in gguf.GGUFReader(out).tensors] == [t.name for t in reference.tensors]


def test_missing_config_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert cli.main(["convert", str(tmp_path), str(tmp_path / "out.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ember: error: ") and "config.json" in err
    assert not (tmp_path / "out.gguf").exists()


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    with pytest.raises(EmberError, match="'MambaForCausalLM'.*BertModel.*LlamaForCausalLM"):
        convert(tmp_path, tmp_path / "out.gguf", "f32")


def test_unknown_outtype_is_refused(converted, tmp_path):
    hf_dir, _, _ = converted["llama"]
    with pytest.raises(EmberError, match="q4_0"):
        convert(hf_dir, tmp_path / "out.gguf", "q4_0")


def test_folder_without_safetensors_is_refused(converted, tmp_path):
    hf_dir, _, _ = converted["llama"]
    (tmp_path / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(EmberError, match="only safetensors"):
        convert(tmp_path, tmp_path / "out.gguf", "f32")


def test_truncated_safetensors_is_refused(converted, tmp_path):
    hf_dir, _, _ = converted["llama"]
    (tmp_path / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
    data = (hf_dir / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(EmberError, match="does not fit"):
        convert(tmp_path, tmp_path / "out.gguf", "f32")


def test_not_a_directory_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(EmberError, match="not a directory"):
        convert(tmp_path / "file", tmp_path / "out.gguf", "f32")
