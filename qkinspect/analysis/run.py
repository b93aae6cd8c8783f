"""`qkinspect.analyze`, the analysis's one library call: a model in, per-head and per-layer records out
(ARCHITECTURE.md §1). The request is checked whole before the model opens (`qkinspect.analysis.request`, in the
caller's names), the selection against the model's description once it is open, and only then is torch loaded and
the model measured (`qkinspect.analysis.engine.measure`): a bad option costs no import of torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from qkinspect.analysis.request import LIBRARY_NAMES, AnalysisRequest, check_model, check_request
from qkinspect.analysis.results import AnalysisResult
from qkinspect.loading import opened
from qkinspect.names import Names

Progress = Callable[[int, int], None]


def analyze(
    model=None,
    *,
    layers: str | int | Iterable[int] | None = None,
    heads: str | int | Iterable[int] | None = None,
    blocks: str | Iterable[str] | None = None,
    metrics: Iterable[str] | None = None,
    fold_ln: bool = False,
    fold_qk_norm: bool = False,
    layer_form: bool = False,
    precision: str = "float32",
    device: str = "cpu",
    spectra: Iterable[str] | None = ("qk",),
    progress: Progress | None = None,
    revision: str | None = None,
    threads: int | None = None,
    names: Names = LIBRARY_NAMES,
    request: AnalysisRequest | None = None,
) -> AnalysisResult:
    """Measure every selected attention head of a model, from its weights alone.

    Args:
        model: a path, hub id or GGUF file; None for the bundled demo model; an opened LoadedModel; or a model in
            memory: a transformers PreTrainedModel (any device; its tensors are read in place, a layer at a time)
            or a (config, state_dict) pair. Its records name it as the model at config.name_or_path is named
            (a local folder by its name), else by its class; its source is "memory:<config.name_or_path>".
        layers, heads: indexes as the CLI takes them ("0-3,7") or as Python values (3, [0, 1]); None for all.
        blocks: block kinds or labels ("encoder", ["text", "vision"]); None for all.
        metrics: metric or group names (qkinspect.metrics.registry); None for the defaults.
        fold_ln, fold_qk_norm: fold the pre-attention norm / the q-k norm gains into the weights first.
        layer_form: also measure each layer's summed form Σ_h W_Q W_Kᵀ (O(d_model³) per layer).
        precision: "float32" or "float64" (half precision is always cast up before any decomposition).
        device: "cpu", "cuda" or "cuda:N".
        spectra: which spectra to keep per head: "qk" (default), "qk_eig", "q", "k", "v", "ov", "ov_eig".
        progress: called as progress(done, total) after each layer.
        revision: hub revision when `model` is a hub id.
        threads: torch intra-op threads for this call (default: the CPUs this process may use); a sweep running
            several analyses side by side on one machine gives each its share. With two or more on a CPU, layers
            small enough (a 7B model's, in float32) are measured two at a time, each on half of the threads.
        names: how errors name the options (`qkinspect.analysis.request`): these arguments' names by default; the
            CLI passes its own.
        request: a request already checked (`qkinspect.analysis.request.check_request`), in place of the options
            from `layers` to `spectra` and `names` (left at their defaults).

    Returns:
        AnalysisResult with head and layer records, spectra, baselines, warnings and the processing flags.

    Raises:
        InputError (and its subclasses): an unknown metric, block, layer, head, precision or device; a model
        that cannot be opened; fold_ln=True on a model without norms. Messages name the argument (`layers=`).

    Example:
        >>> import qkinspect
        >>> result = qkinspect.analyze(None, layers="0", metrics=["symmetry"])  # the demo model
        >>> result.heads[0].values["symmetry"] > 0
        True
    """
    if request is None:
        request = check_request(metrics, spectra, precision, device, fold_ln, fold_qk_norm, layer_form, names,
                                layers=layers, heads=heads, blocks=blocks)
    with opened(model, revision) as m:
        specs = check_model(request, m.info)
        from qkinspect.analysis.engine import measure  # torch: once the request and the model are checked

        return measure(m, request, specs, progress=progress, threads=threads)
