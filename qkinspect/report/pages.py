"""Text pages for the PDF report: headings, wrapped paragraphs and tables laid out on A4 Figures, flowing onto
new pages as they fill. Text is real text (TrueType), so the PDF stays searchable. A PDF report's set-up (style,
metadata, footer, the cover's title) in one place (`report_pdf`). The HTML reports' shared pieces too: the style
sheet (`CSS`), a figure as inline SVG (`svg`), a table (`html_table`)."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from html import escape
from pathlib import Path
from typing import IO

from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path

from qkinspect.report.style import PAGE, style
from qkinspect.report.tables import Table

MARGIN = 0.75  # inches on every side
LEADING = 1.38  # line height as a multiple of the font size
FIRST_COLUMN = 0.7  # inches at least for a table's first (left-aligned) column
MONO_ADVANCE = 0.602  # DejaVu Sans Mono's advance per character, in ems: the width of a table's cells
MAX_COLUMN = 1.25  # inches at most for any other column
MIN_COLUMN = 0.8  # inches at least: wider tables are split into several
TABLE_SIZE = 7.5
CELL_FONT = "DejaVu Sans Mono"
CELL_GAP = 0.15  # inches at least between a table's first column and the next one's widest cell
CAPTION_SIZE = 8.5
CAPTION_SPACE = 1.3  # inches kept under each figure for its caption


def text_width(s: str, size: float, bold: bool = False, family: str = "DejaVu Sans") -> float:
    """Width of `s` in inches at `size` points in the report font (or `family`: a table's cells are monospaced)."""
    prop = FontProperties(family=family, size=size, weight="bold" if bold else "normal")
    return text_to_path.get_text_width_height_descent(s, prop, ismath=False)[0] / 72


def wrap(s: str, width: float, size: float, bold: bool = False) -> list[str]:
    """Greedy word wrap to `width` inches, measuring the real glyph widths; a word too long for a line (a path)
    breaks after its slashes."""
    lines, line = [], ""
    for word in s.split():
        trial = f"{line} {word}" if line else word
        if line and text_width(trial, size, bold) > width:
            lines.append(line)
            line = word
        else:
            line = trial
        while text_width(line, size, bold) > width and len(line) > 1:
            cut = _fit_at_slash(line, width, size, bold) or _fit_chars(line, width, size, bold)
            lines.append(line[:cut])
            line = line[cut:]
    return [*lines, line] if line else lines


def shorten(text: str, width: float, size: float, bold: bool = False) -> str:
    """`text` cut to fit one line of `width` inches, ending in "…" when cut."""
    if text_width(text, size, bold) <= width:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix that fits with the ellipsis
        mid = (lo + hi + 1) // 2
        if text_width(text[:mid].rstrip() + "…", size, bold) <= width:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo].rstrip() + "…"


def _fit_chars(text: str, width: float, size: float, bold: bool) -> int:
    """How many leading characters of `text` fit `width` (at least one): a word with no slash to break at."""
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text_width(text[:mid], size, bold) <= width:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fit_at_slash(text: str, width: float, size: float, bold: bool) -> int | None:
    """The longest prefix of `text` ending in '/' that fits `width`; None when none does."""
    cuts = [i + 1 for i, c in enumerate(text) if c == "/" and 0 < i + 1 < len(text)]
    fitting = [i for i in cuts if text_width(text[:i], size, bold) <= width]
    return max(fitting) if fitting else None


MIN_HEADER_SIZE = 6.0  # points: a table header is set no smaller than this to keep its words whole


def header_lines(header: list[str], width: float, size: float) -> tuple[list[list[str]], float]:
    """Each column name wrapped at its words (underscores read as spaces) to `width` inches, in bold, and the font
    size that keeps every word whole ("directionality", not "directionalit / y"): `size`, or smaller down to
    MIN_HEADER_SIZE when a word is wider than the column; past that a word breaks."""
    words = [w for h in header for w in h.replace("_", " ").split()]
    widest = max((text_width(w, size, bold=True) for w in words), default=0.0)
    hsize = size if widest <= width else max(MIN_HEADER_SIZE, size * width / widest * 0.98)
    return [wrap(h.replace("_", " "), width, hsize, bold=True) for h in header], hsize


KEEP_ROWS = 5  # `table(keep=True)`: fewer rows than this are not left alone on a page


class TextPages:
    """Lays text out top to bottom on A4 pages; each full page goes to `sink` (e.g. PdfPages.savefig).

    Example:
        >>> with PdfPages("out.pdf") as pdf:
        ...     pages = TextPages(pdf.savefig, footer="model: report")
        ...     pages.heading("Summary")
        ...     pages.paragraph("The median symmetry score is 0.512.")
        ...     pages.close()
    """

    def __init__(self, sink: Callable[[Figure], None], footer: str = ""):
        self.sink, self.footer = sink, footer
        self.width = PAGE[0] - 2 * MARGIN
        self.fig: Figure | None = None
        self.y = 0.0
        self.count = 0

    def _put(self, x: float, s: str, size: float, **kw) -> None:
        self.fig.text(x, self.y, s, transform=self.fig.dpi_scale_trans, fontsize=size, va="baseline", **kw)

    def _need(self, height: float) -> None:
        if self.fig is None or self.y - height < MARGIN:
            self.new_page()

    def new_page(self) -> None:
        self.flush()
        self.fig = Figure(figsize=PAGE)
        self.y = PAGE[1] - MARGIN

    def flush(self) -> None:
        """Finish the current text page (if any) and send it on."""
        if self.fig is not None:
            fig, self.fig = self.fig, None
            self.add_page(fig)

    def add_page(self, fig: Figure) -> None:
        """Send a finished page (text or figure) on, with the footer and page number."""
        self.count += 1
        footer = shorten(self.footer, self.width - 0.5, 7)  # the page number keeps its place on the right
        fig.text(MARGIN, MARGIN / 2, footer, transform=fig.dpi_scale_trans, fontsize=7, color="0.4")
        fig.text(PAGE[0] - MARGIN, MARGIN / 2, str(self.count), transform=fig.dpi_scale_trans, fontsize=7,
                 color="0.4", ha="right")
        self.sink(fig)

    def close(self) -> None:
        self.flush()

    def skip(self, inches: float) -> None:
        if self.fig is not None:
            self.y -= inches

    def heading(self, s: str, size: float = 13) -> None:
        """A bold heading, kept on the same page as at least three lines that follow."""
        self._need(size * LEADING / 72 * 4 + 0.2)
        self.skip(0.12)
        for line in wrap(s, self.width, size, bold=True):
            self.y -= size * LEADING / 72
            self._put(MARGIN, line, size, fontweight="bold")
        self.y -= 0.06

    def paragraph(self, s: str, size: float = 9.5, indent: float = 0.0, color: str = "black") -> None:
        for line in wrap(s, self.width - indent, size):
            self._need(size * LEADING / 72)
            self.y -= size * LEADING / 72
            self._put(MARGIN + indent, line, size, color=color)
        self.y -= 0.08

    def pairs(self, items: list[tuple[str, str]], size: float = 9.5, key_width: float = 1.8) -> None:
        """Aligned "key   value" lines (the cover's identity and processing lists)."""
        for key, value in items:
            lines = wrap(value, self.width - key_width, size) or [""]
            for i, line in enumerate(lines):
                self._need(size * LEADING / 72)
                self.y -= size * LEADING / 72
                if i == 0:
                    self._put(MARGIN, key, size, color="0.3")
                self._put(MARGIN + key_width, line, size)
        self.y -= 0.08

    def table(self, t: Table, size: float = TABLE_SIZE, min_column: float = MIN_COLUMN, keep: bool = False) -> None:
        """A table with a rule under the header (repeated on each new page): the first column left-aligned, the
        others right-aligned; columns narrower than `min_column` inches would not fit, so wide tables continue.
        `keep`: a table that fits on a page is not broken (it starts on the next page), and one that does not
        leaves at least KEEP_ROWS rows for each page it continues on."""
        for part in t.split(max_columns=1 + int((self.width - FIRST_COLUMN) // min_column)):
            self._table(part, size, keep)

    def _table_height(self, t: Table, size: float, depth: int) -> float:
        """Inches the whole table takes: its title (as `heading` sets it), header, rule and rows."""
        titles = len(wrap(t.title, self.width, 10, bold=True))
        lh = size * LEADING / 72
        return 0.12 + titles * 10 * LEADING / 72 + 0.06 + lh * (depth + 0.35) + lh * len(t.rows)

    def _table(self, t: Table, size: float, keep: bool = False) -> None:
        lh = size * LEADING / 72
        # the first column as wide as its widest cell needs ("layer 16 head 6" ran into the next column's cell)
        first = max([FIRST_COLUMN, *(text_width(r[0], size, family=CELL_FONT) + CELL_GAP for r in t.rows)])
        first = min(first, self.width / 2)
        col = min(MAX_COLUMN, (self.width - first) / max(1, len(t.header) - 1))
        # each column's anchor: the first column's left edge, the others' right edges (numbers align)
        rights = [0.0] + [first + col * (i + 1) - 0.08 for i in range(len(t.header) - 1)]
        header, hsize = header_lines(t.header, col - 0.1, size)
        depth = max(len(h) for h in header)
        height = self._table_height(t, size, depth)
        if keep and self.fig is not None and self.y - height < MARGIN and height <= PAGE[1] - 2 * MARGIN:
            self.new_page()  # it fits on a page of its own: not broken
        self.heading(t.title, size=10)
        self._header(header, depth, rights, hsize, lh)
        left = len(t.rows)  # rows not yet set, this one included
        for row in t.rows:
            fit = int((self.y - MARGIN) // lh)  # rows this page still holds
            # a page break comes within the rows left; with `keep`, break here so that KEEP_ROWS go on together
            widow = keep and left > fit and left == KEEP_ROWS and left < len(t.rows)
            if fit < 1 or widow:
                self.new_page()
                self._header(header, depth, rights, hsize, lh)
            left -= 1
            self.y -= lh
            for i, (x, cell) in enumerate(zip(rights, row, strict=True)):
                self._put(MARGIN + x, cell, size, ha="left" if i == 0 else "right", family=CELL_FONT)
        self.y -= 0.15

    def _header(self, header: list[list[str]], depth: int, rights: list[float], size: float, lh: float) -> None:
        self._need(lh * (depth + 2))
        for k in range(depth):
            self.y -= lh
            for j, (x, lines) in enumerate(zip(rights, header, strict=True)):
                i = k - (depth - len(lines))  # bottom-align wrapped headers
                if i >= 0:
                    self._put(MARGIN + x, lines[i], size, ha="left" if j == 0 else "right", fontweight="bold")
        self.y -= lh * 0.35
        self.fig.add_artist(_rule(self.fig, self.y, self.width))


@contextmanager
def report_pdf(target: str | Path | IO[bytes], *, report: str, name: str, subject: str, version: str,
               date: dt.datetime, intro: str | None = None) -> Iterator[TextPages]:
    """The set-up every PDF report shares, yielding its text pages: the report style; the PDF's metadata (title
    "qkinspect {report}: {name}", "qkinspect {version}" as its author, `subject`, `date`); the footer "qkinspect
    {version} {report}: {name}" on every page; with `intro`, the cover begun: "qkinspect {report}" as its title,
    `name` under it, `intro` below. The pages are closed on leaving (`pages.count` is then the number of pages).

    Example:
        >>> with report_pdf("twin.pdf", report="twin report", name="run-1", subject="…", version=__version__,
        ...                 date=now, intro="…") as pages:
        ...     pages.pairs([("folder", "run-1")])  # doctest: +SKIP
    """
    from matplotlib.backends.backend_pdf import PdfPages

    meta = {"Title": f"qkinspect {report}: {name}", "Author": f"qkinspect {version}", "Subject": subject,
            "CreationDate": date}
    with style(), PdfPages(target, metadata=meta) as pdf:
        pages = TextPages(pdf.savefig, footer=f"qkinspect {version} {report}: {name}")
        if intro is not None:
            pages.new_page()
            pages.heading(f"qkinspect {report}", size=20)
            pages.heading(name, size=14)
            pages.paragraph(intro)
        yield pages
        pages.close()


def _rule(fig: Figure, y: float, width: float):
    from matplotlib.lines import Line2D

    return Line2D([MARGIN, MARGIN + width], [y, y], transform=fig.dpi_scale_trans, color="0.5", lw=0.6)


def page_canvas(page: Figure, slot: dict):
    """A canvas callback placing the figure at the top of an A4 page, inside the margins, with room for a caption
    (the caption's SubFigure is left in `slot["caption"]`)."""

    def canvas(height: float, width: float | None = None):
        inner_w, inner_h = PAGE[0] - 2 * MARGIN, PAGE[1] - 2 * MARGIN
        h = min(height, inner_h - CAPTION_SPACE)  # the height the figure asks for (a few layers are not stretched
        # down the whole page), the caption right under it
        column = page.subfigures(1, 3, width_ratios=[MARGIN, inner_w, MARGIN])[1]
        rest = PAGE[1] - MARGIN - h - CAPTION_SPACE
        _, body, caption, _ = column.subfigures(4, 1, height_ratios=[MARGIN, h, CAPTION_SPACE, rest])
        slot["caption"] = caption
        return body

    return canvas


def put_caption(sub, caption: str) -> None:
    """`caption` wrapped to the page's text width at the top of `sub` (a page_canvas caption slot)."""
    lines = wrap(caption, PAGE[0] - 2 * MARGIN, CAPTION_SIZE)
    sub.text(0.0, 0.95, "\n".join(lines), va="top", ha="left", fontsize=CAPTION_SIZE, linespacing=1.35,
             transform=sub.transSubfigure)


def figure_page(pages: TextPages, draw: Callable, caption: str) -> None:
    """A page of its own for one figure and its caption, sent on through `pages` (footer and page number):
    `draw(canvas)` draws the figure on the canvas it is given (InputError passes through, no page added)."""
    pages.flush()
    page = Figure(figsize=PAGE, layout="constrained")
    slot: dict = {}
    draw(page_canvas(page, slot))
    put_caption(slot["caption"], caption)
    pages.add_page(page)


CSS = """body{font-family:"DejaVu Sans",sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.45}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{padding:.15em .7em;text-align:right}
th:first-child,td:first-child{text-align:left}th{border-bottom:1px solid #888}td{font-family:monospace}
figure{margin:2em 0}figcaption{font-size:.9em;color:#333}.meta{color:#555}svg{max-width:100%;height:auto}"""


def svg(fig) -> str:
    """A matplotlib figure as inline SVG (no XML prolog or doctype: it sits inside HTML)."""
    buf = io.StringIO()
    with style():
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def html_table(t: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.header)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in t.rows)
    return f"<h3>{escape(t.title)}</h3><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
