"""The JSON form of a primitive tree: a serial is a list, every other node a dict with 'type'.

Each node writes and reads itself (:meth:`Primitive.to_json`, ``from_json``:
generic from the dataclass fields unless the primitive overrides them), so a
new primitive needs no code here; the node types are the subclasses of
:class:`Primitive` that are defined (every module of :mod:`meanfield.layers`
is imported with the subpackage).
"""
from __future__ import annotations

from .base import Primitive
from .combinators import serial

__all__ = ["tree_to_json", "tree_from_json", "primitive_classes"]


def tree_to_json(node: Primitive):
    """A primitive tree as JSON-able data: ``[{"type": "Dense", "sigma_w": "sigma_w", ...}, ...]``."""
    return node.to_json()


def primitive_classes() -> dict:
    """Every primitive class by name (the subclasses of :class:`Primitive`, at any depth)."""
    out, todo = {}, [Primitive]
    while todo:
        for sub in todo.pop().__subclasses__():
            out[sub.__name__] = sub
            todo.append(sub)
    return out


def tree_from_json(data, path: str = "tree") -> Primitive:
    """Inverse of :func:`tree_to_json` (ValueError naming the bad entry by its ``path``)."""
    if isinstance(data, list):
        return serial(*[tree_from_json(d, f"{path}[{i}]") for i, d in enumerate(data)])
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"{path}: a tree node is a list (serial) or a dict with 'type', got {data!r}")
    fields = dict(data)
    kind = fields.pop("type")
    classes = primitive_classes()
    if kind not in classes or kind == "Chain":
        raise ValueError(f"{path}: unknown node type {kind!r}; allowed: "
                         f"{', '.join(sorted(k for k in classes if k != 'Chain'))}")
    return classes[kind].from_json(fields, path, tree_from_json)
