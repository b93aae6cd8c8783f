"""Healing: the edit stays exactly in its set at every step, the control and the edited run see the same batches,
which share no token with the scored text, and the paired difference has the right standard error."""

from __future__ import annotations

import random
import string

import pytest
import torch

from qkinspect.errors import InputError
from qkinspect.experiment import heal as heal_mod
from qkinspect.experiment.model.scoring import Text
from qkinspect.experiment.requests import HealOptions
from qkinspect.experiment.run import run_experiment
from tests.experiment import tiny_models


def _text(n=6000, seed=0) -> Text:
    rnd = random.Random(seed)
    words = ["".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(2, 7))) for _ in range(n // 5)]
    return Text("random words", " ".join(words))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("heal")
    return {f: getattr(tiny_models, f)(root / f) for f in ("llama", "gpt2", "bert")}


def _qk_heads(model, family, layer):
    """(W_Q, W_K) per query head (H, D, d) read straight from the family's modules (not through qkinspect), as
    copies (a module weight may be a view of the parameter the optimizer updates in place)."""
    if family == "llama":
        a = model.model.layers[layer].self_attn
        H, d = model.config.num_attention_heads, model.config.head_dim
        q, k = a.q_proj.weight, a.k_proj.weight
        Wq = q.detach().view(H, d, -1)
        Wk = k.detach().view(-1, d, q.shape[1])
        if Wk.shape[0] != H:  # not expanded: head h reads KV head h // group
            Wk = Wk[torch.arange(H) // (H // Wk.shape[0])]
        return Wq.mT.clone(), Wk.mT.clone()
    if family == "gpt2":
        c = model.transformer.h[layer].attn.c_attn.weight.detach()  # (D, 3D) [in, out]: [q | k | v]
        D, H = c.shape[0], model.config.n_head
        q, k = c[:, :D], c[:, D:2 * D]
        return q.view(D, H, -1).permute(1, 0, 2).clone(), k.view(D, H, -1).permute(1, 0, 2).clone()
    s = model.bert.encoder.layer[layer].attention.self
    H = model.config.num_attention_heads
    return (s.query.weight.detach().view(H, -1, s.query.weight.shape[1]).mT.clone(),
            s.key.weight.detach().view(H, -1, s.key.weight.shape[1]).mT.clone())


CASES = [("llama", "share_qk"), ("llama", "symmetric"), ("llama", "rank:3"), ("llama", "tie_k"),
         ("gpt2", "share_qk"), ("gpt2", "rank:2"), ("bert", "symmetric"), ("bert", "tie_q")]


@pytest.mark.parametrize(("family", "edit"), CASES)
def test_the_edit_holds_exactly_at_every_step(folders, family, edit, monkeypatch):
    seen = []  # (step, W_Q, W_K) of the edited layer as the modules hold them, at every step of the edited run
    original_train = heal_mod.Healer.train

    def train(self, on_step=None, *args):
        def hook(model, step):
            if self.forms:
                seen.append((step, *_qk_heads(model, family, 1)))
            if on_step is not None:
                on_step(model, step)

        return original_train(self, hook, *args)

    monkeypatch.setattr(heal_mod.Healer, "train", train)
    opts = HealOptions(steps=4, lr=3e-2, batch_tokens=64, text=_text())
    r = run_experiment(str(folders[family]), edit, scope="layer", layers=[1], heads=[0, 2], tokens=96, window=32,
                       reference=False, heal=opts)
    run = r.healing.runs[0]
    assert run.violation < 1e-6
    assert [s for s, *_ in seen] == [0, 1, 2, 3, 4]
    first_q = seen[0][1]
    for step, Wq, Wk in seen:
        for h in (0, 2):
            q, k = Wq[h].double(), Wk[h].double()
            scale = q.abs().max()
            if edit in ("share_qk", "tie_k", "tie_q"):
                assert torch.equal(q, k), (step, h)
            elif edit == "symmetric":
                M = q @ k.T
                assert (M - M.T).abs().max() <= 1e-5 * M.abs().max(), (step, h)
            else:  # rank:K: W_Q W_Kᵀ has rank <= K (its rotary blocks included)
                K = int(edit.split(":")[1])
                S = torch.linalg.svdvals(q @ k.T)
                assert S[K:].max() <= 1e-5 * S[0], (step, h, S)
            assert scale > 0
        unedited = [h for h in range(Wq.shape[0]) if h not in (0, 2)]
        assert not torch.equal(Wq[unedited], Wk[unedited])  # the other heads stay free
    assert not torch.equal(seen[-1][1], first_q)  # healing did train the edited heads


def test_control_and_edited_see_the_same_batches_unlike_the_scored_ones(folders, monkeypatch):
    calls = []
    real = heal_mod._with_labels

    def spy(inputs, kind):
        calls.append(inputs["input_ids"].clone())
        return real(inputs, kind)

    monkeypatch.setattr(heal_mod, "_with_labels", spy)
    r = run_experiment(str(folders["llama"]), "share_qk,tie_k", scope="head", layers=[2], heads=[1], tokens=96,
                       window=32, text=_text(), heal=HealOptions(steps=3, lr=1e-2, batch_tokens=64))
    h = r.healing
    assert len(h.runs) == 3 and len(calls) == 4 * 3  # control, share_qk, tie_k, ablate: 3 steps each
    runs = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))
    assert not torch.equal(runs[0][0], runs[0][1])  # the steps do move through the text
    # no training window repeats a scored token position: the scored windows are the text's first 96 tokens
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folders["llama"])
    ids = tok(_text().text, add_special_tokens=False)["input_ids"]
    scored = torch.tensor(ids[:96]).view(3, 32)
    for batch in runs[0]:
        for row in batch:
            start = next(i for i in range(len(ids) - 31) if ids[i:i + 32] == row.tolist())
            assert start >= 96
    assert all(x.control_loss == h.control_loss for x in h.runs)
    del scored


def test_results_and_options(folders, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folders["llama"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = run_experiment(model, "share_qk", scope="model", layers=[0, 1], tokens=96, window=32, text=_text(),
                       tokenizer=AutoTokenizer.from_pretrained(folders["llama"]),
                       heal=HealOptions(steps=2, lr=1e-2, batch_tokens=64, train="all"))
    h = r.healing
    assert h.trained_parameters == h.parameters and h.train == "all"
    assert h.control_gain == pytest.approx(h.control_loss - r.baseline)
    run = next(x for x in h.runs if x.edit == "share_qk")
    assert run.diff == pytest.approx(run.loss - run.control_loss, rel=1e-9, abs=1e-12)
    exact = next(x for x in r.runs if x.edit == "share_qk")
    assert run.unhealed == exact.dloss and run.recovered == pytest.approx(1 - run.diff / exact.dloss)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # the user's model untouched
    with pytest.raises(InputError, match="heal.train='mlp'"):
        run_experiment(model, "share_qk", heal=HealOptions(steps=1, train="mlp"))
    with pytest.raises(InputError, match="heal=0"):
        run_experiment(model, "share_qk", heal=HealOptions(steps=0))
    with pytest.raises(InputError, match="rotary='gauge'"):
        run_experiment(str(folders["llama"]), "share_qk", layers=[0], heads=[0], tokens=64, window=32,
                       rotary="offset0", heal=1)


def test_heal_refusals_name_the_options_as_the_caller_spells_them(folders, tmp_path):
    """What is refused once the model is loaded (a text with nothing left to train on after the scored tokens, a
    missing heal text) says `heal` / `heal.text` to the library's caller and --heal / --heal-text on the CLI."""
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    short = " ".join(_text().text.split()[:12])  # fewer tokens than the scored ones: none left to train on
    (tmp_path / "short.txt").write_text(short)
    common = dict(scope="layer", layers=[1], tokens=64, window=32)
    with pytest.raises(InputError, match=r"^heal: .*/short\.txt after the 64 scored tokens leaves no tokens to "
                                         r"train on \(give heal\.text\)$"):
        run_experiment(str(folders["gpt2"]), "share_qk", text=tmp_path / "short.txt", heal=1, **common)
    with pytest.raises(InputError, match=r"missing\.txt: cannot read heal\.text \(no such file\)$"):
        run_experiment(str(folders["gpt2"]), "share_qk", heal=HealOptions(steps=1, text=tmp_path / "missing.txt"),
                       **common)
    args = ["experiment", str(folders["gpt2"]), "--edit", "share_qk", "--scope", "layer", "--layers", "1",
            "--tokens", "64", "--window", "32", "--heal", "1"]
    r = CliRunner().invoke(app, [*args, "--text", str(tmp_path / "short.txt")])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert (f"--heal: {tmp_path / 'short.txt'} after the 64 scored tokens leaves no tokens to train on "
            "(give --heal-text)") in r.stderr, r.stderr
    r = CliRunner().invoke(app, [*args, "--heal-text", str(tmp_path / "missing.txt")])
    assert r.exit_code == 2 and "missing.txt: cannot read --heal-text (no such file)" in r.stderr, r.output


def test_cli_heal(folders, tmp_path):
    import json

    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    (tmp_path / "words.txt").write_text(_text().text)
    args = ["experiment", str(folders["gpt2"]), "--edit", "share_qk", "--scope", "layer", "--layers", "1",
            "--tokens", "64", "--window", "32", "--text", str(tmp_path / "words.txt"), "--heal", "2",
            "--heal-lr", "0.01", "--heal-batch", "64", "--heal-track", str(tmp_path / "tracks")]
    r = CliRunner().invoke(app, [*args, "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    h = doc["healing"]
    assert h["steps"] == 2 and h["train"] == "attention" and len(h["runs"]) == 2
    assert h["runs"][0]["violation"] < 1e-6 and len(h["runs"][0]["train_loss"]) == 2
    assert set(h["tracks"]) == {"control", "share_qk-L1", "ablate-L1"}
    r = CliRunner().invoke(app, ["plot", h["tracks"]["share_qk-L1"], "--kind", "trajectory", "-o",
                                 str(tmp_path / "t.png")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, [*args[:-2], "--heal-train", "mlp"])
    assert r.exit_code == 2


def test_expanded_groups_keep_their_shared_keys_and_values(folders, monkeypatch):
    """share_qk on one head of a grouped-query layer gives that head its own key; healing must not give the other
    heads of its group keys (or any head values) of their own."""
    final = {}
    original_train = heal_mod.Healer.train

    def train(self, on_step=None, *args):
        original_train(self, on_step, *args)
        if self.forms:
            a = self.model.model.layers[2].self_attn
            final["k"] = a.k_proj.weight.detach().view(4, 16, -1)
            final["v"] = a.v_proj.weight.detach().view(4, 16, -1)
            final["q"] = a.q_proj.weight.detach().view(4, 16, -1)

    monkeypatch.setattr(heal_mod.Healer, "train", train)
    run_experiment(str(folders["llama"]), "share_qk", layers=[2], heads=[1], tokens=64, window=32, text=_text(),
                   reference=False, heal=HealOptions(steps=3, lr=3e-2, batch_tokens=64))
    k, v, q = final["k"], final["v"], final["q"]  # 4 query heads, groups {0, 1} and {2, 3}
    assert torch.equal(q[1], k[1])  # the edited head: one matrix
    assert not torch.equal(k[0], k[1])
    assert torch.equal(k[2], k[3])  # the untouched group still shares one key
    assert torch.equal(v[0], v[1]) and torch.equal(v[2], v[3])  # and every group one value
