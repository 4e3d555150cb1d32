"""Mixture-of-experts feed-forward blocks, as llama.cpp's build_moe_ffn composes them, for every MoE
architecture (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3).

A router scores the experts of each token (`ffn_gate_inp`: softmax or sigmoid of a linear map);
the top k scores choose the token's experts, optionally only among the experts of the best
`expert_group_count` groups (DeepSeek-V3's group-limited routing, a group scoring the sum of its
two best experts) and after adding a score-correction bias (`exp_probs_b`) that changes the choice
but not the weights. The chosen experts' scores are the weights, normalised to sum 1 where the
family does so, times `expert_weights_scale`. Each chosen expert is a SwiGLU MLP over the stacked
`ffn_{gate,up,down}_exps` weights (the core's expert matmul, `matmul_id`); their outputs are summed
with the weights. Shared experts (`ffn_*_shexp`) run on every token and are added, Qwen2-MoE's
scaled by sigmoid(`ffn_gate_inp_shexp` x). The first `leading_dense_block_count` layers have a
dense MLP instead.

    hp.moe = MoEParams.from_gguf(f, hp)      # in an architecture's hparams(f)
    x = x + ffn(b, h, il)                    # in its layer loop: dense or mixture, by layer
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.errors import GGUFError
from ember.gguf.metadata import bool_key, float_key, int_key
from ember.models.blocks import Builder, HParams

GATING_FUNCS = {1: "softmax", 2: "sigmoid"}  # {arch}.expert_gating_func, llama.cpp's enum
GROUP_SCORES = {"top2": 0, "max": 1}  # how a group of experts is scored (the core's top_k op)
MAX_EXPERTS = 1 << 16


@dataclass
class MoEParams:
    n_expert: int
    n_expert_used: int
    n_ff_exp: int           # rows of each expert's gate and up projections
    n_ff_shexp: int         # rows of the shared experts' projections together (0: none)
    gating: str             # "softmax" or "sigmoid"
    norm_weights: bool      # the chosen experts' weights divided by their sum
    weights_scale: float
    n_group: int            # expert groups (0 or 1: no group-limited routing)
    n_group_used: int
    group_score: str        # "top2" (sum of a group's two best scores, llama.cpp, DeepSeek-V3) or "max"
    n_dense_lead: int       # leading layers with a dense MLP

    @classmethod
    def from_gguf(cls, f, hp: HParams, norm_weights: bool = False, gating: str = "softmax",
                  group_score: str = "top2") -> MoEParams:
        """The file's expert metadata, each key checked; the defaults are the architecture's where
        llama.cpp's converter writes no key (norm_weights, gating)."""
        meta = f.metadata

        def key(name: str) -> str:
            return f"{hp.arch}.{name}"

        n_expert = int_key(meta, key("expert_count"), maximum=MAX_EXPERTS)
        n_expert_used = int_key(meta, key("expert_used_count"), maximum=n_expert)
        n_ff_exp = int_key(meta, key("expert_feed_forward_length"), hp.n_ff, per_layer=True)
        n_shared = int_key(meta, key("expert_shared_count"), 0, minimum=0, maximum=MAX_EXPERTS)
        n_ff_shexp = int_key(meta, key("expert_shared_feed_forward_length"), n_ff_exp * n_shared, minimum=0)
        code = int_key(meta, key("expert_gating_func"), None, minimum=0)
        if code not in (None, 0) and code not in GATING_FUNCS:
            raise GGUFError(f"metadata key {key('expert_gating_func')} is {code}; ember supports "
                            + ", ".join(f"{c} ({name})" for c, name in GATING_FUNCS.items()))
        n_group = int_key(meta, key("expert_group_count"), 0, minimum=0, maximum=n_expert)
        n_group_used = int_key(meta, key("expert_group_used_count"), 0, minimum=0, maximum=max(n_group, 1))
        if n_group > 1:
            if n_expert % n_group:
                raise GGUFError(f"metadata key {key('expert_group_count')} ({n_group}) does not divide "
                                f"{key('expert_count')} ({n_expert})")
            if n_group_used < 1 or n_expert_used > n_group_used * (n_expert // n_group):
                raise GGUFError(f"metadata key {key('expert_group_used_count')} is {n_group_used}: its groups must "
                                f"hold the {n_expert_used} experts each token uses")
        scale = float_key(meta, key("expert_weights_scale"), 1.0, non_negative=True)
        return cls(
            n_expert=n_expert,
            n_expert_used=n_expert_used,
            n_ff_exp=n_ff_exp,
            n_ff_shexp=n_ff_shexp,
            gating=GATING_FUNCS.get(code, gating),
            norm_weights=bool_key(meta, key("expert_weights_norm"), norm_weights),
            weights_scale=scale or 1.0,  # llama.cpp: 0 means unscaled
            n_group=n_group,
            n_group_used=n_group_used,
            group_score=group_score,
            n_dense_lead=int_key(meta, key("leading_dense_block_count"), 0, minimum=0, maximum=hp.n_layer),
        )


def features(metadata: dict, arch: str, gating: str = "softmax", group_score: str = "top2") -> list[str]:
    """What `ember info` says of a file's experts (the defaults as MoEParams.from_gguf takes them)."""
    def key(name: str) -> str:
        return f"{arch}.{name}"

    n_expert = int_key(metadata, key("expert_count"), maximum=MAX_EXPERTS)
    used = int_key(metadata, key("expert_used_count"), maximum=n_expert)
    shared = int_key(metadata, key("expert_shared_count"), 0, minimum=0)
    names = [f"mixture of experts: {used} of {n_expert} per token" + (f", {shared} shared" if shared else "")]
    gating = GATING_FUNCS.get(int_key(metadata, key("expert_gating_func"), 0, minimum=0), gating)
    bias = " with a score-correction bias" if gating == "sigmoid" else ""
    names.append(f"{gating} routing{bias}")
    n_group = int_key(metadata, key("expert_group_count"), 0, minimum=0)
    n_group_used = int_key(metadata, key("expert_group_used_count"), n_group, minimum=0)
    if 1 < n_group and n_group_used < n_group:
        score = "its best expert" if group_score == "max" else "its two best experts"
        names.append(f"the best {n_group_used} of {n_group} expert groups (a group scored by {score})")
    n_dense = int_key(metadata, key("leading_dense_block_count"), 0, minimum=0)
    if n_dense:
        names.append(f"{n_dense} leading dense layer{'s' if n_dense > 1 else ''}")
    return names


def tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    """The shapes (ggml order) of the router's and the experts' tensors, by layer-free name."""
    moe, e = hp.moe, hp.n_embd
    n, ff, sh = moe.n_expert, moe.n_ff_exp, moe.n_ff_shexp
    return {
        "ffn_gate_inp.weight": (e, n),
        "ffn_gate_inp.bias": (n,),
        "exp_probs_b.bias": (n,),
        "ffn_gate_exps.weight": (e, ff, n),
        "ffn_up_exps.weight": (e, ff, n),
        "ffn_down_exps.weight": (ff, e, n),
        "ffn_gate_shexp.weight": (e, sh),
        "ffn_up_shexp.weight": (e, sh),
        "ffn_down_shexp.weight": (sh, e),
        "ffn_gate_inp_shexp.weight": (e,),
    }


def route(b: Builder, x: int, prefix: str, moe: MoEParams) -> tuple[int, int]:
    """(expert ids [tokens, k] as F32, their weights [tokens, k]) of each token of x."""
    g = b.g
    logits = b.linear(x, f"{prefix}.ffn_gate_inp")
    probs = g.softmax(logits) if moe.gating == "softmax" else g.sigmoid(logits)
    bias = b.vector(f"{prefix}.exp_probs_b.bias", optional=True)
    chooser = g.add(probs, bias) if bias >= 0 else probs
    ids = g.top_k(chooser, moe.n_expert_used, moe.n_group, moe.n_group_used, GROUP_SCORES[moe.group_score])
    weights = g.take(probs, ids)
    if moe.norm_weights:
        weights = g.sum_normalize(weights)
    if moe.weights_scale != 1.0:
        weights = g.scale(weights, moe.weights_scale)
    return ids, weights


def experts(b: Builder, x: int, prefix: str, moe: MoEParams, ids: int, weights: int) -> int:
    """sum over a token's chosen experts j of weight_j down_j(silu(gate_j x) * up_j x)."""
    g = b.g

    def matmul(name: str, rows: int) -> int:
        return g.matmul_id(b.expert_weight(f"{prefix}.{name}.weight", moe.n_expert), rows, ids, moe.n_expert)

    h = g.swiglu(matmul("ffn_gate_exps", x), matmul("ffn_up_exps", x))
    return g.weighted_sum(matmul("ffn_down_exps", h), weights)


def shared_experts(b: Builder, x: int, prefix: str) -> int:
    """The shared experts' MLP, scaled by sigmoid(ffn_gate_inp_shexp x) where the file has that gate."""
    out = b.gated_mlp(x, prefix, suffix="_shexp")
    if not b.has(f"{prefix}.ffn_gate_inp_shexp.weight"):
        return out
    gate = b.g.sigmoid(b.g.matmul(b.weight(f"{prefix}.ffn_gate_inp_shexp.weight"), x))
    return b.g.weighted_sum(out, gate)


def moe_ffn(b: Builder, x: int, il: int) -> int:
    moe, prefix = b.hp.moe, f"blk.{il}"
    ids, weights = route(b, x, prefix, moe)
    out = experts(b, x, prefix, moe, ids, weights)
    if b.has(f"{prefix}.ffn_up_shexp.weight"):
        out = b.g.add(out, shared_experts(b, x, prefix))
    return out


def ffn(b: Builder, x: int, il: int) -> int:
    """Layer il's feed-forward block: the mixture of experts, or the dense MLP of a model without
    experts and of the leading dense layers."""
    if b.hp.moe is None or il < b.hp.moe.n_dense_lead:
        return b.gated_mlp(x, f"blk.{il}")
    return moe_ffn(b, x, il)
