"""The shape every bad-input test checks: exit 2 and exactly one `error:` line on stderr (no traceback, not an
internal error) and nothing on stdout, naming what `says` lists."""


def one_error_line(r, *says: str) -> str:
    """The `error:` line of a CLI result `r`, after checking that it is the only line, with exit code 2."""
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert all(s in lines[0] for s in says), lines[0]
    assert r.stdout == "", r.stdout  # results go to stdout, never a part of one
    return lines[0]
