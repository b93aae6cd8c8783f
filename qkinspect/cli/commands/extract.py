"""`qkinspect extract`: write the canonical per-head tensors (DESIGN.md §2) to one safetensors file for other tools.

Tensors are named "{block}.{layer}.{W_Q|W_K|W_V|W_O|b_Q|b_K|b_V|b_O|q_norm|k_norm}"; the header's metadata holds,
under the key "qkinspect", a JSON document (schema qkinspect/1, kind "extract") with the model's identity, shapes,
flags and the list of layers written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from qkinspect.cli.options import (
    BlockOpt,
    LayersOpt,
    ModelArg,
    OutputOpt,
    RevisionOpt,
    check_selection,
    parse_blocks,
    parse_indices,
)
from qkinspect.cli.output import atomic_write_file, check_writable, envelope, note, progress
from qkinspect.errors import InputError

TENSORS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "q_norm", "k_norm")
CONVENTION = ("row vectors: q = x @ W_Q[h] + b_Q[h]; W_Q (n_heads, d_model, d_head), W_K/W_V (n_kv_heads, d_model, "
              "d_head), W_O (n_heads, d_head, d_model); query head h reads KV head h // (n_heads // n_kv_heads)")


def register(app: typer.Typer) -> None:
    @app.command()
    def extract(model: ModelArg = None, output: OutputOpt = None, layers: LayersOpt = None, block: BlockOpt = None,
                revision: RevisionOpt = None) -> None:
        """Write every head's W_Q, W_K, W_V, W_O (and biases) in the canonical layout to a .safetensors file.

        Example: qkinspect extract ./my-bert --layers 0-3 -o heads.safetensors
        """
        if output is None:
            raise InputError("extract writes a file: give -o FILE.safetensors")
        if output.suffix.lower() != ".safetensors":
            raise InputError(f"-o {output}: extract writes safetensors; name the file *.safetensors")
        check_writable(output)
        n = extract_heads(model, output, layers=parse_indices(layers, "--layers"), blocks=parse_blocks(block),
                          revision=revision)
        note(f"wrote {n} tensors to {output}")


def extract_heads(model: str | None, output: Path, *, layers: tuple[int, ...] | None = None,
                  blocks: tuple[str, ...] | None = None, revision: str | None = None) -> int:
    """Read the selected layers and write their canonical tensors atomically; returns the number of tensors.

    Example:
        >>> extract_heads(None, Path("heads.safetensors"), layers=(0,))
        8
    """
    from qkinspect.loading import open_model
    from qkinspect.records import model_dict

    tensors: dict[str, Any] = {}
    written: list[dict[str, Any]] = []
    with open_model(model, revision=revision) as m:
        blocks = check_selection(m.info, blocks, layers)
        plan = list(m.plan(blocks, layers))
        with progress("reading attention weights") as p:
            for done, (block, i) in enumerate(plan, 1):
                layer = m.layer(block, i)
                written.append(_add_layer(tensors, layer))
                p(done, len(plan))
        meta = envelope("extract", model=model_dict(m.info), convention=CONVENTION, layers=written)
    _save(tensors, {"qkinspect": json.dumps(meta), "schema": meta["schema"]}, output)
    return len(tensors)


def _add_layer(tensors: dict[str, Any], layer) -> dict[str, Any]:
    shapes = {}
    for name in TENSORS:
        t = getattr(layer, name)
        if t is None:
            continue
        key = f"{layer.block}.{layer.layer}.{name}"
        # contiguous copies: views share storage (and ALBERT layers share tensors), which safetensors refuses
        tensors[key] = t.detach().contiguous().clone()
        shapes[name] = list(t.shape)
    return {"block": layer.block, "layer": layer.layer, "source_layer": layer.source_layer, "shapes": shapes}


def _save(tensors: dict[str, Any], metadata: dict[str, str], output: Path) -> None:
    from safetensors.torch import save_file

    atomic_write_file(output, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
