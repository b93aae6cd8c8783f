"""How the sweep engine's callers (`run_sweep`, the atlas) name its options in errors: the library's arguments
by default (`workers=0`), the CLI's options when the CLI passes `CLI_NAMES` (`--workers 0`), as
`qkinspect.experiment.requests.Names` does for an experiment.
"""

from __future__ import annotations

from dataclasses import dataclass

from qkinspect.errors import said


@dataclass(frozen=True)
class EngineNames:
    """How the caller names each option of the sweep engine and the atlas: the library's arguments by default."""

    scheduler: str = "scheduler"
    workers: str = "workers"
    threads: str = "threads"
    revisions: str = "revisions"
    models: str = "models"
    from_file: str = "from_file"
    hf_cache: str = "hf_cache"
    out: str = "out"

    def said(self, option: str, value: object, quoted: bool = False) -> str:
        """`option` given `value`, as the caller wrote it: "--scheduler x" (CLI) or "scheduler='x'" (library)."""
        return said(getattr(self, option), value, quoted)


LIBRARY_NAMES = EngineNames()
CLI_NAMES = EngineNames(scheduler="--scheduler", workers="--workers", threads="--threads", revisions="--revisions",
                        models="MODEL arguments", from_file="--from", hf_cache="--hf-cache", out="--out")
