"""docs/loading.md's GGUF table has one row per architecture in gguf_arch.ARCHES (and none other), each naming its
model_type and proofs that exist: a case of tests/loading/test_gguf_arch.py for that architecture, and a
transformers proof exactly where that test does not skip it."""

from __future__ import annotations

import re
from pathlib import Path

from qkinspect.loading.gguf_arch import ARCHES
from tests.loading.gguf_convert import CASES, NOT_IN_TRANSFORMERS_GGUF, gguf_arch

DOC = Path(__file__).resolve().parents[2] / "docs" / "loading.md"
TESTS = Path(__file__).resolve().parent


def rows() -> dict[str, list[str]]:
    text = DOC.read_text().split("### GGUF architectures", 1)[1]
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] not in ("GGUF architecture", "---"):
            out[cells[0]] = cells
    return out


def cases_named(cell: str) -> list[str]:
    for name in re.findall(r"test_\w+", cell):
        assert (TESTS / f"{name}.py").is_file(), name
    return re.findall(r"test_gguf_arch\[([\w-]+)\]", cell)


def test_one_row_per_architecture():
    assert set(rows()) == set(ARCHES)


def test_rows_name_their_model_type_and_proofs():
    transformers_cases = {c for c in CASES if c not in NOT_IN_TRANSFORMERS_GGUF and c != "falcon"}
    for arch, (_, model_type, _, own, theirs) in rows().items():
        assert model_type == ARCHES[arch].model_type, arch
        named = cases_named(own)
        assert named and all(c in CASES and gguf_arch(c) == arch for c in named), arch
        assert set(named) == {c for c in CASES if gguf_arch(c) == arch}, arch
        proven = [c for c in cases_named(theirs) if c in transformers_cases]
        assert proven == cases_named(theirs), arch  # every transformers proof named is one the test runs
        assert bool(proven) == any(gguf_arch(c) == arch for c in transformers_cases), arch


def test_quantization_table_names_every_understood_method_and_real_tests():
    from qkinspect.loading.quantized import CT_FORMATS, UNDERSTOOD

    text = DOC.read_text().split("**Quantized safetensors**", 1)[1].split("**PyTorch `.bin`**", 1)[0]
    table = [line for line in text.splitlines() if line.startswith("| `") and "quant_method" not in line]
    methods = {re.match(r"\| `([\w-]+)`", line).group(1) for line in table}
    assert methods == set(UNDERSTOOD)
    ct_row = next(line for line in table if line.startswith("| `compressed-tensors`"))
    assert all(f"`{f}`" in ct_row for f in CT_FORMATS)
    source = (TESTS / "test_quantized.py").read_text()
    for line in table:
        proof = line.strip().strip("|").split("|")[-1]
        names = re.findall(r"test_\w+", proof)
        assert names, line
        for name in names:
            assert name == "test_quantized" or f"def {name}(" in source, name
