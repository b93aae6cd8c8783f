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
    from tests.cli.test_fold_qk_norm import save_qwen3

    steps = [save_qwen3(root / "runs" / f"checkpoint-{step}", seed=step) for step in (10, 20)]
    _ok(cli("sweep", *steps, "--out", root / "sweep", "--metrics", "symmetry,overlap_qk", "--workers", "1", "-f",
            "json"))
    return root / "sweep"


def _tracking(root):
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
# write their PDF beside the table). Tracking writes a sweep folder: walked as the sweep's (WALKED_AS).
SAVE = {"analysis": _analysis, "composition": _composition, "experiment": _experiment, "sweep": _sweep,
        "twin": _twin, "ladder": _ladder, "atlas": _atlas, "heads": _heads, "directions": None,
        "tracking": _tracking}
WALKED_AS = {"tracking": "sweep"}
# Results not named after their capability, and why: tracking's folder is a sweep folder.
RESULT_OF = {"tracking": "SweepResult"}
# Requests shared with another capability: the ladder is the twin's request with several shapes; tracking's options
# are a sweep's, checked by its request when the Tracker is made.
REQUEST_OF = {"ladder": "TwinRequest", "tracking": "SweepRequest"}


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


def _title(name: str) -> str:
    return name[0].upper() + name[1:]


@pytest.mark.parametrize("cap", CAPABILITIES, ids=lambda c: c.name)
def test_the_same_verbs_and_names_everywhere(cap):
    """Every capability has a request check returning its `<Capability>Request`; its result is `<Capability>Result`
    with `document()` (what -o FILE.json writes) and `save()`; the module its reader lives in offers both verbs,
    `read` and `is_saved` (the experiment's too, though the contract asks only its reader: it comes by --experiment,
    never as the model argument)."""
    import importlib
    import inspect

    assert cap.request is not None, f"{cap.name}: no request check"
    returned = inspect.signature(cap.get("request")).return_annotation
    returned = returned if isinstance(returned, str) else returned.__name__
    assert returned == REQUEST_OF.get(cap.name, f"{_title(cap.name)}Request"), (cap.name, returned)
    result = cap.get("result")
    assert result.__name__ == RESULT_OF.get(cap.name, f"{_title(cap.name)}Result"), (cap.name, result)
    for verb in ("document", "save"):
        assert callable(getattr(result, verb, None)), (cap.name, verb)
    if cap.read is not None:
        saved = importlib.import_module(cap.read.partition(":")[0])
        assert callable(saved.read) and callable(saved.is_saved), cap.name


def test_the_names_published_before_stay_as_aliases():
    """Deprecated aliases (docs/notebook.md): the old names are the new objects."""
    from qkinspect.analysis.results import AnalysisResult
    from qkinspect.atlas.results import AtlasRecord, AtlasRelation, AtlasResult
    from qkinspect.composition.results import CompositionResult
    from qkinspect.experiment.requests import ExperimentRequest, Request
    from qkinspect.heads.results import HeadsResult
    from qkinspect.sweep import SweepFolder, SweepResult
    from qkinspect.twin.ladder import Ladder, LadderResult
    from qkinspect.twin.request import Request as TwinRequestAlias
    from qkinspect.twin.request import TwinRequest
    from qkinspect.twin.results import Twin, TwinResult

    assert (SweepFolder, Ladder, Twin, TwinRequestAlias, Request) == (SweepResult, LadderResult, TwinResult,
                                                                    TwinRequest, ExperimentRequest)
    for result in (AnalysisResult, CompositionResult, HeadsResult, TwinResult, LadderResult):
        assert result.to_dict is result.document, result
    for record in (AtlasRecord, AtlasRelation):
        assert record.to_dict is record.row, record
    atlas = AtlasResult(folder=__import__("pathlib").Path("a"), options={}, models=[])
    doc = atlas.document()
    assert atlas.to_dict() == {k: v for k, v in doc.items() if k not in ("schema", "kind", "tool")}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, make in SAVE.items() if make is not None])
def test_saved_then_plot_then_report(name, tmp_path):
    cap = capability(WALKED_AS.get(name, name))
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


@pytest.mark.parametrize("module", ["composition", "heads", "experiment"])
def test_a_documents_predicate_reads_its_head_only(module, tmp_path):
    """`is_saved` of a saved document: a .json file whose head names its kind; anything else (another kind, another
    suffix, a folder, a FIFO that would block a plain open) is not one, and nothing hangs or raises."""
    import importlib
    import json
    import os

    is_saved = importlib.import_module(f"qkinspect.{module}.saved").is_saved
    mine, other = tmp_path / "mine.json", tmp_path / "other.json"
    mine.write_text(json.dumps({"schema": "qkinspect/1", "kind": module}, indent=2))
    other.write_text(json.dumps({"schema": "qkinspect/1", "kind": "analyze"}))
    (tmp_path / "mine.txt").write_text(mine.read_text())
    (tmp_path / "folder.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    assert is_saved(mine) and is_saved(str(mine))
    for not_one in (other, tmp_path / "mine.txt", tmp_path / "folder.json", tmp_path / "fifo.json",
                    tmp_path / "missing.json", None, 3):
        assert not is_saved(not_one), not_one
