"""The runnable examples in the library's docstrings run and print what they say."""

import doctest
import importlib

import pytest

from tests.limits import limit

MODULES = [
    "keras_antisym.cells",
    "keras_antisym.layers",
    "keras_antisym.initializers",
    "keras_antisym.stability",
    "keras_antisym.diagnostics",
]


def test_each_cell_and_layer_documents_every_argument_in_its_signature_order():
    """Shared arguments read as in the class that describes them first (the cell's, then the
    fused layer's own), so a description is written once."""
    from keras_antisym import (
        AntisymmetricCell,
        AntisymmetricRNN,
        GatedAntisymmetricCell,
        GatedAntisymmetricRNN,
    )
    from keras_antisym._docstrings import argument_docs, parameters

    cell, layer = argument_docs(AntisymmetricCell), argument_docs(AntisymmetricRNN)
    for cls in (AntisymmetricCell, GatedAntisymmetricCell, AntisymmetricRNN, GatedAntisymmetricRNN):
        docs = argument_docs(cls)
        assert list(docs) == parameters(cls), cls.__name__
        for name in ("epsilon", "gamma", "recurrent_initializer", "recurrent_dropout"):
            assert docs[name] == cell[name], (cls.__name__, name)
    gated_layer = argument_docs(GatedAntisymmetricRNN)
    assert gated_layer["fused_kernel"] == layer["fused_kernel"]
    assert "fused_kernel" in layer and "fused_kernel" not in cell
    assert gated_layer["recurrent_activation"][0].startswith("    recurrent_activation: Activation")


def test_an_argument_no_docstring_describes_is_named():
    from keras_antisym import AntisymmetricCell
    from keras_antisym._docstrings import arguments_from

    class Cell(AntisymmetricCell):
        """A cell.

        Args:
            units: The state's size.
        """

        def __init__(self, units, warp=1.0, **kwargs):
            super().__init__(units, **kwargs)

    with pytest.raises(ValueError, match="Cell: argument `warp` has no description"):
        arguments_from(AntisymmetricCell)(Cell)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0


def test_the_built_reference_shows_examples_as_code_and_call_arguments_as_lists(tmp_path):
    """The API page as a reader sees it: every docstring example is a highlighted code
    block (not a run-on paragraph or a quote), every "Call arguments" section a list."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(tmp_path)],
        cwd=root, check=True, capture_output=True, timeout=limit(120),
    )  # fmt: skip
    page = (tmp_path / "api.html").read_text()
    blocks = re.findall(r"<pre\b.*?</pre>", page, re.S)
    outside = re.sub(r"<pre\b.*?</pre>", "", page, flags=re.S)
    assert "&gt;&gt;&gt;" not in outside  # no prompt left in prose or a quote
    examples = [block for block in blocks if "&gt;&gt;&gt;" in block]
    documented = len(re.findall(r"^::: ", (root / "docs" / "api.md").read_text(), re.M))
    assert len(examples) == documented, (len(examples), documented)  # one per object
    assert all('class="gp"' in block for block in examples)  # highlighted when built
    sections = re.findall(r'<details class="call-arguments".*?</details>', page, re.S)
    assert len(sections) >= 3  # the layer and the two cells
    assert all("<ul>" in section and "<li><code>" in section for section in sections)
    # Every argument of each cell and layer is listed in its own entry.
    import keras_antisym
    from keras_antisym._docstrings import parameters

    for name in ("AntisymmetricRNN", "GatedAntisymmetricRNN", "AntisymmetricCell",
                 "GatedAntisymmetricCell"):  # fmt: skip
        entry = page.split(f'<h2 id="keras_antisym.{name}"', 1)[1].split("<h2 id=", 1)[0]
        listed = entry.split("Call arguments", 1)[0]
        missing = [arg for arg in parameters(getattr(keras_antisym, name))
                   if f"<code>{arg}</code>" not in listed]  # fmt: skip
        assert not missing, (name, missing)


def test_the_built_site_needs_nothing_from_the_network_and_highlights_every_guide(tmp_path):
    """Offline, the site reads as online: no page loads a script or a stylesheet from
    another host, the guides' code is highlighted at build time (Pygments' classes), and
    the site's stylesheet carries the highlighting and the wide content column."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(tmp_path)],
        cwd=root, check=True, capture_output=True, timeout=limit(120),
    )  # fmt: skip
    pages = sorted(tmp_path.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        text = page.read_text()
        loaded = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="([^"]+)"', text)
        assert not [url for url in loaded if re.match(r"(https?:)?//", url)], page
    training = (tmp_path / "training.html").read_text()
    blocks = re.findall(r'<div class="highlight"><pre>.*?</pre>', training, re.S)
    python = [block for block in blocks if "train_and_evaluate" in block]
    assert python and all('<span class="kn">import</span>' in block for block in python)
    css = (tmp_path / "css" / "site.css").read_text()
    assert ".highlight .kn" in css and "max-width: 1100px" in css


def test_every_internal_link_of_the_built_site_opens_a_file_from_disk(tmp_path):
    """The site read from disk (file://, no server): each link of each page, navigation
    and "Next" included, resolves to a file it holds, never to a folder (which a browser
    shows as a directory listing)."""
    import re
    import subprocess
    import sys
    from pathlib import Path
    from urllib.parse import unquote, urlsplit

    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(tmp_path)],
        cwd=root, check=True, capture_output=True, timeout=limit(120),
    )  # fmt: skip
    broken, checked = [], 0
    # 404.html is a web server's error page, with links from the site's root: never opened
    # from disk.
    for page in sorted(set(tmp_path.rglob("*.html")) - {tmp_path / "404.html"}):
        for href in re.findall(r'<a\b[^>]*\bhref="([^"]*)"', page.read_text()):
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or not parts.path:  # another site, or #anchor
                continue
            checked += 1
            target = (page.parent / unquote(parts.path)).resolve()
            if not target.is_file():
                broken.append(f"{page.relative_to(tmp_path)}: {href}")
    assert checked > 100 and broken == [], broken[:20]
