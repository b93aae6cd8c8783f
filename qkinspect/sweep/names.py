"""How the sweep engine's callers (`run_sweep`, the atlas) name its options in errors, in the one names type
(`qkinspect.names.Names`): the library's arguments by default (`workers=0`), the CLI's options when the CLI passes
`CLI_NAMES` (`--workers 0`).
"""

from __future__ import annotations

from qkinspect.names import Names

LIBRARY_NAMES = Names()
CLI_NAMES = Names.cli(models="MODEL arguments", from_file="--from", blocks="--block")
