"""Signed differences as qkinspect shows them, in the terminal and on the pages alike (`qkinspect twin`'s diff and
interval, the twin figures' titles and the twin report): a ground module with no qkinspect import, below terminal/
and report/.

`signed(x)` is `+0.0123`: signed, 4 decimals; a difference too small for 4 decimals keeps two significant digits
(`-0.000031`, never `-0.0000` or `+0.0000` for a value that is not zero); zero, of either sign, is `0.0000` (no
negative zero). `signed_alike(diff, low, high)` writes a difference and its interval with one number of decimals.
"""

from __future__ import annotations

import math

DECIMALS = 4  # decimals of a loss or a difference of losses, as `qkinspect twin` prints them
_MOST = 8  # decimals before a tiny difference is written in scientific notation


def places(*xs: float | None, decimals: int = DECIMALS) -> int:
    """The decimals that show each of `xs` that is not zero with two significant digits at least where `decimals`
    would round it to a zero (at most _MOST)."""
    out = decimals
    for x in xs:
        if x is not None and math.isfinite(float(x)) and x != 0 and float(f"{x:.{decimals}f}") == 0:
            out = max(out, 1 - math.floor(math.log10(abs(float(x)))))
    return min(out, _MOST)


def signed(x: float | None, decimals: int | None = None, missing: str = "-") -> str:
    """`x` signed with `decimals` decimals (default: DECIMALS, or as many more as two significant digits need);
    `missing` where None or not finite; zero (either sign) unsigned.

    Example:
        >>> signed(0.01234), signed(-3.1e-05), signed(-0.0), signed(None)
        ('+0.0123', '-0.000031', '0.0000', '-')
    """
    if x is None or not math.isfinite(float(x)):
        return missing
    x = float(x)
    decimals = places(x) if decimals is None else decimals
    if x == 0:
        return f"{0.0:.{decimals}f}"
    text = f"{x:+.{decimals}f}"
    return f"{x:+.1e}" if float(text) == 0 else text  # below 10^-_MOST: scientific


def signed_alike(*xs: float | None, missing: str = "-") -> list[str]:
    """`xs` (a difference and its interval) signed with one number of decimals, the most any of them needs.

    Example:
        >>> signed_alike(-3.1e-05, -5.2e-05, -1.04e-05)
        ['-0.000031', '-0.000052', '-0.000010']
    """
    n = places(*xs)
    return [signed(x, n, missing) for x in xs]


def plain(x: float | None, decimals: int = DECIMALS, missing: str = "-") -> str:
    """`x` with `decimals` decimals (a loss), `missing` where None or not finite; no negative zero."""
    if x is None or not math.isfinite(float(x)):
        return missing
    text = f"{float(x):.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text
