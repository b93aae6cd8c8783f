"""A GGUF command on an ill-conditioned model (Gemma-3-270m: float32 Grams resolve none of its heads) says once, as
a note, that heads were recomputed in float64: it asks nothing of the user, so it is no `warning:`; the JSON
records the count in `processing.recomputed_float64`."""

from __future__ import annotations

import json

from tests.loading.test_real_gemma3_gguf import gemma3  # noqa: F401 (fixture)


def test_recomputed_heads_are_one_note_and_a_processing_field(cli, gemma3):  # noqa: F811
    r = cli("analyze", gemma3, "--layers", "0", "--metrics", "symmetry", "--format", "json")
    assert r.exit_code == 0, r.stderr
    lines = r.stderr.splitlines()
    assert not [line for line in lines if line.startswith("warning:") and "recomputed" in line], lines
    notes = [line for line in lines if "recomputed in float64" in line]
    assert len(notes) == 1 and notes[0].startswith("note: 4 of 4 heads recomputed in float64"), lines
    doc = json.loads(r.stdout)
    assert doc["processing"]["recomputed_float64"] == 4
    assert not [w for w in doc["warnings"] if "recomputed" in w]
