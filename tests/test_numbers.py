"""Signed differences as `qkinspect twin`, its figures and its report print them (qkinspect.numbers): signed, 4
decimals or two significant digits, never a negative zero or a zero for a value that is not one (issue 44: a gap
figure read `-0.000 [-0.000, -0.000]`)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from qkinspect.numbers import plain, signed, signed_alike

finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


@given(finite)
def test_signed_is_never_a_false_zero_and_reads_back_close(x):
    text = signed(x)
    if x == 0:
        assert text == "0.0000"
        return
    assert text[0] == ("+" if x > 0 else "-") and float(text) != 0
    if "e" not in text:  # the value within half a unit of the last decimal shown, two significant digits at least
        decimals = len(text.split(".")[1])
        assert abs(float(text) - x) <= 0.5 * 10.0 ** -decimals * (1 + 1e-9)
        assert decimals == 4 or abs(x) < 5e-5


@given(st.lists(finite, min_size=1, max_size=3))
def test_signed_alike_shares_one_number_of_decimals(xs):
    texts = signed_alike(*xs)
    decimals = {len(t.split(".")[1]) for t in texts if "e" not in t}
    assert len(decimals) <= 1
    assert all(not (t.startswith("-") and float(t) == 0) for t in texts)


def test_the_examples():
    assert signed(0.01234) == "+0.0123" and signed(-3.1e-05) == "-0.000031" and signed(-0.0) == "0.0000"
    assert signed(None) == "-" and signed(math.nan, missing="n/a") == "n/a"
    assert signed_alike(-3.1e-05, -5.2e-05, -1.04e-05) == ["-0.000031", "-0.000052", "-0.000010"]
    assert signed_alike(0.0712, 0.065, 0.0774) == ["+0.0712", "+0.0650", "+0.0774"]
    assert plain(-0.00001) == "0.0000" and plain(2.34567) == "2.3457"


def test_the_twin_table_prints_never_and_no_negative_zero():
    """`reach` is "never" where the variant's mean curve does not reach standard's final loss, as in the report
    (the table printed "-", the report "never"); standard's row keeps "-"."""
    import io

    from rich.console import Console

    from qkinspect.terminal.twin import render_twin

    row = dict(params=100, lr=1e-3, seeds=3, val_loss=2.0, verdict="not worse", p_one_sided_better=None)
    summary = [dict(row, variant="standard", diff=0.0, ci_low=None, ci_high=None, steps_to_standard=None),
               dict(row, variant="share_qk", diff=-3.1e-05, ci_low=-5.2e-05, ci_high=-1.04e-05,
                    steps_to_standard=None),
               dict(row, variant="symmetric", diff=0.0123, ci_low=0.001, ci_high=0.0236, steps_to_standard=40)]
    console = Console(file=io.StringIO(), width=120, no_color=True)
    render_twin(console, summary, [], [], [])
    lines = {ln.split()[0]: ln.split() for ln in console.file.getvalue().splitlines() if ln.split()}
    assert lines["standard"][-1] == "-" and lines["share_qk"][-1] == "never" and lines["symmetric"][-1] == "40"
    assert "-0.000031" in lines["share_qk"] and "-0.000052" in lines["share_qk"] and "-0.000010" in lines["share_qk"]
    assert "0.0000" in lines["standard"] and "+0.0000" not in lines["standard"]
    assert "+0.0123" in lines["symmetric"] and "+0.0010" in lines["symmetric"]
