"""Sphinx configuration of meanfield's documentation site.

Build (warnings are errors)::

    pip install ".[verify,docs]"        # verify: the torch tools have pages too
    python -m sphinx -W -b html docs docs/_build/html

The pages are the Markdown files of this folder (MyST), the API reference is
autodoc over the public names (docs/api.rst lists them; tests/test_docs_site.py
checks that the list is ``meanfield.__all__`` and the public submodules'
``__all__``), and the notebooks of notebooks/ are rendered with their stored
outputs, not executed (docs/notebooks is a link to ../notebooks).
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # document this checkout, not an installed copy

import meanfield  # noqa: E402

project = "meanfield"
author = "The meanfield developers"
copyright = "The meanfield developers"
release = version = meanfield.__version__

extensions = [
    "myst_nb",                   # Markdown pages (myst-parser) and the notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]
templates_path = ["_templates"]
html_theme = "alabaster"
html_title = f"meanfield {release}"
html_static_path: list[str] = []

# --- MyST: the pages and the notebooks' Markdown cells -----------------------------------------
# dollarmath: the notebooks' $...$ and $$...$$; amsmath: \begin{align} blocks rendered by MathJax
myst_enable_extensions = ["dollarmath", "amsmath"]
# "## A heading" gets an anchor, so that links such as gram.md#resmlp-and-mlp-mixer-... resolve
myst_heading_anchors = 3
# the notebooks carry their outputs (tests/test_notebooks.py re-runs them); the site shows those
nb_execution_mode = "off"
# the text several print() calls of one cell wrote shows as one block, as in Jupyter
nb_merge_streams = True

# --- autodoc ------------------------------------------------------------------------------------
#: the modules whose ``__all__`` the API reference documents (docs/api.rst; tests/test_docs_site.py
#: checks that the page lists exactly these names, the torch tools once, under meanfield.torch)
PUBLIC_MODULES = ("meanfield", "meanfield.shaping", "meanfield.scaling", "meanfield.autoinit",
                  "meanfield.plotting", "meanfield.torch", "meanfield.verification",
                  "meanfield.verification.distributed", "meanfield.verification.gram")


def _long_values():
    """Public constants whose repr is too long to print (a registry of torch activations)."""
    long = []
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        for name in module.__all__:
            value = getattr(module, name)
            if not callable(value) and not inspect.ismodule(value) and len(repr(value)) > 300:
                long.append(f"{modname}.{name}")
    return long


autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autosummary_context = {"long_values": _long_values()}
napoleon_google_docstring = True
napoleon_numpy_docstring = True


def _data_comment(app, what, name, obj, options, lines):
    """The ``#:`` comment of a public constant, wherever it is defined (``mf.PHASE_ORDERED``).

    autodoc reads ``#:`` comments only in the module it documents from, and otherwise shows the
    docstring of the value's type (``dict``'s for ``PHASES``); a constant documented under its
    public name is often defined in a submodule, found here through the submodules that list it
    in ``__all__``. Runs after napoleon (priority 550 > 500), which would read the comment
    "phase code 1, "chaotic": ..." as a type and a description.
    """
    if what != "data" or not name.startswith("meanfield."):
        return
    from sphinx.pycode import ModuleAnalyzer

    public = name.rsplit(".", 1)[1]
    for modname in sorted(m for m in sys.modules if m.startswith("meanfield.")):
        if public not in getattr(sys.modules[modname], "__all__", ()):
            continue
        try:
            docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
        except Exception:   # no source to read (a compiled module)
            continue
        if ("", public) in docs:
            lines[:] = list(docs["", public])
            return
    if type(obj).__doc__ and "\n".join(lines).strip() == inspect.cleandoc(type(obj).__doc__):
        lines.clear()   # the type's docstring says nothing about this constant


# The package's docstrings write maths as plain text: |x| for an absolute value, a_+ and a_- for
# subscripts, initialise_ for a function name. reStructuredText reads |...| as a substitution and
# word_ as a hyperlink reference; both are escaped here outside ``literals`` and `roles`, so that
# they print as written.
_LITERAL = re.compile(r"(``.+?``|:\w+(?::\w+)?:`[^`]*`|`[^`]*`_{0,2})")
_FIELD = re.compile(r"^(:[^:`]+:)(\s.*|$)")


def _escape_plain_maths(text):
    parts = _LITERAL.split(text)
    for i in range(0, len(parts), 2):   # the even parts lie outside literals and roles
        parts[i] = re.sub(r"(?<!\\)\|", r"\\|", parts[i])
        parts[i] = re.sub(r"(?<=\w)_(?=[\s\-.,:;!?/'\")\]}>]|$)", r"\\_", parts[i])
    return "".join(parts)


def _plain_maths(app, what, name, obj, options, lines):
    """Escape plain-text maths; end a field list (napoleon's Parameters) with a blank line.

    Runs after napoleon (priority 600 > 500), on the reStructuredText it made. A numpydoc
    docstring may end with a paragraph right after its last parameter; napoleon then leaves the
    paragraph glued to the field list, which docutils rejects.
    """
    out = []
    in_fields = False
    for line in lines:
        field = _FIELD.match(line)
        if in_fields and line and not line[0].isspace() and not field:
            out.append("")
        if field:
            line = field.group(1) + _escape_plain_maths(field.group(2))
        else:
            line = _escape_plain_maths(line)
        out.append(line)
        in_fields = bool(field) or (in_fields and (not line or line[0].isspace()))
    lines[:] = out
    _check_parameters(name, lines)


#: numpydoc sections whose entries are "name : type" lines with an indented description
_FIELD_SECTIONS = {"Parameters", "Other Parameters", "Returns", "Yields", "Raises", "Warns", "Attributes"}
_FIELD_HEADER = re.compile(r"^\*{0,2}\w+(\s*,\s*\*{0,2}\w+)*(\s*:.*)?$")


def _numpy_prose(app, what, name, obj, options, lines):
    """A paragraph after the last entry of a Parameters (Returns ...) section gets a Notes heading.

    Runs before napoleon (priority 400 < 500). numpydoc ends a section only at the next
    heading, so napoleon would read the lines of such a paragraph as more parameters; the
    heading it gets here makes it the Notes it is.
    """
    section, i = None, 0
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and line.strip() and re.fullmatch(r"-{3,}", lines[i + 1].strip()):
            section, i = line.strip(), i + 2
            end = i
            while end < len(lines) and lines[end].strip() and not lines[end][0].isspace():
                end += 1
            if section in ("Returns", "Yields") and end - i > 1:
                # a sentence, not "type / indented description": napoleon would make each of its
                # lines a return type; it is written here as the field list napoleon would make
                lines[i - 2:end] = ([f":{section.lower()}: {lines[i]}"]
                                    + ["   " + text for text in lines[i + 1:end]])
                section, i = None, i - 2 + end - i
            continue
        # the first line of a section is its first entry, whatever it looks like (a return type)
        first = i >= 1 and re.fullmatch(r"-{3,}", lines[i - 1].strip())
        if (section in _FIELD_SECTIONS and line and not line[0].isspace() and not first
                and not _FIELD_HEADER.match(line)):
            lines[i:i] = ["", "Notes", "-----", ""] if lines[i - 1].strip() else ["Notes", "-----", ""]
            section = "Notes"
        i += 1


def _check_parameters(name, lines):
    """A ``:param X:`` whose X is not a list of names means a docstring napoleon misread: warn (-W fails)."""
    from sphinx.util import logging

    for line in lines:
        m = re.match(r"^:param ([^:]*):", line)
        if m and not re.fullmatch(r"\\?\*{0,2}[\w\\]+(, \\?\*{0,2}[\w\\]+)*", m.group(1)):
            logging.getLogger(__name__).warning(f"{name}: napoleon read {m.group(1)!r} as a parameter name; "
                                                "give the paragraph after the parameters a Notes heading")


def _out_of_tree_links(app, doctree):
    """A Markdown link to a file of the repository outside docs/ becomes a download link.

    The guides link to ../benchmarks/README.md and to the verification report, which are not
    pages of the site; MyST would look for them as pages and warn. Runs before Sphinx's download
    collector (priority 400 < 500), which then copies the file into the site.
    """
    from sphinx import addnodes

    docdir = Path(app.env.doc2path(app.env.docname)).parent
    for node in list(doctree.findall(addnodes.pending_xref)):
        if node.get("reftype") != "myst" or node.get("refdomain") != "doc":
            continue
        if node["reftarget"] in app.env.found_docs:
            continue
        target = next((p for p in (Path(node["reftarget"] + suffix) for suffix in (".md", ""))
                       if p.is_absolute() and p.is_file() and ROOT in p.parents), None)
        if target is None:
            continue   # a page that really is missing: MyST warns, and -W fails the build
        download = addnodes.download_reference(
            refdomain=None, reftype="myst", refexplicit=True, refdoc=app.env.docname,
            reftarget=os.path.relpath(target, docdir))
        download += node.children
        node.replace_self(download)


def setup(app):
    app.connect("autodoc-process-docstring", _data_comment, priority=550)
    app.connect("autodoc-process-docstring", _numpy_prose, priority=400)
    app.connect("autodoc-process-docstring", _plain_maths, priority=600)
    app.connect("doctree-read", _out_of_tree_links, priority=400)
