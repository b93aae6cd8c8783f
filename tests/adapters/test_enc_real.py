"""Real weights: the bundled demo model (all-MiniLM-L6-v2, a BERT) through the BERT adapter."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from qkinspect.errors import DemoNotInstalledError
from tests.adapters.harness import Sites, assert_probs, check_layers, load_layers


@pytest.fixture(scope="module")
def demo():
    from qkinspect.demo import demo_path

    try:
        return demo_path()
    except DemoNotInstalledError:
        pytest.skip("the demo extra is not installed")


def test_heads_are_the_stored_rows_sliced_by_hand(demo):
    layers = load_layers(demo)
    assert len(layers) == 6 and layers[0].spec.n_heads == 12 and layers[0].spec.d_model == 384
    d = 32
    with safe_open(str(demo / "model.safetensors"), "pt") as f:
        prefix = "" if "encoder.layer.0.attention.self.query.weight" in f.keys() else "bert."
        for lay in (layers[0], layers[5]):
            p = f"{prefix}encoder.layer.{lay.layer}.attention"
            wq, bk = f.get_tensor(f"{p}.self.query.weight"), f.get_tensor(f"{p}.self.key.bias")
            wo = f.get_tensor(f"{p}.output.dense.weight")
            for h in (0, 7, 11):
                assert torch.equal(lay.W_Q[h], wq[h * d:(h + 1) * d, :].T)  # rows of head h, as (D, d)
                assert torch.equal(lay.b_K[h], bk[h * d:(h + 1) * d])
                assert torch.equal(lay.W_O[h], wo[:, h * d:(h + 1) * d].T)  # columns of head h, as (d, D)


def test_reproduces_the_real_forward_pass(demo):
    from transformers import BertModel

    model = BertModel.from_pretrained(str(demo), attn_implementation="eager").eval()
    layers = load_layers(demo)
    ids = torch.randint(1000, 20000, (2, 9), generator=torch.Generator().manual_seed(0))
    outs = []

    def sites(block, i):
        a = model.encoder.layer[i].attention
        return Sites(a.self.query, a.self.key, a.self.value, a.output.dense)

    inputs = check_layers(model, lambda m: outs.append(m(input_ids=ids, output_attentions=True)), layers, sites)
    for lay in layers:
        x = inputs[("encoder", lay.layer)]
        assert_probs(lay, x["x_q"], x["x_kv"], outs[0].attentions[lay.layer], what=f"MiniLM layer {lay.layer}")
