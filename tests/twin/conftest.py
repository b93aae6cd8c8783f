"""Tiny twins: a few steps of a 2-layer model on a short text, trained in this process (workers=0)."""

from __future__ import annotations

import pytest

TINY = dict(layers=2, d_model=32, heads=4, context=16, batch=4, eval_windows=8, workers=0)


def text_file(path, chars: int = 6000, held_out_marker: bool = False):
    """A text with a repeated vocabulary; with `held_out_marker` its last 10 % alone holds the byte 'Z'."""
    body = ("the cat sat on the mat. a dog ran by the sea; " * (chars // 46 + 1))[:chars]
    if held_out_marker:
        cut = chars - int(chars * 0.1)
        body = body[:cut] + ("Z" * (chars - cut))
    path.write_text(body, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def small_text(tmp_path_factory):
    return text_file(tmp_path_factory.mktemp("text") / "t.txt")
