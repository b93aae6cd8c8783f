"""`qkinspect extract`: write the canonical per-head tensors (ARCHITECTURE.md §2) to one safetensors file for other
tools; the library's `qkinspect.extract.extract_heads` with the CLI's option names and a progress bar."""

from __future__ import annotations

import typer

from qkinspect.cli.options import BlockOpt, LayersOpt, ModelArg, OutputOpt, RevisionOpt, parse_blocks
from qkinspect.cli.output import note, progress
from qkinspect.errors import InputError
from qkinspect.extract.run import extract_heads
from qkinspect.files import check_writable
from qkinspect.names import Names
from qkinspect.selection import parse_indices

CLI_NAMES = Names.cli(blocks="--block")  # how errors name the selection: --block, --layers

__all__ = ["extract_heads", "register"]  # extract_heads: docs/training.md once named it here


def register(app: typer.Typer) -> None:
    @app.command()
    def extract(model: ModelArg = None, output: OutputOpt = None, layers: LayersOpt = None, block: BlockOpt = None,
                revision: RevisionOpt = None) -> None:
        """Write every head's W_Q, W_K, W_V, W_O (and biases) in the canonical layout to a .safetensors file.

        Layers are written as they are read (memory holds about two layers, whatever the model's size); the file
        appears only once complete.

        Example: qkinspect extract ./my-bert --layers 0-3 -o heads.safetensors
        """
        if output is None:
            raise InputError("extract writes a file: give -o FILE.safetensors")
        if output.suffix.lower() != ".safetensors":
            raise InputError(f"-o {output}: extract writes safetensors; name the file *.safetensors")
        check_writable(output)
        with progress("extracting attention weights") as p:
            n = extract_heads(model, output, layers=parse_indices(layers, "--layers"), blocks=parse_blocks(block),
                              revision=revision, progress=p, names=CLI_NAMES)
        note(f"wrote {n} tensors to {output}")


