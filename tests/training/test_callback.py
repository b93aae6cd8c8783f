"""The training callback: each step's records equal `analyze` of the checkpoint saved at that step, the summaries
reach the trainer's loggers, and the folder is a sweep folder that plot and report read."""

from __future__ import annotations

import json
import math

import pytest
import torch

import qkinspect
from qkinspect.callback import Tracker, track
from qkinspect.errors import InputError


def _tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=8, intermediate_size=48, vocab_size=30,
                                        max_position_embeddings=32))


def _data(n=8, length=12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 30, (n, length), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def _rows_equal(a, b) -> bool:
    return all((x is None and (y is None or math.isnan(y))) or x == y for x, y in zip(a, b, strict=True))


@pytest.fixture
def trained(tmp_path):
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from qkinspect.callback import QKCallback

    class Recorder(TrainerCallback):  # stands for TensorBoard / W&B: what the trainer's loggers receive
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append((state.global_step, dict(logs)))

    recorder = Recorder()
    args = TrainingArguments(output_dir=str(tmp_path / "ckpt"), max_steps=4, save_steps=2, save_strategy="steps",
                             per_device_train_batch_size=2, learning_rate=5e-2, report_to=[], use_cpu=True,
                             logging_steps=100, disable_tqdm=True, seed=0)
    trainer = Trainer(model=_tiny_llama(), args=args, train_dataset=_data(), callbacks=[recorder])
    cb = QKCallback.attach(trainer, tmp_path / "qk", every=2, metrics=["symmetry", "overlap_qk"])
    trainer.train()
    return tmp_path, cb, recorder


def test_callback_records_equal_analyze_of_the_saved_checkpoints(trained):
    from qkinspect.sweep import read_sweep

    tmp_path, cb, recorder = trained
    sweep = read_sweep(tmp_path / "qk")
    assert [c.step for c in sweep.checkpoints] == [0, 2, 4]
    assert {c.step_source for c in sweep.checkpoints} == {"training"}
    rows = sweep.rows()
    for step in (2, 4):
        want = qkinspect.analyze(tmp_path / "ckpt" / f"checkpoint-{step}", metrics=["symmetry", "overlap_qk"])
        got = [r for r in rows if r["step"] == step]
        assert len(got) == len(want.heads) == 8
        for r, h in zip(got, want.heads, strict=True):
            assert (r["layer"], r["head"]) == (h.layer, h.head)
            assert _rows_equal([r["symmetry"], r["overlap_qk"]], [h.values["symmetry"], h.values["overlap_qk"]])
    first = [r["symmetry"] for r in rows if r["step"] == 0]
    assert first != [r["symmetry"] for r in rows if r["step"] == 4]  # training moved the weights
    # the summaries went through trainer.log, so every logger the trainer has received them
    logged = {step: logs for step, logs in recorder.logs if "qkinspect/seconds" in logs}
    assert sorted(logged) == [0, 2, 4]
    want2 = qkinspect.analyze(tmp_path / "ckpt" / "checkpoint-2", metrics=["symmetry"])
    layer0 = sorted(h.values["symmetry"] for h in want2.heads if h.layer == 0)
    assert logged[2]["qkinspect/symmetry/decoder_layer_0"] == pytest.approx((layer0[1] + layer0[2]) / 2, rel=1e-6)
    state = json.loads((tmp_path / "ckpt" / "checkpoint-4" / "trainer_state.json").read_text())
    assert any("qkinspect/symmetry/decoder_layer_1" in e for e in state["log_history"])


def test_plot_and_report_read_the_run_folder(trained, tmp_path):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    run = trained[0] / "qk"
    r = CliRunner().invoke(app, ["plot", str(run), "--kind", "trajectory", "-o", str(tmp_path / "t.png")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "t.png").stat().st_size > 10_000
    r = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "r.pdf")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r.pdf").read_bytes().startswith(b"%PDF")


def test_track_in_a_hand_written_loop(tmp_path):
    """track() for a loop without Trainer: a live folder after every call, continued across calls."""
    from qkinspect.sweep import read_sweep

    model = _tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for step, batch in enumerate(_data(4), start=1):
        model(input_ids=batch["input_ids"][None], labels=batch["labels"][None]).loss.backward()
        opt.step()
        opt.zero_grad()
        logs = track(model, step, tmp_path / "run", layers=[1], heads=[0, 1], metrics=["symmetry"])
        seen.append(logs)
        assert [c.step for c in read_sweep(tmp_path / "run").checkpoints] == list(range(1, step + 1))
    assert set(seen[0]) == {"qkinspect/symmetry/decoder_layer_1", "qkinspect/seconds"}
    final = qkinspect.analyze(model, layers=[1], heads=[0, 1], metrics=["symmetry"])
    rows = [r for r in read_sweep(tmp_path / "run").rows() if r["step"] == 4]
    assert [r["symmetry"] for r in rows] == [h.values["symmetry"] for h in final.heads]
    with pytest.raises(InputError, match="other options"):
        Tracker(tmp_path / "run", metrics=["overlap_qk"])
    with pytest.raises(InputError, match="step="):
        track(model, -1, tmp_path / "run", layers=[1], heads=[0, 1], metrics=["symmetry"])


def test_import_stays_light():
    import subprocess
    import sys

    code = "import sys, qkinspect.callback; print('transformers' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# -- the trainer's own logs stay whole --------------------------------------------------------------------------------

TIMINGS = ("runtime", "per_second")  # wall-clock entries differ between any two runs


def _train_logging(tmp_path, logging_steps, every=None):
    """A 6-step run of a tiny Llama with dropout (so a callback that drew from the trainer's random numbers would
    change the losses), evaluated every 2 steps; returns log_history and what a logger callback received."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from qkinspect.callback import QKCallback

    class Recorder(TrainerCallback):  # stands for TensorBoard / W&B
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append({**logs, "step": state.global_step})

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, intermediate_size=48, vocab_size=30,
                                         max_position_embeddings=32, attention_dropout=0.3))
    name = f"run-{logging_steps}-{every}"
    args = TrainingArguments(output_dir=str(tmp_path / name), max_steps=6, per_device_train_batch_size=2,
                             learning_rate=5e-2, report_to=[], use_cpu=True, logging_steps=logging_steps,
                             eval_strategy="steps", eval_steps=2, save_strategy="no", disable_tqdm=True, seed=0)
    recorder = Recorder()
    trainer = Trainer(model=model, args=args, train_dataset=_data(), eval_dataset=_data(4), callbacks=[recorder])
    if every is not None:
        QKCallback.attach(trainer, tmp_path / f"{name}-qk", every=every, metrics=["symmetry"])
    trainer.train()
    return trainer.state.log_history, recorder.logs


def _trainers_own(entries):
    """The entries the trainer wrote itself (not qkinspect's), wall-clock timings left out."""
    return [{k: v for k, v in e.items() if not any(t in k for t in TIMINGS)} for e in entries
            if not any(k.startswith("qkinspect/") for k in e)]


@pytest.mark.parametrize("logging_steps", [1, 2, 3])
def test_the_callback_leaves_every_log_entry_of_the_trainer(tmp_path, logging_steps):
    """Step for step, with and without the callback (every 2 and 3 steps): the same loss, learning-rate, grad-norm
    and eval entries, with the same values, and a logger callback receives them and the qkinspect summaries."""
    want, want_seen = _train_logging(tmp_path, logging_steps)
    own = _trainers_own(want)
    assert [e["step"] for e in own if "loss" in e] == list(range(logging_steps, 7, logging_steps))
    assert [e["step"] for e in own if "eval_loss" in e] == [2, 4, 6]
    assert all("learning_rate" in e for e in own if "loss" in e)
    for every in (2, 3):
        got, seen = _train_logging(tmp_path, logging_steps, every)
        assert _trainers_own(got) == own, (logging_steps, every)
        assert _trainers_own(seen) == _trainers_own(want_seen)  # the logger got every entry of the trainer's
        qk = [e["step"] for e in seen if "qkinspect/seconds" in e]
        assert qk == [0, *range(every, 7, every)] + ([] if 6 % every == 0 else [6])  # and every measurement
        assert qk == [e["step"] for e in got if "qkinspect/seconds" in e]


# -- a selection in any form the docs show is stored as the numbers it selects -----------------------------------------

SELECTIONS = [  # (layers, heads, blocks) as a user writes them; the tiny Llama has 2 layers of 4 heads
    ({"layers": "0-1"}, [0, 1], None),
    ({"layers": "0,1", "heads": "0,2"}, [0, 1], [0, 2]),
    ({"layers": 1, "heads": 3}, [1], [3]),
    ({"layers": [1, 0, 1], "heads": (0, 1)}, [0, 1], [0, 1]),
    ({"layers": range(2), "heads": "1-2", "blocks": "decoder"}, [0, 1], [1, 2]),
]


def _plot_and_report(run, tmp_path):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    for args in (["plot", str(run), "--kind", "trajectory", "-o", str(tmp_path / "t.png")],
                 ["report", str(run), "-o", str(tmp_path / "r.pdf")]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output


@pytest.mark.parametrize(("chosen", "layers", "heads"), SELECTIONS)
def test_track_takes_every_selection_form_the_docs_show(tmp_path, chosen, layers, heads):
    """track() called again and again with "0-1", "0,1", an int, a list, a tuple, a range: the folder is continued
    (not refused as written with other options), stores the indexes, and plot and report read it."""
    from qkinspect.sweep import read_sweep

    model = _tiny_llama()
    for step in (1, 2, 3):
        track(model, step, tmp_path / "run", metrics=["symmetry"], **chosen)
    sweep = read_sweep(tmp_path / "run")
    assert [c.step for c in sweep.checkpoints] == [1, 2, 3]
    assert (sweep.options["layers"], sweep.options["heads"]) == (layers, heads)
    assert sweep.options["blocks"] == (["decoder"] if "blocks" in chosen else None)
    rows = [r for r in sweep.rows() if r["step"] == 3]
    assert sorted({r["layer"] for r in rows}) == layers
    assert sorted({r["head"] for r in rows}) == (heads or [0, 1, 2, 3])
    # the same selection in another form continues the folder
    Tracker(tmp_path / "run", metrics=["symmetry"], layers=list(layers), heads=heads,
            blocks=chosen.get("blocks"))
    _plot_and_report(tmp_path / "run", tmp_path)


def test_callback_with_a_text_selection_trains_and_plots(tmp_path):
    """QKCallback.attach(trainer, out, layers="0-1", heads="0,3"): train, then plot and report read the folder."""
    from transformers import Trainer, TrainingArguments

    from qkinspect.callback import QKCallback
    from qkinspect.sweep import read_sweep

    args = TrainingArguments(output_dir=str(tmp_path / "ckpt"), max_steps=2, per_device_train_batch_size=2,
                             learning_rate=5e-2, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                             seed=0)
    trainer = Trainer(model=_tiny_llama(), args=args, train_dataset=_data())
    QKCallback.attach(trainer, tmp_path / "qk", every=1, layers="0-1", heads="0,3", metrics=["symmetry"])
    trainer.train()
    sweep = read_sweep(tmp_path / "qk")
    assert [c.step for c in sweep.checkpoints] == [0, 1, 2]
    assert (sweep.options["layers"], sweep.options["heads"]) == ([0, 1], [0, 3])
    _plot_and_report(tmp_path / "qk", tmp_path)


def test_a_bad_selection_is_refused_before_training(tmp_path):
    with pytest.raises(InputError, match="layers="):
        Tracker(tmp_path / "run", layers="0-x")
    assert not (tmp_path / "run").exists()


def test_a_folder_an_earlier_version_wrote_with_a_text_selection_is_read(tmp_path):
    """Before selections were stored as indexes, track(..., layers="0-1") stored "0-1" in the manifest and each
    result, with keys of those options: such a folder is read (its keys checked as stored) and plot and report draw
    it; a stored text that is no selection is refused naming the file and the key."""
    import json

    from qkinspect.sweep import read_sweep
    from qkinspect.sweep.checkpoints import Checkpoint
    from qkinspect.sweep.keys import stored_key

    model = _tiny_llama()
    for step in (1, 2):
        track(model, step, tmp_path / "run", metrics=["symmetry"], layers="0-1", heads="0,2")
    manifest_path = tmp_path / "run" / "sweep.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["options"].update(layers="0-1", heads="0,2")  # as the earlier version stored them
    renamed = {}
    for ck in manifest["checkpoints"]:
        fields = {k: ck[k] for k in ("spec", "revision", "name", "identity", "step", "step_source")}
        old = stored_key(Checkpoint(**fields), manifest["options"])
        renamed[ck["key"]], ck["key"] = old, old
    manifest_path.write_text(json.dumps(manifest))
    for path in (tmp_path / "run").rglob("*.json"):
        doc = json.loads(path.read_text())
        if doc.get("kind") == "sweep-result":
            doc["key"], doc["options"] = renamed[doc["key"]], manifest["options"]
            path.rename(path.with_name(path.name.replace(path.name.split(".")[-2], doc["key"])))
            path.with_name(path.name.replace(path.name.split(".")[-2], doc["key"])).write_text(json.dumps(doc))
    sweep = read_sweep(tmp_path / "run")
    assert (sweep.options["layers"], sweep.options["heads"]) == ([0, 1], [0, 2])
    assert sorted({r["layer"] for r in sweep.rows()}) == [0, 1]
    _plot_and_report(tmp_path / "run", tmp_path)

    manifest["options"]["layers"] = "0-x"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"options\.layers.*not a selection"):
        read_sweep(tmp_path / "run")
