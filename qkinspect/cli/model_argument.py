"""What `plot` and `report` share about their model argument, not a command: a saved analysis or composition is
drawn as it was saved (options that would shape it refused), else computed on the model (a folder's options are
qkinspect.capabilities'). Commands import it, never each other."""

from __future__ import annotations

from qkinspect.cli.options import Device, Precision
from qkinspect.cli.output import progress, warn
from qkinspect.errors import InputError


def refuse_analysis_options(model: str | None, **given: object) -> None:
    """InputError when `model` is a saved analysis (qkinspect.saved) and an option that shapes an analysis was
    given (`given`: option name -> its value, or whether it differs from its default): the file is drawn as it was
    saved."""
    from qkinspect.analysis.saved import is_saved

    if not is_saved(model):
        return
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v not in (None, False, [], ())]
    if named:
        raise InputError(f"{', '.join(named)}: {model} is a saved analysis, drawn as it was saved; "
                         f"{'these options apply' if len(named) > 1 else 'the option applies'} when analysing a "
                         "model (give them to qkinspect analyze)")


def result_of(model: str | None, request, *, kind: str | None = None, revision: str | None = None):
    """The analysis to draw: read from a saved analysis (`qkinspect analyze -o FILE.json`), or run on the model for
    the checked `request` (qkinspect.analysis.request, in the CLI's names: a figure's --layer is checked against the
    model with the selection, before any work). `kind`: the figure (InputError when a saved analysis cannot give
    it)."""
    from qkinspect.analysis.saved import is_saved, needs_model, read_saved

    if is_saved(model):
        if kind is not None:
            needs_model(kind, model)
        return read_saved(model)
    from qkinspect.cli.run import run_analysis

    return run_analysis(model, request, revision=revision)


def composition_of(model, *, layers=None, block=None, precision=Precision.float32, device=Device.cpu,
                   revision=None):
    """The composition to draw: read from a saved document (`qkinspect composition -o FILE.json`), or computed on
    the model with the defaults (every pair, each layer's input norm folded)."""
    from qkinspect.composition.saved import is_composition_document, read_composition

    if model is not None and is_composition_document(model):
        if layers or block or precision is not Precision.float32 or device is not Device.cpu or revision:
            raise InputError(f"{model} is a saved composition, drawn as it was saved: --layers, --block, "
                             "--precision, --device and --revision apply when computing it from a model")
        return read_composition(model)
    from qkinspect.composition.request import CLI_NAMES
    from qkinspect.composition.run import composition as compose

    with progress("composing heads") as p:  # checked in the library, in plot's option names (--layers, --block)
        result = compose(model, layers=layers, blocks=block, precision=precision, device=device, revision=revision,
                         progress=p, names=CLI_NAMES)
    for w in result.warnings:
        warn(w)
    return result
