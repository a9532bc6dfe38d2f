"""The documentation site: docs/api.rst documents every public name once, and the site builds.

The site is Sphinx over docs/ (docs/conf.py): the Markdown pages, the API reference by autodoc, the
notebooks with their stored outputs. ``python -m sphinx -W`` makes every warning an error (a broken
link, a docstring docutils cannot read, a name autodoc cannot import).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _public_modules() -> tuple[str, ...]:
    """docs/conf.py's PUBLIC_MODULES, read without running conf.py (which imports torch)."""
    tree = ast.parse((DOCS / "conf.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PUBLIC_MODULES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("docs/conf.py defines no PUBLIC_MODULES")


def _api_entries() -> dict[str, list[str]]:
    """module -> the names of the autosummary tables of docs/api.rst under its ``currentmodule``."""
    entries: dict[str, list[str]] = {}
    module, in_table = None, False
    for line in (DOCS / "api.rst").read_text().splitlines():
        if m := re.match(r"\.\. currentmodule:: (\S+)", line):
            module, in_table = m.group(1), False
        elif line.startswith(".. autosummary::"):
            in_table = True
        elif in_table and re.fullmatch(r"   \w+", line):
            entries.setdefault(module, []).append(line.strip())
        elif in_table and line and not line.startswith("   "):
            in_table = False
    return entries


def _expected(module: str) -> list[str]:
    names = list(importlib.import_module(module).__all__)
    if module == "meanfield.verification":   # its re-exports of the torch tools are documented there
        names = [n for n in names if n not in importlib.import_module("meanfield.torch").__all__]
    return names


@pytest.mark.slow   # imports every public module: sympy, numba, torch, dask (~4 s of CPU)
def test_api_reference_lists_every_public_name_once():
    """docs/api.rst has one entry per name of ``__all__`` of each public module, and no other."""
    import meanfield

    modules = _public_modules()
    entries = _api_entries()
    assert set(entries) == set(modules), (sorted(entries), modules)
    # every submodule ``import meanfield`` loads on first use has its section
    assert {f"meanfield.{m}" for m in meanfield._LAZY_SUBMODULES} <= set(modules)
    for module in modules:
        if module.startswith(("meanfield.torch", "meanfield.verification")):
            pytest.importorskip("torch", reason="the torch tools' names need torch (verify extra)")
        listed, expected = entries[module], _expected(module)
        assert len(listed) == len(set(listed)), f"{module}: listed twice: {sorted(n for n in listed if listed.count(n) > 1)}"
        assert set(listed) == set(expected), (f"{module}: not in docs/api.rst: {sorted(set(expected) - set(listed))}; "
                                              f"not public: {sorted(set(listed) - set(expected))}")


def _text(page: Path) -> str:
    """The text of an HTML page: tags dropped, entities decoded, spaces collapsed."""
    import html

    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", page.read_text())))


@pytest.mark.slow   # ~30 s of CPU (100+ s wall on a loaded 2-core machine): autodoc over ~170 names, 8 notebooks
def test_site_builds_without_warnings(tmp_path):
    """``python -m sphinx -W -b html docs ...`` succeeds, and the pages hold what autodoc and myst-nb made."""
    pytest.importorskip("sphinx", reason="the documentation site needs the docs extra: pip install \".[docs]\"")
    pytest.importorskip("myst_nb", reason="the documentation site needs the docs extra: pip install \".[docs]\"")
    pytest.importorskip("torch", reason="the API reference documents the torch tools (verify extra)")
    out = tmp_path / "html"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    # autodoc saw every public name (the package's __init__ is lazy): each has its page and anchor
    for module, names in _api_entries().items():
        for name in names:
            page = out / "generated" / f"{module}.{name}.html"
            assert page.is_file(), page.name
            anchor = f"module-{module}.{name}" if inspect.ismodule(getattr(importlib.import_module(module), name)) \
                else f"{module}.{name}"   # mf.symbols is a module
            assert f'id="{anchor}"' in page.read_text(), f"{page.name}: autodoc documented nothing"
    # a constant shows its value and the meaning from its #: comment, not the docstring of int
    phase = _text(out / "generated" / "meanfield.PHASE_CHAOTIC.html")
    assert "meanfield.PHASE_CHAOTIC = 1" in phase and "chaotic”: chi_J* > 1" in phase and "int([x])" not in phase
    # a paragraph after the parameters is not read as more parameters (napoleon's numpydoc reading)
    network = (out / "generated" / "meanfield.Network.html").read_text()
    assert "Every public function that takes an Architecture" in network
    assert not re.search(r"<strong>Every public", network)
    # the notebooks are pages with their stored outputs (figures), and the guides link to them
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert (out / "notebooks" / f"{nb.stem}.html").is_file(), nb.name
    assert list((out / "_images").glob("*.png")), "no notebook figure rendered"
    # a link to a repository file outside docs/ became a download of that file
    assert (out / "_downloads").is_dir() and any(p.name == "README.md" for p in (out / "_downloads").rglob("*"))
