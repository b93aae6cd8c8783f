"""Bad input exits 2 with one line on stderr and nothing on stdout; internal errors exit 1; --debug traces."""

from __future__ import annotations

import pytest


def _one_line_exit_2(r, needle: str = ""):
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert needle in lines[0]


@pytest.mark.parametrize("args, needle", [
    (["info", "--bogus"], "--bogus"),
    (["info", "--format", "yaml"], "yaml"),
    (["nosuchcommand"], "nosuchcommand"),
    (["extract", "--layers", "x-1", "-o", "h.safetensors"], "--layers"),
])
def test_bad_options(cli, args, needle):
    _one_line_exit_2(cli(*args), needle)


@pytest.mark.parametrize("command, out", [("info", "x.json"), ("extract", "x.safetensors"), ("analyze", "x.csv"),
                                          ("spectrum", "x.json")])
def test_missing_model(cli, command, out, tmp_path):
    _one_line_exit_2(cli(command, tmp_path / "no-such-model", "-o", tmp_path / out), "no-such-model")
    if command != "extract":  # extract asks for -o first
        _one_line_exit_2(cli(command, tmp_path / "no-such-model"), "no-such-model")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("spec, hint", [("bert-base-uncased", True), ("Qwen2.5-0.5B", True),
                                        ("./bert-base-uncased", False), ("model.gguf", False),
                                        ("weights.safetensors", False)])
def test_a_hub_name_without_its_org_gets_a_hint(cli, spec, hint, tmp_path, monkeypatch):
    """`analyze bert-base-uncased` said only "no such file or folder": a name with no path in it (not a weight
    file) is told that hub ids are written org/name, still one line and exit 2 (issue 44)."""
    monkeypatch.chdir(tmp_path)
    r = cli("analyze", spec)
    _one_line_exit_2(r, f"{spec}: no such file or folder")
    assert ("a Hugging Face hub id is written org/name (google-bert/bert-base-uncased)" in r.stderr) == hint


def test_compare_missing_model(cli, tiny_bert, tmp_path):
    _one_line_exit_2(cli("compare", tiny_bert, tmp_path / "no-such-model"), "no-such-model")


def test_folder_without_config(cli, tmp_path):
    _one_line_exit_2(cli("info", tmp_path), "config.json")


@pytest.mark.parametrize("target", ["missing/out.json", "afile/out.json", "."])
def test_unwritable_output(cli, tiny_bert, tmp_path, target):
    (tmp_path / "afile").write_text("")
    _one_line_exit_2(cli("info", tiny_bert, "-o", tmp_path / target))


def test_unknown_extension(cli, tiny_bert, tmp_path):
    _one_line_exit_2(cli("info", tiny_bert, "-o", tmp_path / "x.xlsx"), "--format")


def test_internal_error_exit_1_and_debug_traceback(cli, tiny_bert, monkeypatch):
    import qkinspect.cli.commands.info as info

    def boom(*a, **k):
        raise ZeroDivisionError("kaboom")

    monkeypatch.setattr(info, "info_document", boom)
    r = cli("info", tiny_bert)
    assert r.exit_code == 1 and r.stdout == ""
    assert "internal error: ZeroDivisionError: kaboom" in r.stderr and "Traceback" not in r.stderr
    r = cli("--debug", "info", tiny_bert)
    assert r.exit_code == 1 and "Traceback" in r.stderr


def test_input_error_with_debug_shows_traceback(cli, tmp_path):
    r = cli("--debug", "info", tmp_path / "missing")
    assert r.exit_code == 2 and "Traceback" in r.stderr and "ModelNotFoundError" in r.stderr


def test_closed_pipe_exits_0_quietly(cli, tiny_bert, monkeypatch):
    import qkinspect.cli.output as output

    def reader_gone(doc, f):
        raise BrokenPipeError

    monkeypatch.setattr(output, "write_json", reader_gone)
    r = cli("info", tiny_bert, "-f", "json")
    assert r.exit_code == 0 and r.stderr == ""


@pytest.mark.parametrize("args", [["-o", "out.xlsx"], ["-o", "missing/out.json"], ["--sort", "nope"],
                                  ["--metrics", "nope"], ["--top", "0"]])
def test_analyze_refuses_before_any_work(cli, tiny_bert, tmp_path, monkeypatch, args):
    from qkinspect.analysis import run

    def never(*a, **k):
        raise AssertionError("analyze ran")

    monkeypatch.setattr(run, "analyze", never)
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(cli("analyze", tiny_bert, *args))
    assert list(tmp_path.iterdir()) == []


def test_a_rust_panic_is_one_line_exit_1(cli, tiny_bert, monkeypatch):
    """pyo3's PanicException (a panic inside tokenizers or safetensors) derives from BaseException, not Exception."""
    import qkinspect.cli.commands.info as info

    class PanicException(BaseException):
        pass

    def boom(*a, **k):
        raise PanicException("called `Option::unwrap()` on a `None` value")

    monkeypatch.setattr(info, "info_document", boom)
    r = cli("info", tiny_bert)
    assert r.exit_code == 1 and r.stdout == ""
    assert "internal error: PanicException" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
