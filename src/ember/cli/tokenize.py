"""`ember tokenize TEXT`: token ids and pieces of a text."""

from __future__ import annotations

import json

from ember.engine.load import load_tokenizer


def cli_tokenize(args) -> int:
    """`ember tokenize -m MODEL TEXT [--ids] [--parse-special] [--no-bos]`."""
    tokenizer = load_tokenizer(args.model)
    ids = tokenizer.encode(args.text, add_special=not args.no_bos, parse_special=args.parse_special)
    if args.ids:
        print(json.dumps(ids))
        return 0
    width = max(len("id"), *(len(str(i)) for i in ids)) if ids else len("id")
    print(f"{'id':>{width}}  piece")
    for token_id in ids:
        print(f"{token_id:>{width}}  {_quoted(tokenizer.token_bytes(token_id))}")
    return 0


def _quoted(data: bytes) -> str:
    """A piece for people: quoted, with escapes for control characters and \\xNN for bytes that
    are only part of a UTF-8 character."""
    shown = []
    for char in data.decode("utf-8", errors="surrogateescape"):
        if "\udc80" <= char <= "\udcff":
            shown.append(f"\\x{ord(char) - 0xdc00:02x}")
        elif char in '"\\':
            shown.append("\\" + char)
        elif char.isprintable():
            shown.append(char)
        else:
            shown.append(char.encode("unicode_escape").decode("ascii"))
    return '"' + "".join(shown) + '"'
