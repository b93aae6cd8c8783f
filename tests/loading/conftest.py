"""Fixtures for the loading tests: no test here may reach a network, or read the user's Hugging Face cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_hub(monkeypatch, tmp_path_factory):
    """Point the hub at a private empty cache and an unreachable endpoint; offline unless a test says otherwise."""
    home = tmp_path_factory.mktemp("hf_home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: connection refused at once
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
