"""The analysis's engine: an opened model measured for a checked request (`measure`), per-head and per-layer
records out (ARCHITECTURE.md §1); `qkinspect.analyze` (analysis/run.py) checks the request and the model, torch-free,
then calls it.

Layers are read one at a time (the next one prefetched while the current ones are measured), processed (folds),
measured batched over their heads (on a CPU, two layers side by side when they fit, `_layers_at_once`), and turned
into frozen records in layer order; a random baseline per block comes with them.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
import torch

from qkinspect import limits
from qkinspect.analysis.request import AnalysisRequest
from qkinspect.analysis.results import AnalysisResult, Baseline, HeadRecord, LayerRecord
from qkinspect.layer import AttentionLayer, BlockSpec, ModelInfo
from qkinspect.limits import check_threads
from qkinspect.metrics import backend
from qkinspect.metrics.baseline import gaussian_baselines
from qkinspect.metrics.factored import worker_pool
from qkinspect.metrics.fold import fold_ln as fold_ln_layer
from qkinspect.metrics.fold import fold_qk_norm as fold_qk_norm_layer
from qkinspect.metrics.heads import (
    HEAD_METRICS,
    head_warnings,
    measure_products,
    needs_o,
    numerics_warning,
)
from qkinspect.metrics.layer_form import head_overlap, layer_form_metrics
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.registry import LAYER_FORM, METRICS
from qkinspect.processing import Processing

Progress = Callable[[int, int], None]


def measure(m, request: AnalysisRequest, specs: list[BlockSpec], *, progress: Progress | None = None,
            threads: int | None = None) -> AnalysisResult:
    """The analysis of the opened model `m` (a LoadedModel) asked by `request`, of the blocks `specs` that
    `check_model` returned for it (the selection already checked against the model: nothing is checked twice)."""
    run = _Run.of(request)
    keys = [b.key for b in specs]
    layer_sel = request.layers
    total = sum(1 for _ in m.plan(keys, layer_sel))
    if progress is not None:
        progress(0, total)
    stream = _layers(m, keys, layer_sel, need_o=run.needs_o, dtype=run.dtype, keep=run.keep)
    with torch_threads(threads), contextlib.closing(stream):  # closing stops the prefetch thread on an error
        at_once = _layers_at_once(run, specs, total)
        baselines = None
        if at_once > 1:  # the baseline on a worker too, while the first layer is read
            baselines = _workers(at_once).submit(run.baselines_of, specs)
        try:
            for done, measured in enumerate(_measured(run, stream, at_once), start=1):
                run.add(measured)
                if progress is not None:
                    progress(done, total)
        except BaseException:
            if baselines is not None:
                baselines.cancel()  # not started yet: never starts (a started one ends on its own)
            raise
        run.baselines += run.baselines_of(specs) if baselines is None else baselines.result()
    return run.result(m.info, request.blocks, layer_sel)


def _layers(m, keys: list[str], layers: tuple[int, ...] | None, **options) -> Generator[AttentionLayer, None, None]:
    """The chosen layers in file order, the next one read (and cast to the analysis dtype, without W_O when no
    metric needs it) while the current one is measured. Options a model's `layers` does not take are dropped."""
    accepted = inspect.signature(m.layers).parameters
    kwargs = {k: v for k, v in {"prefetch": True, **options}.items() if k in accepted}
    return m.layers(keys, layers, **kwargs)


PARALLEL_BYTES = 512 << 20  # layers are measured side by side only while their weights fit in this together


def _layers_at_once(run: _Run, specs: list[BlockSpec], n_layers: int) -> int:
    """How many layers to measure side by side, each on a worker thread with an equal share of torch's threads.

    On a CPU with two or more threads, two (or more) layers at once, each on fewer threads, keep every core busy:
    within one layer the small decompositions and the element-wise work wait on the products and on each other,
    and a few cores running one layer's products in parallel stop at a barrier after every step. Only while the
    layers' weights in the compute dtype fit in PARALLEL_BYTES together (a 7B layer's q/k/v: 192 MB in float32;
    a 70B layer is measured alone), so the memory held stays within a layer or so of measuring one at a time.
    """
    threads = torch.get_num_threads()
    if torch.device(run.device).type != "cpu" or threads < 2 or n_layers < 2 or not specs:
        return 1
    itemsize = torch.empty((), dtype=run.dtype).element_size()
    widest = itemsize * max(s.d_model * s.n_heads * (s.d_head + (s.v_head if run.needs_o else 0))  # W_Q, W_O
                            + s.kv_width * s.n_kv_heads * (s.d_head + s.v_head) for s in specs)  # W_K, W_V
    return max(1, min(threads, n_layers, PARALLEL_BYTES // max(widest, 1)))


def _measured(run: _Run, stream: Iterator[AttentionLayer], at_once: int) -> Iterator[_Measured]:
    """Each layer of `stream` measured, in order: one after another, or `at_once` side by side on a pool of worker
    threads (`factored.worker_pool`), the next layer read while they work. An error in one layer is raised here,
    in order, once the layers before it are done; layers still running are waited for, not abandoned."""
    if at_once == 1:
        for layer in stream:
            yield run.measure(layer)
            del layer  # before the next read: the loader reuses the memory of layers nothing holds
        return
    pool = _workers(at_once)
    pending: deque[Future] = deque()
    try:
        for layer in stream:
            pending.append(pool.submit(run.measure, layer))
            del layer
            if len(pending) >= at_once:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for job in pending:
            job.cancel()
        wait(pending)


def _workers(at_once: int) -> ThreadPoolExecutor:
    """The pool that measures `at_once` layers side by side, each worker with its share of the caller's threads."""
    return worker_pool(at_once, max(1, torch.get_num_threads() // at_once))


@contextlib.contextmanager
def torch_threads(threads: int | None = None) -> Iterator[None]:
    """torch's intra-op threads set to `threads`, or raised to the CPUs this process may use (if lower), restored
    afterwards. Not more: the prefetch thread mostly waits on the disk, and more threads than cores slow the GEMMs
    down."""
    before = torch.get_num_threads()
    cores = limits.cores()
    if threads is not None:
        check_threads(threads, "threads")
        torch.set_num_threads(threads)
    elif cores > before:
        torch.set_num_threads(cores)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass
class _Run:
    """Settings of one analysis and the records it accumulates."""

    names: tuple[str, ...]
    spectra: tuple[str, ...]
    dtype: torch.dtype
    device: str
    fold_ln: bool
    fold_qk_norm: bool
    heads: tuple[int, ...] | None = None
    head_records: list[HeadRecord] = field(default_factory=list)
    layer_records: list[LayerRecord] = field(default_factory=list)
    spectra_out: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    baselines: list[Baseline] = field(default_factory=list)
    recomputed: int = 0  # heads measured again in float64 (their Grams unresolved in the chosen precision)
    cut: int = 0  # heads with directions of W_Q, W_K or W_V below the rank cut
    routes: set[str] = field(default_factory=set)  # the product routes the layers took ("bf16", "float32" ...)

    @classmethod
    def of(cls, request: AnalysisRequest) -> _Run:
        return cls(request.metrics, request.spectra, getattr(torch, request.precision), request.device,
                   request.fold_ln, request.fold_qk_norm, request.heads)

    @property
    def keep(self) -> tuple[torch.dtype, ...]:
        """Dtypes the loader leaves uncast: bf16 on the bf16 product route, which reads it directly (not with a
        fold, which scales the weights first)."""
        bf16 = backend.uses_bf16(self.dtype, self.device) and not (self.fold_ln or self.fold_qk_norm)
        return (torch.bfloat16,) if bf16 else ()

    @property
    def head_names(self) -> list[str]:
        return [n for n in self.names if n in HEAD_METRICS]

    @property
    def needs_o(self) -> bool:
        """Whether any selected metric or spectrum reads W_O (else the loader need not read it)."""
        return needs_o(self.head_names, self.spectra)

    def head_index(self, spec: BlockSpec) -> torch.Tensor | None:
        """The selected query heads this block has (None: all of them)."""
        if self.heads is None:
            return None
        return torch.tensor([h for h in self.heads if h < spec.n_heads], dtype=torch.int64)

    def measure(self, layer: AttentionLayer) -> _Measured:
        """One layer's records and warnings. Reads the run's settings and changes nothing of it, so several layers
        may be measured at once on different threads; `add` keeps the result."""
        layer = self._process(layer)
        where = f"{layer.block} layer {layer.layer}"
        p = HeadProducts(layer, self.head_index(layer.spec), dtype=self.dtype, device=self.device)
        values, spectra, num = measure_products(p, self.head_names, self.spectra)
        out = _Measured(p.route, head_warnings(p, where), int(num.recomputed.sum()), int(num.cut.sum()))
        heads, kvs = p.heads.tolist(), p.kv.tolist()
        for i, (h, g) in enumerate(zip(heads, kvs, strict=True)):
            ranks = {k: int(v[i]) for k, v in num.ranks.items()}
            out.heads.append(HeadRecord(layer.block, layer.layer, h, g,
                                        {n: float(values[n][i]) for n in self.head_names}, **ranks))
            if spectra:
                out.spectra[(layer.block, layer.layer, h)] = {k: v[i] for k, v in spectra.items()}
        out.layer = self._layer_record(layer, p, values, out.warnings)
        return out

    def add(self, m: _Measured) -> None:
        """Keep one measured layer (in layer order)."""
        self.routes.add(m.route)
        self.warnings += m.warnings
        self.recomputed += m.recomputed
        self.cut += m.cut
        self.head_records += m.heads
        self.spectra_out.update(m.spectra)
        self.layer_records.append(m.layer)

    def _process(self, layer: AttentionLayer) -> AttentionLayer:
        if self.fold_ln:
            layer = fold_ln_layer(layer)
        if self.fold_qk_norm and layer.spec.qk_norm:  # blocks without q/k norms have nothing to fold
            layer = fold_qk_norm_layer(layer)
        return layer

    def _layer_record(self, layer: AttentionLayer, p: HeadProducts, values: dict[str, np.ndarray],
                      warnings: list[str]) -> LayerRecord:
        out: dict[str, float] = {}
        for name in self.names:
            m = METRICS[name]
            if m.source and m.source in values:
                out[name] = _summary(values[m.source], name.rsplit("_", 1)[1])
        if any(n in self.names for n in LAYER_FORM):
            out.update(self._layer_form(layer, p, warnings))
        overlap = None
        if "head_overlap" in self.names:
            unresolved = p.fq.unresolved & ~p.bad  # any such W_Q: the whole matrix in float64
            q = p.exact(torch.ones_like(unresolved)) if bool(unresolved.any()) else p
            overlap = head_overlap(q).detach().to("cpu", torch.float64).numpy()
            overlap[p.bad.cpu().numpy()] = np.nan
            overlap[:, p.bad.cpu().numpy()] = np.nan
        return LayerRecord(layer.block, layer.layer, p.n, out, overlap)

    def _layer_form(self, layer: AttentionLayer, p: HeadProducts, warnings: list[str]) -> dict[str, float]:
        """Summed-form metrics over all the layer's heads (reusing the cast weights when all were selected)."""
        full = p if p.grouped else HeadProducts(layer, dtype=self.dtype, device=self.device)
        if bool(full.bad.any()):
            warnings.append(f"{layer.block} layer {layer.layer}: non-finite weights; layer-form metrics are NaN")
            return dict.fromkeys(LAYER_FORM, float("nan"))
        vals = layer_form_metrics(full.Q, full.K, full.kv)
        return {k: v for k, v in vals.items() if k in self.names}

    def baselines_of(self, specs: list[BlockSpec]) -> list[Baseline]:
        return [Baseline(*b) for spec in specs
                for b in gaussian_baselines(spec, self.names, dtype=self.dtype, device=self.device)]

    @property
    def precision(self) -> str:
        """The compute dtype's name: "float32" or "float64"."""
        return str(self.dtype).removeprefix("torch.")

    def _numerics_warning(self) -> list[str]:
        # heads recomputed in float64 ask nothing of the user: recorded in `processing`, not warned about
        line = numerics_warning(0, self.cut, len(self.head_records), self.precision)
        return [line] if line else []

    def result(self, info: ModelInfo, blocks, layers) -> AnalysisResult:
        present = set(self.head_names) | {k for r in self.layer_records for k in r.values}
        if any(r.head_overlap is not None for r in self.layer_records):
            present.add("head_overlap")
        processing = Processing(
            fold_ln=self.fold_ln, fold_qk_norm=self.fold_qk_norm, precision=self.precision,
            device=self.device, layer_form=any(n in self.names for n in LAYER_FORM),
            blocks=None if blocks is None else tuple([blocks] if isinstance(blocks, str) else blocks),
            layers=layers, heads=self.heads, metrics=self.names, dequantized=info.quantization,
            products="+".join(sorted(self.routes)) or self.precision, recomputed_float64=self.recomputed,
            qk_norm_not_folded=() if self.fold_qk_norm else _qk_norm_blocks(info, self.head_records))
        return AnalysisResult(model=info, processing=processing, heads=self.head_records, layers=self.layer_records,
                              baselines=self.baselines, spectra=self.spectra_out,
                              warnings=list(dict.fromkeys(self.warnings + self._numerics_warning())),
                              metric_names=[n for n in self.names if n in present])


def _qk_norm_blocks(info: ModelInfo, heads: list[HeadRecord]) -> tuple[str, ...]:
    """The measured blocks that have q/k norms (their gains not folded in, when the caller asks)."""
    measured = {h.block for h in heads}
    return tuple(b.key for b in info.blocks if b.qk_norm and b.key in measured)


@dataclass
class _Measured:
    """One layer's results, as `_Run.measure` returns them for `_Run.add`."""

    route: str
    warnings: list[str]
    recomputed: int
    cut: int
    heads: list[HeadRecord] = field(default_factory=list)
    spectra: dict = field(default_factory=dict)
    layer: LayerRecord | None = None


def _summary(v: np.ndarray, how: str) -> float:
    """Median or mean over the finite values; NaN when there are none."""
    v = v[np.isfinite(v)]
    if not v.size:
        return float("nan")
    return float(np.median(v) if how == "median" else v.mean())
