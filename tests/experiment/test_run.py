"""Running edited models: the write-back is the adapters' inverse, runs from a cached layer equal full runs, undo
is exact, and each measure equals transformers' own (tiny random models of every family the write-back knows)."""

from __future__ import annotations

import pytest
import torch

from qkinspect.errors import InputError, UnsupportedModelError
from qkinspect.experiment import expand_kv, run_experiment
from qkinspect.experiment.model.runtime import load_hf
from qkinspect.experiment.model.scoring import Scorer, Text, default_text, windows
from qkinspect.experiment.model.writeback import written
from qkinspect.loading import open_model
from tests.experiment import tiny_models as tiny
from tests.experiment.effects import EFFECT, moved, with_ablated_neighbour

TOKENS, WINDOW = 96, 32


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("experiment_models")
    return {"llama": tiny.llama(root / "llama"), "bert": tiny.bert(root / "bert"),
            "bare": tiny.bert(root / "bare", head=False), "gpt2": tiny.gpt2(root / "gpt2"),
            "mistral": tiny.mistral(root / "mistral"), "roberta": tiny.roberta(root / "roberta"),
            "qwen2": tiny.qwen2(root / "qwen2"), "mixtral": tiny.mixtral(root / "mixtral"),
            "qwen2_moe": tiny.qwen2_moe(root / "qwen2_moe")}


def opened(folder):
    """(hf, {layer: AttentionLayer}) for a tiny model: transformers' model and qkinspect's own tensors."""
    with open_model(folder) as m:
        spec = m.info.blocks[0]
        layers = {i: m.layer(spec.key, i) for i in range(spec.n_layers)}
        hf = load_hf(m.resolved)
    return hf, layers


def scorer(hf, cache=()):
    s = Scorer(hf, windows(hf, default_text(), TOKENS, WINDOW), batch_tokens=64)
    return s, s.baseline(cache=set(cache))


@pytest.mark.parametrize("family,kind", [("llama", "causal"), ("bert", "masked"), ("bare", "drift"),
                                         ("gpt2", "causal"), ("mistral", "causal"), ("roberta", "masked"),
                                         ("qwen2", "causal"), ("mixtral", "causal"),
                                         ("qwen2_moe", "causal")])
def test_writing_back_the_loaded_tensors_reproduces_the_model(models, family, kind):
    hf, layers = opened(models[family])
    assert hf.kind == kind
    s, base = scorer(hf)
    with written(hf, list(layers.values())):
        assert s.score() == base  # bit for bit: every projection rebuilt from qkinspect's canonical tensors
    assert s.score() == base


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "mistral", "roberta", "qwen2", "mixtral", "qwen2_moe"])
def test_a_run_from_a_cached_layer_equals_the_full_run(models, family):
    hf, layers = opened(models[family])
    last = max(layers)
    s, base = scorer(hf, cache={last})
    # share_qk alone moves the loss by float32's resolution at most (tests/experiment/effects.py)
    with written(hf, [with_ablated_neighbour(layers[last], "share_qk", 1)]):
        full = s.score(0)
        assert moved(s) > EFFECT  # the edit is in effect, so "equal" below cannot pass with it missing
        full_tokens = s.token_losses
        suffix = s.score(start=last)
    assert torch.allclose(s.token_losses, full_tokens, rtol=1e-6, atol=1e-6)
    assert suffix == pytest.approx(full, rel=1e-6, abs=1e-7)


def test_undo_restores_the_modules_exactly(models):
    from qkinspect.experiment import apply_edit, parse_edit

    hf, layers = opened(models["llama"])
    attn = hf.layers[1].self_attn
    before = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.num_key_value_groups)
    s, base = scorer(hf)
    with written(hf, [apply_edit(layers[1], parse_edit("share_qk"), [0]).layer]):
        assert attn.num_key_value_groups == 1 and attn.k_proj.out_features == 4 * 16  # K/V expanded
        assert abs(s.score() - base) > 1e-5  # 1.2e-4 measured: far above float32's ~5e-7 at a loss of 5
    assert (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.num_key_value_groups) == before
    assert s.score() == base


@pytest.mark.parametrize("family", ["llama", "qwen2", "mixtral", "qwen2_moe"])
def test_expanding_the_shared_key_value_heads_alone_changes_nothing(models, family):
    hf, layers = opened(models[family])
    assert layers[0].spec.n_kv_heads == 2
    s, base = scorer(hf)
    with written(hf, [expand_kv(layer) for layer in layers.values()]):
        assert s.score() == pytest.approx(base, rel=1e-6)


def _windows_loss_by_hand(model, ids: torch.Tensor) -> float:
    """transformers' own `labels=input_ids` loss, weighted by predictions over the windows."""
    with torch.inference_mode():
        losses = [float(model(input_ids=w[None], labels=w[None]).loss) for w in ids]
    return sum(losses) / len(losses)  # every window has W-1 predictions


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_ablating_a_head_equals_zeroing_its_output_columns_by_hand(models, family):
    from transformers import AutoModelForCausalLM

    layer, head, d = 1, 2, (16 if family == "llama" else 8)
    r = run_experiment(models[family], "ablate", layers=[layer], heads=[head], tokens=TOKENS, window=WINDOW,
                       reference=False)
    model = AutoModelForCausalLM.from_pretrained(models[family], dtype=torch.float32).eval()
    hf, _ = opened(models[family])
    ids = windows(hf, default_text(), TOKENS, WINDOW)
    assert r.baseline == pytest.approx(_windows_loss_by_hand(model, ids), rel=1e-6)
    with torch.no_grad():
        if family == "llama":  # o_proj is nn.Linear [out, in]: head h is input columns h*d:(h+1)*d
            model.model.layers[layer].self_attn.o_proj.weight[:, head * d:(head + 1) * d] = 0
        else:  # GPT-2's c_proj is Conv1D [in, out]: head h is rows h*d:(h+1)*d
            model.transformer.h[layer].attn.c_proj.weight[head * d:(head + 1) * d] = 0
    (run,) = r.runs
    assert (run.edit, run.layer, run.head) == ("ablate", layer, head)
    assert run.loss == pytest.approx(_windows_loss_by_hand(model, ids), rel=1e-6)
    assert abs(run.dloss) > EFFECT  # 1.1e-3 (gpt2), 1.6e-3 (llama) measured


def test_masked_lm_loss_is_transformers_own_on_the_fixed_masks(models):
    hf, _ = opened(models["bert"])
    s, base = scorer(hf)
    total = count = 0.0
    with torch.inference_mode():
        for inputs in s.inputs:
            n = int((inputs["labels"] != -100).sum())
            total += float(hf.model(**inputs).loss) * n
            count += n
    assert base == pytest.approx(total / count, rel=1e-6)
    masked = sum(int((i["labels"] != -100).sum()) for i in s.inputs)
    ordinary = sum(int((i["input_ids"] != hf.tokenizer.mask_token_id).sum()) for i in s.inputs)
    assert 0.08 < masked / (masked + ordinary) < 0.25  # about 15 % of the tokens
    s2, base2 = scorer(hf)  # the same seed draws the same masks
    assert base2 == base


def test_drift_is_zero_unedited_and_grows_with_ablation(models):
    r = run_experiment(models["bare"], "ablate", scope="layer", tokens=TOKENS, window=WINDOW)
    assert r.measure == "drift" and abs(r.baseline) < 1e-6
    assert [x.layer for x in r.runs] == [0, 1]
    assert all(0 < x.dloss < 2 for x in r.runs)


def test_rank_d_head_changes_nothing_and_ratios_read_against_ablate(models):
    r = run_experiment(models["llama"], "rank:16,share_qk", scope="head", layers=[2], tokens=TOKENS,
                       window=WINDOW)
    assert [(x.edit, x.head) for x in r.runs[:3]] == [("rank:16", 0), ("share_qk", 0), ("ablate", 0)]
    assert len(r.runs) == 3 * 4
    ablate = {x.head: x for x in r.runs if x.edit == "ablate"}
    for x in r.runs:
        if x.edit == "rank:16":
            assert abs(x.dloss) < 1e-5 and x.predicted == pytest.approx(0, abs=1e-6)
        a = ablate[x.head]
        if a.dloss > 2 * a.dloss_se:  # a ratio only against an ablation that costs beyond its error
            assert x.ratio == pytest.approx(x.dloss / a.dloss)
        else:
            assert x.ratio is None
        assert x.dloss_se is not None and x.dloss_se >= 0
        assert x.offset0 is False and x.layer == 2
    assert r.tokens == 96 and r.windows == 3 and r.scored == 3 * 31


def test_scopes(models):
    layer = run_experiment(models["gpt2"], "share_qk", scope="layer", heads=[0, 1], tokens=TOKENS, window=WINDOW)
    assert [(x.edit, x.layer, x.head, x.heads) for x in layer.runs] == [
        ("share_qk", 0, None, 2), ("ablate", 0, None, 2), ("share_qk", 1, None, 2), ("ablate", 1, None, 2)]
    model = run_experiment(models["gpt2"], "share_qk", scope="model", heads=[0, 1], tokens=TOKENS, window=WINDOW)
    assert [(x.edit, x.layer, x.head, x.heads) for x in model.runs] == [("share_qk", None, None, 4),
                                                                        ("ablate", None, None, 4)]
    share, ablate = model.runs
    if ablate.dloss > 2 * ablate.dloss_se:
        assert share.ratio == pytest.approx(share.dloss / ablate.dloss)
    else:  # this tiny random model's ablation lowers the loss: no ratio
        assert share.ratio is None


def test_offset0_edits_are_flagged_on_rotary_heads(models):
    r = run_experiment(models["llama"], "share_qk", layers=[0], heads=[0], rotary="offset0", tokens=TOKENS,
                       window=WINDOW, reference=False)
    assert r.runs[0].offset0 is True


def test_bad_requests_are_refused_in_one_line(models, tmp_path):
    from transformers import OPTConfig, OPTForCausalLM

    with pytest.raises(InputError, match="unknown edit"):
        run_experiment(models["llama"], "share_kq")
    with pytest.raises(InputError, match="scope='everything'"):
        run_experiment(models["llama"], "share_qk", scope="everything")
    with pytest.raises(InputError, match="layers=7 is out of range; decoder has layers 0-2"):
        run_experiment(models["llama"], "share_qk", layers=[7])
    # checks that need the loaded model name the options as the library's caller writes them (the CLI's own
    # spelling: tests/experiment/test_cli_experiment.py)
    with pytest.raises(InputError, match=r"^window=128: this model takes at most 64 positions$"):
        run_experiment(models["bert"], "ablate", window=128)
    with pytest.raises(InputError, match=r"missing\.txt: cannot read text \(no such file\)$"):
        run_experiment(models["bert"], "ablate", text=tmp_path / "missing.txt")
    opt = tmp_path / "opt"
    OPTForCausalLM(OPTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
                             vocab_size=len(tiny.VOCAB), word_embed_proj_dim=16)).save_pretrained(opt)
    with pytest.raises(UnsupportedModelError, match="'opt' cannot be run and edited"):
        run_experiment(opt, "share_qk")
    from transformers import LlamaConfig, LlamaModel

    headless = tmp_path / "llama_without_head"
    LlamaModel(LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                           vocab_size=len(tiny.VOCAB))).save_pretrained(headless)
    tiny.save_tokenizer(headless)
    with pytest.raises(InputError, match="has no lm_head.weight"):
        run_experiment(headless, "share_qk")


def test_text_file_is_named_in_the_result(models, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("attention is all you need, or is it? " * 40)
    r = run_experiment(models["bert"], "ablate", layers=[0], heads=[0], text=f, tokens=64, window=32,
                       reference=False)
    assert r.text == str(f)
    r2 = run_experiment(models["bert"], "ablate", layers=[0], heads=[0], text=Text("mine", f.read_text()),
                        tokens=64, window=32, reference=False)
    assert r2.text == "mine" and r2.baseline == r.baseline
