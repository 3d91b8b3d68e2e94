"""A Griffe extension for the API reference: class docstrings as the imported package has them.

mkdocstrings reads `keras_antisym` from its source. The cells' and layers'
`Args:` sections are composed when their classes are created
(`keras_antisym/_docstrings.py`: each lists every argument it takes, each
description written once), so for every class whose imported docstring differs
from its source's, the reference shows the imported one. Only the classes are
read from the modules that importing the package loads (not every module, as
Griffe's inspection would: the legacy module and the GPU kernels load other
frameworks).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

import griffe


class RuntimeDocstrings(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "keras_antisym":
            importlib.import_module(pkg.name)
            self._replace(pkg)

    def _replace(self, module: griffe.Module) -> None:
        for member in module.members.values():
            if member.is_alias:
                continue
            if isinstance(member, griffe.Module):
                self._replace(member)
            elif isinstance(member, griffe.Class) and member.docstring is not None:
                runtime = getattr(sys.modules.get(module.path), member.name, None)
                text = inspect.cleandoc(getattr(runtime, "__doc__", None) or "")
                if text and text != member.docstring.value:
                    source = member.docstring
                    member.docstring = griffe.Docstring(
                        text, lineno=source.lineno, parent=member, parser=source.parser,
                        parser_options=source.parser_options,
                    )  # fmt: skip
