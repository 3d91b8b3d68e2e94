"""The runnable examples in the library's docstrings run and print what they say."""

import doctest
import importlib

import pytest

MODULES = [
    "keras_antisym.cells",
    "keras_antisym.layers",
    "keras_antisym.initializers",
    "keras_antisym.stability",
    "keras_antisym.diagnostics",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
