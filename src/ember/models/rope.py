"""RoPE scaling as GGUF files describe it ({arch}.rope.scaling.*) and llama.cpp applies it.

The core's rope op rotates pair i of a head by theta_i = pos * freq_scale * base^(-2i/n_rot) / d_i,
with an optional vector of per-pair divisors d_i. Every scaling is expressed through these:

- none: freq_scale 1, no divisors.
- linear: freq_scale = 1 / factor.
- llama3 (Llama 3.1+): no scaling type; the converter writes the divisors as rope_freqs.weight.
- yarn: the interpolated angle (theta / factor) and the extrapolated one mixed per pair by a
  ramp between the correction dimensions (ggml_rope_yarn_corr_dims), which is a divisor per pair;
  cos and sin are scaled by mscale = (1 + 0.1 ln factor) * attn_factor (llama.cpp's llama_context
  and ggml's rope_yarn).
- longrope (Phi-3 "su"): rope_factors_long.weight divides the frequencies when the context is
  longer than the original one, rope_factors_short.weight otherwise (Phi-3 files carry the
  factors but no scaling type, as llama.cpp's converter writes them); cos and sin are scaled by
  rope.scaling.attn_factor (which scales them under any other type too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ember.errors import GGUFError
from ember.gguf.metadata import float_key, int_key, string_key

KINDS = ("none", "linear", "yarn", "longrope")
LONGROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    factor: float = 1.0
    original_context: int = 0  # the context the model was trained with before scaling (the file's, if none)
    attn_factor: float = 1.0  # rope.scaling.attn_factor: multiplies cos and sin
    ext_factor: float = 1.0  # YaRN: weight of the extrapolated angle in the ramp
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @property
    def freq_scale(self) -> float:
        """The rope op's freq_scale (YaRN's interpolation is in its divisors instead)."""
        return 1.0 / self.factor if self.kind == "linear" else 1.0


def read_scaling(meta, arch: str, n_ctx_train: int) -> RopeScaling:
    """The scaling of a file's metadata, each key checked: a bad one is a GGUFError naming it."""
    def key(name: str) -> str:
        return f"{arch}.rope.scaling.{name}"

    kind = string_key(meta, key("type"), "none")
    if kind not in KINDS:
        raise GGUFError(f"RoPE scaling type {kind!r} ({key('type')}) is not supported; ember supports "
                        f"{', '.join(KINDS)}")
    factor = float_key(meta, key("factor"), 1.0, non_negative=True) or 1.0
    original = int_key(meta, key("original_context_length"), n_ctx_train)
    if kind == "yarn" and factor < 1.0:
        raise GGUFError(f"metadata key {key('factor')} is {factor}; YaRN scaling needs a factor >= 1")
    beta_fast = float_key(meta, key("yarn_beta_fast"), 32.0, positive=True)
    beta_slow = float_key(meta, key("yarn_beta_slow"), 1.0, positive=True)
    return RopeScaling(kind=kind, factor=factor, original_context=original,
                       attn_factor=float_key(meta, key("attn_factor"), 1.0, positive=True),
                       ext_factor=float_key(meta, key("yarn_ext_factor"), 1.0, non_negative=True),
                       beta_fast=beta_fast, beta_slow=beta_slow)


def _corr_dim(n_rot: int, original: int, n_rotations: float, base: float) -> float:
    """The pair index whose wavelength turns n_rotations times over the original context."""
    return n_rot * math.log(original / (n_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_divisors(s: RopeScaling, n_rot: int, base: float) -> np.ndarray:
    """Per pair, the divisor of theta that YaRN's ramp between interpolation and extrapolation makes."""
    low = max(0.0, math.floor(_corr_dim(n_rot, s.original_context, s.beta_fast, base)))
    high = min(n_rot - 1.0, math.ceil(_corr_dim(n_rot, s.original_context, s.beta_slow, base)))
    pairs = np.arange(n_rot // 2, dtype=np.float64)
    ramp = 1.0 - np.clip((pairs - low) / max(0.001, high - low), 0.0, 1.0)
    mix = ramp * s.ext_factor
    freq_scale = 1.0 / s.factor
    return (1.0 / (freq_scale * (1.0 - mix) + mix)).astype(np.float32)


def mscale(s: RopeScaling) -> float:
    """The factor cos and sin are multiplied by."""
    if s.kind == "yarn" and s.ext_factor != 0.0:
        return (1.0 + 0.1 * math.log(s.factor)) * s.attn_factor
    return s.attn_factor


def longrope_factors_name(s: RopeScaling, n_ctx: int) -> str:
    """rope_factors_long.weight past the original context, rope_factors_short.weight within it."""
    return LONGROPE_FACTORS[0] if n_ctx > s.original_context else LONGROPE_FACTORS[1]


def scaling_features(meta, arch: str, tensors=None) -> list[str]:
    """How `ember info` names a file's RoPE scaling: rope.scaling.type with its factor, and where
    the file gives them, the original context, YaRN's betas and the attention factor; with no
    type, Llama 3's per-frequency divisors (rope_freqs.weight, the range of its factors, read when
    it is a short F32 vector). A malformed key is left out."""
    def number(name: str):
        value = meta.get(f"{arch}.rope.scaling.{name}")
        return value if isinstance(value, (int, float, np.number)) and not isinstance(value, bool) else None

    kind = meta.get(f"{arch}.rope.scaling.type")
    if isinstance(kind, str) and kind != "none":
        factor = number("factor")
        details = [f"from {int(number('original_context_length'))}"] if number("original_context_length") else []
        if kind == "yarn":
            details += [f"beta {name} {number(f'yarn_beta_{name}'):g}" for name in ("fast", "slow")
                        if number(f"yarn_beta_{name}") is not None]
        if number("attn_factor") not in (None, 1.0):
            details.append(f"attention factor {number('attn_factor'):.4g}")
        return [f"RoPE scaling {kind}" + (f" x{factor:g}" if factor else "") +
                (f" ({', '.join(details)})" if details else "")]
    freqs = (tensors or {}).get("rope_freqs.weight")
    if freqs is None:
        return []
    values = None
    try:
        if freqs.type.name == "F32" and len(freqs.shape) == 1 and freqs.shape[0] <= 4096:
            values = np.asarray(freqs.array(), dtype=np.float64)
    except (AttributeError, ValueError, GGUFError):
        pass
    if values is None or values.size == 0 or not np.isfinite(values).all():
        return ["RoPE scaling llama3 (rope_freqs.weight)"]
    return [f"RoPE scaling llama3 (rope_freqs.weight: factors {values.min():.4g} to {values.max():.4g})"]
