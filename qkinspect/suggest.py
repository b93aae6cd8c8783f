"""'Did you mean …?' for a misspelt name: the closest known names by difflib's ratio."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean symmetry?)" for the known names close to `word` (at most two), else "".

    Example:
        >>> did_you_mean("symetry", ["symmetry", "overlap_qk", "directionality"])
        ' (did you mean symmetry?)'
        >>> did_you_mean("xyz", ["symmetry"])
        ''
    """
    close = difflib.get_close_matches(word.strip().lower(), list(dict.fromkeys(known)), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""
