"""`--estimate`: what every edit would cost every head, from one clean forward pass and a few backward passes
(docs/experiments.md, "Estimates"), instead of one forward pass per head and edit.

For head h of layer l, o_h = z_h W_O[h] is its contribution to the output of the layer's output projection
(z_h: the head's attention-weighted values, the projection's input). An edit changes it by Δo_h (at every token of
every window), computed exactly: the layer's own attention module is run again on the inputs it had in the clean
pass, with the edited weights written back (every selected head of the layer edited at once: a head's z_h depends
on its own weights only, so one run gives every head's Δo_h), so the softmax is recomputed, not linearised. Then

    Δ̂_h = ⟨g, Δo_h⟩ + (1/2N) · mean_k ⟨G_k, Δo_h⟩²

with g = ∂L/∂o (L the mean loss over the N scored tokens; one backward pass of the clean model) and G_k the gradient
of the summed loss on labels sampled from the model's own predictive distribution (K backward passes): since the
expected gradient of a sampled label's loss is zero, E⟨G_k, Δo⟩² = N · Δoᵀ H_GN Δo, with H_GN the Gauss-Newton
(Fisher) matrix of L, so the second term is the Gauss-Newton curvature ½ Δoᵀ H_GN Δo. The first term is exact given
the text; the standard error `se` is that of the Monte-Carlo curvature term over the K probes.

Drift (encoders without a head) is 0 with zero gradient at the clean model; its second-order term is
(1/2N) Σ_t |P_t J_t Δo|² / |h_t|² (P_t: the projection orthogonal to the final hidden state h_t), estimated with
Gaussian probes: G_k = ∂/∂o Σ_t ξ_tk · h_t / |h_t|, ξ ~ N(0, I).

Where the quadratic model cannot be trusted is found by evaluating the loss at the edit itself: each edit's quarter of
the heads with the largest reach |Δo_h| / |o| (o the layer's whole attention output) is run exactly on a quarter of
the text, and flagged unreliable where that is far above the estimate (`qkinspect.experiment.spot`).

The verified heads (`choose`) are run exactly by `qkinspect.experiment.exact`, as `run_experiment` runs every head
without an estimate; their agreement with the estimate is Spearman's ρ (`qkinspect.experiment.results`).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from qkinspect.errors import UnsupportedModelError
from qkinspect.experiment.edits.apply import apply_edit
from qkinspect.experiment.edits.names import Edit
from qkinspect.experiment.edits.qknorm import check as check_qk_norm
from qkinspect.experiment.exact import make_units, run_unit
from qkinspect.experiment.model.runtime import DRIFT, HFModel
from qkinspect.experiment.model.scoring import CachedStates, Scorer, logits_and_targets
from qkinspect.experiment.model.writeback import written
from qkinspect.experiment.results import Agreement, Estimate, Run, spearman
from qkinspect.experiment.spot import spot_check
from qkinspect.layer import AttentionLayer
from qkinspect.progress import phase

PROBES = 16  # default K (docs/experiments.md, "Estimates": measured on SmolLM2)
# Rows (windows) per backward pass: the estimate keeps a forward graph of this many tokens.
GRAD_TOKENS = 512

ATTENTION = ("self_attn", "attn", "attention")  # the attention module of a transformer block, by attribute name
OUTPUT = ("o_proj", "c_proj", "dense", "output.dense", "out_proj")  # its output projection, under it


@dataclass(frozen=True)
class HeadEstimate:
    """One head's estimated Δloss for one edit."""

    layer: int
    head: int
    edit: str
    first: float  # ⟨g, Δo_h⟩: exact given the text
    curvature: float  # (1/2N) mean_k ⟨G_k, Δo_h⟩²
    se: float  # the Monte-Carlo standard error of `curvature` (and so of the estimate)
    moved: float  # |Δo_h| / |o_h| over every token
    reach: float  # |Δo_h| / |o| over every token: o the layer's whole attention output (every head, the bias)
    unreliable: bool  # the spot check found the estimate far below the edit's cost (qkinspect.experiment.spot)
    predicted: float | None  # the edit's weight-space figure
    offset0: bool
    spot: float | None = None  # the spot check's exact Δloss (None: not among the heads it checks)
    spot_se: float | None = None

    @property
    def estimate(self) -> float:
        return self.first + self.curvature


@dataclass(frozen=True)
class Sites:
    """Where a block's attention lives: the module re-run on cached inputs and its output projection's path."""

    attention: str
    output: str


def sites(block: nn.Module, option: str = "estimate") -> Sites:
    """The attention module of `block` and its output projection (the first names of ATTENTION / OUTPUT found);
    UnsupportedModelError naming the estimate's option as the caller spells it (`option`: a `Names` entry,
    "--estimate" from the CLI) where there are none."""
    for a in ATTENTION:
        att = getattr(block, a, None)
        if isinstance(att, nn.Module):
            for o in OUTPUT:
                if _get(att, o) is not None:
                    return Sites(a, f"{a}.{o}")
    raise UnsupportedModelError(f"{option}: cannot find the attention module and its output projection in "
                                f"{type(block).__name__}")


def check_sites(hf: HFModel, layers: list[int], option: str = "estimate") -> None:
    """Refuse (`sites`) before any pass over the text where a chosen layer's attention cannot be found."""
    for i in layers:
        sites(hf.layers[i], option)


def _get(module: nn.Module, path: str) -> nn.Module | None:
    for part in path.split("."):
        module = getattr(module, part, None)
        if not isinstance(module, nn.Module):
            return None
    return module


@contextlib.contextmanager
def _frozen(model: nn.Module) -> Iterator[None]:
    """No parameter requires a gradient for the duration (only the inserted leaves do)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)


@contextlib.contextmanager
def _from_layer(hf: HFModel, states: Tensor | None, start: int, as_tuple: bool) -> Iterator[None]:
    """Layers before `start` stand in by the cached states entering `start` (as Scorer.score does)."""
    layers = hf.layers
    saved = [layers[k] for k in range(start)]
    try:
        for k in range(start):
            layers[k] = CachedStates(states, as_tuple)
        yield
    finally:
        for k, m in enumerate(saved):
            layers[k] = m


def _detach(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.detach()
    if isinstance(x, tuple):
        return tuple(_detach(v) for v in x)
    if isinstance(x, list):
        return [_detach(v) for v in x]
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    return x


class _Capture:
    """Forward hooks on the chosen layers: each attention module's inputs, each output projection's input z and
    output o, and a zero leaf added to o, whose gradient is ∂(objective)/∂o."""

    def __init__(self, hf: HFModel, layers: list[int], leaves: bool):
        self.inputs: dict[int, tuple[tuple, dict]] = {}
        self.z: dict[int, Tensor] = {}
        self.o: dict[int, Tensor] = {}
        self.leaf: dict[int, Tensor] = {}
        self.hooks = []
        for i in layers:
            block = hf.layers[i]
            s = sites(block)
            self.hooks.append(_get(block, s.attention).register_forward_pre_hook(self._inputs(i), with_kwargs=True))
            self.hooks.append(_get(block, s.output).register_forward_hook(self._output(i, leaves)))

    def _inputs(self, i: int):
        def hook(module, args, kwargs):
            self.inputs[i] = (_detach(args), _detach(kwargs))

        return hook

    def _output(self, i: int, leaves: bool):
        def hook(module, args, out):
            self.z[i] = args[0].detach()
            self.o[i] = out.detach()
            if leaves:
                self.leaf[i] = torch.zeros_like(out, requires_grad=True)
                return out + self.leaf[i]
            return None

        return hook

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def rerun_z(hf: HFModel, layer: int, inputs: tuple[tuple, dict]) -> Tensor:
    """The output projection's input z of `layer`'s attention module, run again (as the model now is) on `inputs`."""
    block = hf.layers[layer]
    s = sites(block)
    got: dict[str, Tensor] = {}
    hook = _get(block, s.output).register_forward_hook(lambda m, a, o: got.setdefault("z", a[0].detach()))
    try:
        with torch.no_grad():
            args, kwargs = inputs
            _get(block, s.attention)(*args, **kwargs)
    finally:
        hook.remove()
    return got["z"]


def head_outputs(z: Tensor, W_O: Tensor) -> Tensor:
    """Each head's contribution z_h W_O[h] to the output projection: (M, H, D) from z (..., H*d), W_O (H, d, D)."""
    H, d, D = W_O.shape
    return torch.einsum("mhd,hdD->mhD", z.reshape(-1, H, d).to(W_O.dtype), W_O)  # (M, H*d) -> (M, H, d) -> (M, H, D)


def projected(G: Tensor, W_O: Tensor) -> Tensor:
    """G (..., D) carried back through each head's output map: (M, H, d) = G W_O[h]ᵀ for every head."""
    H, d, D = W_O.shape
    return torch.einsum("mD,hdD->mhd", G.reshape(-1, D).to(W_O.dtype), W_O)


def head_dots(G: Tensor, W_O: Tensor, z: Tensor, W_O_new: Tensor, z_new: Tensor,
              clean: Tensor | None = None) -> Tensor:
    """⟨G, Δo_h⟩ per head (H,), with Δo_h = z_new_h W_O_new[h] − z_h W_O[h] (z: (M, H*d)), without forming Δo:
    Σ (G W_O_new[h]ᵀ) · z_new_h − (G W_O[h]ᵀ) · z_h. `clean`: projected(G, W_O), when already computed."""
    H, d, _ = W_O.shape
    A = projected(G, W_O) if clean is None else clean  # (M, H, d)
    z0, z1 = z.reshape(-1, H, d).to(A.dtype), z_new.reshape(-1, H, d).to(A.dtype)
    if W_O_new is W_O or torch.equal(W_O_new, W_O):
        return (A * (z1 - z0)).sum((0, 2)).double()
    return ((projected(G, W_O_new) * z1).sum((0, 2)) - (A * z0).sum((0, 2))).double()


def combine(first: Tensor, dots: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """(first-order term, curvature term, its standard error) per head from the summed dot products: curvature
    = (1/2N) mean_k dots², se = (1/2N) sd_k(dots²) / √K."""
    sq = dots**2  # (K, H)
    K = sq.shape[0]
    curvature = sq.mean(0) / (2 * n)
    se = (sq.std(0, unbiased=True) / math.sqrt(K) / (2 * n)) if K > 1 else torch.full_like(curvature, math.nan)
    return first, curvature, se


def _objectives(hf: HFModel, out, inputs: dict[str, Tensor], n: int, probes: int,
                gen: torch.Generator) -> tuple[Tensor | None, list[Tensor]]:
    """The clean mean loss (None for drift: its gradient is 0) and the K probe objectives."""
    if hf.kind == DRIFT:
        h = out.last_hidden_state  # (B, T, D)
        unit = h / h.norm(dim=-1, keepdim=True)
        xi = [torch.randn(h.shape, generator=gen, dtype=h.dtype, device="cpu").to(h.device) for _ in range(probes)]
        return None, [(x * unit).sum() for x in xi]
    pred, target = logits_and_targets(out.logits, inputs, hf.kind)
    scored = target != -100
    logp = torch.log_softmax(pred[scored], dim=-1)  # (n_b, V), one graph node for every objective
    t = target[scored]
    loss = -logp.gather(1, t[:, None]).sum() / n
    with torch.no_grad():
        probs = logp.detach().double().exp().cpu()
    sampled = [torch.multinomial(probs, 1, generator=gen).to(logp.device) for _ in range(probes)]  # (n_b, 1)
    return loss, [-logp.gather(1, y).sum() for y in sampled]


def estimate_heads(scorer: Scorer, originals: dict[int, AttentionLayer], heads: list[int], edits: list[Edit],
                   *, rotary: str = "gauge", probes: int = PROBES, seed: int = 0,
                   progress: Callable[..., None] | None = None) -> list[HeadEstimate]:
    """Estimate Δloss of every edit on every head of `heads` in every layer of `originals`.

    `scorer` must have run its baseline with the states entering min(originals) cached (`baseline(cache=...)`).
    Returns one HeadEstimate per (layer, head, edit), layer by layer, head by head, edit by edit.
    """
    hf = scorer.hf
    layers = sorted(originals)
    start = layers[0]
    if start and start not in scorer.cache:
        raise ValueError(f"no cached states entering layer {start}; baseline(cache=...) must include it")
    for i in layers:  # each head's estimate is of that head edited alone
        for e in edits:
            check_qk_norm(originals[i], e, heads[:1])
    results = {(i, str(e)): apply_edit(originals[i], e, heads, rotary=rotary) for i in layers for e in edits}
    n = scorer.counted
    H = originals[start].spec.n_heads
    first = {key: torch.zeros(H, dtype=torch.float64) for key in results}
    dots = {key: torch.zeros(probes, H, dtype=torch.float64) for key in results}
    moved2 = {key: torch.zeros(H, dtype=torch.float64) for key in results}
    out2 = {i: torch.zeros(H, dtype=torch.float64) for i in layers}
    layer2 = {i: torch.zeros((), dtype=torch.float64) for i in layers}  # Σ_t |o|²: the whole attention output
    gen = torch.Generator().manual_seed(seed)
    device = next(hf.model.parameters()).device  # W_O where the model's z and gradients are (--device)
    W_O = {i: originals[i].W_O.float().to(device) for i in layers}
    W_O_new = {key: (W_O[key[0]] if r.layer.W_O is originals[key[0]].W_O else r.layer.W_O.float().to(device))
               for key, r in results.items()}
    chunks = [(b, rows) for b, batch in enumerate(scorer.batches)
              for rows in _row_chunks(batch.shape[0], max(1, GRAD_TOKENS // batch.shape[1]))]
    passes = probes + (hf.kind != DRIFT)  # the clean loss's gradient (none for drift), then the K probes'
    tick = phase(progress, "estimate: gradients", len(chunks) * passes, "backward passes")
    for done, (b, rows) in enumerate(chunks):
        inputs = {k: (v[rows] if isinstance(v, Tensor) else v) for k, v in scorer.inputs[b].items()}
        states = scorer.cache[start][b][rows] if start else None
        cap = _Capture(hf, layers, leaves=True)
        try:
            with _frozen(hf.model), torch.enable_grad(), _from_layer(hf, states, start, scorer.as_tuple):
                res = hf.model(**{k: v for k, v in inputs.items() if k != "labels"})
        finally:
            cap.remove()
        # Every head's edited z, from the layer's attention module run again with each edit written back.
        z_new: dict[tuple[int, str], Tensor] = {}
        for i in layers:
            clean = head_outputs(cap.z[i], W_O[i])  # (M, H, D)
            out2[i] += clean.double().pow(2).sum((0, 2)).cpu()
            layer2[i] += cap.o[i].double().pow(2).sum().cpu()
            for e in edits:
                key = (i, str(e))
                with written(hf, [results[key].layer]):
                    z_new[key] = rerun_z(hf, i, cap.inputs[i])
                delta = head_outputs(z_new[key], W_O_new[key]) - clean  # (M, H, D)
                moved2[key] += delta.double().pow(2).sum((0, 2)).cpu()
            del clean
        loss, objectives = _objectives(hf, res, inputs, n, probes, gen)
        leaves = [cap.leaf[i] for i in layers]
        targets = ([] if loss is None else [(None, loss)]) + list(enumerate(objectives))
        for t, (k, objective) in enumerate(targets):
            grads = torch.autograd.grad(objective, leaves, retain_graph=t + 1 < len(targets))
            tick(done * passes + t + 1, status=f"chunk {done + 1}/{len(chunks)}" if len(chunks) > 1 else "")
            for j, i in enumerate(layers):
                A = projected(grads[j], W_O[i])  # (M, H, d)
                for e in edits:
                    key = (i, str(e))
                    d = head_dots(grads[j], W_O[i], cap.z[i], W_O_new[key], z_new[key], clean=A).cpu()
                    if k is None:
                        first[key] += d
                    else:
                        dots[key][k] += d
            del grads
        del res, objectives, loss, leaves, targets, cap, z_new
    found: list[HeadEstimate] = []
    for i in layers:
        for h in heads:
            for e in edits:
                key = (i, str(e))
                f, c, se = combine(first[key], dots[key], n)
                moved = float(torch.sqrt(moved2[key][h] / out2[i][h])) if out2[i][h] > 0 else math.inf
                r = results[key]
                found.append(HeadEstimate(
                    layer=i, head=h, edit=str(e), first=float(f[h]), curvature=float(c[h]), se=float(se[h]),
                    moved=moved, reach=float(torch.sqrt(moved2[key][h] / layer2[i])) if layer2[i] > 0 else math.inf,
                    unreliable=False,
                    predicted=r.predicted.get(h), offset0=r.offset0_only))
    return found


def _row_chunks(n: int, per: int) -> list[slice]:
    return [slice(i, min(n, i + per)) for i in range(0, n, per)]




def choose(found: list[HeadEstimate], n: int, seed: int = 0) -> tuple[list[HeadEstimate], set[tuple[int, int]]]:
    """The `n` heads of one edit's estimates worth an exact run: the n//4 predicted cheapest and costliest, up to
    n//4 flagged ones (furthest above their estimate first, in the spot check's standard errors), and a random sample
    (seeded) for the rest; returns them and the (layer, head) pairs of the random part."""
    if n >= len(found):
        return list(found), {(x.layer, x.head) for x in found}
    q = max(1, n // 4)
    by = sorted(found, key=lambda x: (x.estimate, x.layer, x.head))
    picked = {(x.layer, x.head): x for x in by[:q] + by[-q:]}
    for x in sorted((x for x in found if x.unreliable), key=lambda x: -(x.spot - x.estimate) / x.spot_se):
        if len(picked) >= min(n, 3 * q):
            break
        picked.setdefault((x.layer, x.head), x)
    rest = [x for x in found if (x.layer, x.head) not in picked]
    sample = random.Random(seed).sample(rest, max(0, min(len(rest), n - len(picked))))
    picked.update({(x.layer, x.head): x for x in sample})
    return sorted(picked.values(), key=lambda x: (x.layer, x.head)), {(x.layer, x.head) for x in sample}


def estimated_runs(scorer: Scorer, originals: dict[int, AttentionLayer], heads: list[int], edits: list[Edit],
                   base: float, *, rotary: str, probes: int, verify: int, seed: int,
                   progress: Callable[..., None] | None = None):
    """run_experiment's --estimate: a Run per (layer, head, edit) holding the estimate, exact where verified."""
    import time

    n_verify = min(verify, len(originals) * len(heads)) * len(edits)
    t0 = time.perf_counter()
    found = estimate_heads(scorer, originals, heads, edits, rotary=rotary, probes=probes, seed=seed,
                           progress=progress)
    found, spot_tokens = spot_check(scorer, originals, found, edits, rotary=rotary, seed=seed, progress=progress)
    t_est = time.perf_counter() - t0
    exact: dict[tuple[int, int, str], Run] = {}
    agreement = []
    t0 = time.perf_counter()
    done = 0
    tick = phase(progress, "verifying the estimate", n_verify, "exact runs") if n_verify else None
    for e in edits:
        mine = [x for x in found if x.edit == str(e)]
        chosen, sampled = choose(mine, verify, seed) if verify else ([], set())
        for x in chosen:
            (unit,) = make_units("head", [x.layer], [x.head])
            exact[(x.layer, x.head, x.edit)] = run_unit(scorer, scorer.hf, originals, unit, e, "head", base, rotary)
            done += 1
            tick(done, status=f"{e} L{x.layer} H{x.head}")
        if verify:
            pairs = [(x.estimate, exact[(x.layer, x.head, x.edit)].dloss) for x in chosen]
            rand = [p for x, p in zip(chosen, pairs, strict=True) if (x.layer, x.head) in sampled]
            agreement.append(Agreement(str(e), len(pairs), spearman(*map(list, zip(*pairs, strict=True))),
                                       len(rand), spearman(*map(list, zip(*rand, strict=True))) if rand else None))
    t_verify = time.perf_counter() - t0
    runs = []
    for x in found:
        r = exact.get((x.layer, x.head, x.edit))
        runs.append(Run(
            edit=x.edit, scope="head", layer=x.layer, head=x.head, heads=1,
            loss=None if r is None else r.loss, dloss=None if r is None else r.dloss, ratio=None,
            predicted=x.predicted, offset0=x.offset0, seconds=0.0 if r is None else r.seconds,
            forward_seconds=0.0 if r is None else r.forward_seconds, dloss_se=None if r is None else r.dloss_se,
            dloss_estimate=x.estimate, dloss_estimate_se=x.se, moved=x.moved, unreliable=x.unreliable,
            reach=x.reach, spot=x.spot, spot_se=x.spot_se))
    return runs, Estimate(probes=probes, seconds=t_est, verify_seconds=t_verify, agreement=tuple(agreement),
                          spot_tokens=spot_tokens)
