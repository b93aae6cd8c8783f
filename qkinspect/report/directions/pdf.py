"""The directions report: what was read and how, then each head's directions and their tokens, as text pages.

Example:
    >>> import qkinspect
    >>> n_pages = write_directions_pdf(qkinspect.directions(None, layers="0"), "directions.pdf")
"""

from __future__ import annotations

import datetime as dt
import warnings
from pathlib import Path
from typing import IO

from qkinspect.directions.results import DirectionsResult
from qkinspect.errors import InputError
from qkinspect.report.pages import report_pdf
from qkinspect.version import __version__

SIDE_LABEL = {"read": "OV read", "write": "OV write", "query": "QK query", "key": "QK key"}
INTRO = (
    "Each head's top singular directions of W_OV = W_V W_O and W_QK = W_Q W_Kᵀ (row vectors), read as tokens. "
    "OV read: the tokens whose embedding e_t has the largest dot product with the left singular vector u (what the "
    "head reads); OV write: the tokens whose unembedding row, times the final norm's gain, has the largest dot "
    "product with the right singular vector v (the logits the head raises); QK query and key: the tokens whose "
    "embeddings best match each side of the score. A direction is defined up to sign: '+' and '-' list the tokens "
    "of +v and of -v (reading +u writes +σv). Where neighbouring singular values are within 5 % (σ_i/σ_{i+1} < 1.05) "
    "no single direction is defined: the run is read as one subspace ('±'), its tokens ranked by the norm of their "
    "projection onto it. Deeper layers read a residual stream that is no longer the embedding basis, so these "
    "readings are a first look, strongest for early-layer reads and late-layer writes."
)


def write_directions_pdf(result: DirectionsResult, target: str | Path | IO[bytes], *,
                         date: dt.datetime | None = None) -> int:
    """Write the directions pages to `target` (a path or a binary file); returns the number of pages.

    Raises:
        InputError: the result holds no records.
    """
    from qkinspect.loading.tokens import printable

    if not result.records:
        raise InputError("the directions report needs at least one head")
    date = date or dt.datetime.now(dt.timezone.utc)
    name = result.model.name
    with report_pdf(target, version=__version__, report="directions", name=name, date=date,
                    subject="singular directions of attention heads read as tokens") as pages, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # glyphs the page font lacks (CJK, emoji tokens) are drawn as boxes
        pages.new_page()
        pages.heading(f"Singular directions read as tokens: {name}")
        pages.paragraph(INTRO)
        rd = result.readout
        pages.pairs([("model", f"{name} ({result.model.model_type})"),
                     ("write side", rd.unembedding + ("" if rd.tied else " (untied)")
                      + (f", gain of {rd.final_norm} folded" if rd.final_norm else ", no final gain")),
                     ("other sides", rd.embedding),
                     ("tokens", rd.tokenizer or "none found: token ids only"),
                     ("processing", ", ".join(f"{k} {v}" for k, v in result.processing.items()
                                              if k in ("fold_ln", "fold_qk_norm", "precision", "top_directions")))])
        for line in result.notes:
            pages.paragraph(line, size=8.5, color="0.3")
        last_head = None
        for r in result.records:
            head = (r.block, r.layer, r.head)
            if head != last_head:
                pages.heading(f"{r.block} layer {r.layer} head {r.head} (KV head {r.kv_head})", size=10.5)
                last_head = head
            where = str(r.index) if len(r.indices) == 1 else f"{r.indices[0]}-{r.indices[-1]}"
            words = " ".join(printable(t) if t is not None else f"#{i}" for t, i in zip(r.tokens, r.token_ids,
                                                                                        strict=True))
            pages.paragraph(f"{SIDE_LABEL[r.side]} {where} σ={r.sigma:.3g} {r.sign}   {words}", size=8)
    return pages.count


__all__ = ["write_directions_pdf"]
