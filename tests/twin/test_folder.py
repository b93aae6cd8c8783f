"""The twin folder: resumable with identical records, the held-out text never trained on, checkpoints that
analyze reads, and a checked reader."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkinspect
from qkinspect.errors import InputError
from qkinspect.twin.data import batch_starts, gather
from qkinspect.twin.saved import read_twin
from tests.twin.conftest import TINY, text_file


def test_qkinspect_twin_is_the_library_call(tmp_path, small_text):
    result = qkinspect.twin(tmp_path, text=small_text, variants="share_qk", seeds=2, steps=4, **TINY)
    assert [s.variant for s in result.summaries] == ["standard", "share_qk"]
    assert {(r.variant, r.seed) for r in result.runs} == {(v, s) for v in ("standard", "share_qk") for s in (0, 1)}
    assert result.to_pandas("summary").shape[0] == 2 and "<pre" in result._repr_html_()


def test_resuming_gives_identical_records(tmp_path, small_text):
    kw = dict(text=small_text, variants="symmetric", seeds=2, steps=4, eval_every=2, **TINY)
    first = qkinspect.twin(tmp_path / "a", **kw)
    done = sorted((tmp_path / "a" / "runs").iterdir())
    done[-1].unlink()  # an interrupted run: the others are kept, the missing one computed again
    stamps = {p.name: p.stat().st_mtime_ns for p in done[:-1]}
    again = qkinspect.twin(tmp_path / "a", **kw)
    assert {p.name: p.stat().st_mtime_ns for p in done[:-1]} == stamps  # not run again
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    for kind in ("runs", "summary", "trajectories"):
        assert strip(again.rows(kind)) == strip(first.rows(kind)), kind
    assert read_twin(tmp_path / "a").rows("summary") == again.rows("summary")


def test_an_lr_sweep_chooses_on_seed_0_then_runs_every_seed_at_it(tmp_path, small_text):
    result = qkinspect.twin(tmp_path, text=small_text, variants="share_qk", seeds=2, steps=4, lr="1e-3,1e-2",
                            **TINY)
    chosen = {t.variant: t.lr for t in result.lr_sweep if t.chosen}
    assert len(result.lr_sweep) == 4 and set(chosen) == {"standard", "share_qk"}
    for v, lr in chosen.items():
        assert {r.seed for r in result.runs if r.variant == v and r.lr == lr} == {0, 1}
        assert {r.seed for r in result.runs if r.variant == v and r.lr != lr} == {0}


def test_no_held_out_token_in_a_training_batch(tmp_path):
    text = text_file(tmp_path / "t.txt", 4000, held_out_marker=True)  # 'Z' only in the held-out tenth
    qkinspect.twin(tmp_path / "out", text=text, tokenizer="byte", seeds=1, steps=2, variants="standard", **TINY)
    train = np.load(tmp_path / "out" / "tokens" / "train.npy")
    held = np.load(tmp_path / "out" / "tokens" / "held_out.npy")
    assert ord("Z") in held and ord("Z") not in train
    for seed in range(3):  # every window of every step of any seed is cut from the training stream
        windows = gather(train, batch_starts(len(train), 16, 4, 200, seed).reshape(-1), 16)
        assert ord("Z") not in windows


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_saved_checkpoints_read_back_by_analyze_with_symmetry_one(tmp_path, small_text, arch):
    result = qkinspect.twin(tmp_path, text=small_text, variants="share_qk,symmetric,share_qk_reformer", arch=arch,
                            seeds=1, steps=3,
                            save_checkpoints=True, **TINY)
    for run in result.runs:
        folder = tmp_path / run.checkpoint
        assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
        if run.variant == "standard":
            continue
        heads = qkinspect.analyze(str(folder), metrics=["symmetry"]).heads
        assert heads and all(h.values["symmetry"] == pytest.approx(1.0, abs=1e-5) for h in heads)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_share_kv_checkpoints_read_back_by_analyze_with_keys_equal_to_values(tmp_path, small_text, arch):
    result = qkinspect.twin(tmp_path, text=small_text, variants="share_kv", arch=arch, seeds=1, steps=3,
                            save_checkpoints=True, **TINY)
    run = next(r for r in result.runs if r.variant == "share_kv")
    heads = qkinspect.analyze(str(tmp_path / run.checkpoint), metrics=["cosine_kv", "overlap_kv"]).heads
    assert len(heads) == 2 * 4  # every head of both layers
    assert all(h.values["cosine_kv"] == pytest.approx(1.0, abs=1e-5) for h in heads)
    assert all(h.values["overlap_kv"] == pytest.approx(1.0, abs=1e-4) for h in heads)
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    out = CliRunner().invoke(app, ["analyze", str(tmp_path / run.checkpoint), "--metrics", "cosine_kv", "-f", "csv"])
    assert out.exit_code == 0 and out.output.count("\n") >= 9, out.output


def test_bilinear_saves_its_tensors_and_says_why_analyze_cannot(tmp_path, small_text):
    result = qkinspect.twin(tmp_path, text=small_text, variants="bilinear", seeds=2, lr="1e-3,2e-3", steps=2,
                            save_checkpoints=True, **TINY)
    run = next(r for r in result.runs if r.variant == "bilinear")
    assert "analyze cannot read" in run.note and (tmp_path / run.checkpoint / "README.txt").is_file()
    # said once for the variant, not once for each of its three runs (two lrs on seed 0, then seed 1)
    assert sum(n.startswith("bilinear:") for n in result.notes) == 1


def test_the_reader_refuses_a_bad_folder_in_one_line(tmp_path, small_text):
    qkinspect.twin(tmp_path, text=small_text, seeds=1, steps=2, variants="standard", **TINY)
    run = next((tmp_path / "runs").iterdir())
    manifest = json.loads((tmp_path / "twin.json").read_text())
    manifest["setup"]["text"] = 5  # what the reader does not need is not trusted either: no crash
    (tmp_path / "twin.json").write_text(json.dumps(manifest))
    assert read_twin(tmp_path).runs
    doc = json.loads(run.read_text())
    doc["run"]["points"][0]["val_loss"] = "NaN"
    run.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="val_loss"):
        read_twin(tmp_path)
    (tmp_path / "twin.json").write_text("[1]")
    with pytest.raises(InputError, match="twin.json"):
        read_twin(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        read_twin(tmp_path / "nothing")


def test_bpe_is_trained_on_the_training_text_only(tmp_path):
    text = text_file(tmp_path / "t.txt", 4000, held_out_marker=True)
    result = qkinspect.twin(tmp_path / "out", text=text, tokenizer="bpe:300", seeds=1, steps=2, variants="standard",
                            **TINY)
    tok = result.setup["tokenizer"]
    assert tok["kind"] == "bpe:300" and len(tok["sha256"]) == 64
    vocab = json.loads((tmp_path / "out" / "tokens" / "tokenizer.txt").read_text())["model"]["vocab"]
    assert not any("ZZ" in piece for piece in vocab)  # 'Z' runs only in the held-out text: never merged
    assert result.setup["text"]["sha256"] and result.setup["text"]["files"] == ["t.txt"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="no CUDA device (torch.cuda.is_available() is False)")
def test_twins_on_cuda_train_as_on_the_cpu(tmp_path, small_text):
    """The same seeds, initial weights and batches on cuda: the held-out losses agree with the CPU's to float32
    rounding accumulated over a few steps (every variant held, the Reformer's attention function included)."""
    kw = dict(text=small_text, variants="share_qk,share_qk_reformer,symmetric,bilinear", seeds=1, steps=6,
              eval_every=3, **TINY)
    cpu = qkinspect.twin(tmp_path / "cpu", **kw)
    gpu = qkinspect.twin(tmp_path / "cuda", device="cuda", **kw)
    key = lambda p: (p.variant, p.seed, p.step)  # noqa: E731
    a, b = sorted(cpu.points, key=key), sorted(gpu.points, key=key)
    assert [key(p) for p in a] == [key(p) for p in b] and len(a) == 15
    assert max(abs(p.val_loss - q.val_loss) for p, q in zip(a, b, strict=True)) < 2e-3
    assert all(r.violation < 1e-4 for r in gpu.runs)
