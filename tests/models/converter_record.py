"""What llama.cpp's convert_hf_to_gguf.py writes for each architecture's tiny model, recorded in
tests/fixtures/llama_cpp_convert/<config>.json (by tests/fixtures/make_llama_cpp_convert_fixtures.py)
so that `ember convert` is held to it without llama.cpp.

The model converted is the test configuration's, its weights set to a pattern of each parameter's
name and element index (`patterned`, exact in F16 and F32, the same under any torch), with the tiny
tokenizer of `write_tiny_tokenizer`. A record (`summary`, read by the gguf package) holds:
- "metadata": every `<arch>.` key with its GGUF type and value (and, for the configurations that
  ask, every `tokenizer.` key, an array of more than 16 values as its length and a CRC-32 of its JSON);
- "tensors": each tensor's type, shape (ne0 first), and two sums of its values in file order, plain
  and weighted by (index mod 251) + 1, so a tensor transposed, permuted or offset differently
  (Q/K row order, Gemma's 1 + w norms, fused QKV order) sums differently.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llama_cpp_convert"
WEIGHT_PERIOD = 251
SUM_RTOL = 1e-6  # the sums of values computed from the config (RoPE factors) may round differently


def patterned(model) -> None:
    """Each parameter (each once, tied ones included) and each floating-point buffer the checkpoint
    stores (DeepSeek-V3's e_score_correction_bias) set to ((i * 7919 + h) mod 1009 - 504) / 8192 at
    flat index i, h a hash of its name: distinct, exactly representable values in every tensor."""
    import torch

    stored = model.state_dict().keys()
    buffers = [(name, b) for name, b in model.named_buffers() if name in stored and b.is_floating_point()]
    with torch.no_grad():
        for name, param in [*model.named_parameters(), *buffers]:
            h = zlib.crc32(name.encode()) % 1009
            i = torch.arange(param.numel(), dtype=torch.int64)
            param.copy_((((i * 7919 + h) % 1009 - 504).to(torch.float64) / 8192).reshape(param.shape))


def patterned_checkpoint(case: type, config_name: str, folder: Path) -> Path:
    """The configuration's model with patterned weights and the tiny tokenizer, saved in `folder`/hf."""
    import torch

    config = case.configs[config_name]()
    torch.manual_seed(0)
    model = case.make_model(config).eval()
    patterned(model)
    hf_dir = folder / "hf"
    case.save_model(model, hf_dir)
    write_tiny_tokenizer(hf_dir, config.vocab_size, case.tokenizer)
    return hf_dir


def summary(path: Path, tokenizer: bool = False) -> dict:
    """The record of one GGUF file (see the module's docstring), read by the gguf package; with
    `tokenizer`, its tokenizer.* keys too."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    metadata = {}
    prefixes = (f"{arch}.", "tokenizer.") if tokenizer else (f"{arch}.",)
    for name, field in reader.fields.items():
        if name.startswith(prefixes):
            value = _plain(field.contents())
            if isinstance(value, list) and len(value) > 16:
                value = {"length": len(value), "crc32": zlib.crc32(json.dumps(value, ensure_ascii=False).encode())}
            metadata[name] = {"type": "/".join(gguf.GGUFValueType(t).name for t in field.types), "value": value}
    tensors = {}
    for t in reader.tensors:
        values = gguf.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
        weights = np.arange(values.size) % WEIGHT_PERIOD + 1
        tensors[t.name] = {"type": t.tensor_type.name, "shape": [int(d) for d in t.shape],
                           "sum": float(values.sum()), "weighted_sum": float(values @ weights),
                           "abs_weighted_sum": float(np.abs(values) @ weights)}
    return {"architecture": arch, "metadata": metadata, "tensors": tensors}


def tokenizer_record(hf_dir: Path, output: Path, llama_cpp: str | Path | None = None) -> dict:
    """The record, tokenizer keys too, of `hf_dir` converted to F32 by `ember convert` or, given a
    llama.cpp source tree, by its converter."""
    if llama_cpp is not None:
        return summary(llama_cpp_convert(llama_cpp, hf_dir, output), tokenizer=True)
    from ember.convert import convert

    return summary(convert(hf_dir, output, "f32"), tokenizer=True)


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def record_path(config_name: str) -> Path:
    return FIXTURES / f"{config_name}.json"


def load_record(config_name: str) -> dict:
    path = record_path(config_name)
    if not path.exists():
        raise AssertionError(f"{path.name} is missing: run tests/fixtures/make_llama_cpp_convert_fixtures.py")
    return json.loads(path.read_text())


def assert_same_file(ours: dict, theirs: dict, left_out=()) -> None:
    """`ours` (ember's record) holds what `theirs` (llama.cpp's) does: the architecture, the same
    metadata keys (less `left_out`, keys llama.cpp's converter does not write) of the same types and
    values, and the same tensors, of the same types, shapes and sums."""
    assert ours["architecture"] == theirs["architecture"]
    keys = set(ours["metadata"]) - set(left_out)
    assert keys == set(theirs["metadata"]), "metadata keys differ"
    for key in sorted(keys):
        a, b = ours["metadata"][key], theirs["metadata"][key]
        assert a["type"] == b["type"], f"{key}: type {a['type']}, llama.cpp's converter writes {b['type']}"
        assert _close(a["value"], b["value"]), f"{key}: {a['value']!r}, llama.cpp's converter writes {b['value']!r}"
    assert set(ours["tensors"]) == set(theirs["tensors"]), "tensor names differ"
    for name, b in theirs["tensors"].items():
        a = ours["tensors"][name]
        assert (a["type"], a["shape"]) == (b["type"], b["shape"]), f"{name}: {a['type']} {a['shape']}, " \
            f"llama.cpp's converter writes {b['type']} {b['shape']}"
        scale = max(b["abs_weighted_sum"], 1e-30)
        for what in ("sum", "weighted_sum"):
            assert abs(a[what] - b[what]) <= SUM_RTOL * scale, f"{name}: {what} {a[what]!r}, llama.cpp's {b[what]!r}"


def _close(a, b) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(_close, a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6)
    return a == b


def write_tiny_tokenizer(hf_dir: Path, n_vocab: int, kind: str = "bpe") -> None:
    """A byte-level BPE tokenizer of exactly n_vocab tokens, or a SentencePiece model of fewer
    (the converters pad the vocabulary), for the families llama.cpp reads only tokenizer.model of."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "sentencepiece":
        import sentencepiece

        text = [f"the model {i} runs {i * 7} tokens of text, one after another" for i in range(200)]
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(hf_dir / "tokenizer"),
                                                 vocab_size=min(n_vocab, 100), model_type="bpe", minloglevel=2)
        return

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|user|>"]
    text = [f"the model {i} runs {i * 7} tokens of text, one after another" for i in range(200)]
    trainer = trainers.BpeTrainer(vocab_size=n_vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text, trainer)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(n_vocab - tokenizer.get_vocab_size())])
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}')


# llama.cpp's converter refuses a tokenizer whose pre-tokenizer it does not know by hash; the tiny
# tokenizer's is GPT-2's (a real one, all-MiniLM's, it knows).
_LLAMA_CPP_CONVERT = """
import sys
tree = sys.argv.pop(1)
sys.path[:0] = [tree, tree + "/gguf-py"]
import conversion.base
known = conversion.base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
conversion.base.TextModel.get_vocab_base_pre = pre
import convert_hf_to_gguf
sys.argv[0] = "convert_hf_to_gguf.py"
convert_hf_to_gguf.main()
"""


def llama_cpp_convert(tree: str | Path, hf_dir: Path, output: Path) -> Path:
    """`hf_dir` converted to F32 by the convert_hf_to_gguf.py of the llama.cpp source `tree`."""
    run = subprocess.run([sys.executable, "-c", _LLAMA_CPP_CONVERT, str(tree), str(hf_dir), "--outfile", str(output),
                          "--outtype", "f32"], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {hf_dir}:\n{run.stderr[-3000:]}")
    return output
