"""qkinspect: the query-key geometry of trained attention heads, from the weights alone."""

from qkinspect.errors import QkinspectError
from qkinspect.version import __version__

__all__ = [
    "__version__", "QkinspectError", "analyze", "atlas", "composition", "directions", "heads", "load", "read_atlas",
    "track", "twin",
]

_MOVED = {"records": "qkinspect.analysis.results", "saved": "qkinspect.analysis.saved"}


def __getattr__(name: str):
    # Lazy: importing qkinspect must stay cheap (the CLI's --help should not pay for torch).
    if name == "analyze":
        from qkinspect.analysis.run import analyze

        return analyze
    if name == "composition":  # the package, callable as qkinspect.composition(model, ...)
        import qkinspect.composition as composition

        return composition
    if name == "heads":  # the package, callable as qkinspect.heads(model, ...)
        import qkinspect.heads as heads

        return heads
    if name == "atlas":  # the package, callable as qkinspect.atlas(models, out=...)
        import qkinspect.atlas as atlas

        return atlas
    if name == "read_atlas":
        from qkinspect.atlas.saved import read_atlas

        return read_atlas
    if name == "directions":  # the package, callable as qkinspect.directions(model, ...)
        import qkinspect.directions as directions

        return directions
    if name == "load":
        from qkinspect.loading import load

        return load
    if name == "twin":  # the package, callable as qkinspect.twin(out, ...)
        import qkinspect.twin as twin

        return twin
    if name == "track":
        from qkinspect.callback import track

        return track
    if name in _MOVED:  # the analysis's modules before they became qkinspect.analysis (docs once named them)
        from importlib import import_module

        return import_module(_MOVED[name])
    raise AttributeError(f"module 'qkinspect' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazy names too, so that dir(), tab completion and help() show the API
    return sorted({*globals(), *__all__})
