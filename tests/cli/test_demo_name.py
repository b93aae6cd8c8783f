"""The demo model has one name whether it is given by folder, by weight file, or not at all."""

from __future__ import annotations

import json

import pytest

from qkinspect.demo import DEMO_NAME, demo_path
from qkinspect.errors import DemoNotInstalledError


@pytest.fixture(scope="module")
def demo():
    try:
        return demo_path()
    except DemoNotInstalledError as e:
        pytest.skip(str(e))


def test_the_demo_has_one_name(cli, demo):
    names = []
    for args in ([], [demo], [demo / "model.safetensors"]):
        r = cli("info", *args, "--format", "json")
        assert r.exit_code == 0, r.stderr
        names.append(json.loads(r.stdout)["model"]["name"])
    assert names == [DEMO_NAME] * 3


def test_another_folder_keeps_its_own_name(cli, tiny_bert):
    r = cli("info", tiny_bert, "--format", "json")
    assert json.loads(r.stdout)["model"]["name"] == tiny_bert.name != DEMO_NAME
