"""`ember chat` over the fake echo model, for driving through a pseudo-terminal in tests:
it answers "You said: <message>", and to "long" it says "la " slowly until it is stopped."""

import sys

from ember.cli.chat import ChatSession, repl
from ember.engine.sampling import SamplingParams
from fake_llm import fake_llm

if __name__ == "__main__":
    n_ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    session = ChatSession(fake_llm(n_ctx=n_ctx, delay=0.005), params=SamplingParams(temperature=0.0),
                          notice=lambda text: print(text, file=sys.stderr, flush=True))
    sys.exit(repl(session))
