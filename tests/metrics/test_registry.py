"""The registry is the contract other parts read: exact names, resolution of groups, errors."""

from __future__ import annotations

import json

import pytest

from qkinspect.errors import InputError
from qkinspect.metrics.registry import METRICS, definitions, groups, resolve_metrics

CONTRACT_HEAD = """symmetry directionality qk_effective_rank qk_stable_rank qk_participation_ratio qk_k90
qk_eig_pos_frac
qk_eig_real_ratio shared_qk_distance
overlap_qk overlap_qv overlap_kv cosine_qk cosine_qv cosine_kv cka_qk cka_qv cka_kv norm_q_fro
norm_k_fro norm_v_fro norm_qk_fro norm_q_spec norm_k_spec norm_v_spec norm_qk_spec bias_q_norm bias_k_norm
bias_v_norm ov_effective_rank ov_copying ov_norm_spec""".split()
CONTRACT_LAYER = ["symmetry_median", "symmetry_mean", "overlap_qk_median", "qk_effective_rank_median",
                  "symmetry_layer", "directionality_layer", "head_overlap"]


def test_names_are_the_contract():
    assert [m.name for m in METRICS.values() if m.per == "head"] == CONTRACT_HEAD
    assert [m.name for m in METRICS.values() if m.per == "layer"] == CONTRACT_LAYER


def test_every_spec_is_complete():
    for m in METRICS.values():
        assert m.gauge_invariant in ("yes", "no", "orthogonal")
        assert m.description and m.range and m.cost and m.group
        assert not (set(groups()) & set(METRICS)), "a group name shadows a metric"


def test_defaults_and_groups():
    default = resolve_metrics(None)
    assert "symmetry" in default and "symmetry_median" in default and "norm_q_spec" in default
    opt_in = ("qk_eig_pos_frac", "qk_eig_real_ratio", "shared_qk_distance", "ov_effective_rank", "ov_copying",
              "ov_norm_spec")
    assert not set(opt_in) & set(default), "eigenvalues and the OV circuit are opt-in"
    assert resolve_metrics(["eigen"]) == opt_in[:3] and resolve_metrics(["ov"]) == opt_in[3:]
    assert set(opt_in) <= set(resolve_metrics(["all"])) and set(opt_in[:3]) <= set(resolve_metrics(["spectrum"]))
    assert "head_overlap" not in default and "symmetry_layer" not in default
    similarity = resolve_metrics(["similarity"])
    assert similarity == tuple(n for n in METRICS if n.startswith(("overlap", "cosine", "cka")))
    assert similarity[-1] == "overlap_qk_median"  # the summary of a computed head metric comes along
    assert resolve_metrics("symmetry, qk_k90") == ("symmetry", "qk_k90", "symmetry_median", "symmetry_mean")
    assert set(resolve_metrics(["all"])) == set(METRICS)


def test_summaries_bring_their_source_and_layer_form_flag():
    assert resolve_metrics(["qk_effective_rank_median"]) == ("qk_effective_rank", "qk_effective_rank_median")
    assert resolve_metrics(["symmetry"], layer_form=True)[-2:] == ("symmetry_layer", "directionality_layer")


def test_unknown_name_lists_known_ones():
    with pytest.raises(InputError) as e:
        resolve_metrics(["symetry"])
    assert "'symetry'" in str(e.value) and "symmetry" in str(e.value) and "similarity" in str(e.value)


def test_definitions_are_json_ready():
    d = definitions(["symmetry", "cosine_qk", "not_a_metric"])
    assert list(d) == ["symmetry", "cosine_qk"]
    assert d["symmetry"]["gauge_invariant"] == "yes" and d["cosine_qk"]["gauge_invariant"] == "orthogonal"
    json.dumps(definitions())


def test_every_metric_and_group_is_documented():
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    missing = [n for n in [*METRICS, *groups()] if f"`{n}`" not in text]
    assert not missing, f"docs/metrics.md does not describe {missing}"
