"""The contract (qkinspect.capabilities), walked: every piece it names exists; for every capability, what it saved
round-trips through `plot` (each of its figures) and `report`; a figure it does not draw is refused with one line
naming the kinds it draws, exit 2. A capability added to the list without a way to save one here fails
`test_every_capability_is_walked`."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import qkinspect
from qkinspect.capabilities import CAPABILITIES, FROM_MODEL, all_figures, capability, saved_by
from qkinspect.cli.app import app
from tests.one_line import one_error_line

TWIN = ["--variants", "share_qk", "--seeds", "2", "--steps", "3", "--layers", "1", "--d-model", "16", "--heads", "2",
        "--context", "8", "--batch", "2", "--eval-windows", "4", "--eval-every", "3", "--track-every", "3",
        "--workers", "0", "-f", "json"]


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _ok(r):
    assert r.exit_code == 0, r.stderr
    return r


def _analysis(root):
    _ok(cli("analyze", "--layers", "0-1", "--metrics", "default,shared_qk_distance,head_overlap", "-o",
            root / "run.json"))
    return root / "run.json"


def _composition(root):
    _ok(cli("composition", "--layers", "0-1", "-o", root / "c.json"))
    return root / "c.json"


def _experiment(root):
    _ok(cli("experiment", "--layers", "5", "--tokens", "64", "--window", "32", "--estimate", "--probes", "2",
            "--verify", "2", "-o", root / "runs.json"))
    return root / "runs.json"


def _sweep(root):
    from transformers import AutoModel

    from tests.cli.test_fold_qk_norm import save_qwen3

    save_qwen3(root / "tiny-qwen", seed=3)
    model = AutoModel.from_pretrained(root / "tiny-qwen")
    for step in (10, 20):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        qkinspect.track(model, step, root / "qk", metrics=["symmetry", "overlap_qk"])
    return root / "qk"


def _twin(root):
    _ok(cli("twin", "--out", root / "twin", *TWIN))
    return root / "twin"


def _ladder(root):
    shape = TWIN.index("--layers")  # the ladder's shapes replace the one shape
    small = [*TWIN[:shape], *TWIN[shape + 6:]]
    _ok(cli("twin", "--out", root / "ladder", *small, "--shapes", "1x16,2x16", "--head-size", "8"))
    return root / "ladder"


def _heads(root):
    from tests.experiment import tiny_models

    llama = tiny_models.llama(root / "llama")
    _ok(cli("heads", llama, "--sequences", "6", "--length", "12", "--windows", "3", "--window", "24", "--resamples",
            "100", "--permutations", "100", "-o", root / "heads.json"))
    return root / "heads.json"


def _atlas(root):
    _ok(cli("atlas", _analysis(root), "--out", root / "atlas", "--workers", "1", "-f", "csv"))
    return root / "atlas"


# How each capability's saved thing is made here (None: it saves nothing of its own to draw or report: directions
# write their PDF beside the table; tracking writes a sweep folder, walked as the sweep's).
SAVE = {"analysis": _analysis, "composition": _composition, "experiment": _experiment, "sweep": _sweep,
        "twin": _twin, "ladder": _ladder, "atlas": _atlas, "heads": _heads, "directions": None, "tracking": None}


def test_every_capability_is_walked():
    assert sorted(SAVE) == sorted(c.name for c in CAPABILITIES)


@pytest.mark.parametrize("cap", CAPABILITIES, ids=lambda c: c.name)
def test_every_piece_the_contract_names_exists(cap):
    for piece in ("request", "call", "result", "read", "is_saved", "draw", "pdf", "html"):
        if getattr(cap, piece) is not None:
            assert callable(cap.get(piece)), (cap.name, piece)
    assert not cap.draw or cap.figures
    if cap.pdf and cap.is_saved and cap.name not in FROM_MODEL:  # a folder with a report of its own
        assert cap.noun and cap.report_noun and bool(cap.filled) == bool(cap.empty)
    if cap.figures:
        assert set(cap.figures) <= set(all_figures())
    for piece, verb in (("read", "read"), ("is_saved", "is_saved")):  # the same two verbs in every saved module
        assert getattr(cap, piece) is None or getattr(cap, piece).endswith(f":{verb}"), (cap.name, piece)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, make in SAVE.items() if make is not None])
def test_saved_then_plot_then_report(name, tmp_path):
    cap = capability(name)
    saved = SAVE[name](tmp_path)
    holder = saved_by(saved) if cap.is_saved else None
    assert holder is (cap if cap.is_saved else None)
    for kind in cap.figures:
        out = tmp_path / f"{kind}.png"
        args = ("--experiment", saved) if cap.from_option else (saved,)
        if kind == "healing":
            continue  # needs an experiment run with --heal-eval-every: tests/experiment/test_heal_curve.py
        if kind in ("compare",):
            args = (*args, "--compare", saved)
        if kind == "metric":
            args = (*args, "--metric", "symmetry")
        if kind == "spectra":  # a saved analysis keeps no spectra: refused, naming the model it needs
            one_error_line(cli("plot", *args, "--kind", kind, "-o", out), "the spectra figure needs")
            continue
        r = _ok(cli("plot", *args, "--kind", kind, "-o", out))
        assert out.stat().st_size > 5_000 and f"to {out}" in r.stderr
    if cap.pdf and cap.name not in FROM_MODEL:  # a folder's own report, PDF and HTML
        for suffix, extra in ((".pdf", ()), (".html", ("--html",))):
            out = tmp_path / f"report{suffix}"
            r = _ok(cli("report", saved, *extra, "-o", out))
            assert out.stat().st_size > 5_000 and f"{cap.report_noun} report to {out}" in r.stderr
    elif cap.name == "analysis":
        _ok(cli("report", saved, "-o", tmp_path / "report.pdf"))
    else:  # a section of the model's report (the experiment's of the demo model itself)
        model = (_analysis(tmp_path),) if cap.name == "composition" else ()
        _ok(cli("report", *model, f"--{cap.name}", saved, "-o", tmp_path / "section.pdf"))
    if cap.is_saved and cap.name not in FROM_MODEL:  # a kind it does not draw: one line naming those it does
        other = next(k for k in all_figures() if k not in cap.figures)
        one_error_line(cli("plot", saved, "--kind", other, "-o", tmp_path / "x.png"), f"--kind {other}",
                       *cap.figures)
        assert not (tmp_path / "x.png").exists()


def test_the_design_notes_cited_in_docstrings_ship():
    """Every docstring's ARCHITECTURE.md §N names a section the repository's ARCHITECTURE.md has; none cites the
    DESIGN.md that never shipped."""
    import re
    from pathlib import Path

    root = Path(qkinspect.__file__).parent
    notes = (root.parent / "ARCHITECTURE.md").read_text()
    sections = set(re.findall(r"^## (§\d+)", notes, flags=re.M))
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "DESIGN.md" not in text, path
        for cited in re.findall(r"ARCHITECTURE\.md (§\d+)", text):
            assert cited in sections, (path, cited)
