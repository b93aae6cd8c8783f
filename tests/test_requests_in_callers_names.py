"""The analysis', the atlas's, the composition's, the directions' and the sweep's requests are checked once, in the
library, torch-free, and refused in the caller's option names: the library's arguments by default, the CLI's options
with its names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qkinspect.errors import InputError
from qkinspect.sweep.names import CLI_NAMES as ENGINE_CLI


@pytest.mark.parametrize(("call", "library", "cli"), [
    ("atlas", "^workers: 0 must be at least 1$", "^--workers: 0 must be at least 1$"),
    ("composition", "^kinds=x: choose among q, k, v$", "^--kinds x: choose among q, k, v$"),
    ("directions", r"^top_tokens=0: give a whole number from 1 to 1000$", "^--top-tokens: 0 must be from 1 to 1000$"),
    ("analysis", r"^layers='0-x': '0-x' is not an index or a range like 0-3$",
     r"^--layers: '0-x' is not an index or a range like 0-3$"),
    ("sweep", "^threads: 0 must be at least 1$", "^--threads: 0 must be at least 1$"),
    ("sweep-layers", "^layers='x': 'x' is not an index", "^--layers: 'x' is not an index"),
    ("sweep-precision", "^precision='float16': choose float32 or float64$", "^--precision float16: choose float32"),
])
def test_a_refusal_names_the_option_as_the_caller_spells_it(call, library, cli):
    from qkinspect.analysis import request as analysis
    from qkinspect.atlas.request import check_request as atlas_request
    from qkinspect.composition import request as composition
    from qkinspect.directions import request as directions
    from qkinspect.sweep.request import check_request as sweep_request

    def ask(names):
        if call.startswith("sweep"):  # the engine's options first, then the analysis's, in the sweep's names
            options = {"sweep-layers": {"layers": "x", "metrics": ["symmetry"]},
                       "sweep-precision": {"precision": "float16"}}.get(call, {"layers": "x"})
            return sweep_request("out", options, threads=0 if call == "sweep" else None,
                                 **({"names": names} if names else {}))
        if call == "atlas":
            return atlas_request("out", workers=0, **({"names": names} if names else {}))
        if call == "composition":
            return composition.check_request(kinds="x", **({"names": names} if names else {}))
        if call == "analysis":
            return analysis.check_request(layers="0-x", **({"names": names} if names else {}))
        return directions.check_request(top_tokens=0, **({"names": names} if names else {}))

    with pytest.raises(InputError, match=library):
        ask(None)
    names = {"atlas": ENGINE_CLI, "composition": composition.CLI_NAMES, "directions": directions.CLI_NAMES,
             "analysis": analysis.CLI_NAMES}.get(call, ENGINE_CLI)
    with pytest.raises(InputError, match=cli):
        ask(names)


def test_the_requests_are_checked_without_torch():
    code = ("import sys\n"
            "from qkinspect.atlas.request import check_request as a\n"
            "from qkinspect.composition.request import check_request as c\n"
            "from qkinspect.directions.request import check_request as d\n"
            "from qkinspect.analysis.request import check_request as n\n"
            "from qkinspect.sweep.request import check_request as s\n"
            "a('out', metrics='symmetry', workers=1, threads=1)\n"
            "c(kinds='k', layers='0-1', from_heads=[0, 1])\n"
            "d(layers='0', heads=[0], top_directions=2, reading='cosine')\n"
            "n(['symmetry'], layers='0-1', heads=[0], blocks='encoder', layer_form=True)\n"
            "s('out', {'layers': '0-1', 'metrics': ['symmetry'], 'precision': 'float64'}, workers=1, threads=1)\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_each_side_of_a_composition_keeps_its_own_selection():
    from qkinspect.composition.request import check_request

    r = check_request(layers="0-2", heads="1", to_layers=[3, 4])
    assert r.side("from") == ((0, 1, 2), (1,)) and r.side("to") == ((3, 4), (1,))


def test_the_analysis_checks_the_model_in_the_callers_names():
    """One check against the model, after the syntax: `analyze`, `compare` and `spectrum` in the library's names
    (the CLI's are pinned by the CLI's tests and bench/same_outputs.py)."""
    import qkinspect
    from qkinspect.analysis.compare import compare
    from qkinspect.analysis.spectrum import spectrum

    with pytest.raises(InputError, match="^layers=9 is out of range; encoder has layers 0-5$"):
        qkinspect.analyze(None, layers=9)
    with pytest.raises(InputError, match="^heads=40 is out of range; encoder has heads 0-11$"):
        compare(None, None, heads="40")
    with pytest.raises(InputError, match="^layer=9 is out of range; encoder has layers 0-5$"):
        spectrum(None, layer=9)
    with pytest.raises(InputError, match="^head=12 is out of range"):
        spectrum(None, head=12)
    with pytest.raises(InputError, match=r"^fold_qk_norm=True: the selected blocks have no q/k norm$"):
        qkinspect.analyze(None, layers="0", fold_qk_norm=True)
    with pytest.raises(InputError, match=r"^blocks=decoder \(did you mean encoder\?\): this model's blocks are"):
        qkinspect.analyze(None, blocks="decoder")
