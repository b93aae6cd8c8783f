"""Rich tables for people, in a terminal and in a notebook: per-head metrics grouped by block and layer,
colour-scaled symmetry and overlap, the random baseline, and a per-layer summary. Pure presentation: every number
comes from the records; library code, so a result renders itself without the CLI (which only prints these).

Tables fit the terminal without cutting a number: columns get short headers (`sym`, `erank`, `ovl_qk` …) with a
legend line below (JSON and CSV keep the full names), columns that carry nothing are dropped (`kv` when it equals
`head`, `block` when there is one block), and metric columns that still do not fit go to a second table that repeats
the row labels. Colours are the 16 standard ones, in steps that follow the value (dim, plain, colour, bold colour),
so a 16-colour terminal shows the same order as a true-colour one.

Example:
    >>> from rich.console import Console
    >>> render_analysis(Console(), result, columns=default_columns(result))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Shown when the user names no metrics: the questions of the README, one column each.
DEFAULT_COLUMNS = ("symmetry", "directionality", "qk_effective_rank", "qk_stable_rank", "overlap_qk", "overlap_qv",
                   "overlap_kv", "ov_copying")
LAYER_COLUMNS = ("symmetry_median", "symmetry_mean", "overlap_qk_median", "qk_effective_rank_median",
                 "symmetry_layer", "directionality_layer")
# the metrics with a random baseline (qkinspect.metrics.baseline, which imports torch: not imported here)
BASELINE_METRICS = ("symmetry", "shared_qk_distance", "overlap_qk", "overlap_qv", "overlap_kv")

# Column headers in tables (the legend line under a table spells them out; JSON and CSV use the full names).
SHORT_NAMES = {
    "symmetry": "sym", "directionality": "dir", "qk_effective_rank": "erank", "qk_stable_rank": "srank",
    "qk_participation_ratio": "pratio", "qk_k90": "k90", "qk_eig_pos_frac": "eig_pos", "qk_eig_real_ratio": "eig_re",
    "shared_qk_distance": "shared", "overlap_qk": "ovl_qk", "overlap_qv": "ovl_qv", "overlap_kv": "ovl_kv",
    "cosine_qk": "cos_qk", "cosine_qv": "cos_qv", "cosine_kv": "cos_kv",
    "norm_q_fro": "q_fro", "norm_k_fro": "k_fro", "norm_v_fro": "v_fro", "norm_qk_fro": "qk_fro",
    "norm_q_spec": "q_spec", "norm_k_spec": "k_spec", "norm_v_spec": "v_spec", "norm_qk_spec": "qk_spec",
    "bias_q_norm": "bq", "bias_k_norm": "bk", "bias_v_norm": "bv",
    "ov_effective_rank": "ov_erank", "ov_copying": "ov_copy", "ov_norm_spec": "ov_spec",
    "symmetry_layer": "sym_sum", "directionality_layer": "dir_sum",
}
_SUFFIXES = {"_median": "_med", "_mean": "_mean"}
COLUMN_GAP = 2  # two spaces between columns: no vertical rules, one space of padding on the right


def short_name(metric: str) -> str:
    """The table header for `metric`: `symmetry` -> `sym`, `delta_symmetry` -> `Δsym`, `symmetry_median` ->
    `sym_med`; a name without a short form is kept whole."""
    if metric.startswith("delta_"):
        return "Δ" + short_name(metric.removeprefix("delta_"))
    if metric in SHORT_NAMES:
        return SHORT_NAMES[metric]
    for suffix, short in _SUFFIXES.items():
        if metric.endswith(suffix) and metric.removesuffix(suffix) in SHORT_NAMES:
            return SHORT_NAMES[metric.removesuffix(suffix)] + short
    return metric


def default_columns(result, requested: Sequence[str] | None = None, sort: str | None = None) -> list[str]:
    """The metric columns to show: the requested ones, else the defaults that were computed; plus the sort key."""
    have = list(result.metric_names) or sorted({k for h in result.heads for k in h.values})
    cols = [m for m in (requested_head_metrics(requested) if requested else DEFAULT_COLUMNS) if m in have] or have[:8]
    if sort and sort in have and sort not in cols:
        cols.append(sort)
    return cols


def requested_head_metrics(requested: Sequence[str]) -> list[str]:
    """Requested metric and group names ("symmetry,eigen") as the per-head metrics they stand for, in the order
    given; a name the registry does not know is kept as it is (it simply matches no column)."""
    from qkinspect.errors import InputError
    from qkinspect.metrics.registry import METRICS, resolve_metrics

    out: list[str] = []
    for name in requested:
        try:
            names = resolve_metrics([name])
        except InputError:  # not a registry name: left to the caller's own checks
            names = (name,)
        out += [n for n in names if n not in out and (n not in METRICS or METRICS[n].per == "head")]
    return out


def basis_dependent(names: Iterable[str]) -> list[str]:
    """The metrics among `names` that are not invariant under the full gauge freedom (registry's gauge_invariant)."""
    from qkinspect.metrics.registry import METRICS

    return [n for n in names if n in METRICS and METRICS[n].gauge_invariant != "yes"]




def fmt_value(v: Any, digits: int = 3) -> str:
    """A table cell: '-' for a missing value, integers as integers, else `digits` decimals (4 significant digits
    from 1000 up)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    v = float(v)
    if abs(v) >= 1000:
        return f"{v:.4g}"
    return f"{v:.{digits}f}"


def fmt_spec(v: Any, spec: str = ".4f") -> str:
    """A cell in the format `spec` (`"+.4f"`, `"d"` …), '-' for a missing value."""
    return "-" if v is None else format(v, spec)


def scale_style(metric: str, v: Any) -> str:
    """Colour by value, in steps of the 16 standard colours so every terminal shows the same order: symmetry-like
    scores diverge around 0 (blue below, red above; plain near 0, bold beyond ±0.4); overlaps and similarities
    grow over [0, 1] from dim through plain and green to bold green; others are plain. NaN is dim."""
    if v is None or not isinstance(v, (int, float)) or math.isnan(v):
        return "dim"
    name = metric.removeprefix("delta_")
    if name.startswith(("symmetry", "directionality")):
        return _diverging(float(v))
    if name.startswith(("overlap", "cka")):
        return _sequential(abs(float(v)))
    return ""


def _diverging(x: float) -> str:
    if abs(x) < 0.1:
        return ""
    hue = "red" if x > 0 else "blue"
    return f"bold {hue}" if abs(x) >= 0.4 else hue


def _sequential(x: float) -> str:
    steps = ((0.2, "dim"), (0.4, ""), (0.7, "green"))
    return next((style for top, style in steps if x < top), "bold green")


@dataclass
class Column:
    """One table column: its header and its cells (str or rich Text), right-aligned unless `left`."""

    header: str
    cells: list[Any] = field(default_factory=list)
    left: bool = False

    def width(self) -> int:
        from rich.cells import cell_len

        texts = [c if isinstance(c, str) else c.plain for c in self.cells]
        return max([cell_len(self.header), *(cell_len(t) for t in texts)])


def fit_tables(labels: Sequence[Column], values: Sequence[Column], *, width: int, sections: Sequence[int] = (),
               title: str | None = None) -> list:
    """Tables holding every column whole: the label columns, then as many value columns as fit `width`; the rest
    go to further tables that repeat the labels. `sections`: row indices that start a new group (a rule above)."""
    used = sum(c.width() for c in labels) + COLUMN_GAP * len(labels)  # each label column and the gap after it
    groups: list[list[Column]] = [[]]
    room = width - used
    for col in values:
        need = col.width() + COLUMN_GAP
        if groups[-1] and need > room:
            groups.append([])
            room = width - used
        groups[-1].append(col)
        room -= need
    if not labels and not values:
        return []
    return [_table([*labels, *cols], sections, title if i == 0 else f"{title}, continued" if title else "continued")
            for i, cols in enumerate(groups)]


def _table(columns: Sequence[Column], sections: Sequence[int], title: str | None):
    """A rich Table, under its title as a line of its own (rich would wrap a title to a narrow table's width)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table(header_style="bold", show_edge=False, pad_edge=False, box=box.SIMPLE_HEAVY, padding=(0, 1, 0, 0))
    for c in columns:
        t.add_column(c.header, justify="left" if c.left else "right", no_wrap=True, overflow="fold",
                     min_width=c.width())
    starts = set(sections)
    n_rows = len(columns[0].cells) if columns else 0
    for i in range(n_rows):
        if i in starts and i > 0:
            t.add_section()
        t.add_row(*[c.cells[i] for c in columns])
    return Group(Text(title, style="italic"), t) if title else t


def legend(columns: Iterable[str], marked: Iterable[str] = ()) -> str:
    """'columns: sym=symmetry, erank=qk_effective_rank, …' for the headers that differ from their names."""
    marked = set(marked)
    pairs = [f"{short_name(c)}{'*' if c in marked else ''}={c}" for c in columns if short_name(c) != c]
    return "columns: " + ", ".join(pairs) if pairs else ""


def head_table(heads: Iterable, columns: Sequence[str], *, grouped: bool = True, title: str | None = None,
               width: int = 80) -> list:
    """Per-head tables, one row per head; with `grouped`, a rule between layers (rows arrive in block, layer, head
    order). `block` is shown only when the rows span several blocks, `kv` only when some head's key/value head
    differs from its own index (grouped-query attention)."""
    heads = list(heads)
    marked = set(basis_dependent(c.removeprefix("delta_") for c in columns))
    labels = [Column("block", [h.block for h in heads], left=True), Column("layer", [str(h.layer) for h in heads]),
              Column("head", [str(h.head) for h in heads]), Column("kv", [str(h.kv_head) for h in heads])]
    if len({h.block for h in heads}) <= 1:
        labels[0] = None
    if all(h.kv_head == h.head for h in heads):
        labels[3] = None
    empty = set(empty_columns(heads, columns))
    values = [Column(short_name(c) + ("*" if c.removeprefix("delta_") in marked else ""),
                     [_cell(c, h.values.get(c)) for h in heads]) for c in columns if c not in empty]
    sections = [i for i in range(1, len(heads)) if (heads[i].block, heads[i].layer)
                != (heads[i - 1].block, heads[i - 1].layer)] if grouped else []
    return fit_tables([c for c in labels if c is not None], values, width=width, sections=sections, title=title)


def empty_columns(records: Sequence, columns: Iterable[str]) -> list[str]:
    """The columns with no value in any record (e.g. bias norms of a model without biases): not shown."""
    return [c for c in columns if records and all(fmt_value(r.values.get(c)) == "-" for r in records)]


def _cell(metric: str, v: Any):
    from rich.text import Text

    from qkinspect.metrics.registry import INTEGER_METRICS

    if metric in INTEGER_METRICS and isinstance(v, float) and v.is_integer():
        v = int(v)
    return Text(fmt_value(v), style=scale_style(metric, v))


def layer_columns(layers: Sequence, columns: Sequence[str] | None = None) -> list[str]:
    have = {k for r in layers for k in r.values}
    return [c for c in (columns or LAYER_COLUMNS) if c in have]


def layer_table(layers: Iterable, columns: Sequence[str] | None = None, title: str | None = "per layer",
                width: int = 80) -> list:
    """Per-layer tables: the layer summaries (and the summed form's scores with --layer-form)."""
    layers = list(layers)
    cols = layer_columns(layers, columns)
    labels = [Column("block", [r.block for r in layers], left=True), Column("layer", [str(r.layer) for r in layers]),
              Column("heads", [str(r.n_heads) for r in layers])]
    if len({r.block for r in layers}) <= 1:
        labels = labels[1:]
    values = [Column(short_name(c), [_cell(c, r.values.get(c)) for r in layers]) for c in cols]
    return fit_tables(labels, values, width=width, title=title)


def baseline_lines(baselines: Iterable, metrics: Sequence[str] = BASELINE_METRICS) -> list[str]:
    """'random baseline (encoder, 32 Gaussian heads): sym 0.003 ± 0.003, ovl_qk 0.084 ± 0.003'."""
    by_block: dict[str, list] = {}
    for b in baselines:
        if b.metric in metrics:
            by_block.setdefault(b.block, []).append(b)
    lines = []
    for block, bs in by_block.items():
        parts = ", ".join(f"{short_name(b.metric)} {fmt_value(b.mean)}±{fmt_value(b.std)}" for b in bs)
        lines.append(f"random baseline ({block}, {bs[0].n} Gaussian heads): {parts}")
    return lines


def model_line(info, processing=None) -> str:
    shapes = "; ".join(f"{b.key}: {b.n_layers} layers x {b.n_heads} heads"
                       + (f" ({b.n_kv_heads} KV)" if b.n_kv_heads != b.n_heads else "")
                       + f", d_model {b.d_model}, d_head {b.d_head}, {b.positional}" for b in info.blocks)
    line = f"{info.name} ({info.model_type}) {shapes}"
    if processing is not None:
        flags = [processing.precision, processing.device]
        flags += [name for name in ("fold_ln", "fold_qk_norm", "layer_form") if getattr(processing, name, False)]
        line += f"  [{', '.join(flags)}]"
    return line


def qk_norm_line(blocks: Sequence[str]) -> str:
    """What a raw measurement of blocks with q/k norms is not, and how to get what attention computes."""
    which = f"{', '.join(blocks)} block{'s' if len(blocks) > 1 else ''}"
    return (f"q/k norm not folded ({which}): this is the raw W_Q W_Kᵀ as stored, not what attention computes; "
            "--fold-qk-norm measures W_Q diag(γ_q γ_k) W_Kᵀ")


def gauge_note(console, columns: Iterable[str]) -> None:
    """The footnote for columns marked '*' by `head_table`."""
    marked = basis_dependent(c.removeprefix("delta_") for c in columns)
    if marked:
        console.print(f"* not gauge-invariant (depends on the basis of the head space): {', '.join(marked)}",
                      style="dim", highlight=False)


def print_lines(console, lines: Iterable[str]) -> None:
    """Dim notes under a table, wrapped at word boundaries to the console's width."""
    for line in lines:
        if line:
            console.print(line, style="dim", highlight=False, markup=False)


def render_analysis(console, result, *, columns: Sequence[str], by: str = "head", grouped: bool = True,
                    notes: Sequence[str] = ()) -> None:
    """The whole human view of an AnalysisResult."""
    console.print(model_line(result.model, result.processing), markup=False, highlight=False)
    if any(b.positional == "rope" for b in result.model.blocks):
        console.print("rotary positions: the metrics describe the form at offset 0", style="dim")
    unfolded = getattr(result.processing, "qk_norm_not_folded", ())
    if unfolded:
        console.print(qk_norm_line(unfolded), style="bold yellow", markup=False, highlight=False)
    width = console.width
    shown: list[str] = []
    notes = list(notes)
    if by == "head":
        for t in head_table(result.heads, columns, grouped=grouped, width=width):
            console.print(t)
        empty = empty_columns(result.heads, columns)
        shown += [c for c in columns if c not in empty]
        if empty:
            notes.append(f"no value for any head (not shown): {', '.join(empty)}")
    subset = getattr(result.processing, "heads", None) is not None
    layer_cols = layer_columns(result.layers)
    for t in layer_table(result.layers, title="per layer (over the selected heads)" if subset else "per layer",
                         width=width):
        console.print(t)
    shown += [c for c in layer_cols if c not in shown]
    baselines = baseline_lines(result.baselines)
    shown += [b.metric for b in result.baselines if b.metric in BASELINE_METRICS and b.metric not in shown]
    marked = basis_dependent(c.removeprefix("delta_") for c in shown) if by == "head" else []
    print_lines(console, [*baselines, legend(shown, marked)])
    if by == "head":
        gauge_note(console, shown)
    counted = [*shown, *(empty_columns(result.heads, columns) if by == "head" else [])]  # empty: noted above
    scalar = {k for r in [*result.heads, *result.layers] for k, v in r.values.items() if not isinstance(v, list)}
    tabular = [m for m in result.metric_names if m in scalar]  # not head_overlap's (H, H) matrices: JSON only
    print_lines(console, [*notes, hidden_hint(tabular, counted, by)])


def hidden_hint(computed: Sequence[str], shown: Iterable[str], by: str = "head") -> str:
    """'11 of 30 computed metrics shown; …' where the table leaves computed metrics out, else ""."""
    shown = set(shown)
    hidden = [m for m in computed if m not in shown]
    if not hidden:
        return ""
    where = "--by head --metrics all shows" if by != "head" else "--metrics all shows"
    n = len(computed)
    return f"{n - len(hidden)} of {n} computed metrics shown; {where} every one, JSON and CSV keep them all"


def sweep_tables(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, by: str = "head",
                 width: int = 80) -> tuple[list, list[str]]:
    """A sweep's tidy rows (a dict per checkpoint, step, block, layer and head, or per layer with by="layer") as
    tables like `analyze`'s: the same label and value columns, a rule between checkpoints, metric columns that do not
    fit in further tables. Checkpoint names wider than a quarter of `width` are numbered, the numbers spelt out in
    the returned lines (with the legend of short headers)."""
    names = list(dict.fromkeys(r["checkpoint"] for r in rows))
    numbered = max(map(len, names), default=0) > width // 4
    ids = {n: str(i + 1) for i, n in enumerate(names)}
    labels = [Column("ckpt" if numbered else "checkpoint", [ids[r["checkpoint"]] if numbered else r["checkpoint"]
                                                           for r in rows], left=not numbered),
              Column("step", [str(r["step"]) for r in rows])]
    if len({r.get("block") for r in rows}) > 1:
        labels.append(Column("block", [r["block"] for r in rows], left=True))
    labels.append(Column("layer", [str(r["layer"]) for r in rows]))
    if by == "head":
        labels.append(Column("head", [str(r["head"]) for r in rows]))
        if any(r.get("kv_head") != r["head"] for r in rows):
            labels.append(Column("kv", [str(r.get("kv_head")) for r in rows]))
    else:
        labels.append(Column("heads", [str(r.get("n_heads")) for r in rows]))
    shown = [c for c in columns if any(fmt_value(r.get(c)) != "-" for r in rows)]
    marked = set(basis_dependent(shown)) if by == "head" else set()
    values = [Column(short_name(c) + ("*" if c in marked else ""), [_cell(c, r.get(c)) for r in rows]) for c in shown]
    sections = [i for i in range(1, len(rows)) if rows[i]["checkpoint"] != rows[i - 1]["checkpoint"]]
    lines = [legend(shown, marked)]
    if numbered:
        lines.append("checkpoints: " + ", ".join(f"{ids[n]}={n}" for n in names))
    return fit_tables(labels, values, width=width, sections=sections), lines


def render_sweep(console, rows: Sequence[dict[str, Any]], requested=None, by: str = "head") -> None:
    """A row per checkpoint, step, block, layer and head (or per layer with --by layer), in `analyze`'s tables."""
    labels = {"checkpoint", "step", "block", "layer", "head", "kv_head", "n_heads", "rank_q", "rank_k", "rank_v"}
    have = list(dict.fromkeys(k for r in rows for k in r if k not in labels))
    wanted = (requested_head_metrics(requested) if by == "head" else list(requested)) if requested else \
        (DEFAULT_COLUMNS if by == "head" else LAYER_COLUMNS)
    cols = [c for c in wanted if c in have] or have[:8]
    tables, lines = sweep_tables(rows, cols, by=by, width=console.width)
    for t in tables:
        console.print(t)
    print_lines(console, [*lines, hidden_hint(have, cols, by)])


# -- directions (qkinspect directions) --------------------------------------------------------------------------------

SIDE_LABEL = {"read": "OV read", "write": "OV write", "query": "QK query", "key": "QK key"}


def span(indices) -> str:
    """(3,) -> "3"; (1, 2, 3) -> "1-3"."""
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"


def render_directions(console, result) -> None:
    """`qkinspect directions`' table: per head, side, direction (or subspace), σ, sign and its tokens, cut to the
    console's width."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from qkinspect.loading.tokens import printable

    console.print(model_line(result.model), markup=False, highlight=False)
    by_head: dict[tuple, list[Any]] = {}
    for r in result.records:
        by_head.setdefault((r.block, r.layer, r.head, r.kv_head), []).append(r)
    for (blk, layer, head, kv), recs in by_head.items():
        t = Table(header_style="bold", show_edge=False, pad_edge=False, box=box.SIMPLE_HEAVY, padding=(0, 1, 0, 0),
                  width=console.width)
        t.add_column("side", no_wrap=True)
        t.add_column("dir", justify="right", no_wrap=True)
        t.add_column("σ", justify="right", no_wrap=True)
        t.add_column("±", no_wrap=True)
        t.add_column("tokens (␣ = space; ids with --format json)", no_wrap=True, overflow="ellipsis", ratio=1)
        last = None
        for r in recs:
            if last is not None and (r.matrix, r.side) != last:
                t.add_section()
            shown = " ".join(printable(x) if x is not None else f"#{i}" for x, i in zip(r.tokens, r.token_ids,
                                                                                       strict=True))
            t.add_row(SIDE_LABEL[r.side] if (r.matrix, r.side) != last else "",
                      span(r.indices) + ("+" if r.cut else ""), f"{r.sigma:.3g}", r.sign, Text(shown))
            last = (r.matrix, r.side)
        console.print(Text(f"{blk} layer {layer} head {head} (KV head {kv})", style="italic"))
        console.print(t)
    rd = result.readout
    read = f"write side: {rd.unembedding}" + ("" if rd.tied else " (untied)") + \
        (f" with {rd.final_norm}'s gain folded" if rd.final_norm else "")
    cut = ["dir a-b+: the near-equal run goes on past b (a run grows at most K directions past the K asked for)"]
    print_lines(console, [f"{read}; read, query and key sides: {rd.embedding}",
                          "a subspace (dir a-b, ±): near-equal σ, its tokens by the norm of their projection",
                          *(cut if any(r.cut for r in result.records) else []), *result.notes])


# -- composition (qkinspect composition) ------------------------------------------------------------------------------


def _head(block: str, layer: int, head: int, multi: bool, heads: tuple[int, ...] | None = None) -> str:
    """"L3 H5"; a key/value head with its query heads (by kv-head): "L18 KV2 (H12-17)"."""
    short = {"encoder": "enc", "decoder": "dec", "cross": "cross"}.get(block, block)
    unit = f"H{head}" if heads is None else f"KV{head} (H{spans(heads)})"
    return f"{short + ' ' if multi else ''}L{layer} {unit}"


def spans(heads) -> str:
    """Head indexes as ranges: (12, 13, 14, 17) -> "12-14,17"."""
    out, run = [], []
    for h in heads:
        if run and h != run[-1] + 1:
            out.append(run)
            run = []
        run.append(h)
    if run:
        out.append(run)
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


KIND_TITLE = {"q": "Q-composition: a writes what b's queries read",
              "k": "K-composition: a writes what b's keys read",
              "v": "V-composition: a writes what b's values read"}


def render_composition(console, result, top: int = 10) -> None:
    """`qkinspect composition`'s table: the `top` strongest pairs of each kind, beside the null."""
    p = result.processing
    info = result.model
    console.print(f"{info.name} ({info.model_type})  [{p.precision}"
                  f"{', fold_ln' if p.fold_ln else ''}{', fold_qk_norm' if p.fold_qk_norm else ''}]",
                  markup=False, highlight=False)
    multi = result.multi_block
    for kind in p.kinds:
        recs = result.top(kind, top)
        if not recs:
            continue
        cols = [Column("earlier a", [_head(r.from_block, r.from_layer, r.from_head, multi) for r in recs], left=True),
                Column("later b", [_head(r.to_block, r.to_layer, r.to_head, multi, r.to_heads) for r in recs],
                       left=True)]
        vals = [Column("score", [fmt_value(r.score, 4) for r in recs]),
                Column("null", [fmt_value(r.baseline, 4) for r in recs]),
                Column("ratio", [fmt_value(r.ratio, 2) for r in recs])]
        for t in fit_tables(cols, vals, width=console.width, title=f"{KIND_TITLE[kind]} (top {len(recs)})"):
            console.print(t)
    lines = ["null = 1/√d_model, the RMS score of random Gaussian heads; ratio = score / null"]
    if result.by_kv:
        lines.append("by key/value head: b is a key/value head KVg with its query heads (H…) stacked side by side, "
                     "each weighted by its own ‖W_QK‖² (q, k) or ‖W_OV‖² (v); under multi-head attention the same "
                     "as by head")
    elif any(b.n_kv_heads < b.n_heads for b in info.blocks) and any(k in p.kinds for k in ("k", "v")):
        lines.append("grouped-query attention: the query heads of one key/value head share its keys and values, so "
                     "their K and V scores are nearly alike; --by kv-head gives one row per key/value head")
    if multi:
        lines += [f"{q.from_block} -> {q.to_block} ({','.join(q.kinds)}): {q.rule}" for q in result.pairs]
    print_lines(console, lines)
