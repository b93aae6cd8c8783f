"""Shared option parsing (qkinspect/cli/options.py)."""

from __future__ import annotations

import pytest

from qkinspect.analysis.request import CLI_NAMES, check_request, check_selection_of
from qkinspect.cli.options import parse_names
from qkinspect.device import requested_device
from qkinspect.errors import InputError
from qkinspect.layer import BlockSpec, ModelInfo
from qkinspect.selection import parse_indices


@pytest.mark.parametrize("text, expected", [
    ("0-3,7", (0, 1, 2, 3, 7)),
    ("7,0-1,1", (0, 1, 7)),
    (" 2 ", (2,)),
    ("4-4", (4,)),
    (None, None),
    ("", None),
])
def test_parse_indices(text, expected):
    assert parse_indices(text, "--layers") == expected


@pytest.mark.parametrize("text", ["a", "3-1", "-1", "1-", "0,,x", "1.5"])
def test_parse_indices_refuses(text):
    with pytest.raises(InputError, match="--heads"):
        parse_indices(text, "--heads")


def test_parse_names_commas_and_repeats():
    assert parse_names(["symmetry,overlap_qk", "symmetry", " qk_k90 "]) == ("symmetry", "overlap_qk", "qk_k90")
    assert parse_names(None) is None
    assert parse_names([","]) is None


def test_cuda_refused_when_unavailable(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="^--device cuda: no CUDA device"):
        requested_device("cuda", "--device")
    assert requested_device("cpu", "--device") == "cpu"
    with pytest.raises(InputError, match="^--device cuda: no CUDA device"):  # as every analysis command says it
        check_request(device="cuda", names=CLI_NAMES)


def _info():
    enc = BlockSpec("encoder", n_layers=2, n_heads=4, n_kv_heads=4, d_model=16, d_head=4, label="text")
    vis = BlockSpec("encoder", n_layers=3, n_heads=2, n_kv_heads=2, d_model=8, d_head=4, label="vision")
    return ModelInfo(name="m", source="m", model_type="clip", format="safetensors", blocks=(enc, vis))


def check_selection(info, blocks, layers, heads=None):
    """The analysis request's selection in the CLI's names, checked against `info`: the chosen blocks' keys, or None
    when no --block was given."""
    request = check_request(names=CLI_NAMES, blocks=blocks, layers=layers, heads=heads)
    chosen = check_selection_of(request, info)
    return tuple(b.key for b in chosen) if blocks else None


def test_check_selection_maps_kinds_and_labels():
    info = _info()
    assert check_selection(info, None, "0,2", "1") is None
    assert check_selection(info, ["encoder"], None) == ("text", "vision")
    assert check_selection(info, ["vision"], "2") == ("vision",)


@pytest.mark.parametrize("blocks, layers, heads, message", [
    (["decoder"], None, None, "^--block decoder \\(did you mean encoder\\?\\): this model's blocks are text, vision$"),
    (["text"], "2", None, "^--layers: 2 is out of range; text has layers 0-1$"),
    (None, "3", None, "out of range"),
    (None, None, "4", "^--heads: 4 is out of range; text has heads 0-3, vision has heads 0-1$"),
])
def test_check_selection_refuses(blocks, layers, heads, message):
    with pytest.raises(InputError, match=message):
        check_selection(_info(), blocks, layers, heads)


def test_the_library_names_its_arguments():
    """One check, two spellings: the library's arguments (`layers=3`) and the CLI's options (`--layers: 3`)."""
    with pytest.raises(InputError, match="^layers=3 is out of range; text has layers 0-1, vision has layers 0-2$"):
        check_selection_of(check_request(layers=[3]), _info())
    with pytest.raises(InputError, match="^layers='x': 'x' is not an index"):
        check_request(layers="x")
    with pytest.raises(InputError, match="^--layers: 'x' is not an index"):
        check_request(layers="x", names=CLI_NAMES)


def test_request_options():
    r = check_request(["symmetry"], precision="float64", names=CLI_NAMES, layers="0-1", heads="3",
                      blocks=["encoder"])
    assert r.options() == {"layers": (0, 1), "heads": (3,), "blocks": ("encoder",), "metrics": ("symmetry",),
                           "precision": "float64", "fold_ln": False, "fold_qk_norm": False, "layer_form": False}
    assert r.describe() == "--block encoder --layers 0,1 --heads 3"
    folded = check_request(fold_ln=True, fold_qk_norm=True, names=CLI_NAMES)
    assert (folded.fold_ln, folded.fold_qk_norm, folded.device) == (True, True, "cpu")
