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
_KANA_HAN = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
# Qwen3.5: marks (\p{M}) belong to words
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_JAIS2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
          r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
_MINICPM5 = (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3_WORDS = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+")
_DEEPSEEK3 = (r"\p{N}{1,3}", _KANA_HAN,
              _DEEPSEEK3_WORDS + "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
_SPARK2_5 = (r"\p{N}{1,3}", _KANA_HAN,
             _DEEPSEEK3_WORDS + "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+", r"\p{N}")
_UPPER_THEN_LOWER = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:" + _CONTRACTIONS
                     + r")?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:"
                     + _CONTRACTIONS + ")?")
_YOUTU = ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
          "\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
          _UPPER_THEN_LOWER + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CASED_WORDS = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*")
_TEKKEN = _CASED_WORDS + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:" + _CONTRACTIONS + r")?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:" + _CONTRACTIONS + r")?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GRANITE_EMB_MULTI = _GPT4O.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
_PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"
_CHAMELEON = ("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\t\n]|    |  )", r"\p{N}",
              r"[\p{P}!-/:-@\[-`{-~]", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")
_BAILINGMOE = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]|\s+(?!\S)|\s+")
_SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_EXAONE_MOE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
               r"|\s*[\r\n]|\s+(?!\S)|\s+")
_LINES = "[^\n]+|[\n]+"
# llama.cpp's digit grouping (its own code for AFMoE and Tiny Aya): a run of numbers splits into
# groups of 3 from the right, and the text before the run joins the run's first group
_GROUPED_DIGITS = r"\P{N}*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
# Tiny Aya's words as llama.cpp matches them: its regex's cased classes (\p{Lu}, \p{Ll}, ...) are
# all one class of letters there
_TINY_AYA = (_GROUPED_DIGITS, r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+(?:" + _CONTRACTIONS + r")?|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_AFMOE_SCRIPTS = "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+"
_AFMOE = (_GROUPED_DIGITS, _AFMOE_SCRIPTS, _DEEPSEEK3[2])
# SuperBPE: number runs, then ASCII digit runs cut into groups of 3 from the right
_SUPERBPE = (r"\p{N}+", r"[0-9]{1,3}(?=(?:[0-9]{3})*(?![0-9]))")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
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
    byte_encode: bool = True  # GPT-2's byte-level characters; False: merges over the raw UTF-8 characters
    escape_whitespace: bool = False  # spaces are "▁" in the vocabulary (SentencePiece-style BPE)
    force_bos: bool = False  # BOS even where the file's add_bos_token says no (Gemma 4)
    default_bos: bool = True  # BOS is token 11 when the file names none (llama.cpp's BPE default)


_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
_GPT2_STYLE = PreTokenizer((_GPT2,))
_STARCODER = PreTokenizer((r"\p{N}", _GPT2))
_LLAMA3_STYLE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_STYLE = PreTokenizer((_QWEN2,), clean_spaces=False)
_GEMMA4 = PreTokenizer((_LINES,), byte_encode=False, escape_whitespace=True, force_bos=True)
_DEEPSEEK3_STYLE = PreTokenizer(_DEEPSEEK3, clean_spaces=False)
_GPT4O_STYLE = PreTokenizer((_GPT4O,), clean_spaces=False)
_PORO_STYLE = PreTokenizer((_PORO,), clean_spaces=False)
_CHATGLM4 = PreTokenizer((_LLAMA3,), default_bos=False)
_UNCLEANED_GPT2 = PreTokenizer((_GPT2,), clean_spaces=False)
_UNCLEANED_QWEN2 = _QWEN2_STYLE

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
    "falcon-h1": _LLAMA3_STYLE,
    "pixtral": _LLAMA3_STYLE,
    "midm-2.0": _LLAMA3_STYLE,
    "lfm2": _LLAMA3_STYLE,
    "jina-v5-nano": _LLAMA3_STYLE,
    "minicpm5": PreTokenizer(_MINICPM5, ignore_merges=True),
    "jina-es": _GPT2_STYLE,
    "jina-de": _GPT2_STYLE,
    "gigachat": _GPT2_STYLE,
    "jina-v2-es": _GPT2_STYLE,
    "jina-v2-de": _GPT2_STYLE,
    "a.x-4.0": _GPT2_STYLE,
    "mellum": _GPT2_STYLE,
    "modern-bert": _GPT2_STYLE,
    "jina-v1-en": _GPT2_STYLE,
    "jina-v2-code": _GPT2_STYLE,
    "roberta-bpe": _GPT2_STYLE,
    "exaone4": _GPT2_STYLE,
    "trillion": _UNCLEANED_GPT2,
    "granite-docling": _UNCLEANED_GPT2,
    "jais-2": PreTokenizer((_JAIS2,)),
    "gemma4": _GEMMA4,
    "granite-embed-multi-311m": _GEMMA4,
    "sarvam-moe": PreTokenizer((_LINES,), byte_encode=False, escape_whitespace=True, clean_spaces=False),
    "qwen35": PreTokenizer((_QWEN35,), clean_spaces=False),
    "kormo": _QWEN2_STYLE,
    "f2llmv2": _QWEN2_STYLE,
    "hunyuan": _UNCLEANED_QWEN2,
    "solar-open": _UNCLEANED_QWEN2,
    "grok-2": _UNCLEANED_QWEN2,
    "spark2_5": PreTokenizer(_SPARK2_5, clean_spaces=False),
    "youtu": PreTokenizer(_YOUTU, clean_spaces=False, ignore_merges=True),
    "hunyuan-dense": _DEEPSEEK3_STYLE,
    "hy_v4": _DEEPSEEK3_STYLE,
    "joyai-llm": _DEEPSEEK3_STYLE,
    "poro-chat": _PORO_STYLE,
    "bloom": PreTokenizer((_PORO,)),
    "gpt3-finnish": PreTokenizer((_PORO,)),
    "viking": PreTokenizer((_PORO, r"\p{N}"), clean_spaces=False),
    "chatglm-bpe": _CHATGLM4,
    "glm4": PreTokenizer((_LLAMA3,), ignore_merges=True, default_bos=False),
    "glm5": PreTokenizer((_LLAMA3,), ignore_merges=True, default_bos=False),
    "tekken": PreTokenizer((_TEKKEN,), clean_spaces=False, ignore_merges=True, add_bos=True),
    "exaone-moe": PreTokenizer((_EXAONE_MOE,)),
    "chameleon": PreTokenizer(_CHAMELEON, add_bos=True, clean_spaces=False),
    "gpt-4o": _GPT4O_STYLE,
    "llama4": _GPT4O_STYLE,
    "kanana2": _GPT4O_STYLE,
    "talkie": _GPT4O_STYLE,
    "minimax-m2": _GPT4O_STYLE,
    "granite-embed-multi-97m": PreTokenizer((_GRANITE_EMB_MULTI,), clean_spaces=False, ignore_merges=True),
    "bailingmoe": PreTokenizer((_BAILINGMOE,), clean_spaces=False),
    "bailingmoe2": PreTokenizer((_BAILINGMOE,), clean_spaces=False),
    "llada-moe": PreTokenizer((_BAILINGMOE,), clean_spaces=False),
    "seed-coder": PreTokenizer((_SEED_CODER,), clean_spaces=False),
    "ufakzeka": PreTokenizer((_UFAKZEKA,), clean_spaces=False),
    "laguna": PreTokenizer((_LINES, _QWEN2), clean_spaces=False),
    "mellum2": _STARCODER,
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
    "deepseek-v3": _DEEPSEEK3_STYLE,
    "tiny_aya": PreTokenizer(_TINY_AYA, clean_spaces=False),
    "cohere2moe": PreTokenizer(_TINY_AYA, clean_spaces=False),
    "afmoe": PreTokenizer(_AFMOE, clean_spaces=False),
    "superbpe": PreTokenizer(_SUPERBPE, clean_spaces=False),
    "whitespace": PreTokenizer((r"\S+",), byte_encode=False),  # jina-embeddings-v2-base-zh
}


# Names llama.cpp knows whose splitting is its own code, not a regex ember can run the same way.
UNSUPPORTED = {
    "kimi-k2": "Kimi K2's tokenizer (no BPE merges, \\p{Han} runs)",
}


def pre_tokenizer(name: str) -> PreTokenizer:
    """The pre-tokenizer that `tokenizer.ggml.pre` names; an unknown or unsupported name is an error."""
    if name in UNSUPPORTED:
        raise EmberError(f"the pre-tokenizer tokenizer.ggml.pre={name!r} ({UNSUPPORTED[name]}) is one llama.cpp "
                         "knows but ember does not support yet")
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise EmberError(
            f"unknown pre-tokenizer tokenizer.ggml.pre={name!r}; ember knows: {known}") from None
