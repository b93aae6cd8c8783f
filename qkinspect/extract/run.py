"""Extract: write the canonical per-head tensors (ARCHITECTURE.md §2) to one safetensors file for other tools
(`qkinspect extract` is this, with the CLI's option names and a progress bar).

Tensors are named "{block}.{layer}.{W_Q|W_K|W_V|W_O|b_Q|b_K|b_V|b_O|q_norm|k_norm}" and keep the checkpoint's dtype;
the header's metadata holds, under the key "qkinspect", a JSON document (schema qkinspect/1, kind "extract") with the
model's identity, shapes, flags and the list of layers written.

The file is streamed: each layer is written as soon as it is read (the next one is read meanwhile), so memory holds
about two layers whatever the model's size. The header, known only at the end, goes into room reserved at the
file's start from an upper bound on its length (see `qkinspect.extract.writer`). The file is written under a
temporary name and renamed at the end: a run that fails or is interrupted leaves no output and no temporary file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qkinspect.documents import envelope
from qkinspect.files import atomic_write_file
from qkinspect.names import Names
from qkinspect.selection import check_selection

LIBRARY_NAMES = Names()
TENSORS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "q_norm", "k_norm")
CONVENTION = ("row vectors: q = x @ W_Q[h] + b_Q[h]; W_Q (n_heads, d_model, d_head), W_K/W_V (n_kv_heads, d_model, "
              "d_head), W_O (n_heads, d_head, d_model); query head h reads KV head h // (n_heads // n_kv_heads)")


def extract_heads(model: str | None, output: Path, *, layers: tuple[int, ...] | None = None,
                  blocks: tuple[str, ...] | None = None, revision: str | None = None,
                  progress: Callable[[int, int], None] | None = None, names: Names = LIBRARY_NAMES) -> int:
    """Stream the selected layers' canonical tensors to `output` (atomically); returns the number of tensors.
    `progress(done, total)` is called after each layer; errors name the selection as `names` spells it.

    Example:
        >>> extract_heads(None, Path("heads.safetensors"), layers=(0,))
        8
    """
    from qkinspect.loading import open_model

    counts: list[int] = []
    with open_model(model, revision=revision) as m:
        chosen = check_selection(m.info, blocks, layers, options=(names.blocks, names.layers, names.heads))
        blocks = tuple(b.key for b in chosen) if blocks else None
        atomic_write_file(output, lambda tmp: counts.append(_write(m, blocks, layers, tmp, progress)))
    return counts[0]


def _write(m, blocks: tuple[str, ...] | None, layers: tuple[int, ...] | None, path: Path,
           progress: Callable[[int, int], None] | None) -> int:
    from qkinspect.documents import model_dict
    from qkinspect.extract.writer import SafetensorsWriter

    steps = list(m.plan(blocks, layers))
    model = model_dict(m.info)
    written: list[dict[str, Any]] = []
    with open(path, "w+b") as f:
        w = SafetensorsWriter(f, reserve=_reserve(m.info, steps, model))
        # closing(): a failure here stops the prefetch thread before the temporary file is removed
        with contextlib.closing(m.layers(blocks, layers, prefetch=True)) as stream:
            for layer in stream:  # not enumerate(): its reused result tuple would keep the last layer alive
                written.append(_write_layer(w, layer))
                del layer  # only the layer being prefetched stays in memory while the next is read
                if progress is not None:
                    progress(len(written), len(steps))
        w.finish(_metadata(model, written))
    return w.count


def _write_layer(w, layer) -> dict[str, Any]:
    shapes = {}
    for name in TENSORS:
        t = getattr(layer, name)
        if t is None:
            continue
        w.add(f"{layer.block}.{layer.layer}.{name}", t)
        shapes[name] = list(t.shape)
    return {"block": layer.block, "layer": layer.layer, "source_layer": layer.source_layer, "shapes": shapes}


def _metadata(model: dict[str, Any], written: list[dict[str, Any]]) -> dict[str, str]:
    meta = envelope("extract", model=model, convention=CONVENTION, layers=written)
    return {"qkinspect": json.dumps(meta), "schema": meta["schema"]}


def _reserve(info, steps: list[tuple[str, int]], model: dict[str, Any]) -> int:
    """Room for the header: its length were every step to hold all of TENSORS at their largest canonical shapes,
    in the widest dtype name, at offsets as long as the largest possible one. A real header longer than this
    (a layout the plan did not foresee) still works: the writer then moves the data."""
    from qkinspect.extract.writer import WIDEST_DTYPE, header_bytes, header_room

    plans = [(block, i, _planned_shapes(info.block(block))) for block, i in steps]
    end = 8 * sum(_numel(s) for _, _, shapes in plans for s in shapes.values())  # 8 bytes: the widest element
    entries = [(f"{block}.{i}.{name}", WIDEST_DTYPE, shape, end, end)
               for block, i, shapes in plans for name, shape in shapes.items()]
    # source_layer is null (4 characters) or a layer index: plan for the longer of the two
    written = [{"block": block, "layer": i, "source_layer": max(i, 1000),
                "shapes": {k: list(s) for k, s in shapes.items()}} for block, i, shapes in plans]
    return header_room(len(header_bytes(entries, _metadata(model, written))))


def _planned_shapes(spec) -> dict[str, tuple[int, ...]]:
    """Every tensor a layer of this block may have, at its canonical shape (AttentionLayer; q/k-norm gains at
    their per-head (heads, d_head) shape, the larger of the two they come in)."""
    H, G, D, Dk, d, dv = spec.n_heads, spec.n_kv_heads, spec.d_model, spec.kv_width, spec.d_head, spec.v_head
    return {"W_Q": (H, D, d), "W_K": (G, Dk, d), "W_V": (G, Dk, dv), "W_O": (H, dv, D), "b_Q": (H, d),
            "b_K": (G, d), "b_V": (G, dv), "b_O": (D,), "q_norm": (H, d), "k_norm": (G, d)}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
