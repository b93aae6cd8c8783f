"""Healing as a curve: every evaluation point is the exact runs' scoring of the weights the healed copy held at that
step, paired with the control at the same step; the precision healing trains in is measured, forced, and kept."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.experiment import heal as heal_mod
from qkinspect.experiment import heal_curve
from qkinspect.experiment.heal_curve import choose_precision, eval_steps, late_change, late_start
from qkinspect.experiment.requests import HealOptions
from qkinspect.experiment.results import Precision
from qkinspect.experiment.run import run_experiment
from tests.experiment import tiny_models
from tests.experiment.test_heal import _text


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("heal_curve")
    return {f: getattr(tiny_models, f)(root / f) for f in ("gpt2", "bert")}


def test_eval_steps():
    assert eval_steps(5, 2) == [0, 2, 4, 5]
    assert eval_steps(4, 2) == [0, 2, 4]
    assert eval_steps(4, None) == [4]
    assert eval_steps(3, 10) == [0, 3]
    from qkinspect.errors import InputError

    for bad in (0, -1, True, 2.5):  # refused before anything loads, named as the library spells it
        with pytest.raises(InputError, match=r"heal\.eval_every="):
            run_experiment("no-such-model", "share_qk", heal=HealOptions(steps=2, eval_every=bad))


def test_late_start_is_the_last_point_at_or_before_three_quarters():
    assert late_start(100, eval_steps(100, 10)) == 70
    assert late_start(200, eval_steps(200, 10)) == 150
    assert late_start(5, eval_steps(5, 2)) == 2
    assert late_start(100, eval_steps(100, 30)) == 60
    assert late_start(4, eval_steps(4, None)) is None  # only the last point: no late part
    assert late_start(3, eval_steps(3, 10)) is None  # 0 and the last


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5), st.floats(-5, 5), st.floats(-5, 5)), min_size=4,
                max_size=40), st.integers(2, 6))
def test_late_change_is_the_paired_difference_of_two_points(rows, n_blocks):
    """change = point(end).diff − point(start).diff exactly (a mean is linear); its standard error is the block
    standard error of the per-token change, which is zero when the curve did not move token by token."""
    from qkinspect.experiment.heal_curve import point
    from qkinspect.experiment.model.scoring import block_se

    t = torch.tensor(rows, dtype=torch.float64)
    run = {1: t[:, 0], 3: t[:, 1]}
    ref = {1: t[:, 2], 3: t[:, 3]}
    blocks = torch.arange(len(rows)) % n_blocks
    c = late_change(1, 3, run, ref, blocks)
    a, b = point(1, run[1], ref[1], blocks), point(3, run[3], ref[3], blocks)
    assert (c.start, c.end) == (1, 3)
    assert c.change == pytest.approx(b.diff - a.diff, abs=1e-9)
    assert c.se == block_se((run[3] - ref[3]) - (run[1] - ref[1]), blocks)
    still = late_change(1, 3, {1: run[1], 3: run[1] + 0.25}, ref[1], blocks)  # every token moved alike: se 0
    assert still.change == pytest.approx(0.25) and still.se == pytest.approx(0.0, abs=1e-12)


def _separately(hf_copy, folder, family, scorer_ids, batch_tokens, seed):
    """Score the weights `hf_copy` holds now in a fresh model of the family, through a fresh Scorer (the exact
    runs' scoring), without healing's parametrisation or modules: (mean loss, per-token losses)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from qkinspect.experiment.model.runtime import HFModel
    from qkinspect.experiment.model.scoring import Scorer

    cls = AutoModelForCausalLM if family == "gpt2" else AutoModelForMaskedLM
    fresh = cls.from_pretrained(folder).eval()
    state = {}
    with torch.no_grad():
        for key in fresh.state_dict():
            path, _, attr = key.rpartition(".")
            state[key] = getattr(hf_copy.model.get_submodule(path), attr).detach().clone()
    fresh.load_state_dict(state)
    s = Scorer(HFModel(fresh, hf_copy.family, hf_copy.kind, hf_copy.tokenizer), scorer_ids, batch_tokens=batch_tokens,
               seed=seed)
    return s.score(0), s.token_losses


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_every_point_is_a_separate_scoring_of_the_same_weights(folders, family, monkeypatch):
    seen = []  # (per-token losses healing got, the separate scoring's) in the order healing scored
    real = heal_mod.scored_tokens
    box = {}

    def spy(scorer, hf):
        got = real(scorer, hf)
        ids = torch.cat(scorer.batches)
        seen.append((got, _separately(hf, folders[family], family, ids, box["batch"], 0)[1]))
        return got

    monkeypatch.setattr(heal_mod, "scored_tokens", spy)
    box["batch"] = 64
    opts = HealOptions(steps=5, lr=2e-2, batch_tokens=64, text=_text(), eval_every=2, float32=True)
    r = run_experiment(str(folders[family]), "share_qk,symmetric", scope="layer", layers=[1], tokens=128,
                       window=32, batch_tokens=64, heal=opts)
    h = r.healing
    at = [0, 2, 4, 5]
    assert len(seen) == len(at) * (1 + len(h.runs))  # the control, then each run, at every point
    for got, separate in seen:
        assert torch.allclose(got, separate, rtol=1e-5, atol=1e-6)
    control = [got for got, _ in seen[:len(at)]]
    assert [p.step for p in h.control_curve] == at
    assert h.control_curve[0].loss == pytest.approx(r.baseline, rel=1e-5)  # step 0: the unedited model
    for p, c in zip(h.control_curve, control, strict=True):
        assert p.loss == pytest.approx(float(c.mean()), rel=1e-12)
        assert p.diff == pytest.approx(p.loss - r.baseline, rel=1e-6, abs=1e-9)
    for k, run in enumerate(h.runs):
        mine = [got for got, _ in seen[len(at) * (k + 1):len(at) * (k + 2)]]
        assert [p.step for p in run.curve] == at
        for p, e, c in zip(run.curve, mine, control, strict=True):
            assert p.loss == pytest.approx(float(e.mean()), rel=1e-12)
            assert p.diff == pytest.approx(float((e - c).mean()), rel=1e-9, abs=1e-12)
            assert p.se is not None and p.se > 0
        exact = next(x for x in r.runs if x.edit == run.edit)
        assert run.curve[0].diff == pytest.approx(exact.dloss, rel=1e-4, abs=1e-6)  # step 0: the unhealed cost
        assert (run.loss, run.diff, run.se) == (run.curve[-1].loss, run.curve[-1].diff, run.curve[-1].se)
        assert run.violation < 1e-6
        # the late change: steps 2 -> 5, paired token by token with the control at each step
        e2, e5, c2, c5 = mine[1], mine[3], control[1], control[3]
        assert (run.late.start, run.late.end) == (2, 5)
        assert run.late.change == pytest.approx(float(((e5 - c5) - (e2 - c2)).mean()), rel=1e-9, abs=1e-12)
        assert run.late.change == pytest.approx(run.curve[3].diff - run.curve[1].diff, abs=1e-9)
        assert run.late.se is not None and run.late.se > 0
    assert (h.control_late.start, h.control_late.end) == (2, 5)
    assert h.control_late.change == pytest.approx(float((control[3] - control[1]).mean()), rel=1e-9, abs=1e-12)
    assert h.precision.dtype == "float32" and h.precision.reason == "float32 asked for (heal.float32)"


def test_precision_is_measured_against_the_smallest_standard_error(folders, monkeypatch):
    from qkinspect.experiment.model.runtime import load_hf
    from qkinspect.experiment.model.scoring import Scorer, windows
    from qkinspect.loading import open_model

    with open_model(str(folders["gpt2"])) as m:
        hf = load_hf(m.resolved)
    scorer = Scorer(hf, windows(hf, _text(), 128, 32), batch_tokens=64)
    scorer.baseline()
    monkeypatch.setattr(heal_curve, "bf16_hardware", lambda device: None)
    assert choose_precision(scorer, hf, 1.0, False).dtype == "float32"
    monkeypatch.setattr(heal_curve, "bf16_hardware", lambda device: "a test CPU")
    assert choose_precision(scorer, hf, None, False).dtype == "float32"
    assert choose_precision(scorer, hf, 1.0, True).dtype == "float32"
    wide = choose_precision(scorer, hf, 1e9, False)
    assert wide.dtype == "bfloat16" and wide.float32_loss == pytest.approx(scorer.baseline(), rel=1e-6)
    assert wide.bfloat16_loss != wide.float32_loss  # autocast did compute in bfloat16
    narrow = choose_precision(scorer, hf, abs(wide.bfloat16_loss - wide.float32_loss) / 2, False)
    assert narrow.dtype == "float32" and narrow.bfloat16_loss == wide.bfloat16_loss


def test_bfloat16_training_keeps_the_edit_and_says_so(folders, monkeypatch, tmp_path):
    used = []
    real = heal_mod.autocast

    def spy(device, on):
        used.append(on)
        return real(device, on)

    monkeypatch.setattr(heal_mod, "autocast", spy)
    monkeypatch.setattr(heal_mod, "choose_precision",
                        lambda *a: Precision("bfloat16", "test", 1.0, 1.0, 1.0))
    r = run_experiment(str(folders["gpt2"]), "share_qk,rank:2,symmetric", scope="layer", layers=[1], tokens=64,
                       window=32, reference=False,
                       heal=HealOptions(steps=3, lr=1e-2, batch_tokens=64, text=_text()))
    h = r.healing
    assert used and all(used) and h.precision.dtype == "bfloat16"
    assert len(h.runs) == 3 and h.step_seconds > 0
    for run in h.runs:  # the forms compute in float32 under autocast (rank's factor product included)
        assert run.violation < 1e-6 and all(torch.isfinite(torch.tensor(run.train_loss)))
        assert [p.step for p in run.curve] == [3]


def test_fully_covered_originals_are_not_kept(folders, monkeypatch):
    """The edited layers' weights live in the form once: a module weight the form covers whole keeps no original."""
    sizes = {}
    real = heal_mod.Healer.train

    def train(self, *args):
        for name, p in self.model.named_parameters():
            if "original" in name:
                sizes[name] = p.numel()
        return real(self, *args)

    monkeypatch.setattr(heal_mod.Healer, "train", train)
    run_experiment(str(folders["gpt2"]), "share_qk", scope="layer", layers=[1], tokens=64, window=32,
                   reference=False, heal=HealOptions(steps=1, batch_tokens=64, text=_text()))
    assert sizes and all(n == 0 for n in sizes.values()), sizes


def test_cli_curve_in_the_document_and_the_figure(folders, tmp_path):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app
    from tests.cli.schema import validate

    (tmp_path / "words.txt").write_text(_text().text)
    out = tmp_path / "healed.json"
    r = CliRunner().invoke(app, ["experiment", str(folders["gpt2"]), "--edit", "share_qk,rank:2", "--scope",
                                 "layer", "--layers", "1", "--tokens", "64", "--window", "32", "--text",
                                 str(tmp_path / "words.txt"), "--heal", "4", "--heal-eval-every", "2",
                                 "--heal-lr", "0.01", "--heal-batch", "64", "--heal-float32", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = validate(json.loads(out.read_text()))
    h = doc["healing"]
    assert h["eval_every"] == 2 and h["precision"]["dtype"] == "float32"
    assert h["precision"]["reason"] == "float32 asked for (--heal-float32)"  # the CLI's own name
    assert [p["step"] for p in h["control_curve"]] == [0, 2, 4]
    assert all([p["step"] for p in x["curve"]] == [0, 2, 4] for x in h["runs"])
    png = tmp_path / "healing.png"
    r = CliRunner().invoke(app, ["plot", "--kind", "healing", "--experiment", str(out), "-o", str(png)])
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 0
    r = CliRunner().invoke(app, ["experiment", str(folders["gpt2"]), "--heal", "2", "--heal-eval-every", "0"])
    assert r.exit_code == 2 and "--heal-eval-every" in r.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")
def test_cuda_healing_curve_matches_the_cpu_in_float32(folders):
    """--device cuda: the same run in float32 gives the CPU's curve to float rounding, and bfloat16 autocast is
    measured there (CUDA computes it natively) and said."""
    kw = dict(scope="layer", layers=[1], tokens=128, window=32, batch_tokens=64, reference=False)
    opts = HealOptions(steps=4, lr=1e-3, batch_tokens=64, text=_text(), eval_every=2, float32=True)
    cpu = run_experiment(str(folders["gpt2"]), "share_qk", heal=opts, **kw).healing
    gpu = run_experiment(str(folders["gpt2"]), "share_qk", heal=opts, device="cuda", **kw).healing
    assert gpu.device.startswith("cuda") and gpu.runs[0].violation < 1e-6
    for a, b in zip(cpu.runs[0].curve, gpu.runs[0].curve, strict=True):
        assert a.step == b.step and b.loss == pytest.approx(a.loss, rel=2e-3)
        assert b.diff == pytest.approx(a.diff, abs=2e-3 * max(1.0, abs(a.diff)))
    auto = run_experiment(str(folders["gpt2"]), "share_qk", device="cuda", **kw,
                          heal=HealOptions(steps=2, lr=1e-2, batch_tokens=64, text=_text())).healing
    assert "CUDA" in auto.precision.reason and auto.precision.bfloat16_loss is not None
    # a model in memory on the GPU: its edits are computed on the CPU and written back to the GPU
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folders["gpt2"]).cuda()
    forced = run_experiment(model, "share_qk,rank:2", tokenizer=AutoTokenizer.from_pretrained(folders["gpt2"]),
                            **kw, heal=HealOptions(steps=2, lr=1e-2, batch_tokens=64, text=_text()))
    assert all(r.violation < 1e-6 for r in forced.healing.runs) and forced.healing.device.startswith("cuda")


def test_strided_placements_read_what_the_index_maps_read():
    """A module weight that is one canonical tensor with permuted axes is read as a view (no index map kept); the
    view gives exactly the elements the map would gather, and anything else stays a map."""
    import itertools

    from qkinspect.experiment.edits.parametrised import strided

    shape, start = (3, 4, 5), 7
    flat = torch.randn(100)
    for perm in itertools.permutations(range(3)):
        dims = [shape[p] for p in perm]
        for out in ((dims[0] * dims[1], dims[2]), (dims[0], dims[1] * dims[2]), tuple(dims)):
            index = (torch.arange(60).view(shape).permute(perm).reshape(out) + start).to(torch.int32)
            st = strided(index, {start: shape})
            assert st is not None and torch.equal(st.read(flat), flat[index.long()])
            st.view(back := torch.zeros(100)).copy_(flat[index.long()].reshape(st.view(back).shape))
            assert torch.equal(back[start:start + 60], flat[start:start + 60])  # and writes back where it read
    index = torch.arange(60).view(3, 20) + start
    swapped = index.clone()
    swapped[0, 0], swapped[0, 1] = index[0, 1], index[0, 0]
    assert strided(swapped, {start: shape}) is None  # not a permutation of axes
    assert strided(index, {0: shape}) is None  # not where a canonical tensor starts
    assert strided(torch.where(index == start, -1, index), {start: shape}) is None  # not every element


def test_layouts_are_views_where_the_family_allows(folders):
    from qkinspect.experiment.edits.apply import Edit, apply_edit
    from qkinspect.experiment.edits.parametrised import Strided
    from qkinspect.experiment.model.runtime import load_hf
    from qkinspect.experiment.model.writeback import module_maps
    from qkinspect.loading import open_model

    for family, views in (("bert", True), ("gpt2", False)):  # separate projections; gpt2's fused c_attn
        with open_model(str(folders[family])) as m:
            hf = load_hf(m.resolved)
            layer = apply_edit(m.layer(m.info.blocks[0].key, 1), Edit("share_qk"), [0]).layer
        maps = module_maps(hf, layer)
        kinds = {name: isinstance(v, Strided) for name, v in maps.items()}
        assert any(kinds.values()) == views or family == "gpt2", kinds
        if family == "bert":
            assert kinds["attention.self.query.weight"] and kinds["attention.self.key.weight"], kinds
        else:
            assert not kinds["attn.c_attn.weight"], kinds
