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

With embeddings=True the model returns, for every token, the base model's last hidden state (after
the final norm) that transformers computes: cosine >= 0.9999 per token.

Beyond that bound, as the registry models are judged: in F32 the top-1 token equals the
reference's at every position and every position's cosine similarity is >= 0.9999. The same
model quantized to Q8_0 (`ember convert --outtype q8_0`) and Q4_K_M (`ember quantize`), run with
ember's 8-bit activations, is compared as the registry models are, with transformers on the
weights the file holds (dequantized by the gguf package): cosines >= 0.99, and the reference's
top-1 token wherever its top-2 margin is clear (QUANT_MARGIN of the largest logit: ember's 8-bit
activations, like llama.cpp's, move these models' logits by up to 2% of it, and a top-1 token
may flip below that, as the registry models' do at their MARGINS). The tensor names must
be ones gguf-py declares for the architecture. What llama.cpp's convert_hf_to_gguf.py writes for
each configuration (its model with patterned weights) is recorded in tests/fixtures/llama_cpp_convert
(converter_record.py): `ember convert` must write the same metadata keys, GGUF types and values, and
the same tensors, shapes and values, and ember must run a file with the recorded metadata to the
reference logits. With EMBER_LLAMA_CPP naming a llama.cpp source tree, its converter must still write
the record, and on the random model the file `ember convert` writes, which ember runs to the same logits.
Mixtures of experts (`mixture_of_experts = True`): 8-bit activations can swap two near-tied
experts of a token, so the quantized cosine bar holds at most positions (assert_quantized_close);
with float activations the quantized file must meet the F32 bound at every position.

An architecture's test file (tests/models/test_<arch>.py) subclasses `TransformersParity` with
its Hugging Face model class and a few configurations that switch on every feature of the family
(and `f16_cache` where its cache holds something other than K and V: DeepSeek's latents);
(and `mixture_of_experts = True` for MoE models, whose experts transformers then runs one by one);
tests/models/conftest.py runs each test once per configuration.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ember.convert import convert  # noqa: E402
from ember.engine.runtime import Model  # noqa: E402
from ember.gguf import open_gguf  # noqa: E402
from ember.quant.quantize import quantize_file  # noqa: E402

from converter_record import (  # noqa: E402
    assert_same_file,
    llama_cpp_convert,
    load_record,
    patterned_checkpoint,
    summary,
    write_tiny_tokenizer,
)

N_TOKENS = 40
RTOL = 1e-4
RTOL_PLAIN = 1e-3
F32_COSINE = 0.9999
QUANT_COSINE = 0.99
QUANT_MARGIN = 0.03
QUANT_EXPERT_SHARE = 0.9
QUANT_EXPERT_MEAN_COSINE = 0.998
LLAMA_CPP = os.environ.get("EMBER_LLAMA_CPP")  # a llama.cpp source tree, for its converter
WEIGHT_STD = 0.05
F16_KV = "ember_f16_kv"


def register_f16_kv_attention(model, implementation: str = "sdpa") -> None:
    """The model's attention ("sdpa", or "eager": its module's own, for soft-capping) with K and V
    rounded to F16 first, as ember's KV cache stores them."""
    import importlib

    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    forward = sdpa_attention_forward
    if implementation == "eager":
        forward = importlib.import_module(type(model).__module__).eager_attention_forward

    def attention(module, query, key, value, *args, **kwargs):
        key, value = key.half().to(key.dtype), value.half().to(value.dtype)
        return forward(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(F16_KV, attention)
    AttentionMaskInterface.register(F16_KV, eager_mask if implementation == "eager" else sdpa_mask)


def randomize(model, norm_offset: float = 1.0) -> None:
    """Every parameter random: weights and biases N(0, s^2); norm scales norm_offset + N(0, s^2)
    (Gemma stores the offset from 1: norm_offset 0); s = WEIGHT_STD. So is every floating-point
    buffer the checkpoint stores (DeepSeek-V3's e_score_correction_bias, zero at init): N(0, s^2)."""
    generator = torch.Generator().manual_seed(1234)
    stored = model.state_dict().keys()
    buffers = [(name, b) for name, b in model.named_buffers() if name in stored and b.is_floating_point()]
    with torch.no_grad():
        for name, param in [*model.named_parameters(), *buffers]:
            param.copy_(torch.randn(param.shape, generator=generator) * WEIGHT_STD)
            is_norm = "norm" in name or ".ln_" in name
            if is_norm and name.endswith("weight"):
                param.add_(norm_offset)


def converted_random_model(model, folder: Path) -> Path:
    """`model` (a transformers model) with every parameter random (randomize), saved to `folder` and
    converted to F32 by `ember convert` beside it."""
    randomize(model)
    model.save_pretrained(folder, safe_serialization=True)
    return convert(folder, folder.parent / "f32.gguf", "f32")


def relative_error(got: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(got - reference).max() / np.abs(reference).max())


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def assert_quantized_close(logits: np.ndarray, reference: np.ndarray, experts: bool = False) -> None:
    """The registry models' bar. In a mixture of experts, rounding the activations to 8 bits can
    swap two experts that score within the rounding of each other for a token, which moves that
    position's logits (cosines down to 0.96 on these random routers): there both bars hold at
    QUANT_EXPERT_SHARE of the positions, and the cosine QUANT_EXPERT_MEAN_COSINE on average."""
    cos = cosines(logits, reference)
    top2 = np.sort(reference, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= QUANT_MARGIN * np.abs(reference).max()
    assert clear.mean() >= 0.5  # the check is not vacuous
    same_top1 = logits.argmax(1)[clear] == reference.argmax(1)[clear]
    if experts:
        assert (cos >= QUANT_COSINE).mean() >= QUANT_EXPERT_SHARE and cos.mean() >= QUANT_EXPERT_MEAN_COSINE
        assert same_top1.mean() >= QUANT_EXPERT_SHARE
    else:
        assert cos.min() >= QUANT_COSINE
        assert same_top1.all()


def dequantized_reference(hf_dir: Path, gguf_path: Path, tokens: np.ndarray, case: type) -> np.ndarray:
    """transformers' logits (float64, what ember caches rounded to F16 as `case.f16_cache` rounds
    it: K and V, or DeepSeek's latents) on the weights a quantized file holds: every
    quantized tensor, dequantized by the gguf package, put back into the Hugging Face model where
    the converter took it from (undoing its row permutation or transposition)."""
    import json

    import gguf

    from ember.models import converter_for

    config = json.loads((hf_dir / "config.json").read_text())
    converter = converter_for(config["architectures"][0], config)
    tensors = {t.name: t for t in gguf.GGUFReader(gguf_path).tensors}
    experts = {"experts_implementation": "eager"} if is_mixture_of_experts(config) else {}
    model = case.load_model(hf_dir, dtype=torch.float64, **experts).eval()
    with torch.no_grad():
        for hf_name, param in model.named_parameters():
            fused = FUSED_EXPERTS.match(hf_name)
            if fused is not None:  # transformers holds a layer's experts stacked: gate and up, then down
                layer, kind = fused.groups()
                parts = ("gate", "up") if kind == "gate_up_proj" else ("down",)
                stored = [tensors[f"blk.{layer}.ffn_{part}_exps.weight"] for part in parts]
                values = np.concatenate([gguf.dequantize(t.data, t.tensor_type).reshape(
                    tuple(int(d) for d in reversed(t.shape))) for t in stored], axis=1)
                param.copy_(torch.from_numpy(values.reshape(param.shape).astype(np.float64)))
                continue
            # the GGUF tensors the parameter became (one, or the parts of a split) and where each took its values from
            parts = converter.split(hf_name, tuple(param.shape)) if hasattr(converter, "split") else None
            if parts is None:
                parts = [(converter.gguf_name(hf_name), lambda v, name=hf_name: converter.transform(name, v), None)]
            values = param.detach().numpy().reshape(-1).copy()
            for name, part, _ in parts:
                t = tensors.get(name)
                if t is None or t.tensor_type == gguf.GGMLQuantizationType.F32:
                    continue
                where = part(np.arange(param.numel(), dtype=np.float64).reshape(param.shape))
                values[where.reshape(-1).astype(np.int64)] = gguf.dequantize(t.data, t.tensor_type).reshape(-1)
            param.copy_(torch.from_numpy(values.reshape(param.shape)))
        model.set_attn_implementation(case.attention)
        with case.f16_cache(model):
            return model(torch.tensor(tokens)[None]).logits[0].numpy()


# transformers' stacked experts (a layer's gate and up projections together, and the down ones)
FUSED_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def is_mixture_of_experts(config: dict) -> bool:
    return any(config.get(key) for key in ("num_local_experts", "num_experts", "n_routed_experts"))


def build_tiny(case: type, config_name: str, tmp_path_factory):
    """For one configuration of a TransformersParity subclass: (ember Model on the converted F32
    file, float64 reference logits with F16 K/V, plain float64 reference logits, token ids)."""
    config = case.configs[config_name]()
    if case.mixture_of_experts:
        config._experts_implementation = "eager"  # the fused grouped_mm kernel has no float64
    torch.manual_seed(0)
    model = case.make_model(config).eval()
    randomize(model, case.norm_offset)
    hf_dir = tmp_path_factory.mktemp(config_name) / "hf"
    case.save_model(model, hf_dir)
    gguf_path = convert(hf_dir, hf_dir.parent / f"{config_name}-f32.gguf", "f32")

    tokens = np.random.default_rng(7).integers(0, config.vocab_size, N_TOKENS)
    ids = torch.tensor(tokens)[None]
    with torch.no_grad():
        model.double()
        model.set_attn_implementation(case.attention)
        plain = model(ids).logits[0].numpy()
        with case.f16_cache(model):
            reference = model(ids).logits[0].numpy()
    return Model(gguf_path, n_ctx=64, n_threads=2), reference, plain, tokens


class TransformersParity:
    """The shared tests; a subclass sets `model_class` (a transformers class name), `configs`
    ({name: () -> config}), where the family stores norms as offsets from 1, `norm_offset`, and
    where sdpa lacks a feature (soft-capping), `attention = "eager"`;
    the `tiny` fixture (tests/models/conftest.py) builds each configuration once."""

    model_class: str = ""
    configs: dict = {}
    norm_offset: float = 1.0
    attention: str = "sdpa"  # transformers' attention for the reference ("eager" where sdpa lacks a feature)
    tokenizer: str = "bpe"  # the tiny tokenizer llama.cpp's converter reads: "bpe" or "sentencepiece"
    llama_cpp_leaves_out: dict = {}  # {config name: metadata keys llama.cpp's converter does not write}
    llama_cpp_fails: dict = {}  # {config name: what llama.cpp's converter's error says on it}
    mixture_of_experts: bool = False

    @classmethod
    def make_model(cls, config):
        """The reference model of a configuration (a family transformers has no class for builds it
        from transformers' pieces)."""
        return getattr(transformers, cls.model_class)(config)

    @classmethod
    def save_model(cls, model, hf_dir: Path) -> None:
        """The checkpoint `ember convert` reads, as the family's checkpoints are laid out."""
        model.save_pretrained(hf_dir, safe_serialization=True)

    @classmethod
    def load_model(cls, hf_dir: Path, **kwargs):
        return transformers.AutoModelForCausalLM.from_pretrained(hf_dir, **kwargs)

    @classmethod
    @contextlib.contextmanager
    def f16_cache(cls, model):
        """Within it, `model` rounds what ember's KV cache holds to F16: K and V, as attention
        receives them (a family that caches something else overrides this)."""
        register_f16_kv_attention(model, cls.attention)
        model.set_attn_implementation(F16_KV)
        try:
            yield
        finally:
            model.set_attn_implementation(cls.attention)

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

    def test_f32_top1_at_every_position_and_cosines(self, tiny):
        model, reference, _, tokens = tiny
        model.reset()
        logits = model.eval(tokens.tolist(), logits="all")
        assert np.array_equal(logits.argmax(1), reference.argmax(1))
        assert cosines(logits, reference).min() >= F32_COSINE

    @pytest.mark.parametrize("kind", ["q8_0", "Q4_K_M"])
    def test_quantized_logits_within_registry_tolerance(self, tiny, kind, tmp_path):
        model, _, _, tokens = tiny
        hf_dir = Path(model.gguf.path).parent / "hf"
        if kind == "q8_0":
            path = convert(hf_dir, tmp_path / "q8_0.gguf", "q8_0")
        else:
            path = tmp_path / "q4_k_m.gguf"
            quantize_file(model.gguf.path, path, kind, n_threads=2)
        reference = dequantized_reference(hf_dir, path, tokens, type(self))
        for activations in ("int8", "f32") if self.mixture_of_experts else ("int8",):
            quantized = Model(path, n_ctx=64, n_threads=2, activations=activations)
            try:
                logits = quantized.eval(tokens.tolist(), logits="all")
            finally:
                quantized.close()
            if activations == "int8":
                assert_quantized_close(logits, reference, experts=self.mixture_of_experts)
            else:  # unrounded activations choose the experts transformers chooses: the F32 bound
                assert relative_error(logits, reference) <= RTOL

    def test_embeddings_are_transformers_final_hidden_states(self, tiny):
        """Model(embeddings=True) returns what the LM head reads: the base model's last hidden state
        (after the final norm) of every token, as transformers computes it (float64, F16 K/V)."""
        from ember.engine.embed import Embedder

        model, _, _, tokens = tiny
        import json

        hf_dir = Path(model.gguf.path).parent / "hf"
        config = json.loads((hf_dir / "config.json").read_text())
        experts = {"experts_implementation": "eager"} if is_mixture_of_experts(config) else {}
        hf = self.load_model(hf_dir, dtype=torch.float64, **experts).eval()
        hf.set_attn_implementation(self.attention)
        with torch.no_grad(), self.f16_cache(hf):
            expected = hf.base_model(torch.tensor(tokens)[None]).last_hidden_state[0].numpy()
        embedding = Model(model.gguf, n_ctx=64, n_threads=2, embeddings=True)
        try:
            states = Embedder(embedding, None, pooling="none", normalize=False).embed_tokens([tokens])[0].vector
        finally:
            embedding.graph = None  # the file stays open for the other tests
        assert states.shape == expected.shape
        assert cosines(states, expected).min() >= F32_COSINE

    def test_tensor_names_are_llama_cpps_for_the_architecture(self, tiny):
        gguf = pytest.importorskip("gguf")
        model = tiny[0]
        arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == model.gguf.arch)
        declared = {gguf.TENSOR_NAMES[t].format(bid=il) + suffix for t in gguf.MODEL_TENSORS[arch]
                    for il in range(model.hp.n_layer) for suffix in (".weight", ".bias")}
        assert set(model.gguf.tensors) <= declared

    def recorded(self, config_name: str) -> dict | None:
        """The record of llama.cpp's converter on the configuration (converter_record.py); None
        where it records the failure `llama_cpp_fails` names (any other failure is an error)."""
        record = load_record(config_name)
        if "llama_cpp_fails" in record or config_name in self.llama_cpp_fails:
            assert self.llama_cpp_fails.get(config_name, "<none known>") in record.get("llama_cpp_fails", "")
            return None
        return record

    def test_ember_convert_writes_what_llama_cpps_converter_writes(self, config_name, tmp_path):
        """Against the record of llama.cpp's converter on the patterned model (converter_record.py):
        the same metadata keys, of the same GGUF types and values, the same tensors, types and shapes,
        holding the same values in the same order."""
        theirs = self.recorded(config_name)
        if theirs is None:
            return
        hf_dir = patterned_checkpoint(type(self), config_name, tmp_path)
        ours = summary(convert(hf_dir, tmp_path / "ember.gguf", "f32"))
        assert_same_file(ours, theirs, self.llama_cpp_leaves_out.get(config_name, ()))

    def test_ember_runs_the_metadata_llama_cpps_converter_writes(self, tiny, config_name, tmp_path):
        """The F32 file with llama.cpp's converter's metadata (the record's keys, types and values in
        place of the `<arch>.` keys ember wrote) and its tensors runs to transformers' logits; where
        llama.cpp's converter leaves keys out, to the logits of ember's file without them."""
        model, reference, _, tokens = tiny
        record = self.recorded(config_name)
        if record is None:
            return
        path = with_recorded_metadata(model.gguf.path, record, tmp_path / "recorded.gguf")
        left_out = self.llama_cpp_leaves_out.get(config_name, ())
        if left_out:  # what their file means: ours without those keys
            reference = logits_of(rewritten(model.gguf.path, tmp_path / "ours-less.gguf", dict.fromkeys(left_out)), tokens)
        assert relative_error(logits_of(path, tokens), reference) <= RTOL

    @pytest.mark.skipif(not LLAMA_CPP, reason="EMBER_LLAMA_CPP (a llama.cpp source tree) is not set")
    def test_llama_cpp_converter_writes_the_same_file(self, tiny, tmp_path, config_name):
        """With llama.cpp's converter at hand: the record is what it writes today, and on the random
        model it writes the file `ember convert` writes, which ember runs to the same logits."""
        patterned = patterned_checkpoint(type(self), config_name, tmp_path / "patterned")
        if config_name in self.llama_cpp_fails:
            with pytest.raises(RuntimeError, match=re.escape(self.llama_cpp_fails[config_name])):
                llama_cpp_convert(LLAMA_CPP, patterned, tmp_path / "patterned.gguf")
            return
        assert_same_file(summary(llama_cpp_convert(LLAMA_CPP, patterned, tmp_path / "patterned.gguf")),
                         self.recorded(config_name))
        model, reference, _, tokens = tiny
        hf_dir = tmp_path / "hf"
        shutil.copytree(Path(model.gguf.path).parent / "hf", hf_dir)
        write_tiny_tokenizer(hf_dir, model.n_vocab, self.tokenizer)
        ours_path = convert(hf_dir, tmp_path / "ember.gguf", "f32")
        theirs_path = llama_cpp_convert(LLAMA_CPP, hf_dir, tmp_path / "llama.cpp.gguf")
        left_out = self.llama_cpp_leaves_out.get(config_name, ())
        assert_same_file(summary(ours_path), summary(theirs_path), left_out)
        if left_out:  # what their file means: ours without those keys
            reference = logits_of(rewritten(ours_path, tmp_path / "ours-less.gguf", dict.fromkeys(left_out)), tokens)
        assert relative_error(logits_of(theirs_path, tokens), reference) <= RTOL


def with_recorded_metadata(source: Path, record: dict, output: Path) -> Path:
    """A copy of the GGUF file `source` whose `<arch>.` metadata is the record's (keys, GGUF types,
    values) and whose tensors are the record's names, each `source`'s tensor of that name and shape."""
    from ember.gguf import GGUFWriter
    from ember.gguf.format import GGUFValueType

    f = open_gguf(source)
    arch = record["architecture"]
    writer = GGUFWriter(output, arch)
    for key, value in f.metadata.items():
        if key != "general.architecture" and not key.startswith(("GGUF.", f"{arch}.")):
            writer.add(key, value, f.metadata_types[key])
    for key, entry in record["metadata"].items():
        names = entry["type"].split("/")
        spec = (GGUFValueType.ARRAY, GGUFValueType[names[1]]) if names[0] == "ARRAY" else GGUFValueType[names[0]]
        writer.add(key, entry["value"], spec)
    for name, t in record["tensors"].items():
        ours = f.tensors[name]
        assert [ours.type.name, list(ours.shape)] == [t["type"], t["shape"]], name
        writer.add_tensor(name, np.array(ours.data), ours.type, ours.shape)
    return writer.write()


def logits_of(path: Path, tokens: np.ndarray) -> np.ndarray:
    runner = Model(path, n_ctx=64, n_threads=2)
    try:
        return runner.eval(tokens.tolist(), logits="all")
    finally:
        runner.close()


def rewritten(source, output: Path, metadata: dict | None = None, tensors: dict | None = None) -> Path:
    """A copy of the GGUF file `source` with some metadata values and some tensors (F32 arrays in
    numpy order; None leaves one out) replaced or added: the malformed files the validation tests load."""
    from ember.gguf import GGUFWriter

    metadata, tensors = metadata or {}, tensors or {}
    f = open_gguf(source)
    writer = GGUFWriter(output, f.arch)
    for key, value in {**f.metadata, **metadata}.items():
        if key != "general.architecture" and not key.startswith("GGUF.") and value is not None:
            writer.add(key, value)
    for name, t in f.tensors.items():
        if name not in tensors:
            writer.add_tensor(name, np.array(t.data), t.type, t.shape)
    for name, values in tensors.items():
        if values is not None:
            writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    return writer.write()
