"""Read a PNG's size and pixels without a display (matplotlib's image reader)."""

from __future__ import annotations

import struct
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from the IHDR chunk; AssertionError if the file is not a PNG."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def ink_fraction(path: Path) -> float:
    """Fraction of pixels that are not white: a blank or nearly blank image gives ~0."""
    from matplotlib.image import imread

    img = imread(str(path))[..., :3]  # (H, W, 3) floats in [0, 1]
    return float((img.min(axis=2) < 0.95).mean())


def expected_size(fig, dpi: float) -> tuple[int, int]:
    w, h = fig.get_size_inches()
    return int(round(w * dpi)), int(round(h * dpi))

