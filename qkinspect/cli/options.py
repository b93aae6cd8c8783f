"""Options shared by every command, declared once: import the `Annotated` aliases into a command's signature
and pass the raw values to the library call, which checks them once in the CLI's names (an analysis's selection:
`qkinspect.analysis.request`); the `parse_*` helpers serve the commands that take names or indexes as text.

Example:
    >>> from qkinspect.cli.options import ModelArg, LayersOpt, FormatOpt, OutputOpt
    >>> from qkinspect.selection import parse_indices
    >>> def plot(model: ModelArg = None, layers: LayersOpt = None, fmt: FormatOpt = None,
    ...          output: OutputOpt = None) -> None:
    ...     wanted = parse_indices(layers, "--layers")   # "0-3,7" -> (0, 1, 2, 3, 7)

Parsing errors raise InputError, which the CLI turns into one line on stderr and exit code 2.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from qkinspect.errors import InputError


class Format(str, Enum):
    table = "table"
    json = "json"
    ndjson = "ndjson"
    csv = "csv"


class RecordFormat(str, Enum):
    """The formats of a command whose output is tidy records (sweep, atlas, composition, directions, twin)."""

    table = "table"
    json = "json"
    ndjson = "ndjson"
    csv = "csv"
    parquet = "parquet"


class Precision(str, Enum):
    float32 = "float32"
    float64 = "float64"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


ModelArg = Annotated[
    str | None,
    typer.Argument(help="Model folder, .safetensors/.bin/.gguf file, or hub id (org/name); omit for the demo.",
                   show_default=False, metavar="MODEL"),
]
RevisionOpt = Annotated[str | None, typer.Option("--revision", metavar="REV",
                                                 help="Hub revision (branch, tag or commit).")]
LayersOpt = Annotated[
    str | None, typer.Option("--layers", "-l", metavar="LIST", help="Layers to include, e.g. 0-3,7 (default: all).")
]
HeadsOpt = Annotated[
    str | None, typer.Option("--heads", metavar="LIST", help="Query heads to include, e.g. 0,2-5 (default: all).")
]
BlockOpt = Annotated[
    list[str] | None,
    typer.Option("--block", "-b", metavar="BLOCK",
                 help="Block to include: encoder, decoder, cross, or a tower's label (text, vision); "
                      "comma-separated or repeated (default: all)."),
]
MetricsOpt = Annotated[
    list[str] | None,
    typer.Option("--metrics", "-m", metavar="NAMES",
                 help="Metric or group names (symmetry, overlap, spectrum, all, ...), comma-separated or repeated "
                      "(default: the 'default' group; the eigenvalue metrics 'eigen' and the OV circuit 'ov' are "
                      "opt-in, e.g. default,eigen,ov)."),
]
PrecisionOpt = Annotated[Precision, typer.Option("--precision", help="Arithmetic precision.")]
DeviceOpt = Annotated[Device, typer.Option("--device", help="Where to compute (cuda needs a GPU).")]
FoldLnOpt = Annotated[bool, typer.Option("--fold-ln", help="Fold the preceding LayerNorm/RMSNorm into Q, K, V.")]
FoldQkNormOpt = Annotated[bool, typer.Option(
    "--fold-qk-norm",
    help="Fold the per-head q/k-norm gains (Qwen3, OLMo2, Gemma3) into W_Q and W_K, so the form measured is "
         "W_Q diag(γ_q γ_k) W_Kᵀ; blocks without q/k norms are measured as stored, and a selection with none is "
         "refused.")]
FormatOpt = Annotated[
    Format | None,
    typer.Option("--format", "-f", show_default=False,
                 help="Output format; default: from -o's extension, else table on a terminal and json in a pipe."),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option("--output", "-o", metavar="FILE",
                 help="Write results to FILE instead of stdout (atomically; a link is written through, a FIFO or "
                      "device straight to; - is stdout)."),
]


def parse_names(values: list[str] | None, option: str | None = None) -> tuple[str, ...] | None:
    """Comma-separated and/or repeated names -> a tuple in the given order, duplicates removed; None -> None.
    Values given with nothing in them (``--metrics ''``) are refused when `option` names the option."""
    if not values:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if not names and option is not None:
        raise InputError(f"{option}: no names given (leave the option out for the default)")
    return tuple(dict.fromkeys(names)) or None


def parse_blocks(values: list[str] | None) -> tuple[str, ...] | None:
    """Block names as given (kinds or labels); `check_selection` maps them to the model's block keys."""
    return parse_names(values, "--block")


class By(str, Enum):
    head = "head"
    layer = "layer"


ByOpt = Annotated[By, typer.Option("--by", help="Rows per head, or per layer (summaries and the summed form).")]
LayerFormOpt = Annotated[bool, typer.Option(
    "--layer-form", help="Also measure each layer's summed form Σ_h W_Q W_Kᵀ (costs O(d_model³) per layer).")]
