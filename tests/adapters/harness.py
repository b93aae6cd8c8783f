"""Shared machinery for adapter proofs: build a tiny model, save it, load it through qkinspect,
and compare the canonical matrices with the model's own projections captured in a real forward pass."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from qkinspect.layer import AttentionLayer
from qkinspect.loading import open_model

# Tolerance relative to the values compared: the largest error over the largest value of the model's own float32
# output. A float32 forward pass rounds at about 6e-8 per operation, so a right matrix stays far below it whatever
# the values' size, and a wrong one (an error of the values' own order) far above. Measured over every adapter test
# (transformers 5.24, torch 2.13 CPU): median 2e-7, largest 3.7e-6 (SigLIP's pooling output, a sum over heads).
RTOL = 1e-5


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got − expected| / max |expected| (the plain error where `expected` is all zeros)."""
    err = (got.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    return err / scale if scale > 0 else err


def save_tiny(model: torch.nn.Module, path: Path) -> Path:
    """Save a randomly initialised model (float32, safetensors) and return its folder."""
    model.eval()
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_layers(path: Path) -> list[AttentionLayer]:
    with open_model(path) as m:
        return list(m.layers())


@contextlib.contextmanager
def capture(*modules: torch.nn.Module):
    """Record (inputs, output) of each module's forward calls: `records[i]` is a list of (args, kwargs, output)."""
    records: list[list] = [[] for _ in modules]
    handles = []
    for i, mod in enumerate(modules):
        def hook(m, args, kwargs, out, i=i):
            records[i].append((args, kwargs, out))
        handles.append(mod.register_forward_hook(hook, with_kwargs=True))
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def per_head(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (..., D) through canonical W (n, D, d) and b (n, d) -> (..., n, d)."""
    y = torch.einsum("...m,nmd->...nd", x, W)
    return y if b is None else y + b


def assert_heads(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, expected: torch.Tensor, what: str = ""):
    """Compare x projected per head with the model's own states `expected` (..., n, d)."""
    got = per_head(x.double(), W.double(), None if b is None else b.double())
    exp = expected.double()
    assert got.shape == exp.shape, f"{what}: shape {tuple(got.shape)} != model's {tuple(exp.shape)}"
    err = relative_error(got, exp)
    assert err <= RTOL, f"{what}: relative error {err:.3g} > {RTOL}"


def split_heads(y: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """(..., n*d) -> (..., n, d): the model's own per-head split for head-major layouts."""
    return y.reshape(*y.shape[:-1], n, d)


# -- helpers added for the decoder-only adapter proofs -------------------------------------------------


def randomize(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> torch.nn.Module:
    """Overwrite every parameter with N(0, std) noise (norm gains: 1 + noise) so that biases, gains and
    q/k-norm weights are not the identity and attention probabilities are far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype) * std
            is_gain = p.ndim == 1 and ("norm" in name or "ln" in name) and name.endswith("weight")
            p.copy_(noise + 1 if is_gain else noise)
    return model.eval()


def apply_norm(norm, y: torch.Tensor, eps: float) -> torch.Tensor:
    """Apply a canonical `Norm` record (qkinspect.layer.Norm) to y (..., D), in float64."""
    y = y.double()
    if norm.kind == "layernorm":
        y = y - y.mean(-1, keepdim=True)
        out = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + eps) * norm.gain.double()
        return out if norm.bias is None else out + norm.bias.double()
    return y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + eps) * norm.gain.double()


def assert_close(got: torch.Tensor, expected: torch.Tensor, what: str = "", rtol: float = RTOL) -> None:
    """`got` equals `expected` to `rtol` of the largest value of `expected` (see `relative_error`)."""
    got, exp = got.double(), expected.double()
    assert got.shape == exp.shape, f"{what}: shape {tuple(got.shape)} != model's {tuple(exp.shape)}"
    err = relative_error(got, exp)
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol}"


def output_proj(z: torch.Tensor, W_O: torch.Tensor, b_O: torch.Tensor | None) -> torch.Tensor:
    """Per-head attention outputs z (..., H, dv) through canonical W_O (H, dv, D) and b_O (D,) -> (..., D)."""
    y = torch.einsum("...hd,hdm->...m", z.double(), W_O.double())
    return y if b_O is None else y + b_O.double()


# -- helpers added for the encoder and encoder-decoder proofs ------------------------------------------------------

def randomise_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Make every projection and norm distinguishable, so that a wrong tensor cannot pass by accident:
    linear and convolution weights ~ N(0, 1/fan_in) (scores of order 1), other tables (embeddings, class tokens,
    position tables) ~ N(0, 1), 1-D weights (norm gains) ~ U(0.5, 1.5), 1-D biases ~ N(0, 0.1). Default inits
    leave gains at 1, biases at 0 and some tokens at 0, which would hide a wrong norm or bias."""
    g = torch.Generator().manual_seed(seed)
    fan_in = {}
    for mod in model.modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
            fan_in[id(mod.weight)] = mod.weight[0].numel()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in fan_in:
                p.copy_(torch.randn(p.shape, generator=g) * fan_in[id(p)] ** -0.5)
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.ndim == 1 and name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.ndim == 1 and name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def assert_normalised(x: torch.Tensor, norm, what: str = "", tol: float = 1e-3):
    """`x` (..., D) was produced by `norm` (a qkinspect Norm): undoing its gain and bias leaves rows of zero mean
    and unit variance (LayerNorm) or unit mean square (RMSNorm)."""
    n = x.double()
    if norm.bias is not None:
        n = n - norm.bias.double()
    n = n / norm.gain.double()
    if norm.kind == "layernorm":
        err = max(n.mean(-1).abs().max().item(), (n.var(-1, unbiased=False) - 1).abs().max().item())
    else:
        err = (n.pow(2).mean(-1) - 1).abs().max().item()
    assert err <= tol, f"{what}: input is not the output of the recorded {norm.kind} (error {err:.3g})"


def assert_out_proj(z: torch.Tensor, W_O: torch.Tensor, b_O: torch.Tensor | None, expected: torch.Tensor,
                    what: str = ""):
    """The output projection's input z (..., H*dv) through canonical W_O (H, dv, D) reproduces its output."""
    H, dv, _ = W_O.shape
    zh = split_heads(z.double(), H, dv)  # (..., H*dv) -> (..., H, dv)
    got = torch.einsum("...hv,hvm->...m", zh, W_O.double())
    if b_O is not None:
        got = got + b_O.double()
    err = relative_error(got, expected)
    assert err <= RTOL, f"{what}: W_O relative error {err:.3g} > {RTOL}"


def record_input(rec) -> torch.Tensor:
    """The first positional input (or `hidden_states`) of a captured call (args, kwargs, output)."""
    args, kwargs, _ = rec
    return args[0] if args else kwargs["hidden_states"]


def record_output(rec) -> torch.Tensor:
    out = rec[2]
    return out[0] if isinstance(out, tuple) else out


@dataclasses.dataclass
class Sites:
    """Where one layer's projections live in the real model, named independently of the adapter under test.
    For a fused projection q, k and v are the same module and `split` maps its output to the flat
    (q, k, v) outputs, each (..., n*d), exactly as the model's own code splits it."""

    q: torch.nn.Module
    k: torch.nn.Module
    v: torch.nn.Module
    o: torch.nn.Module
    split: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None


def check_layers(model: torch.nn.Module, run: Callable[[torch.nn.Module], object], layers: list[AttentionLayer],
                 sites_of: Callable[[str, int], Sites]) -> dict[tuple[str, int], dict[str, torch.Tensor]]:
    """Run the model once, capturing every layer's projections, and assert that each layer's canonical
    W_Q/b_Q, W_K/b_K, W_V/b_V reproduce the model's query, key and value states from the projections' own
    inputs, that W_O/b_O reproduce the output projection, and that the recorded norms produced those inputs.
    A module serving several layers (ALBERT) is matched call by call in layer order.
    Returns, per (block, layer), the captured query-side input "x_q" and key-side input "x_kv"."""
    sites = {(lay.block, lay.layer): sites_of(lay.block, lay.layer) for lay in layers}
    modules: list[torch.nn.Module] = []
    for s in sites.values():
        for m in (s.q, s.k, s.v, s.o):
            if all(m is not other for other in modules):
                modules.append(m)
    index = {id(m): i for i, m in enumerate(modules)}
    with torch.no_grad(), capture(*modules) as records:
        run(model)
    calls: dict[int, int] = {}
    captured = {}
    for lay in layers:
        s, key = sites[(lay.block, lay.layer)], (lay.block, lay.layer)
        distinct = {id(m): m for m in (s.q, s.k, s.v, s.o)}
        rec = {i: records[index[i]][calls.get(i, 0)] for i in distinct}
        for i in distinct:
            calls[i] = calls.get(i, 0) + 1
        captured[key] = _check_one(lay, s, {role: rec[id(getattr(s, role))] for role in "qkvo"})
    return captured


def _check_one(lay: AttentionLayer, s: Sites, rec: dict) -> dict[str, torch.Tensor]:
    sp, what = lay.spec, f"{lay.block} layer {lay.layer}"
    if s.split is not None:
        q, k, v = s.split(record_output(rec["q"]))
    else:
        q, k, v = (record_output(rec[r]) for r in "qkv")
    x_q, x_kv = record_input(rec["q"]), record_input(rec["k"])
    assert torch.equal(record_input(rec["v"]), x_kv), f"{what}: keys and values read different inputs"
    assert_heads(x_q, lay.W_Q, lay.b_Q, split_heads(q, sp.n_heads, sp.d_head), f"{what} queries")
    assert_heads(x_kv, lay.W_K, lay.b_K, split_heads(k, sp.n_kv_heads, sp.d_head), f"{what} keys")
    assert_heads(x_kv, lay.W_V, lay.b_V, split_heads(v, sp.n_kv_heads, sp.v_head), f"{what} values")
    assert_out_proj(record_input(rec["o"]), lay.W_O, lay.b_O, record_output(rec["o"]), what)
    if lay.norm_q is not None:
        assert_normalised(x_q, lay.norm_q, f"{what} query input")
    if lay.norm_kv is not None:
        assert_normalised(x_kv, lay.norm_kv, f"{what} key/value input")
    return {"x_q": x_q, "x_kv": x_kv}


def attention_probs(lay: AttentionLayer, x_q: torch.Tensor, x_kv: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(score_scale * q k^T) from the canonical matrices: x_q (B, T, D), x_kv (B, S, Dk) -> (B, H, T, S).
    Only for attention with no positional term inside the scores (absolute positions, or none)."""
    q = per_head(x_q.double(), lay.W_Q.double(), None if lay.b_Q is None else lay.b_Q.double())  # (B, T, H, d)
    k = per_head(x_kv.double(), lay.W_K.double(), None if lay.b_K is None else lay.b_K.double())  # (B, S, G, d)
    k = k[:, :, lay.kv_index()]  # (B, S, G, d) -> (B, S, H, d): query head h reads KV head h // group
    scores = torch.einsum("bthd,bshd->bhts", q, k) * lay.spec.score_scale
    if causal:
        T, S = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def assert_probs(lay: AttentionLayer, x_q: torch.Tensor, x_kv: torch.Tensor, expected: torch.Tensor,
                 causal: bool = False, what: str = ""):
    """The model's own attention probabilities (B, H, T, S) from softmax(score_scale * q k^T)."""
    got = attention_probs(lay, x_q, x_kv, causal)
    err = relative_error(got, expected)
    assert err <= RTOL, f"{what}: attention probabilities relative error {err:.3g} > {RTOL}"
