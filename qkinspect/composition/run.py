"""`qkinspect.composition`: Q-, K- and V-composition scores between every earlier and later head, from the weights
(ARCHITECTURE.md §3, "Heads together"; the math in `qkinspect.metrics.composition`, the derivations in
docs/composition.md).

Which heads compose into which: `qkinspect.composition.streams`.

Streaming: the earlier layers are taken in chunks whose reduced write factors (one (H d_head, D) matrix per layer)
fit in HELD_BYTES; for each chunk, the layers are read once in file order (a layer read as a later layer is scored
against the chunk's layers already held), and a second read covers the later layers that come before their earlier
partners in the file (a decoder's self-attention after the cross-attention of an earlier layer). Each later layer
costs one product per run of held layers (the kinds side by side where they share their partners), at most
OUT_BYTES each. Peak memory: the chunk, one layer (two while the next is read) and one product, whatever the
number of pairs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from qkinspect.analysis.engine import torch_threads
from qkinspect.composition.request import LIBRARY_NAMES, check_model, check_request
from qkinspect.composition.results import BlockPair, CompositionResult
from qkinspect.composition.streams import Unit, block_pairs, units
from qkinspect.errors import InputError
from qkinspect.layer import AttentionLayer, ModelInfo
from qkinspect.loading import opened
from qkinspect.metrics.composition import KINDS, ReadSide, normalised, product_norms, read_side, write_side
from qkinspect.metrics.fold import fold_qk_norm
from qkinspect.names import Names
from qkinspect.processing import CompositionProcessing

HELD_BYTES = 256 << 20  # the earlier layers' reduced write factors held at once (a 7B layer's: 64 MB in float32)
OUT_BYTES = 64 << 20  # one product's result (a 7B layer pair's: 64 MB in float32)
Progress = Callable[[int, int], None]


@dataclass
class _Request:
    """The run's settings as the scoring uses them (the checked request's precision as a torch dtype, each side's
    selection once the model is known) and the blocks whose q/k norms it measured unfolded."""

    kinds: tuple[str, ...]
    dtype: torch.dtype
    device: str
    fold_ln: bool
    fold_qk_norm: bool
    from_layers: tuple[int, ...] | None = None
    to_layers: tuple[int, ...] | None = None
    from_heads: tuple[int, ...] | None = None
    to_heads: tuple[int, ...] | None = None
    not_folded: list[str] = field(default_factory=list)


def composition(
    model=None,
    *,
    kinds: str | Iterable[str] = KINDS,
    blocks: str | Iterable[str] | None = None,
    layers: str | int | Iterable[int] | None = None,
    heads: str | int | Iterable[int] | None = None,
    from_layers: str | int | Iterable[int] | None = None,
    to_layers: str | int | Iterable[int] | None = None,
    from_heads: str | int | Iterable[int] | None = None,
    to_heads: str | int | Iterable[int] | None = None,
    fold_ln: bool = True,
    fold_qk_norm: bool = False,
    precision: str = "float32",
    device: str = "cpu",
    progress: Progress | None = None,
    revision: str | None = None,
    by: str = "head",
    names: Names = LIBRARY_NAMES,
) -> CompositionResult:
    """Q-, K- and V-composition scores of every earlier head into every later head, each beside its null 1/√D.

    Args:
        model: a path, hub id or GGUF file; None for the demo model; an opened LoadedModel; or a model in memory
            (a transformers PreTrainedModel, or a (config, state_dict) pair), as `qkinspect.analyze` takes it.
        kinds: "q", "k", "v" or several ("q,k" or ["q", "k"]); default all three.
        blocks: block kinds or labels (both sides of a pair); None for all.
        layers, heads: the earlier and later layers and heads alike ("0-3,7", 3, [0, 1]); None for all.
        from_layers, to_layers, from_heads, to_heads: the earlier (writing) or later (reading) side alone; they
            override `layers` / `heads` for that side.
        fold_ln: fold each layer's input-norm gain into W_Q, W_K, W_V first (the default; False for the weights as
            stored). Sides the model gives no norm for are measured as stored and listed in `processing`.
        fold_qk_norm: fold q/k-norm gains (Qwen3, OLMo2, Gemma3) into W_Q and W_K.
        precision: "float32" (default) or "float64" for the products; the QR factors are float64 in both.
        device: "cpu", "cuda" or "cuda:N".
        progress: called as progress(done, total) after each later layer.
        revision: hub revision when `model` is a hub id.
        by: "head" (each later query head, the default) or "kv-head": each later key/value head with its query
            heads taken together (CompositionResult.by_kv_head: under grouped-query attention the query heads of
            one group score nearly alike, and a list by query head repeats one key head).
        names: how errors name the options (`qkinspect.composition.request`): these arguments' names by default;
            the CLI passes its own.

    Returns:
        CompositionResult: the scores per (earlier layer, later layer, kind), its records, block pairs, processing.

    Raises:
        InputError: an unknown kind, block, layer, head, precision or device; a model that cannot be opened;
            a selection in which no earlier head composes into any later one.

    Example:
        >>> import qkinspect
        >>> r = qkinspect.composition(None, kinds="k", to_layers="1-2")  # the demo model
        >>> r.top("k", 1)[0].ratio > 1
        True
    """
    request = check_request(kinds=kinds, blocks=blocks, layers=layers, heads=heads, from_layers=from_layers,
                            to_layers=to_layers, from_heads=from_heads, to_heads=to_heads, fold_ln=fold_ln,
                            fold_qk_norm=fold_qk_norm, precision=precision, device=device, by=by, names=names)
    blocks, by = request.blocks, request.by
    req = _Request(request.kinds, getattr(torch, request.precision), request.device, request.fold_ln,
                   request.fold_qk_norm)  # the torch dtype of the precision's name
    with opened(model, revision) as m:
        chosen = check_model(request, m.info)
        (req.from_layers, req.from_heads), (req.to_layers, req.to_heads) = request.side("from"), request.side("to")
        keys = {b.key for b in chosen}
        every = units(m.info)
        pairs = block_pairs(every, m.info)
        earlier = [u for u in every if u.block in keys and _has(req.from_layers, u.layer)]
        later = [u for u in every if u.block in keys and _has(req.to_layers, u.layer)]
        todo = {(a, b): k for a in earlier for b in later if (k := tuple(x for x in a.kinds_into(b) if x in req.kinds))}
        if not todo:
            raise InputError(f"{m.info.name}: in this selection no earlier head composes into a later one "
                             f"(kinds {','.join(req.kinds)}; blocks: {_pairs_text(pairs)})")
        result = CompositionResult(m.info, _processing(req, m.info, blocks), [p for p in pairs
                                   if p.from_block in keys and p.to_block in keys])
        with torch_threads():  # torch's threads raised to the CPUs this process may use, as for analyze
            _run(m, req, todo, result, progress)
        result.processing = _processing(req, m.info, blocks)
    result.scores = dict(sorted(result.scores.items(), key=lambda kv: _order(kv[0], every)))
    return result.by_kv_head() if by == "kv-head" else result


def _has(sel: tuple[int, ...] | None, i: int) -> bool:
    return sel is None or i in sel


def _pairs_text(pairs: list[BlockPair]) -> str:
    return "; ".join(f"{p.from_block} -> {p.to_block} ({','.join(p.kinds)})" for p in pairs) or "none"


def _order(key, every: list[Unit]) -> tuple:
    pos = {(u.block, u.layer): (u.pos, n) for n, u in enumerate(every)}
    fb, fl, tb, tl, kind = key
    return (pos[(fb, fl)][1], pos[(tb, tl)][1], KINDS.index(kind))




def _processing(req: _Request, info: ModelInfo, blocks) -> CompositionProcessing:
    return CompositionProcessing(
        fold_ln=req.fold_ln, fold_qk_norm=req.fold_qk_norm, precision=str(req.dtype).removeprefix("torch."),
        device=req.device, kinds=req.kinds,
        blocks=None if blocks is None else tuple([blocks] if isinstance(blocks, str) else blocks),
        from_layers=req.from_layers, from_heads=req.from_heads, to_layers=req.to_layers, to_heads=req.to_heads,
        not_folded=tuple(dict.fromkeys(req.not_folded)),
        rotary=tuple(b.key for b in info.blocks if b.positional == "rope"),
        qk_norm_not_folded=() if req.fold_qk_norm else tuple(b.key for b in info.blocks if b.qk_norm),
        dequantized=info.quantization)


# -- the streamed computation ------------------------------------------------------------------------------------

class _Held:
    """One chunk of earlier layers: their write factors in one buffer per stream, rows in file order."""

    def __init__(self, chunk: list[Unit], rows: dict[Unit, int], dtype: torch.dtype, device: str):
        self.offset: dict[Unit, int] = {}
        self.norm: dict[Unit, torch.Tensor] = {}
        self.buffer: dict[str, torch.Tensor] = {}
        sizes: dict[str, int] = {}
        for u in chunk:
            self.offset[u] = sizes.get(u.writes, 0)
            sizes[u.writes] = self.offset[u] + rows[u]
        widths = {u.writes: u.width for u in chunk}
        for s, n in sizes.items():
            self.buffer[s] = torch.empty(n, widths[s], dtype=dtype, device=device)
        self.rows = rows

    def keep(self, u: Unit, layer: AttentionLayer, dtype: torch.dtype, gains: _Gains) -> None:
        w = write_side(layer, dtype, gains.kv)
        self.buffer[u.writes][self.offset[u]:self.offset[u] + self.rows[u]].copy_(w.A)
        self.norm[u] = w.norm

    def runs(self, partners: list[Unit]) -> Iterator[list[Unit]]:
        """The partners grouped into runs of consecutive rows of one buffer, same heads and rows per head, each
        run's product at most OUT_BYTES (at least one layer)."""
        run: list[Unit] = []
        for u in sorted(partners, key=lambda x: (x.writes, self.offset[x])):
            if run:
                last = run[-1]
                joined = (u.writes == last.writes and self.offset[u] == self.offset[last] + self.rows[last]
                          and u.heads == last.heads and self.rows[u] == self.rows[last])
                if not joined:
                    yield run
                    run = []
            run.append(u)
        if run:
            yield run


def _rows(u: Unit, info: ModelInfo) -> int:
    """Rows of a unit's write factor: H * d_head_v."""
    s = info.block(u.block)
    return s.n_heads * s.v_head


def _chunks(earlier: list[Unit], rows: dict[Unit, int], itemsize: int) -> Iterator[list[Unit]]:
    chunk: list[Unit] = []
    held = 0
    for u in earlier:
        size = rows[u] * u.width * itemsize
        if chunk and held + size > HELD_BYTES:
            yield chunk
            chunk, held = [], 0
        chunk.append(u)
        held += size
    if chunk:
        yield chunk


def _run(m, req: _Request, todo: dict[tuple[Unit, Unit], tuple[str, ...]], result: CompositionResult,
         progress: Progress | None) -> None:
    earlier = list(dict.fromkeys(a for a, _ in todo))
    rows = {u: _rows(u, m.info) for u in earlier}
    itemsize = torch.empty((), dtype=req.dtype).element_size()
    chunks = list(_chunks(earlier, rows, itemsize))
    plans = []
    for chunk in chunks:
        inside = set(chunk)
        plans.append({pair: k for pair, k in todo.items() if pair[0] in inside})
    total = sum(len({b for _, b in p}) for p in plans)
    done = 0
    if progress is not None:
        progress(done, total)
    for chunk, plan in zip(chunks, plans, strict=True):
        held = _Held(chunk, rows, req.dtype, req.device)
        later = {b for _, b in plan}
        for sweep in (0, 1):  # the second read: later layers that came before a partner in the file
            wanted = set(chunk) | later if sweep == 0 else {b for _, b in plan}
            if not wanted:
                break
            for u, layer in _read(m, wanted, req):
                gains = _gains(layer, req)
                ready = {a: k for (a, b), k in plan.items() if b == u and a in held.norm}
                if ready:
                    _score(held, u, layer, gains, ready, req, result)
                    for a in ready:
                        del plan[(a, u)]
                    if not any(b == u for _, b in plan):
                        done += 1
                        if progress is not None:
                            progress(done, total)
                if u in held.offset and sweep == 0:
                    held.keep(u, layer, req.dtype, gains)
                del layer
        if plan:  # every pair of the chunk is scored by its two reads; anything left is a bug, never a silent gap
            (a, b), _ = next(iter(plan.items()))
            raise RuntimeError(f"composition: {a.block} layer {a.layer} -> {b.block} layer {b.layer} was not scored")
        del held


def _read(m, wanted: set[Unit], req: _Request) -> Iterator[tuple[Unit, AttentionLayer]]:
    """The wanted units' layers in file order, processed (folds, in the compute dtype), one block at a time."""
    by_block: dict[str, set[int]] = {}
    for u in wanted:
        by_block.setdefault(u.block, set()).add(u.layer)
    lookup = {(u.block, u.layer): u for u in wanted}
    for b in m.info.blocks:
        if b.key not in by_block:
            continue
        stream = m.layers([b.key], sorted(by_block[b.key]), prefetch=True, dtype=req.dtype)
        with contextlib.closing(stream):
            for layer in stream:
                u = lookup[(layer.block, layer.layer)]
                layer = _process(layer, req)  # rebound: the stored tensors a fold replaced are freed now
                yield u, layer
                del layer


@dataclass(frozen=True)
class _Gains:
    """The input-norm gains folded into a layer's products (None: not folded)."""

    q: torch.Tensor | None = None
    kv: torch.Tensor | None = None


def _process(layer: AttentionLayer, req: _Request) -> AttentionLayer:
    if req.fold_qk_norm and layer.spec.qk_norm:
        layer = fold_qk_norm(layer)
    return layer


def _gains(layer: AttentionLayer, req: _Request) -> _Gains:
    """The gains of the norms before the query and key/value projections, as `fold_ln` folds them (diag(gain) W);
    sides without a norm are noted as not folded (once per layer)."""
    if not req.fold_ln:
        return _Gains()
    raw = [side for side, norm in (("query", layer.norm_q), ("key/value", layer.norm_kv)) if norm is None]
    req.not_folded += [f"{layer.block} layer {layer.layer} {side}" for side in raw]
    return _Gains(None if layer.norm_q is None else layer.norm_q.gain,
                  None if layer.norm_kv is None else layer.norm_kv.gain)


def _score(held: _Held, u: Unit, layer: AttentionLayer, gains: _Gains, partners: dict[Unit, tuple[str, ...]],
           req: _Request, result: CompositionResult) -> None:
    """Score the later layer `u` against its held partners, one product per kind and run of held layers."""
    kinds = tuple(k for k in KINDS if any(k in ks for ks in partners.values()))
    if "v" in kinds and layer.W_O is None:
        raise InputError(f"{layer.block} layer {layer.layer}: the model gives no W_O, so no V-composition into it")
    read = read_side(layer, kinds, req.dtype, gains.q, gains.kv)
    read = ReadSide({k: b.to(req.device) for k, b in read.B.items()}, read.norm, read.n_heads)  # cpu -> device
    for group in _same_partners(kinds, partners, read, held):
        with_kind = [a for a, ks in partners.items() if group[0] in ks]
        B = read.B[group[0]] if len(group) == 1 else torch.cat([read.B[k] for k in group], dim=1)  # (D, kinds H r)
        for run in held.runs(with_kind):
            for piece in _pieces(run, held.rows[run[0]] * B.shape[1] * B.element_size()):
                _score_piece(held, piece, u, B, group, read, result)


def _same_partners(kinds: tuple[str, ...], partners: dict[Unit, tuple[str, ...]], read: ReadSide, held: _Held
                   ) -> list[tuple[str, ...]]:
    """The kinds in groups that can share one product: the same held partners and operands of one shape (a
    decoder's q, k and v when d_head_v = d_head), and only while one earlier layer's product with them all fits in
    OUT_BYTES (a 7B layer's would not: there the products are large enough one kind at a time, and the joined
    operand and product would cost memory)."""
    rows = max(held.rows[a] for a in partners)
    if rows * sum(read.B[k].shape[1] for k in kinds) * read.B[kinds[0]].element_size() > OUT_BYTES:
        return [(k,) for k in kinds]
    groups: list[tuple[str, ...]] = []
    for k in kinds:
        key = (frozenset(a for a, ks in partners.items() if k in ks), read.B[k].shape)
        for i, g in enumerate(groups):
            first = g[0]
            if (frozenset(a for a, ks in partners.items() if first in ks), read.B[first].shape) == key:
                groups[i] = (*g, k)
                break
        else:
            groups.append((k,))
    return groups


def _pieces(run: list[Unit], bytes_per_unit: int) -> Iterator[list[Unit]]:
    step = max(1, OUT_BYTES // max(bytes_per_unit, 1))
    for i in range(0, len(run), step):
        yield run[i:i + step]


def _score_piece(held: _Held, piece: list[Unit], u: Unit, B: torch.Tensor, kinds: tuple[str, ...], read: ReadSide,
                 result: CompositionResult) -> None:
    first, n, H_b = piece[0], len(piece), read.n_heads
    start = held.offset[first]
    A = held.buffer[first.writes][start:start + n * held.rows[first]]  # (n H_a r, D): a view, no copy
    num = product_norms(A, B, n * first.heads, len(kinds) * H_b).view(n, first.heads, len(kinds), H_b).cpu()
    for i, a in enumerate(piece):
        for j, kind in enumerate(kinds):
            arr = normalised(num[i, :, j], held.norm[a], read.norm[kind]).numpy()
            result.scores[(a.block, a.layer, u.block, u.layer, kind)] = arr
            result.read_norms[(u.block, u.layer, kind)] = read.norm[kind].double().cpu().numpy()
            bad = ~np.isfinite(arr)
            if bad.any():
                result.warnings.append(f"{a.block} layer {a.layer} -> {u.block} layer {u.layer} ({kind}): "
                                       f"{int(bad.sum())} pairs are NaN{_unusable(held.norm[a], read.norm[kind])}")


def _unusable(norm_a: torch.Tensor, norm_b: torch.Tensor) -> str:
    """Which heads of the earlier (a) and the later (b) layer have zero or non-finite weights (NaN or inf in their
    factors or folded gains, or an overflow), as the NaN scores' reason."""
    said = []
    for side, norm in (("earlier", norm_a), ("later", norm_b)):
        heads = torch.nonzero(~torch.isfinite(norm) | (norm == 0)).flatten().tolist()
        if heads:
            said.append(f"{side} head{'s' if len(heads) > 1 else ''} {', '.join(map(str, heads))}")
    why = "; ".join(said) if said else "the products overflow"
    return f" ({why}: zero or non-finite weights)" if said else f" ({why})"
