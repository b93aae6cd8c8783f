"""An edit kept as a parametrisation while the edited model trains (docs/training.md, "Healing").

`EditForm` holds one edited layer's canonical tensors (ARCHITECTURE.md §2) as parameters and computes them with the
edit's constraint applied, so that every optimizer step stays inside the edit's set:

- share_qk, tie_q, tie_k, share_qkv: an edited query head has no W_Q of its own: W_Q[h] := W_K[g(h)] (share_qk and
  share_qkv give each edited head its own key head, so this is one matrix W per head; share_qkv also W_V := W).
  Under the rotary gauge this is the same statement: share_qk's W = W Wᴴ per block writes identical columns into
  W_Q and W_K (forms.share_qk), so the rotation sees one matrix.
- symmetric: W_Q[h] := W_K[h] diag(s), s the fixed ±1 signs the edit chose per column (per rotary pair both
  columns share a sign), so W_Q W_Kᵀ stays symmetric (Hermitian per rotary block).
- rank:K: the query factor of the real block is A C (D x k, k x k0) with k the real directions the edit kept, the
  rotary pairs the edit dropped stay zero, the pairs it kept train freely: rank W_Q W_Kᵀ <= K at every step.
- ablate: W_O[h] := 0.
Where the model has both biases, the key bias follows the query bias the same way (b_Q[h] := b_K[g(h)] s).
Where the edit gave grouped-query heads keys of their own (expanded K/V), only the edited heads' keys (and, for
share_qkv, values) are their own: the other heads of a group keep one shared key, and every value not edited stays
its group's, so healing trains no more key/value parameters than the model had.

The parameters are the free ones only, so the optimizer's state and the gradients are no larger than the edit
needs: a canonical tensor the constraint fills whole has no parameter (W_Q where a tie edits every head of the
layer: share_qk's key of each head IS its query projection, one matrix; W_V under share_qkv on every head; W_O
under ablate on every head), and an expanded key or value holds one row per distinct head it is read from (share_qk
on every head of SmolLM2's layers: 9 keys, 3 values, no W_Q; fewer parameters than the unedited layer). A parameter
read whole by one module weight with permuted axes (separate q/k/v/o projections) is stored in that weight's axis
order, so the weight is a view of it: share_qk on every head reads q_proj and k_proj as one parameter, with no copy
per step; only gathers (a group's value read by its heads, a tie on some heads) and arithmetic (symmetric's signs,
rank's mask and factors) compute anything.

`qkinspect.experiment.model.writeback.module_maps` finds where each canonical element lands in the family's modules
by writing a layer of index probes with the family's own write-back: the module weights are then gathered
from `EditForm`'s tensors with `torch.nn.utils.parametrize`, for every family the write-back knows, and a layout is
never written twice. A write-back that does arithmetic on the values (not a pure re-layout) is refused.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from qkinspect.experiment.edits.names import Edit
from qkinspect.experiment.edits.rotary import rotary_layout
from qkinspect.layer import AttentionLayer

CANON = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
TIES = ("share_qk", "tie_q", "tie_k", "share_qkv", "symmetric")
PROBE_BITS = 12  # bits per probe pass: values 1..4096 are exact in float32


class EditForm(nn.Module):
    """The canonical tensors of one edited layer, with the edit `edit` on `heads` kept as their form.

    Built from the edited layer (`apply_edit(...).layer`), whose tensors are already in the edit's set; checked
    on construction (the form reproduces them to float rounding). Its parameters are the edit's free ones only: a
    tensor the constraint fills whole has none (W_Q where every head is edited by a tie), and expanded keys and
    values hold one row per distinct head they are read from (`take_<name>`: which row each head reads). `store`
    lays a parameter out in the axis order of the module weight that reads it, so that weight is a view of it."""

    def __init__(self, layer: AttentionLayer, edit: Edit, heads: list[int], groups: Tensor | None = None):
        super().__init__()
        self.edit, self.kind = str(edit), edit.name
        self.names = [n for n in CANON if getattr(layer, n) is not None]
        self.shapes = {n: tuple(getattr(layer, n).shape) for n in self.names}
        self.offsets: dict[int, str] = {}  # where each canonical tensor starts in `flat` (module_maps' order)
        offset = 0
        for n in self.names:
            self.offsets[offset] = n
            offset += math.prod(self.shapes[n])
        h = torch.tensor(heads, dtype=torch.int64)
        self.register_buffer("heads", h)
        # whether the edited rows are every row in order (no copy of the rest needed), decided here, not per step;
        # all_kv: the edited heads read every key/value head in order (W_K[kv] is W_K itself)
        self.all_q = heads == list(range(layer.W_Q.shape[0]))
        self.all_kv = layer.kv_index()[h].tolist() == list(range(layer.W_V.shape[0]))
        self.register_buffer("kv", layer.kv_index()[h].clone())
        both_b = "b_Q" in self.names and "b_K" in self.names
        self.derived: set[str] = set()  # canonical tensors the constraint fills whole: no parameter
        self.deferred: set[str] = set()  # canonical tensors built only where a module weight reads them (`deferrable`)
        if self.kind in TIES and self.all_q:
            self.derived |= {"W_Q", "b_Q"} if both_b else {"W_Q"}
        if self.kind == "share_qkv" and self.all_kv:
            self.derived.add("W_V")
        if self.kind == "ablate" and self.all_q:
            self.derived.add("W_O")
        takes: dict[str, tuple[list[int], Tensor]] = {}
        if groups is not None:  # expanded K/V: one parameter row per distinct head read (module docstring)
            k_from, v_from = _group_ties(groups, heads, self.kind == "share_qkv")
            for pair, src in ((("W_K", "b_K"), k_from), (("W_V", "b_V"), v_from)):
                rows = sorted(set(src.tolist()))
                if rows != list(range(len(src))):
                    at = torch.tensor([rows.index(i) for i in src.tolist()], dtype=torch.int64)
                    takes.update({n: (rows, at) for n in pair if n in self.names and n not in self.derived})
        for n in self.names:
            if n in self.derived:
                continue
            value = getattr(layer, n).detach().to(torch.float32)
            if n in takes:
                value = value[takes[n][0]]
                self.register_buffer(f"take_{n}", takes[n][1])
            self.register_parameter(n, nn.Parameter(value.clone()))
        self.perm: dict[str, tuple[int, ...]] = {}  # a parameter's axis order where `store` changed it
        if self.kind in TIES:
            self.register_buffer("signs", _signs(layer, h, self.kv) if self.kind == "symmetric"
                                 else torch.ones(len(h), layer.spec.d_head))
        elif self.kind == "rank":
            self._init_rank(layer, edit.k or 0)
        with torch.no_grad():
            free = {n: self._free(n) for n in self.names if n not in self.derived}
            check = self.tensors(free)
        # canonical tensors the constraint leaves as their parameter reads them (a projection may compute on the
        # parameter's rows: `projections`), and those that are one tensor (one projection's output serves both)
        self.untouched = {n for n in free if check[n] is free[n]}
        self.alias = {n: next(m for m in self.names if check[m] is check[n]) for n in self.names}
        for n in self.names:
            want = getattr(layer, n).to(torch.float32)
            err = float((check[n].detach() - want).abs().max()) if want.numel() else 0.0
            scale = float(want.abs().max()) if want.numel() else 0.0
            if err > 1e-4 * max(scale, 1e-30):
                raise AssertionError(f"healing: the {self.edit} form does not reproduce the edited {n} ({err:.3g})")

    def _init_rank(self, layer: AttentionLayer, K: int) -> None:
        """Real block of the edited W_Q as A C (kept directions), pair columns free where kept, zero where
        dropped (exactly zero in the edit's output)."""
        lay = rotary_layout(layer)
        Wq = layer.W_Q[self.heads].to(torch.float64)  # (n, D, d)
        pair_kept = (Wq[..., lay.a].abs().sum(-2) + Wq[..., lay.b].abs().sum(-2)) > 0  # (n, P)
        real = Wq[..., lay.real]  # (n, D, k0)
        k_real = (K - 2 * pair_kept.sum(-1)).clamp(min=0, max=min(real.shape[-1], real.shape[-2]))  # (n,)
        kmax = int(k_real.max()) if len(k_real) else 0
        U, S, Vh = torch.linalg.svd(real, full_matrices=False)
        cols = torch.arange(S.shape[-1]) < k_real.unsqueeze(-1)  # (n, r) directions kept per head
        A = (U * S.unsqueeze(-2) * cols.unsqueeze(-2))[..., :kmax]  # (n, D, kmax)
        C = (Vh * cols.unsqueeze(-1))[..., :kmax, :]  # (n, kmax, k0)
        self.A = nn.Parameter(A.to(torch.float32))
        self.C = nn.Parameter(C.to(torch.float32))
        self.register_buffer("kept_dirs", cols[..., :kmax].to(torch.float32))
        mask = torch.zeros(Wq.shape[0], Wq.shape[-1])  # (n, d): 1 on the columns that train freely
        mask[:, lay.a] = pair_kept.to(mask.dtype)
        mask[:, lay.b] = pair_kept.to(mask.dtype)
        self.register_buffer("free_cols", mask)
        self.register_buffer("real_cols", lay.real.clone())

    def store(self, name: str, perm: tuple[int, ...]) -> None:
        """Hold parameter `name` as its canonical tensor permuted by `perm` (the axis order of the module weight
        that reads it), so the weight is a view of it, not a copy per step. Before training; once per tensor."""
        p = self._parameters.get(name)
        if p is None or name in self.perm or perm == tuple(range(p.dim())):
            return
        self.register_parameter(name, nn.Parameter(p.detach().permute(perm).contiguous(),
                                                   requires_grad=p.requires_grad))
        self.perm[name] = perm

    def _free(self, name: str) -> Tensor:
        """Canonical tensor `name` as its parameter holds it, in canonical axis order (a view), each head read
        from its row."""
        x = self._parameters[name]
        if name in self.perm:
            x = x.permute(_inverse(self.perm[name]))
        take = self._buffers.get(f"take_{name}")
        return x if take is None else _take(x, take)

    def tensors(self, free: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """The layer's canonical tensors, the constraint applied (in the parameters' memory layout, so that a
        module weight read as a view of a canonical tensor needs no copy). `free`: the free tensors as `_free`
        reads them, where the caller has them."""
        t = (dict(free) if free is not None
             else {n: self._free(n) for n in self.names if n not in self.derived and n not in self.deferred})
        h, kv = self.heads, self.kv
        if self.kind in TIES:
            signed = self.kind == "symmetric"  # the other ties' signs are all +1: no multiply
            key = t["W_K"] if self.all_kv else _take(t["W_K"], kv)
            query = key * self.signs.unsqueeze(-2) if signed else key
            t["W_Q"] = query if self.all_q else _rows_set(t["W_Q"], h, query)
            if "b_Q" in self.names and "b_K" in self.names:
                kb = t["b_K"] if self.all_kv else t["b_K"][kv]
                qb = kb * self.signs if signed else kb
                t["b_Q"] = qb if self.all_q else _rows_set(t["b_Q"], h, qb)
            if self.kind == "share_qkv":
                t["W_V"] = key if self.all_kv else _rows_set(t["W_V"], kv, key)
        elif self.kind == "rank":
            Wq = t["W_Q"] if self.all_q else _take(t["W_Q"], h)
            new = Wq * self.free_cols.unsqueeze(-2)  # (n, D, d): kept pairs free, the rest zero
            if self.real_cols.numel():
                real = (self.A * self.kept_dirs.unsqueeze(-2)) @ self.C  # (n, D, kmax) @ (n, kmax, k0) -> (n, D, k0)
                new = new.index_copy(-1, self.real_cols, real)
            t["W_Q"] = new if self.all_q else _rows_set(t["W_Q"], h, new)
        elif self.kind == "ablate":
            t["W_O"] = (torch.zeros(self.shapes["W_O"], device=h.device) if self.all_q
                        else _rows_set(t["W_O"], h, torch.zeros_like(t["W_O"][h])))
        return t

    def constrained(self) -> dict[str, Tensor]:
        """`tensors()` in float32 (also under autocast); inside `cached` computed once and shared by all the
        module weights read from it."""
        cache = self.__dict__.get("_cache")
        if cache is not None and "t" in cache:
            return cache["t"]
        with torch.autocast(self.heads.device.type, enabled=False):  # the weights stay float32 under autocast
            t = self.tensors()
        if cache is not None:
            cache["t"] = t
        return t

    def flat(self) -> Tensor:
        """Every canonical tensor, constraint applied, in one vector (`module_maps` order), for the module
        weights gathered by an index map (a fused projection). Inside `cached` it is computed once."""
        cache = self.__dict__.get("_cache")
        if cache is not None and "flat" in cache:
            return cache["flat"]
        flat = torch.cat([self.canonical(n).reshape(-1) for n in self.names])
        if cache is not None:
            cache["flat"] = flat
        return flat

    def read(self, st: Strided) -> Tensor:
        """The module weight at strided placement `st`: its canonical tensor with permuted axes (a view where the
        parameter is stored in that order)."""
        return self.canonical(self.offsets[st.start]).permute(st.perm).reshape(st.out)

    def canonical(self, name: str) -> Tensor:
        """Canonical tensor `name`, constraint applied (`constrained()[name]`); a deferred one (`deferrable`) is
        gathered here, where a module weight reads it (once inside `cached`)."""
        t = self.constrained()
        if name not in t:
            with torch.autocast(self.heads.device.type, enabled=False):
                t[name] = self._free(name)  # inside `cached`, t is the cached dict: kept for the next read
        return t[name]

    def deferrable(self, name: str) -> bool:
        """Whether canonical tensor `name` can be left out of `constrained()` (`deferred`: gathered only where a
        module weight reads it, `canonical`): the constraint neither changes nor reads it, an untouched parameter
        read by heads through `take_<name>` (an expanded value), not a key a tie copies into the queries. For a
        projection computing on the parameter's rows (`projections`), so that no step builds the gathered tensor
        its forward does not use."""
        return (name in self.untouched and f"take_{name}" in self._buffers
                and not (self.kind in TIES and name in ("W_K", "b_K")))

    def violation(self, t: dict[str, Tensor]) -> Tensor:
        """How far canonical tensors `t` (as the model's modules hold them) are from the edit's set, relative to
        the edited heads' scale: 0 for the ties and ablate up to rounding; for rank:K, σ_{K+1}/σ_1 of the heads'
        forms, their rotary blocks included (0 up to rounding). A 0-d tensor on t's device (no synchronisation:
        the caller reads all layers' at once)."""
        h, kv = self.heads, self.kv
        if self.kind in TIES:
            Wq = t["W_Q"] if self.all_q else t["W_Q"][h]
            Wk = t["W_K"] if self.all_kv else t["W_K"][kv]
            if self.kind == "symmetric":
                Wk = Wk * self.signs.unsqueeze(-2)
            return (Wq - Wk).abs().max() / Wq.abs().max().clamp_min(1e-30)
        if self.kind == "ablate":
            return t["W_O"][h].abs().max() / t["W_O"].abs().max().clamp_min(1e-30)
        if self.kind == "rank":
            return _rank_excess(t["W_Q"][h], self)
        return torch.zeros((), device=h.device)


@contextlib.contextmanager
def cached(forms: Iterable[EditForm]) -> Iterator[None]:
    """Within the block, each form computes its constrained tensors once (one forward and its backward, or one
    scoring pass with the weights fixed); with `torch.nn.utils.parametrize.cached` the module weights too."""
    forms = [f for f in forms if "_cache" not in f.__dict__]  # nested: the outer block's cache stays
    for f in forms:
        f.__dict__["_cache"] = {}
    try:
        with parametrize.cached():
            yield
    finally:
        for f in forms:
            f.__dict__.pop("_cache", None)


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _memory_order(t: Tensor) -> tuple[int, ...]:
    """The axes of `t` from the slowest to the fastest in memory (`t.permute(order)` is contiguous where `t` is a
    permuted contiguous tensor)."""
    return tuple(sorted(range(t.dim()), key=lambda a: -t.stride(a)))


def _take(t: Tensor, rows: Tensor) -> Tensor:
    """`t[rows]` (along axis 0) in `t`'s memory layout: where `t` is a permuted view of a parameter, the result
    is laid out alike, so a module weight read from it with the parameter's axis order needs no second copy."""
    order = _memory_order(t)
    if order == tuple(range(t.dim())):
        return t.index_select(0, rows)
    return t.permute(order).index_select(order.index(0), rows).permute(_inverse(order))


def _rank_excess(Wq: Tensor, form: EditForm) -> Tensor:
    """σ_{r+1}/σ_1 of the real block's query factor (r the kept directions) and the largest dropped pair's
    weight: both 0 up to rounding while the rank constraint holds (a 0-d tensor, computed without a sync)."""
    real = Wq[..., form.real_cols].double()
    S = torch.linalg.svdvals(real)  # (n, r)
    k = form.kept_dirs.sum(-1).long()  # (n,)
    r = S.shape[-1]
    if r:
        beyond = S.gather(-1, k.clamp(max=r - 1).unsqueeze(-1)).squeeze(-1) / S[:, 0].clamp_min(1e-300)  # (n,)
        excess = torch.where((k < r) & (S[:, 0] > 0), beyond, torch.zeros_like(beyond)).max()
    else:  # no unrotated block: the rotary pairs alone carry the rank
        excess = torch.zeros((), dtype=S.dtype, device=S.device)
    dropped = (1 - form.free_cols).clone()
    dropped[:, form.real_cols] = 0
    moved = (Wq * dropped.unsqueeze(-2)).abs().max() / Wq.abs().max().clamp_min(1e-30)
    return torch.maximum(excess.to(moved.dtype), moved)


def _group_ties(groups: Tensor, heads: list[int], own_v: bool) -> tuple[Tensor, Tensor]:
    """For a layer whose K/V were expanded to one head per query head: the head each key and value is read from.
    Keys: an edited head its own, the others their group's first unedited head. Values: the group's first head,
    or (share_qkv) an edited head's own."""
    edited = set(heads)
    k_from, v_from = torch.arange(len(groups)), torch.arange(len(groups))
    for g in groups.unique().tolist():
        members = [i for i in range(len(groups)) if int(groups[i]) == g]
        rest = [i for i in members if i not in edited]
        for i in members:
            if i not in edited:
                k_from[i] = rest[0]
            if not (own_v and i in edited):
                v_from[i] = members[0]
    return k_from, v_from


def _rows_set(full: Tensor, rows: Tensor, values: Tensor) -> Tensor:
    """`full` with `rows` (along axis 0) replaced by `values`, differentiably (out of place), in `full`'s memory
    layout (as `_take`)."""
    order = _memory_order(full)
    if order == tuple(range(full.dim())):
        return full.index_copy(0, rows, values.to(full.dtype))
    out = full.permute(order).index_copy(order.index(0), rows, values.to(full.dtype).permute(order))
    return out.permute(_inverse(order))


def _signs(layer: AttentionLayer, h: Tensor, kv: Tensor) -> Tensor:
    """The ±1 per column with W_Q[h] = W_K[kv] diag(s) in a symmetric edit's output (zero columns: +1)."""
    dot = (layer.W_Q[h].double() * layer.W_K[kv].double()).sum(-2)  # (n, d)
    return torch.where(dot < 0, -1.0, 1.0).to(torch.float32)


class Strided:
    """A module weight that is one canonical tensor, its axes permuted and reshaped (the usual layout: a Linear's
    weight is W_Q (n, D, d) as (n·d, D)): read as a view of `EditForm.flat`, with no index map kept."""

    def __init__(self, start: int, shape: tuple[int, ...], perm: tuple[int, ...], out: tuple[int, ...]):
        self.start, self.shape, self.perm, self.out = start, shape, perm, out
        self.size = math.prod(shape)

    def to(self, device) -> Strided:
        return self

    def view(self, flat: Tensor) -> Tensor:
        """The canonical tensor's elements as they sit in `flat`, in the weight's axis order (a view)."""
        return flat[self.start:self.start + self.size].view(self.shape).permute(self.perm)

    def read(self, flat: Tensor) -> Tensor:
        return self.view(flat).reshape(self.out)


def strided(index: Tensor, shapes: dict[int, tuple[int, ...]]) -> Strided | None:
    """`index` (a module weight's canonical positions) as a Strided placement where it is one canonical tensor
    (starting at an offset in `shapes`) with permuted axes, else None."""
    import itertools

    if index.numel() == 0 or bool((index < 0).any()):
        return None
    start = int(index.min())
    shape = shapes.get(start)
    if shape is None or math.prod(shape) != index.numel() or int(index.max()) != start + index.numel() - 1:
        return None
    local = torch.arange(index.numel(), dtype=torch.int64).view(shape)
    for perm in itertools.permutations(range(len(shape))):
        if torch.equal(local.permute(perm).reshape(index.shape) + start, index.to(torch.int64)):
            return Strided(start, shape, perm, tuple(index.shape))
    return None


class _Gathered(nn.Module):
    """A module weight whose elements come from an EditForm (where `index` >= 0) or its own original."""

    def __init__(self, form: EditForm, index: Tensor | Strided, dtype: torch.dtype):
        super().__init__()
        self.form, self.dtype, self.strided = form, dtype, index if isinstance(index, Strided) else None
        if self.strided is not None:  # a view of the form's tensors: no map
            self.whole = True
            return
        self.shape = index.shape
        self.whole = bool((index >= 0).all())  # every element from the form: the original is not kept
        # the map itself where it covers the whole weight (shared by every run of the layer), no copy of it
        self.register_buffer("index", (index if self.whole else index.clamp_min(0)).reshape(-1))
        self.register_buffer("take", None if self.whole else index >= 0)

    def forward(self, X: Tensor) -> Tensor:
        if self.strided is not None:
            return self.form.read(self.strided).to(self.dtype)
        taken = self.form.flat().index_select(0, self.index).view(self.shape).to(self.dtype)
        return taken if self.whole else torch.where(self.take, taken, X)


def parametrise(block: nn.Module, maps: dict[str, Tensor | Strided], form: EditForm) -> list[nn.Parameter]:
    """Put `form` behind the block's written parameters named in `maps`; returns the parameters left to train
    (the form's, and the originals of the elements the form does not cover). An original whose every element
    comes from the form is emptied (the form holds the values), so the edited layers are held once. A form
    parameter read whole by one module weight is stored in that weight's axis order (`EditForm.store`); linear
    projections compute from the form's parameters where that costs less than their gathered weight
    (`projections`)."""
    for index in maps.values():
        if isinstance(index, Strided):
            form.store(form.offsets[index.start], index.perm)
    params: list[nn.Parameter] = list(form.parameters())
    projections(block, maps, form)
    for name, index in maps.items():
        path, _, attr = name.rpartition(".")
        module = block.get_submodule(path)
        weight = getattr(module, attr)
        gathered = _Gathered(form, index.to(weight.device), weight.dtype)
        parametrize.register_parametrization(module, attr, gathered)
        original = module.parametrizations[attr].original
        if gathered.whole:
            original.requires_grad_(False)
            original.data = original.data.new_empty(0)
        else:
            params.append(original)
    return params


def canonical_from(block: nn.Module, maps: dict[str, Tensor | Strided], form: EditForm,
                   whole: dict[str, bool] | None = None) -> dict[str, Tensor]:
    """The canonical tensors as the block's modules hold them now (read back through `maps`: a strided weight as
    a view of itself, the others gathered), on the maps' device. `whole`: which maps hold canonical elements only
    (computed here where not given)."""
    device = form.heads.device
    out: dict[str, Tensor] = {}
    flat = None
    for name, index in maps.items():
        path, _, attr = name.rpartition(".")
        w = getattr(block.get_submodule(path), attr).detach().to(device, torch.float32)
        if isinstance(index, Strided):
            out[form.offsets[index.start]] = w.reshape([index.shape[p] for p in index.perm]).permute(
                _inverse(index.perm))
            continue
        if flat is None:
            flat = torch.empty(sum(math.prod(form.shapes[n]) for n in form.names), dtype=torch.float32,
                               device=device)
        if whole[name] if whole is not None else bool(index.min() >= 0):  # canonical elements only: no mask
            flat[index.reshape(-1)] = w.reshape(-1)
        else:
            take = index >= 0
            flat[index[take]] = w[take]
    offset = 0
    for n in form.names:
        size = math.prod(form.shapes[n])
        if n not in out:
            out[n] = flat[offset:offset + size].view(form.shapes[n])
        offset += size
    return out


def projections(block: nn.Module, maps: dict[str, Tensor | Strided], form: EditForm) -> dict[str, str]:
    """Give the block's linear projections a forward that costs no more than the unedited model's, where their
    weights are read from `form` as views (`Strided`); returns {module path: which} for those changed.

    - "rows": a weight the constraint leaves as its parameter with heads reading shared rows (an expanded value:
      SmolLM2's 9 heads reading 3 value rows) is computed on the rows, x Wᵀ over the distinct heads, and its output
      channels gathered to the heads: no gathered weight is built and kept for the backward, and a third of the
      matmul.
    - "shared": projections whose weights (and biases) are one tensor (share_qk on every head: q_proj and k_proj
      both read the key parameter) called on the same input within `cached` (one forward and its backward) compute
      once; the second call returns the first's output, so autograd adds both uses' gradients into one matmul's.
    The module weights still read as before (`module.weight`, for the constraint check and the trackers); outside
    `cached` a shared projection computes its own output. The outputs equal the gathered weights' to float
    rounding (the same products, summed in the same order per output channel)."""
    paths: dict[str, dict[str, Strided]] = {}
    for name, index in maps.items():
        path, _, attr = name.rpartition(".")
        paths.setdefault(path, {})[attr] = index  # type: ignore[assignment]
    plans: dict[str, tuple] = {}
    for path, got in paths.items():
        module = block.get_submodule(path)
        w, b = got.get("weight"), got.get("bias")
        has_bias = getattr(module, "bias", None) is not None
        if (not isinstance(module, nn.Linear) or set(got) - {"weight", "bias"} or not isinstance(w, Strided)
                or (has_bias and not isinstance(b, Strided)) or (b is not None and not has_bias)):
            continue
        wn = form.offsets[w.start]
        bn = form.offsets[b.start] if b is not None else None
        # what the projection computes: which tensor (one object for tied names), in which layout, with which bias
        key = (form.alias[wn], w.perm, w.out, form.alias[bn] if bn else None, b.perm if b else None)
        plans[path] = (module, w, b, wn, bn, key)
    shared: dict[tuple, list[str]] = {}
    for path, plan in plans.items():
        shared.setdefault(plan[-1], []).append(path)
    made: dict[str, str] = {}
    for path, (module, w, b, wn, bn, key) in plans.items():
        rows = _rows_plan(form, w, b, wn, bn)
        twins = len(shared[key]) > 1
        if rows is None and not twins:
            continue
        if rows is not None:  # the forward reads the rows themselves: no gathered tensor per step
            form.deferred.update(name for name in rows[:2] if name is not None)
        module.forward = _Projection(module, form, rows, key if twins else None)
        made[path] = "shared" if twins else "rows"
    return made


def _rows_plan(form: EditForm, w: Strided, b: Strided | None, wn: str, bn: str | None):
    """(weight name, bias name, output channels to gather) where a Linear weight is an untouched parameter of rows
    read by heads through `take_<name>` in the Linear layout ((n, D, d) as (n·d, D), the parameter stored so),
    the bias alike; else None."""
    take = form._buffers.get(f"take_{wn}")
    if (take is None or not form.deferrable(wn) or len(w.shape) != 3 or w.perm != (0, 2, 1)
            or form.perm.get(wn) != (0, 2, 1) or w.out != (w.shape[0] * w.shape[2], w.shape[1])):
        return None
    if bn is not None:
        b_take = form._buffers.get(f"take_{bn}")
        if (b is None or not form.deferrable(bn) or b_take is None or not torch.equal(b_take, take)
                or b.perm != (0, 1) or bn in form.perm):
            return None
    d = w.shape[2]
    cols = (take.unsqueeze(1) * d + torch.arange(d, device=take.device)).reshape(-1)
    return wn, bn, cols


class _Projection:
    """A Linear's forward computed from its EditForm (`projections`): on the parameter's rows with the output
    gathered (`rows`), and/or shared with the projections of the same tensor within `cached` (`key`)."""

    def __init__(self, module: nn.Linear, form: EditForm, rows, key: tuple | None):
        self.module, self.form, self.rows, self.key = module, form, rows, key

    def compute(self, x: Tensor) -> Tensor:
        if self.rows is None:
            return type(self.module).forward(self.module, x)
        wn, bn, cols = self.rows
        dtype = self.module.parametrizations["weight"].original.dtype
        W = self.form._parameters[wn]  # (rows, d, D): read now (an optimizer step updates it in place)
        bias = self.form._parameters[bn].reshape(-1).to(dtype) if bn is not None else None
        return nn.functional.linear(x, W.reshape(-1, W.shape[-1]).to(dtype), bias).index_select(-1, cols)

    def __call__(self, x: Tensor) -> Tensor:
        cache = self.form.__dict__.get("_cache")
        if self.key is None or cache is None or x.is_inference():  # inference tensors keep no version count
            return self.compute(x)
        outputs = cache.setdefault("outputs", {})
        hit = outputs.pop(self.key, None)
        if hit is not None and hit[0] is x and hit[1]._version == hit[2] and x._version == hit[3]:
            return hit[1]  # held only until the other projection of the pair takes it; unchanged in place
        y = self.compute(x)
        outputs[self.key] = (x, y, y._version, x._version)
        return y
