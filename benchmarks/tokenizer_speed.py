"""Tokenizer speed: building ember's tokenizer from GGUF metadata, and encode throughput beside
transformers' tokenizer for the same GGUF file.

    python benchmarks/tokenizer_speed.py [--models smollm2-135m,...,unigram] [--repeat 5] [--out FILE.md]

Build time is Tokenizer.from_metadata on metadata already read (ember.gguf.open_gguf is timed
apart), as wall time and as CPU time (less disturbed by other work on the machine). Encode
throughput is measured on two texts, English prose and the mixed multilingual corpus of the
tokenizer tests (code, CJK, Arabic, emoji, whitespace runs), each about 256 KiB, encoded whole
and line by line. transformers loads the same file with
AutoTokenizer.from_pretrained(folder, gguf_file=...), its own GGUF-to-tokenizers conversion;
where its ids differ from ember's, ember's are llama.cpp's (tests/test_tokenizer.py checks them).
"unigram" is the Unigram ("t5") vocabulary of the tests (tests/fixtures/unigram.model, 1,629 ids
as the XLM-RoBERTa converters write them: tokenizer_support.unigram_metadata) beside transformers'
XLMRobertaTokenizer on the same SentencePiece model (its `tokenizers` Unigram, in Rust).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "fixtures"), str(ROOT / "tests")]

from tokenizer_corpus import ENGLISH, corpus

from ember.gguf import open_gguf
from ember.hub import resolve_model
from ember.tokenizer.tokenizer import Tokenizer

MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m", "unigram")
TEXT_BYTES = 1 << 18


def repeated(lines: list[str], size: int = TEXT_BYTES) -> str:
    block = "\n".join(lines) + "\n"
    return block * max(1, size // len(block.encode()))


def best_and_median(fn, repeat: int, clock=time.perf_counter) -> tuple[float, float]:
    timings = []
    for _ in range(repeat):
        start = clock()
        result = fn()
        timings.append(clock() - start)
        del result  # freeing what was built is not part of building it
    return min(timings), statistics.median(timings)


def throughput(encode, text: str, repeat: int) -> tuple[float, int]:
    """MB/s (best of `repeat`) and the number of tokens."""
    n_tokens = len(encode(text))
    best, _ = best_and_median(lambda: encode(text), repeat)
    return len(text.encode()) / best / 1e6, n_tokens


def line_by_line(encode, text: str) -> list[int]:
    return [i for line in text.splitlines() for i in encode(line)]


def transformers_tokenizer(path: Path):
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def unigram_peer():
    """The tests' Unigram vocabulary and transformers' tokenizer of the same SentencePiece model."""
    import shutil
    import tempfile

    from tokenizer_support import UNIGRAM_MODEL, unigram_metadata
    from transformers import XLMRobertaTokenizer

    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(UNIGRAM_MODEL, Path(folder) / "sentencepiece.bpe.model")
        return unigram_metadata(), XLMRobertaTokenizer.from_pretrained(folder)


def bench_model(name: str, texts: dict[str, str], repeat: int) -> tuple[str, list[str]]:
    """One row of the build table and the encode rows of one model."""
    if name == "unigram":
        open_time = 0.0
        start = time.perf_counter()
        metadata, theirs = unigram_peer()
        hf_load = time.perf_counter() - start
    else:
        path = resolve_model(name)
        open_time, _ = best_and_median(lambda: open_gguf(path).metadata, repeat)
        metadata = open_gguf(path).metadata
    build_best, build_median = best_and_median(lambda: Tokenizer.from_metadata(metadata), repeat)
    build_cpu, _ = best_and_median(lambda: Tokenizer.from_metadata(metadata), repeat, time.process_time)
    ours = Tokenizer.from_metadata(metadata)
    if name != "unigram":
        start = time.perf_counter()
        theirs = transformers_tokenizer(path)
        hf_load = time.perf_counter() - start
    build_row = (f"| {name} | {len(metadata['tokenizer.ggml.tokens'])} | {open_time * 1e3:.0f} | "
                 f"{build_best * 1e3:.0f} / {build_median * 1e3:.0f} | {build_cpu * 1e3:.0f} | {hf_load:.1f} |")
    encoders = {"ember": lambda s: ours.encode(s, add_special=False),
                "transformers": lambda s: theirs.encode(s, add_special_tokens=False)}
    encode_rows = []
    for text_name, text in texts.items():
        for split in ("whole", "by line"):
            speed, ids = {}, {}
            for who, encode in encoders.items():
                run = encode if split == "whole" else (lambda s, e=encode: line_by_line(e, s))
                speed[who], _ = throughput(run, text, repeat)
                ids[who] = run(text)
            same = "yes" if ids["ember"] == ids["transformers"] else "no"
            encode_rows.append(
                f"| {name} | {text_name}, {split} | {len(ids['ember'])} | {speed['ember']:.2f} | "
                f"{speed['transformers']:.2f} | {speed['ember'] / speed['transformers']:.2f} | {same} |")
    return build_row, encode_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = parser.parse_args()
    texts = {"English": repeated(ENGLISH), "mixed corpus": repeated(corpus())}
    build_rows, encode_rows = [], []
    for name in args.models.split(","):
        build_row, rows = bench_model(name, texts, args.repeat)
        build_rows.append(build_row)
        encode_rows += rows
        print(build_row, *rows, sep="\n", flush=True)
    lines = [
        (f"# Tokenizer speed ({time.strftime('%Y-%m-%d')}; {platform.machine()}, {os.cpu_count()} CPUs, "
         f"Python {platform.python_version()}, best of {args.repeat}, load average at the end "
         f"{os.getloadavg()[0]:.1f})"),
        "",
        "| model | n_vocab | open GGUF, ms | ember build, ms (best / median) | ember build, CPU ms | transformers load, s |",
        "|---|---|---|---|---|---|",
        *build_rows,
        "",
        (f"Encode throughput, MB of UTF-8 text per second (texts of {TEXT_BYTES >> 10} KiB; \"same ids\": "
         "whether transformers' conversion of the GGUF vocabulary gives ember's ids, which are llama.cpp's):"),
        "",
        "| model | text | tokens | ember | transformers | ember / transformers | same ids |",
        "|---|---|---|---|---|---|---|",
        *encode_rows,
    ]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
