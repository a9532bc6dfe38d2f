"""Generate docs/api.md from the package's docstrings.

Run ``python docs/gen_api.py`` after changing a public docstring;
tests/test_docs.py fails when docs/api.md is out of date.
"""
from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # document this checkout

#: module -> public names documented (None: the module's __all__)
MODULES = [
    ("meanfield", None),
    ("meanfield.activations", None),
    ("meanfield.calculus", None),
    ("meanfield.symbolic", None),
    ("meanfield.gram", None),
    ("meanfield.gram.tokens", ["token_state"]),
    ("meanfield.gaussian", None),
    ("meanfield.solvers", None),
    ("meanfield.plotting", None),
    ("meanfield.shaping", None),
    ("meanfield.scaling", None),
    ("meanfield.torch", None),
    ("meanfield.verification", None),
    ("meanfield.torch.autoinit", None),
    ("meanfield.verification.distributed", None),
    ("meanfield.torch.from_torch", None),
    ("meanfield.verification.gram", None),
    ("meanfield.torch.activations", None),
]


def _home(mod, name, obj) -> str:
    """The module that defines a public name of ``meanfield`` (data have no ``__module__``)."""
    if hasattr(obj, "__module__") and not isinstance(obj, (int, float, str, dict, tuple)):
        return obj.__module__
    exports = getattr(mod, "_EXPORTS", {})
    return f"meanfield.{exports.get(name, 'solvers')}" if name not in getattr(mod, "_OWN_NAMES", []) else mod.__name__


def _data_doc(modname: str, name: str) -> str:
    """The ``#:`` comment above ``name = ...`` in the module or one of its submodules (Sphinx's convention)."""
    for path in sorted(Path(importlib.import_module(modname).__file__).parent.rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(rf"(\w+\s*,\s*)*{re.escape(name)}\b[^=(]*=", line):
                comment = []
                while i > 0 and lines[i - 1].lstrip().startswith("#:"):
                    i -= 1
                    comment.insert(0, lines[i].lstrip()[2:].strip())
                if comment:
                    return " ".join(comment)
    return "(undocumented)"


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else "(undocumented)"


def render() -> str:
    out = ["# API reference", "",
           "Generated from the docstrings by `python docs/gen_api.py`; do not edit by hand.", ""]
    documented: dict = {}  # id of a documented callable -> the module it is documented under
    for modname, names in MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError as exc:  # optional parts (torch) may be missing
            out += [f"## `{modname}`", "", f"(not importable here: {exc})", ""]
            continue
        out += [f"## `{modname}`", "", _doc(mod).split("\n\n")[0], ""]
        names = names or getattr(mod, "__all__", [])
        for name in names:
            obj = getattr(mod, name, None)
            if obj is None or inspect.ismodule(obj):
                continue
            if modname == "meanfield" and _home(mod, name, obj) != modname:
                # re-exports are documented where they are defined
                out.append(f"- `{name}`: see `{_home(mod, name, obj)}`")
                continue
            if not callable(obj):
                value = repr(obj)  # printed when short (a code, a tuple of names), else only its type
                head = f"{modname}.{name} = {value}" if len(value) <= 120 else f"{modname}.{name}"
                out += [f"### `{head}`", "", f"*data* ({type(obj).__name__})", "", _data_doc(modname, name), ""]
                continue
            if id(obj) in documented:  # one object, one entry: the first module of MODULES that exports it
                out.append(f"- `{name}`: see `{documented[id(obj)]}.{name}`")
                continue
            documented[id(obj)] = modname
            kind = "class" if inspect.isclass(obj) else "function"
            sig = _signature(obj)
            out += [f"### `{modname}.{name}{sig}`", "", f"*{kind}*", "", "```text", _doc(obj), "```", ""]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    target = Path(__file__).with_name("api.md")
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if target.exists() and target.read_text() == text else 1)
    target.write_text(text)
    print(f"wrote {target}")
