"""models/moe.py: the mixture-of-experts block built from a file's tensors and metadata, against a
float64 numpy forward of the same weights, routing as llama.cpp's build_moe_ffn does it.

Each case writes a GGUF with one MoE layer's tensors (F32: the core's F32 matmuls are float32
dot products, so 2e-5 relative error bounds the comparison) and the expert metadata keys, builds
`moe.ffn` on the rows of an input and compares with `reference_ffn` below: softmax or sigmoid
scores, the score-correction bias `exp_probs_b` added for the choice only, the top k among the
best groups (a group scoring its two best experts' sum), weights from the unbiased scores,
normalised and scaled, SwiGLU experts, shared experts (gated by sigmoid where the file has
ffn_gate_inp_shexp) and the dense first layers.
"""

from __future__ import annotations

import numpy as np
import pytest

from ember import _core
from ember.errors import GGUFError
from ember.gguf import GGUFWriter, open_gguf
from ember.models import moe
from ember.models.blocks import Builder, HParams

E, FF, SHARED_FF, N_EXPERT = 64, 32, 48, 8


def silu(x):
    return x / (1 + np.exp(-x))


def reference_ffn(x, t, meta, il):
    """float64 numpy of layer il's feed-forward block on rows x (the file's tensors t, metadata meta)."""
    key = lambda name, default=None: meta.get(f"llama.{name}", default)
    p = f"blk.{il}."
    if il < key("leading_dense_block_count", 0):
        return (silu(x @ t[p + "ffn_gate.weight"].T) * (x @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
    logits = x @ t[p + "ffn_gate_inp.weight"].T
    if key("expert_gating_func", 1) == 2:
        probs = 1 / (1 + np.exp(-logits))
    else:
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
    choice = probs + t.get(p + "exp_probs_b.bias", 0)
    n_group, k = key("expert_group_count", 0), key("expert_used_count")
    if n_group > 1:
        groups = choice.reshape(len(x), n_group, -1)
        score = np.sort(groups, axis=2)[:, :, -2:].sum(2)
        keep = np.argsort(-score, axis=1, kind="stable")[:, :key("expert_group_used_count")]
        masked = np.full(groups.shape, -np.inf)
        for r in range(len(x)):
            masked[r, keep[r]] = groups[r, keep[r]]
        choice = masked.reshape(len(x), -1)
    ids = np.argsort(-choice, axis=1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, ids, 1)
    if key("expert_weights_norm", False):
        weights /= weights.sum(1, keepdims=True)
    weights *= key("expert_weights_scale", 1.0)
    out = np.zeros_like(x)
    for r in range(len(x)):
        for j, e in enumerate(ids[r]):
            h = silu(t[p + "ffn_gate_exps.weight"][e] @ x[r]) * (t[p + "ffn_up_exps.weight"][e] @ x[r])
            out[r] += weights[r, j] * (t[p + "ffn_down_exps.weight"][e] @ h)
    if p + "ffn_up_shexp.weight" in t:
        shared = (silu(x @ t[p + "ffn_gate_shexp.weight"].T) * (x @ t[p + "ffn_up_shexp.weight"].T)) \
            @ t[p + "ffn_down_shexp.weight"].T
        if p + "ffn_gate_inp_shexp.weight" in t:
            shared *= 1 / (1 + np.exp(-(x @ t[p + "ffn_gate_inp_shexp.weight"].T)))
        out += shared
    return out


def moe_file(path, meta, shared=False, gated_shared=False, bias=False, n_layer=1):
    """A GGUF with the layers' feed-forward tensors (numpy order) and the metadata; returns (path, tensors)."""
    rng = np.random.default_rng(0)
    shapes = {}
    for il in range(n_layer):
        p = f"blk.{il}."
        if il < meta.get("llama.leading_dense_block_count", 0):
            shapes |= {p + "ffn_gate.weight": (FF, E), p + "ffn_up.weight": (FF, E), p + "ffn_down.weight": (E, FF)}
            continue
        shapes |= {p + "ffn_gate_inp.weight": (N_EXPERT, E), p + "ffn_gate_exps.weight": (N_EXPERT, FF, E),
                   p + "ffn_up_exps.weight": (N_EXPERT, FF, E), p + "ffn_down_exps.weight": (N_EXPERT, E, FF)}
        if shared:
            shapes |= {p + "ffn_gate_shexp.weight": (SHARED_FF, E), p + "ffn_up_shexp.weight": (SHARED_FF, E),
                       p + "ffn_down_shexp.weight": (E, SHARED_FF)}
        if gated_shared:
            shapes[p + "ffn_gate_inp_shexp.weight"] = (1, E)
        if bias:
            shapes[p + "exp_probs_b.bias"] = (N_EXPERT,)
    tensors = {name: (rng.standard_normal(shape) * (0.3 if "gate_inp" in name or "probs" in name else 0.2))
               .astype(np.float32) for name, shape in shapes.items()}
    w = GGUFWriter(path, "llama")
    for key, value in meta.items():
        w.add(key, value)
    for name, values in tensors.items():
        w.add_tensor(name, values)
    w.write()
    return path, {name: v.astype(np.float64) for name, v in tensors.items()}


def hparams(n_layer=1):
    return HParams(arch="llama", n_vocab=1, n_ctx_train=16, n_embd=E, n_layer=n_layer, n_ff=FF, n_head=1,
                   n_kv_head=1, head_dim=E, norm_eps=1e-5, rope_base=1e4, rope_dims=E, rope_freq_scale=1.0,
                   sliding_window=0)


def run_ffn(path, il, x, **moe_args):
    f = open_gguf(path)
    hp = hparams(il + 1)
    hp.moe = moe.MoEParams.from_gguf(f, hp, **moe_args)
    graph = _core.Graph(2)
    b = Builder(graph, f, hp, moe.tensor_shapes(hp))
    rows = graph.input(E)
    graph.set_output(moe.ffn(b, rows, il))
    graph.plan(len(x), len(x), 1)
    ids = np.arange(len(x), dtype=np.int32)
    return graph.run(np.zeros(len(x), np.int32), np.zeros(len(x), np.int32), np.zeros(len(x), np.int32), ids,
                     [x.astype(np.float32)])


BASE = {"llama.expert_count": N_EXPERT, "llama.expert_used_count": 2}
CASES = {
    # Mixtral, Qwen3-MoE: softmax, top 2, normalised
    "softmax-normalised": (BASE | {"llama.expert_weights_norm": True}, {}),
    # Qwen2-MoE: softmax, not normalised, a shared expert gated by sigmoid(ffn_gate_inp_shexp x)
    "softmax-gated-shared-expert": (BASE | {"llama.expert_used_count": 3, "llama.expert_shared_feed_forward_length": SHARED_FF},
                                    {"shared": True, "gated_shared": True}),
    # DeepSeek-V3: sigmoid, score-correction bias, 4 groups of which 2 are used, normalised, scaled, shared
    "sigmoid-groups-bias-scale": (BASE | {"llama.expert_gating_func": 2, "llama.expert_group_count": 4,
                                          "llama.expert_group_used_count": 2, "llama.expert_weights_norm": True,
                                          "llama.expert_weights_scale": 2.5, "llama.expert_used_count": 3,
                                          "llama.expert_shared_feed_forward_length": SHARED_FF},
                                  {"shared": True, "bias": True}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("n_tokens", [1, 37])
def test_moe_block_matches_numpy(tmp_path, case, n_tokens):
    meta, tensors = CASES[case]
    path, t = moe_file(tmp_path / "moe.gguf", meta, **tensors)
    x = np.random.default_rng(1).standard_normal((n_tokens, E))
    out = run_ffn(path, 0, x)
    expected = reference_ffn(x, t, meta, 0)
    assert np.abs(out - expected).max() <= 2e-5 * np.abs(expected).max()


def test_groups_and_bias_change_the_choice(tmp_path):
    """The DeepSeek-V3 case is not the plain top 3 of its scores: the reference without groups and
    bias gives other outputs, so the case above checks the group-limited, biased choice."""
    meta, tensors = CASES["sigmoid-groups-bias-scale"]
    _, t = moe_file(tmp_path / "moe.gguf", meta, **tensors)
    x = np.random.default_rng(1).standard_normal((37, E))
    plain = {k: v for k, v in meta.items() if "group" not in k}
    plain_t = {k: v for k, v in t.items() if "probs_b" not in k}
    changed = np.abs(reference_ffn(x, t, meta, 0) - reference_ffn(x, plain_t, plain, 0)).max(axis=1) > 1e-3
    assert changed.mean() > 0.3


def test_leading_dense_layers_have_a_dense_mlp(tmp_path):
    meta = BASE | {"llama.leading_dense_block_count": 1}
    path, t = moe_file(tmp_path / "moe.gguf", meta, n_layer=2)
    x = np.random.default_rng(1).standard_normal((5, E))
    for il in (0, 1):
        expected = reference_ffn(x, t, meta, il)
        assert np.abs(run_ffn(path, il, x) - expected).max() <= 2e-5 * np.abs(expected).max()


@pytest.mark.parametrize("key, value, message", [
    ("llama.expert_used_count", 9, r"expert_used_count is 9, outside \[1, 8\]"),
    ("llama.expert_group_count", 3, "does not divide"),
    ("llama.expert_gating_func", 3, "expert_gating_func is 3"),
    ("llama.expert_weights_scale", -1.0, "expert_weights_scale"),
])
def test_bad_expert_metadata_is_a_gguf_error(tmp_path, key, value, message):
    path, _ = moe_file(tmp_path / "moe.gguf", BASE | {key: value})
    with pytest.raises(GGUFError, match=message):
        run_ffn(path, 0, np.zeros((1, E)))


def test_groups_must_hold_the_experts_used(tmp_path):
    meta = BASE | {"llama.expert_group_count": 4, "llama.expert_group_used_count": 1, "llama.expert_used_count": 3}
    path, _ = moe_file(tmp_path / "moe.gguf", meta)
    with pytest.raises(GGUFError, match="expert_group_used_count is 1"):
        run_ffn(path, 0, np.zeros((1, E)))


def test_expert_tensors_of_the_wrong_shape_are_gguf_errors(tmp_path):
    path, _ = moe_file(tmp_path / "moe.gguf", BASE | {"llama.expert_count": 4})  # the file has 8 experts
    with pytest.raises(GGUFError, match="ffn_gate_inp.weight has shape"):
        run_ffn(path, 0, np.zeros((1, E)))


def test_a_3d_tensor_is_refused_where_a_matrix_is_read(tmp_path):
    path, _ = moe_file(tmp_path / "moe.gguf", BASE)
    f = open_gguf(path)
    hp = hparams()
    hp.moe = moe.MoEParams.from_gguf(f, hp)
    b = Builder(_core.Graph(1), f, hp, moe.tensor_shapes(hp))
    with pytest.raises(GGUFError, match="only expert weights"):
        b.weight("blk.0.ffn_up_exps.weight")
