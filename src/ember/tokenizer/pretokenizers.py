"""The pre-tokenizers of byte-level BPE vocabularies, by the name in `tokenizer.ggml.pre`.

A pre-tokenizer cuts text into words before BPE merges run inside each word. Each one is a
list of regexes applied in order, every regex splitting the pieces the previous one left
(matches and the text between them both become pieces: `Split(..., "isolated")`). The regexes
and flags follow llama.cpp's src/llama-vocab.cpp (llm_tokenizer_bpe and llama_vocab::load),
which is what GGUF files are converted for.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.errors import EmberError

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_KANA_HAN = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_DEEPSEEK_LLM_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_DEEPSEEK_LLM_LETTERS = (
    "\\s?["
    "A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-"
    "\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-"
    "\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d"
    "\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4"
    "\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec"
    "\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-"
    "\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f"
    "\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-"
    "\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-"
    "\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
    "]+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How one `tokenizer.ggml.pre` value tokenizes and detokenizes."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token is not merged piece by piece
    clean_spaces: bool = True  # detokenize drops the space before . , ! ? and some contractions
    add_bos: bool = False  # default for add_bos_token when the file does not say


_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
_GPT2_STYLE = PreTokenizer((_GPT2,))
_STARCODER = PreTokenizer((r"\p{N}", _GPT2))
_LLAMA3_STYLE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_STYLE = PreTokenizer((_QWEN2,), clean_spaces=False)

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    "gpt-2": _GPT2_STYLE,
    "gpt2": _GPT2_STYLE,
    "phi-2": _GPT2_STYLE,
    "mpt": _GPT2_STYLE,
    "olmo": _GPT2_STYLE,
    "jais": _GPT2_STYLE,
    "llama3": _LLAMA3_STYLE,
    "llama-v3": _LLAMA3_STYLE,
    "llama-bpe": _LLAMA3_STYLE,
    "falcon3": _LLAMA3_STYLE,
    "dbrx": PreTokenizer((_LLAMA3,)),
    "smaug-bpe": PreTokenizer((_LLAMA3,)),
    "qwen2": _QWEN2_STYLE,
    "deepseek-r1-qwen": _QWEN2_STYLE,
    "megrez": PreTokenizer((_QWEN2,)),
    "stablelm2": PreTokenizer((_QWEN2,)),
    "starcoder": _STARCODER,
    "refact": _STARCODER,
    "codeshell": _STARCODER,
    "exaone": _STARCODER,
    "minerva-7b": _STARCODER,
    "smollm": PreTokenizer((r"\p{N}", _GPT2), clean_spaces=False),
    "command-r": PreTokenizer((r"\p{N}", _GPT2), clean_spaces=False),
    "falcon": PreTokenizer((
        r"[\p{P}\$\+<=>\^~\|`]+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        "[0-9][0-9][0-9]",
    )),
    "deepseek-llm": PreTokenizer((
        "[\r\n]",
        _DEEPSEEK_LLM_LETTERS,
        _DEEPSEEK_LLM_PUNCT,
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ), clean_spaces=False),
    "deepseek-coder": PreTokenizer((
        "[\r\n]",
        r"\s?\p{L}+",
        r"\s?\p{P}+",
        _CJK,
        r"\p{N}",
    ), clean_spaces=False),
    "deepseek-v3": PreTokenizer((
        r"\p{N}{1,3}",
        _KANA_HAN,
        ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
         "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
    ), clean_spaces=False),
}


def pre_tokenizer(name: str) -> PreTokenizer:
    """The pre-tokenizer that `tokenizer.ggml.pre` names; an unknown name is an error."""
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise EmberError(
            f"unknown pre-tokenizer tokenizer.ggml.pre={name!r}; ember knows: {known}") from None
