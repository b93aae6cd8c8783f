"""Stacked training (qkinspect.twin.stacked): the batched model is transformers' model for every run, its AdamW
is each run's own, a stacked run's records equal the single run's, its files are a single run's, and it resumes
run by run."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkinspect
from qkinspect.errors import InputError
from qkinspect.twin.batched import FORMS, Stacked, to_state
from qkinspect.twin.model import build, state_tensors
from qkinspect.twin.request import Shape
from qkinspect.twin.stacked import _StackedAdamW, plan_stacks, stack_kind
from tests.one_line import one_error_line
from tests.twin.conftest import text_file

VARIANTS = ["standard", "share_qk", "symmetric", "share_qkv", "share_kv", "rank:2", "wq_identity"]
ALONE = ["share_qk_reformer", "bilinear"]  # attention functions of their own: stacks of their own


def _runs(arch: str, variants: list[str], seeds=(0, 1), vocab: int = 11):
    shape = Shape(arch, 2, 16, 2, 8)
    return [(v.partition(":")[0], build(v, shape, vocab, s)) for v in variants for s in seeds]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("variants", [VARIANTS, ALONE[:1], ALONE[1:]])
def test_the_batched_model_is_each_runs_transformers_model(arch, variants):
    """Dense reference: each run's loss through its own transformers model (the constraint's form on it) equals
    the stack's, and the stack holds each run's tensors exactly (the state dict round trip)."""
    from qkinspect.experiment.edits.parametrised import cached
    from qkinspect.twin.train import next_token_loss

    runs = _runs(arch, variants)
    model = Stacked.from_built(runs)
    x = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        per_run = model(x.unsqueeze(0).expand(len(runs), -1, -1))
    for r, (_, b) in enumerate(runs):
        with torch.no_grad(), cached(b.forms):
            want = float(next_token_loss(b.model, x))
        assert abs(float(per_run[r]) - want) < 2e-5
        state, back = state_tensors(b.model), to_state(model.cfg, model.run_tensors(r))
        assert state.keys() == back.keys()
        assert all(torch.equal(state[k], back[k]) for k in state)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_batched_gradients_are_each_runs_transformers_gradients(arch):
    """Dense reference for the backward (the norms' written-out backward, the rotary product, the attention on
    views): each run's gradient of every tensor outside the attention's q, k, v equals the gradient of its own
    transformers model; the fused attention kernel (a GPU's) and the CPU's products give the same losses."""
    from qkinspect.experiment.edits.parametrised import cached
    from qkinspect.twin.batched import ATTENTION, to_internal
    from qkinspect.twin.train import next_token_loss

    runs = _runs(arch, ["standard", "share_qk", "symmetric"])
    model = Stacked.from_built(runs)
    x = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(2))
    model(x.unsqueeze(0).expand(len(runs), -1, -1)).sum().backward()
    for r, (_, b) in enumerate(runs):
        b.model.zero_grad()
        with cached(b.forms):
            next_token_loss(b.model, x).backward()
        grads = {k: torch.full_like(v, float("nan")) for k, v in state_tensors(b.model).items()}
        grads.update({k: p.grad for k, p in b.model.named_parameters() if k in grads and p.grad is not None})
        want = to_internal(model.cfg, grads)  # NaN: a tensor read through a form (its gradient is the form's)
        checked = 0
        for key, p in model.shared.items():
            name = key.replace("__", ".")
            if name.partition(".")[2] in ATTENTION or name in ATTENTION or want[name].isnan().any():
                continue
            assert torch.allclose(p.grad[r], want[name], atol=2e-5, rtol=1e-4), (arch, r, name)
            checked += 1
        assert checked >= 9  # embeddings, norms, MLP and output (and W_O outside a form)
    x3 = x.unsqueeze(0).expand(len(runs), -1, -1)
    with torch.no_grad():
        model.fused = False
        mine = model(x3)
        model.fused = True
        fused = model(x3)
    assert torch.allclose(mine, fused, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(R=st.integers(1, 3), rows=st.integers(1, 5), D=st.integers(1, 9), seed=st.integers(0, 1000))
def test_the_written_out_rmsnorm_backward_is_autograds(R, rows, D, seed):
    """Identity: `_RMSNorm`'s output and gradients are autograd's through llama's formula (float64)."""
    from qkinspect.twin.batched import _RMSNorm

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, rows, D, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(R, D, dtype=torch.float64, generator=g, requires_grad=True)
    up = torch.randn(R, rows, D, dtype=torch.float64, generator=g)
    mine = _RMSNorm.apply(x, w, 1e-6)
    gx, gw = torch.autograd.grad(mine, (x, w), up)
    want = w.unsqueeze(1) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    wx, ww = torch.autograd.grad(want, (x, w), up)
    assert torch.allclose(mine, want) and torch.allclose(gx, wx) and torch.allclose(gw, ww)


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 7), H=st.integers(1, 3), half=st.integers(1, 4), seed=st.integers(0, 1000))
def test_the_rotary_product_on_interleaved_pairs_is_transformers_rotary(T, H, half, seed):
    """Identity: rotating the interleaved pairs as complex numbers, then undoing the interleaving, is
    transformers' rotate_half form on the head's own column order."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from qkinspect.twin.batched import _once, _rotary
    from qkinspect.twin.model import config_for

    d = 2 * half
    cfg = config_for(Shape("llama", 1, H * d, H, T), 5)
    x = torch.randn(2, 1, T, H, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    pairs = _once("pairs", T, "cpu", H, d, cfg)
    turn = _once("rotary", T, "cpu", H, d, cfg).double()
    mine = _rotary(x.reshape(2, 1, T, H * d)[..., pairs].view(2, 1, T, H, d), turn).reshape(2, 1, T, H * d)
    back = torch.empty_like(mine)
    back[..., pairs] = mine
    inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    emb = torch.cat([torch.arange(T, dtype=torch.float64)[:, None] * inv] * 2, -1)
    q = x.transpose(2, 3)  # (2, 1, H, T, d): transformers' layout
    want, _ = apply_rotary_pos_emb(q, q, emb.cos()[None], emb.sin()[None])
    assert torch.allclose(back.view(2, 1, T, H, d), want.transpose(2, 3), atol=1e-6)


def test_every_variant_has_a_form():
    from qkinspect.twin.request import VARIANTS as ALL

    assert set(ALL) <= set(FORMS)


@settings(max_examples=12, deadline=None)
@given(lrs=st.lists(st.sampled_from([1e-3, 3e-3, 1e-2]), min_size=1, max_size=4), steps=st.integers(1, 4),
       seed=st.integers(0, 100))
def test_one_adamw_over_the_stack_is_each_runs_adamw(lrs, steps, seed):
    """Identity: the stacked AdamW with per-run rates is torch's AdamW on each run alone (the single twin's)."""
    from qkinspect.experiment.heal import adamw

    g = torch.Generator().manual_seed(seed)
    R = len(lrs)
    w = torch.randn(R, 3, 4, generator=g)
    grads = [torch.randn(R, 3, 4, generator=g) for _ in range(steps)]

    class Fake:  # a stack of one tensor
        shared = {"w": torch.nn.Parameter(w.clone())}
        groups: list = []

    fake = Fake()
    fake.R = R
    opt = _StackedAdamW(fake, lrs)
    for k in range(steps):
        fake.shared["w"].grad.copy_(grads[k])
        opt.step(lambda lr: lr * (k + 1))  # noqa: B023 - a schedule, called at once
    for r, lr in enumerate(lrs):
        p = torch.nn.Parameter(w[r].clone())
        single = adamw([p], lr)
        for k in range(steps):
            for group in single.param_groups:
                group["lr"] = lr * (k + 1)
            p.grad = grads[k][r].clone()
            single.step()
        assert torch.allclose(fake.shared["w"][r], p.detach(), atol=1e-7, rtol=0)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), stack=st.one_of(st.none(), st.integers(1, 6)), largest=st.integers(1, 8))
def test_stacks_hold_one_kind_each_and_every_run_once(n, stack, largest):
    variants = ["standard", "share_qk", "bilinear", "share_qk+params", "share_qk_reformer"]
    items = [(variants[i % len(variants)], i // len(variants), 1e-3) for i in range(n)]
    stacks = plan_stacks(items, stack, largest)
    assert sorted(x for s in stacks for x in s) == sorted(items)
    assert all(len({stack_kind(v) for v, _, _ in s}) == 1 for s in stacks)
    assert all(len(s) <= (stack or largest) for s in stacks)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_stacked_runs_records_equal_the_single_runs(tmp_path, arch):
    """Every variant, two rates and two seeds: each held-out evaluation within 1e-3 nats of
    the single-run twin's (float32, CPU); tracking rows alike; the run's file has the single run's fields."""
    text = text_file(tmp_path / "t.txt", 3000)
    kw = dict(text=text, variants=VARIANTS[1:] + ALONE, arch=arch, layers=2, d_model=16, heads=2, context=8,
              batch=4, eval_windows=6, seeds=2, lr="1e-3,1e-2", steps=12, eval_every=4, track_every=6, workers=0)
    one = qkinspect.twin(tmp_path / "one", stack=1, **kw)
    many = qkinspect.twin(tmp_path / "many", **kw)
    a = {(p.variant, p.seed, p.lr, p.step): p.val_loss for p in one.points}
    b = {(p.variant, p.seed, p.lr, p.step): p.val_loss for p in many.points}
    assert a.keys() == b.keys() and len(a) > 50
    assert max(abs(a[k] - b[k]) for k in a) < 1e-3
    ta = {(t.variant, t.seed, t.step, t.layer, t.head, t.metric): t.value for t in one.trajectories}
    tb = {(t.variant, t.seed, t.step, t.layer, t.head, t.metric): t.value for t in many.trajectories}
    assert ta.keys() == tb.keys() and ta
    assert max(abs(ta[k] - tb[k]) for k in ta if ta[k] is not None) < 1e-3
    sizes = []
    for path in (tmp_path / "one" / "runs").iterdir():
        single = json.loads(path.read_text())["run"]
        stacked = json.loads((tmp_path / "many" / "runs" / path.name).read_text())["run"]
        assert set(single) <= set(stacked)
        sizes.append(stacked["stack"]["runs"])
        assert (single["params"], single["note"]) == (stacked["params"], stacked["note"])
        assert stacked["violation"] < 1e-5
    assert max(sizes) == 14  # seed 0 at two rates of the seven variants of standard attention


def test_a_matched_arm_stacks_with_its_own_kind_and_keeps_its_records(tmp_path):
    text = text_file(tmp_path / "t.txt", 3000)
    kw = dict(text=text, variants="share_qkv", match_params=True, arch="gpt2", layers=1, d_model=16, heads=2,
              context=8, batch=4, eval_windows=6, seeds=2, steps=8, eval_every=4, workers=0)
    one = qkinspect.twin(tmp_path / "one", stack=1, **kw)
    many = qkinspect.twin(tmp_path / "many", **kw)
    a = {(p.variant, p.seed, p.step): p.val_loss for p in one.points}
    b = {(p.variant, p.seed, p.step): p.val_loss for p in many.points}
    assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-3
    doc = json.loads((tmp_path / "many" / "runs" / "share_qkv-params-s0-lr0.001.json").read_text())["run"]
    assert doc["stack"]["runs"] == 2 and doc["params"] == one.runs[-1].params


def test_a_stacked_checkpoint_is_the_single_runs(tmp_path):
    from transformers import AutoModelForCausalLM

    text = text_file(tmp_path / "t.txt", 3000)
    kw = dict(text=text, variants="share_qk,bilinear", layers=2, d_model=16, heads=2, context=8, batch=4,
              eval_windows=6, seeds=2, steps=6, save_checkpoints=True, workers=0)
    qkinspect.twin(tmp_path / "one", stack=1, **kw)
    qkinspect.twin(tmp_path / "many", **kw)
    for name in ("standard-s1", "share_qk-s0"):
        a = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "checkpoints" / name).state_dict()
        b = AutoModelForCausalLM.from_pretrained(tmp_path / "many" / "checkpoints" / name).state_dict()
        assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)
    heads = qkinspect.analyze(str(tmp_path / "many" / "checkpoints" / "share_qk-s0"), metrics=["symmetry"]).heads
    assert heads and all(h.values["symmetry"] == pytest.approx(1.0, abs=1e-5) for h in heads)  # W_Q = W_K
    files = sorted(p.name for p in (tmp_path / "many" / "checkpoints" / "bilinear-s0").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "one" / "checkpoints" / "bilinear-s0").iterdir())


def test_a_stack_that_dies_loses_only_its_unfinished_runs(tmp_path):
    """Stacks of 2: the first stack's runs are written, then the orchestrator is interrupted; the same call again
    trains only the runs not in the folder, and the records are those of an uninterrupted folder."""
    text = text_file(tmp_path / "t.txt", 3000)
    kw = dict(text=text, variants="share_qk", layers=1, d_model=16, heads=2, context=8, batch=4, eval_windows=6,
              seeds=2, steps=6, stack=2, workers=0)
    lines: list[str] = []

    def stop_after_first_stack(line: str) -> None:
        lines.append(line)
        if line.startswith("[2/4]"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        qkinspect.twin(tmp_path / "a", notice=stop_after_first_stack, **kw)
    kept = sorted(p.name for p in (tmp_path / "a" / "runs").iterdir())
    assert len(kept) == 2
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "a" / "runs").iterdir()}
    said: list[str] = []
    again = qkinspect.twin(tmp_path / "a", notice=said.append, **kw)
    assert said[0] == "2 of 4 runs already in " + str(tmp_path / "a")
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "a" / "runs").iterdir() if p.name in stamps} == stamps
    whole = qkinspect.twin(tmp_path / "b", **kw)
    a = {(p.variant, p.seed, p.step): p.val_loss for p in again.points}
    b = {(p.variant, p.seed, p.step): p.val_loss for p in whole.points}
    assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-5


def test_stack_zero_is_refused(tmp_path):
    with pytest.raises(InputError, match="stack=0"):
        qkinspect.twin(tmp_path / "out", stack=0)
    assert not (tmp_path / "out").exists()


def twin_cli(*args):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    return CliRunner().invoke(app, ["twin", *map(str, args)])


def test_bad_stack_precision_and_compile_are_one_line(tmp_path, monkeypatch):
    one_error_line(twin_cli("--out", tmp_path / "out", "--stack", "0"), "--stack")
    one_error_line(twin_cli("--out", tmp_path / "out", "--precision", "fp8"), "--precision")
    import qkinspect.twin.stacked as stacked

    monkeypatch.setattr(stacked, "bf16_cpu", lambda: False)
    one_error_line(twin_cli("--out", tmp_path / "out", "--precision", "bf16"), "--precision bf16", "bfloat16")
    monkeypatch.setattr("shutil.which", lambda name: None)
    one_error_line(twin_cli("--out", tmp_path / "out", "--compile"), "--compile")
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_bf16_trains_with_float32_weights(tmp_path):
    """bfloat16 autocast where the CPU has it: the weights stay float32, the losses close to float32's."""
    from qkinspect.twin.stacked import bf16_cpu

    if not bf16_cpu():
        pytest.skip("this CPU has no bfloat16")
    text = text_file(tmp_path / "t.txt", 3000)
    kw = dict(text=text, variants="share_qk", layers=1, d_model=16, heads=2, context=8, batch=4, eval_windows=6,
              seeds=1, steps=6, workers=0, save_checkpoints=True)
    half = qkinspect.twin(tmp_path / "bf16", precision="bf16", **kw)
    full = qkinspect.twin(tmp_path / "f32", **kw)
    assert all(abs(a.val_loss - b.val_loss) < 0.05 for a, b in zip(half.runs, full.runs, strict=True))
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "bf16" / "checkpoints" / "share_qk-s0" / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {torch.float32}


def test_a_compiled_stack_keeps_the_single_runs_records(tmp_path):
    """torch.compile of the stacked step (`--compile`): each held-out evaluation within 1e-3 nats of the
    single-run twin's, and the record says it was compiled."""
    from qkinspect.twin.stacked import check_compile

    try:
        check_compile("cpu", "compile")
    except InputError as e:
        pytest.skip(str(e))
    text = text_file(tmp_path / "t.txt", 3000)
    kw = dict(text=text, variants="share_qk,symmetric", layers=1, d_model=16, heads=2, context=8, batch=4,
              eval_windows=6, seeds=1, steps=6, eval_every=3, workers=0)
    one = qkinspect.twin(tmp_path / "one", stack=1, **kw)
    many = qkinspect.twin(tmp_path / "many", compile=True, **kw)
    a = {(p.variant, p.seed, p.step): p.val_loss for p in one.points}
    b = {(p.variant, p.seed, p.step): p.val_loss for p in many.points}
    assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-3
    for path in (tmp_path / "many" / "runs").iterdir():
        assert json.loads(path.read_text())["run"]["stack"] == {"runs": 3, "precision": "float32", "compile": True}


def test_by_default_on_the_cpu_the_stacks_train_in_this_process(tmp_path, monkeypatch):
    """No --workers, --stack or --scheduler on the CPU: each kind's runs one stack, trained here (two kinds, two
    stacks, no local cluster); --workers 2 still shares them among a local cluster."""
    import qkinspect.twin.cluster as cluster

    def no_cluster(*args, **kwargs):
        raise AssertionError("a local cluster was started")

    monkeypatch.setattr(cluster, "twin_cluster", no_cluster)
    text = text_file(tmp_path / "t.txt", 3000)
    kw = dict(text=text, variants="share_qk,bilinear", layers=1, d_model=16, heads=2, context=8, batch=4,
              eval_windows=6, seeds=2, steps=2)
    lines: list[str] = []
    result = qkinspect.twin(tmp_path / "here", notice=lines.append, **kw)
    assert len(result.runs) == 6 and not result.failures
    assert [line.split(" runs started")[0] for line in lines if " runs started" in line] == \
        ["stack 1/2 of 4", "stack 2/2 of 2"]
    with pytest.raises(AssertionError, match="local cluster"):
        qkinspect.twin(tmp_path / "cluster", workers=2, **kw)


def test_the_default_stack_here_uses_the_cores_and_gives_torch_its_threads_back(tmp_path, monkeypatch):
    """The CPU's default (stacks trained in this process) uses one torch thread per core this process may use;
    --threads, --stack 1 and workers keep theirs; torch's thread count is what it was once the twin returns."""
    import torch

    import qkinspect.limits as limits
    from qkinspect.twin.request import check_request
    from qkinspect.twin.run import task_threads

    monkeypatch.setattr(limits, "cores", lambda: 3)
    text = text_file(tmp_path / "t.txt", 3000)
    base = dict(out=tmp_path / "x", text=text, variants="share_qk", layers=1, d_model=16, heads=2)
    assert task_threads(check_request(**base)) == 3
    assert task_threads(check_request(**base, threads=1)) == 1
    assert task_threads(check_request(**base, stack=1, workers=0)) == 1
    assert task_threads(check_request(**base, workers=0)) == 3  # stacks here
    assert task_threads(check_request(**base, workers=2)) == 1
    before = torch.get_num_threads()
    result = qkinspect.twin(tmp_path / "here", text=text, variants="share_qk", layers=1, d_model=16, heads=2,
                            context=8, batch=4, eval_windows=6, seeds=1, steps=2)
    assert torch.get_num_threads() == before
    assert {r.threads for r in result.runs} == {3}
    assert json.loads((tmp_path / "here" / "twin.json").read_text())["setup"]["training"]["threads"] == 3
