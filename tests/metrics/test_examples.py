"""The docstring examples of the metrics engine run (those not marked +SKIP)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["qkinspect.analysis.run", "qkinspect.metrics.factored", "qkinspect.metrics.spectrum",
           "qkinspect.metrics.registry", "qkinspect.metrics.layer_form", "qkinspect.composition.run"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
