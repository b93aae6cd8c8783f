"""Titles that fit their canvas: wrapped at word (then path) boundaries to the width of the figure or sub-figure
they sit on, measured with the real glyph widths, and shortened with "…" past a few lines. A model's name can be
any length; a title centred on a narrower canvas would otherwise be cut at both edges."""

from __future__ import annotations

import re

import matplotlib

from qkinspect.report.pages import shorten as _shorten
from qkinspect.report.pages import text_width

MAX_LINES = 3  # a title longer than this is shortened: the figure is what the page is for
PAD = 0.08  # inches kept free at each edge of the canvas
_BREAKS = re.compile(r"(?<=[/_\-.:])")  # a word too long for a line breaks after one of these


def canvas_width(fig) -> float:
    """Width in inches of a Figure or SubFigure (a SubFigure's box is known before any layout)."""
    root = fig.figure  # a Figure's is itself, a SubFigure's the Figure it lies on
    if root is fig:
        return float(fig.get_figwidth())
    return float(fig.bbox.width / root.dpi)


def fit(text: str, width: float, size: float, bold: bool = False, max_lines: int = MAX_LINES) -> str:
    """`text` wrapped to `width` inches at `size` points in at most `max_lines` lines; explicit newlines are kept.
    Too long, a "name: what is shown" title gives up letters of the name (what is shown stays whole), any other
    text its last words (ending in "…").

    Example:
        >>> fit("a-rather-long/model/name.gguf: symmetry of W_Q W_Kᵀ per head", 2.0, 11).count("\\n") > 0
        True
    """
    lines = _lines(text, width, size, bold)
    if len(lines) <= max_lines:
        return "\n".join(lines)
    head, sep, tail = text.partition(": ")
    if sep and tail and len(_lines(f"…{sep}{tail}", width, size, bold)) <= max_lines:
        lo, hi = 0, len(head)
        while lo < hi:  # the longest start of the name that leaves what is shown whole
            mid = (lo + hi + 1) // 2
            if len(_lines(f"{head[:mid].rstrip()}…{sep}{tail}", width, size, bold)) <= max_lines:
                lo = mid
            else:
                hi = mid - 1
        return "\n".join(_lines(f"{head[:lo].rstrip()}…{sep}{tail}", width, size, bold))
    return "\n".join(lines[: max_lines - 1] + [_shorten(" ".join(lines[max_lines - 1:]), width, size, bold)])


def _lines(text: str, width: float, size: float, bold: bool) -> list[str]:
    out: list[str] = []
    for para in text.split("\n"):
        out += _wrap(para, width, size, bold) or [""]
    return out


def _wrap(text: str, width: float, size: float, bold: bool) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}" if line else word
        if text_width(trial, size, bold) <= width:
            line = trial
            continue
        if line:
            lines.append(line)
        line = word
        while text_width(line, size, bold) > width:  # one word wider than the canvas: break it
            head, line = _split(line, width, size, bold)
            lines.append(head)
    return [*lines, line] if line else lines


def _split(word: str, width: float, size: float, bold: bool) -> tuple[str, str]:
    """The longest head of `word` that fits, cut after a path separator if one fits, else between characters."""
    cuts = [m.start() for m in _BREAKS.finditer(word) if 0 < m.start() < len(word)]
    fitting = [i for i in cuts if text_width(word[:i], size, bold) <= width]
    if fitting:
        i = max(fitting)
    else:
        i = max(1, max((k for k in range(1, len(word)) if text_width(word[:k], size, bold) <= width), default=1))
    return word[:i], word[i:]


def _title_size(fontsize) -> float:
    from matplotlib.font_manager import FontProperties

    return float(FontProperties(size=fontsize or matplotlib.rcParams["figure.titlesize"]).get_size_in_points())


def suptitle(fig, text: str, *, x: float = 0.5, ha: str = "center", fontsize=None, **kw):
    """`fig.suptitle(text)` wrapped to fit the canvas: centred titles within both edges, left-aligned ones (at
    fraction `x`) within the right edge.

    Example:
        >>> suptitle(fig, f"{result.model.name}: symmetry of W_Q W_Kᵀ per head")  # doctest: +SKIP
    """
    width = canvas_width(fig)
    room = width - 2 * PAD if ha == "center" else width * (1 - x) - PAD
    bold = str(kw.get("fontweight", matplotlib.rcParams["figure.titleweight"])) == "bold"
    fitted = fit(text, max(room, 0.5), _title_size(fontsize), bold=bold)
    if fontsize is not None:
        kw["fontsize"] = fontsize
    return fig.suptitle(fitted, x=x, ha=ha, **kw)


def retitle(fig, text: str | None):
    """Replace the figure's title by `text` (the user's --title), fitted like every title; None keeps it."""
    if text is None:
        return fig
    from qkinspect.report.style import style

    with style():
        suptitle(fig, text)
    return fig
