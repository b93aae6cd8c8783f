"""The real executable in a real pipe: stdout carries only the JSON document, notes go to stderr."""

from __future__ import annotations

import subprocess
import sys


def test_analyze_json_pipes_into_json_load(tiny_bert):
    cmd = f"{sys.executable} -m qkinspect analyze {tiny_bert} --layers 0 --format json"
    check = f"{sys.executable} -c 'import json,sys; d = json.load(sys.stdin); print(d[\"schema\"], len(d[\"heads\"]))'"
    p = subprocess.run(f"set -o pipefail; {cmd} | {check}", shell=True, executable="/bin/bash",
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "qkinspect/1 4"


def test_demo_pipe_without_format_is_json_and_note_on_stderr():
    p = subprocess.run([sys.executable, "-m", "qkinspect", "analyze", "--layers", "5", "--metrics", "symmetry"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.lstrip().startswith("{") and '"kind": "analyze"' in p.stdout
    assert "note: no model given" in p.stderr


def test_missing_model_subprocess_exit_2():
    p = subprocess.run([sys.executable, "-m", "qkinspect", "analyze", "/no/such/model"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == ["error: /no/such/model: no such file or folder"]
