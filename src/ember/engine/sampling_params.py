"""`SamplingParams`: the options of the sampler (engine/sampling.py), validated, and their
defaults, which are llama.cpp's. Everything that offers these options (the API, the CLI, the
server) takes its defaults from `DEFAULTS`. No numpy here: the CLI's parser reads it at start.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from ember.errors import EmberError

if TYPE_CHECKING:
    from ember.engine.constraints import Grammar


class InvalidParameter(EmberError, ValueError):
    """A sampling or generation parameter outside its range."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token; see the module docstring for the order and the math.

    `seed=None` (or a negative seed) draws a fresh random seed for each request.
    `logit_bias` maps token ids (ints, or strings of digits as in OpenAI requests) to a value
    added to their logits. `grammar` (an `ember.Grammar`: JSON schema, GBNF, regex, choice)
    constrains every token to keep the text within it; generation ends where it is complete.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: Mapping[int, float] | None = None
    seed: int | None = None
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature, low=0.0)
        _check_int("top_k", self.top_k)
        _check_number("top_p", self.top_p, low=0.0, high=1.0)
        _check_number("min_p", self.min_p, low=0.0, high=1.0)
        _check_number("typical_p", self.typical_p, low=0.0, high=1.0)
        _check_number("repeat_penalty", self.repeat_penalty)
        if self.repeat_penalty <= 0:
            raise InvalidParameter(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        _check_int("repeat_last_n", self.repeat_last_n, low=-1)
        _check_number("frequency_penalty", self.frequency_penalty)
        _check_number("presence_penalty", self.presence_penalty)
        _check_int("mirostat_mode", self.mirostat_mode, low=0)
        if self.mirostat_mode > 2:
            raise InvalidParameter(f"mirostat_mode must be 0 (off), 1 or 2, got {self.mirostat_mode}")
        _check_number("mirostat_tau", self.mirostat_tau, low=0.0)
        _check_number("mirostat_eta", self.mirostat_eta, low=0.0)
        if self.seed is not None:
            _check_int("seed", self.seed)
        object.__setattr__(self, "logit_bias", _normalized_bias(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalizes(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0)


def _check_number(name: str, value: object, low: float | None = None, high: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InvalidParameter(f"{name} must be a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidParameter(f"{name} must be {bounds}, got {value}")


def _check_int(name: str, value: object, low: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameter(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise InvalidParameter(f"{name} must be >= {low}, got {value}")


def _normalized_bias(bias: Mapping | None) -> dict[int, float] | None:
    if not bias:
        return None
    normalized = {}
    for key, value in bias.items():
        try:
            token = int(key)
            value = float(value)
        except (TypeError, ValueError):
            raise InvalidParameter(f"logit_bias needs token ids and numbers, got {key!r}: {value!r}") from None
        if token < 0 or math.isnan(value):
            raise InvalidParameter(f"logit_bias has an invalid entry {key!r}: {value!r}")
        normalized[token] = value
    return normalized


DEFAULTS = SamplingParams()  # the one spelling of the defaults: the API, CLI and server read them here
# Chat completions sample cooler by default, as llama-cpp-python's create_chat_completion does.
CHAT_TEMPERATURE = 0.2
