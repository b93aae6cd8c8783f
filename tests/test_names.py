"""The one names type (qkinspect.names) and the analysis request it names options in (qkinspect.analysis.request)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.sweep.names import CLI_NAMES, LIBRARY_NAMES


def test_library_names_are_the_arguments_and_cli_names_the_options():
    assert LIBRARY_NAMES.workers == "workers" and LIBRARY_NAMES.said("scheduler", "x") == "scheduler='x'"
    assert CLI_NAMES.hf_cache == "--hf-cache" and CLI_NAMES.from_file == "--from"
    assert CLI_NAMES.models == "MODEL arguments" and CLI_NAMES.said("workers", 0) == "--workers 0"
    assert CLI_NAMES.said("scheduler", "x", quoted=True) == "--scheduler 'x'"


def test_names_are_frozen_and_compare_by_spelling():
    assert Names.cli(blocks="--block") == Names.cli(blocks="--block") != Names(blocks="--block")
    assert len({Names(), Names()}) == 1
    with pytest.raises(AttributeError):
        Names().workers = "n"


def test_the_analysis_request_names_the_option_as_the_caller_does():
    from qkinspect.analysis.request import check_request

    with pytest.raises(InputError, match=r"^precision='float16': choose float32 or float64$"):
        check_request(precision="float16")
    with pytest.raises(InputError, match=r"^--precision float16: choose"):
        check_request(precision="float16", names=Names.cli())
    with pytest.raises(InputError, match="unknown spectrum"):
        check_request(spectra=("qq",))
    r = check_request(metrics=["symmetry"], precision="float64")
    assert r.precision == "float64" and "symmetry" in r.metrics and r.spectra == ("qk",)


def test_the_request_and_the_analysis_face_load_no_torch():
    code = ("import sys\nimport qkinspect.analysis.request, qkinspect.analysis, qkinspect.names, qkinspect.processing\n"
            "import qkinspect.rho, qkinspect.extract\nassert 'torch' not in sys.modules, 'torch loaded'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
