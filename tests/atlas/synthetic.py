"""Synthetic atlases for the figure and table tests: analysis documents of made-up models (no weights), their
records computed by the atlas's own statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qkinspect.atlas import AtlasResult
from qkinspect.atlas.stats import entry_stats

FAMILIES = [("bert", ["encoder"]), ("llama", ["decoder"]), ("t5", ["encoder", "decoder", "cross"]),
            ("gpt2", ["decoder"])]


def synthetic_doc(i: int, rng: np.random.Generator) -> dict:
    family, kinds = FAMILIES[i % len(FAMILIES)]
    n_layers = int(rng.integers(1, 40)) if i % 13 else 1  # some models of one layer
    n_heads = int(rng.choice([4, 8, 12, 16]))
    kv = n_heads // 4 if family == "llama" else n_heads
    d_head = 64
    blocks = [{"name": k, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": kv, "d_model": n_heads * d_head,
               "d_head": d_head, "positional": "rope" if family == "llama" else "absolute"} for k in kinds]
    heads, layers = [], []
    base = 0.4 if kinds == ["encoder"] else 0.1
    for b in blocks:
        for layer in range(n_layers):
            sym = base * (1 - layer / max(1, n_layers)) + rng.normal(0, 0.05, n_heads)
            for h in range(n_heads):
                heads.append({"block": b["name"], "layer": layer, "head": h, "kv_head": h // (n_heads // kv),
                              "symmetry": float(sym[h]), "overlap_qk": float(rng.uniform(0.1, 0.6))})
            layers.append({"block": b["name"], "layer": layer, "n_heads": n_heads,
                           "symmetry_layer": float(np.mean(sym) * 1.2)})
    return {"model": {"name": f"m{i}", "source": f"/m{i}", "model_type": family, "format": "safetensors",
                      "blocks": blocks}, "heads": heads, "layers": layers}


def synthetic_atlas(n: int, seed: int = 0) -> AtlasResult:
    rng = np.random.default_rng(seed)
    atlas = AtlasResult(Path(f"synthetic-{n}"), {}, [])
    for i in range(n):
        name = f"org-{i % 7}/model-{i}{'-xlarge' * (i % 3 == 0)}"
        records, facts = entry_stats(name, synthetic_doc(i, rng))
        atlas.models.append(name)
        atlas.records += records
        atlas.facts += facts
    return atlas
