"""Results as data: JSON-ready dicts, short reprs, and save/load (JSON, NPZ, CSV).

Two encodings share this module:

* :func:`to_jsonable` -- plain strict JSON for the CLI's ``--json`` and reports.
  JSON has no NaN or infinity: ``nan`` becomes ``null`` and ``inf`` becomes the
  strings ``"inf"`` / ``"-inf"``, so any parser reads it. It is one-way.
* :func:`encode` / :func:`decode` -- the lossless form behind
  :meth:`Result.save` and :func:`load`: arrays keep their dtype and shape,
  non-finite floats are tagged, tuples stay tuples, nested results (the
  :class:`~meanfield.CriticalPoint` s of :class:`~meanfield.CriticalPoints`)
  and the :class:`~meanfield.Architecture` are rebuilt. ``save(path)`` picks
  the format from the extension: ``.json`` (everything in one strict JSON
  file), ``.npz`` (arrays as numpy arrays, the rest as JSON in the entry
  ``__meta__``; loads with ``allow_pickle=False``) or ``.csv`` (the arrays
  that share the result's grid as columns, one row per grid point, after a
  first line ``# meanfield {...}`` holding the rest as JSON: reloadable;
  ``pandas.read_csv(path, comment="#")`` reads the columns).

Every public result class derives from :class:`Result`, which gives it the
short repr (what was computed, array shapes and ranges, headline numbers), the
``to_dict`` used for JSON, and ``save`` / ``load``. The architecture is stored
by its spec (activation name and parameters, norm, mu, block, eps, stages), so
results of user-defined activations (``mf.activation(...)`` objects that are
not in the registry) save, but load only after the activation is registered.
"""
from __future__ import annotations

import dataclasses
import math
from enum import Enum

import numpy as np

# json, csv, importlib and pathlib are imported where used: ``import meanfield`` imports this
# module (every result derives from Result) and must stay quick

__all__ = ["to_jsonable", "encode", "decode", "dumps", "write_csv", "Result", "load", "summarize", "FORMAT_VERSION"]

#: version of the lossless encoding written by :meth:`Result.save`
FORMAT_VERSION = 1


def _float(v: float):
    if math.isnan(v):
        return None
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def to_jsonable(obj):
    """Recursively convert ``obj`` into dicts, lists, strings, numbers and None (one-way, strict JSON)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _float(float(obj))
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()] if obj.ndim else to_jsonable(obj.item())
    if hasattr(obj, "to_dict") and not isinstance(obj, type):  # e.g. Architecture: its spec, not its internals
        return to_jsonable(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    try:  # sympy numbers and anything else float() understands
        return _float(float(obj))
    except (TypeError, ValueError):
        return str(obj)


# ---------------------------------------------------------------------------
# Lossless encoding.
# ---------------------------------------------------------------------------
def _enc_float(v: float):
    v = float(v)
    return v if math.isfinite(v) else {"__float__": repr(v)}   # 'nan', 'inf', '-inf'


def _enc_array_values(a: np.ndarray):
    if a.dtype.kind == "f":
        return [None if math.isnan(v) else (v if math.isfinite(v) else repr(v)) for v in a.ravel().tolist()]
    if a.dtype.kind in "biu":
        return a.ravel().tolist()
    if a.dtype.kind in "UO":
        return [str(v) for v in a.ravel().tolist()]
    raise TypeError(f"cannot encode an array of dtype {a.dtype}")


def _architecture_spec(arch) -> dict:
    return {"activation": arch.activation.name, "activation_params": [list(p) for p in arch.activation_params],
            "norm": arch.norm, "mu": arch.mu, "block": arch.block, "eps": arch.eps, "stages": arch.stages}


def encode(obj, arrays: dict | None = None, _path: str = ""):
    """The lossless JSON form of ``obj``; with ``arrays`` (a dict), arrays go there instead (for NPZ)."""
    from .calculus import Architecture, TreeSpec

    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _enc_float(obj)
    if isinstance(obj, np.ndarray):
        kind = "str" if obj.dtype.kind in "UO" else str(obj.dtype)
        if arrays is not None and obj.dtype.kind in "biuf":
            key = _path or f"a{len(arrays)}"
            while key in arrays:
                key += "_"
            arrays[key] = obj
            return {"__npz__": key}
        return {"__ndarray__": _enc_array_values(obj), "dtype": kind, "shape": list(obj.shape)}
    if isinstance(obj, Architecture):
        return {"__architecture__": _architecture_spec(obj)}
    if isinstance(obj, TreeSpec):   # a Network: its JSON form (calculus.to_json)
        return {"__network__": obj.to_json()}
    if isinstance(obj, Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        fields = {f.name: encode(getattr(obj, f.name), arrays, f"{_path}.{f.name}".lstrip("."))
                  for f in dataclasses.fields(obj)}
        return {"__result__": f"{cls.__module__}.{cls.__qualname__}", "fields": fields}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, arrays, f"{_path}.{i}".lstrip(".")) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, arrays, f"{_path}.{i}".lstrip(".")) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return {"__dict__": [[encode(k), encode(v, arrays, f"{_path}.{k}".lstrip("."))] for k, v in obj.items()]}
    try:  # sympy numbers
        return _enc_float(float(obj))
    except (TypeError, ValueError):
        raise TypeError(f"cannot save a {type(obj).__name__} ({obj!r:.60})") from None


def _dec_array(d):
    dtype = d["dtype"]
    vals = d["__ndarray__"]
    if dtype == "str":
        return np.array(vals, dtype=str).reshape(d["shape"])
    if np.dtype(dtype).kind == "f":
        vals = [np.nan if v is None else float(v) for v in vals]
    return np.array(vals, dtype=dtype).reshape(d["shape"])


def decode(data, arrays=None):
    """Inverse of :func:`encode`."""
    if isinstance(data, list):
        return [decode(v, arrays) for v in data]
    if not isinstance(data, dict):
        return data
    if "__float__" in data:
        return float(data["__float__"])
    if "__ndarray__" in data:
        return _dec_array(data)
    if "__npz__" in data:
        return np.asarray(arrays[data["__npz__"]])
    if "__tuple__" in data:
        return tuple(decode(v, arrays) for v in data["__tuple__"])
    if "__dict__" in data:
        return {decode(k, arrays): decode(v, arrays) for k, v in data["__dict__"]}
    if "__architecture__" in data:
        from .calculus import Architecture

        spec = dict(data["__architecture__"])
        params = tuple(tuple(p) for p in spec.pop("activation_params"))
        try:
            return Architecture(activation_params=params, **spec)
        except ValueError as exc:
            raise ValueError(f"the saved architecture {spec} cannot be rebuilt ({exc}); a user-defined "
                             "activation must be registered before loading") from None
    if "__network__" in data:
        from .calculus import from_json

        return from_json(data["__network__"])
    if "__result__" in data:
        import importlib

        modname, _, clsname = data["__result__"].rpartition(".")
        if not modname.startswith("meanfield"):
            raise ValueError(f"not a meanfield result: {data['__result__']!r}")
        cls = getattr(importlib.import_module(modname), clsname)
        fields = {k: decode(v, arrays) for k, v in data["fields"].items()}
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in names})
    return {k: decode(v, arrays) for k, v in data.items()}


_FORMATS = (".json", ".npz", ".csv")


def _suffix(path) -> str:
    from pathlib import Path

    suf = Path(path).suffix.lower()
    if suf not in _FORMATS:
        raise ValueError(f"path must end in one of {', '.join(_FORMATS)} (the format), got {str(path)!r}")
    return suf


def dumps(obj, indent=None) -> str:
    """The text of ``obj`` saved as ``.json`` (what :func:`save` writes and :func:`load` reads)."""
    import json

    return json.dumps({"meanfield_format": FORMAT_VERSION, "data": encode(obj)}, allow_nan=False, indent=indent)


def save(obj, path):
    """Write ``obj`` (a result) to ``path``; the format follows the extension (see the module notes).

    Returns the path (a :class:`pathlib.Path`).
    """
    import json
    from pathlib import Path

    path = Path(path)
    suf = _suffix(path)
    if suf == ".csv":
        _write_csv(obj, path)
        return path
    if suf == ".json":
        path.write_text(dumps(obj))
        return path
    arrays = {}
    meta = {"meanfield_format": FORMAT_VERSION, "data": encode(obj, arrays)}
    np.savez_compressed(path, __meta__=np.array(json.dumps(meta, allow_nan=False)), **arrays)
    return path


def load(path):
    """Read a result written by :meth:`Result.save` (``.json``, ``.npz`` or ``.csv``)."""
    import json
    from pathlib import Path

    path = Path(path)
    suf = _suffix(path)
    if suf == ".csv":
        return _read_csv(path)
    if suf == ".json":
        doc = json.loads(path.read_text())
        arrays = None
    else:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
            doc = json.loads(str(z["__meta__"]))
    if not isinstance(doc, dict) or "meanfield_format" not in doc:
        raise ValueError(f"{path} is not a saved meanfield result")
    if doc["meanfield_format"] > FORMAT_VERSION:
        raise ValueError(f"{path} was written by a newer meanfield (format {doc['meanfield_format']})")
    return decode(doc["data"], arrays)


# ---------------------------------------------------------------------------
# CSV: arrays of the result's grid as columns, the rest in a first '#' line.
# ---------------------------------------------------------------------------
#: the start of a saved CSV's first line, which holds what the columns do not (JSON)
CSV_META_PREFIX = "# meanfield "


def _table(obj) -> dict:
    if hasattr(obj, "_table"):
        return obj._table()
    arrays = {f.name: np.asarray(getattr(obj, f.name)) for f in dataclasses.fields(obj)
              if isinstance(getattr(obj, f.name), np.ndarray) and not f.name.startswith("_")}
    if not arrays:
        raise ValueError(f"{type(obj).__name__} has no arrays to write as CSV; save as .json")
    shape = max((a.shape for a in arrays.values()), key=lambda s: int(np.prod(s)))
    return {k: a.ravel() for k, a in arrays.items() if a.shape == shape}


def _is_column(col, a: np.ndarray) -> bool:
    """Whether the CSV column ``col`` holds exactly the values of the field array ``a`` (raveled)."""
    col = np.asarray(col)
    return (col.shape == (a.size,) and col.dtype == a.dtype and a.dtype.kind in "biuf"
            and np.array_equal(col, a.ravel(), equal_nan=a.dtype.kind == "f"))


def write_csv(obj, fh) -> None:
    """Write ``obj`` as CSV to the open text file ``fh``: columns from the result's ``_table`` (one row
    per grid point; what a spreadsheet shows) after a first line ``# meanfield {...}``, the lossless
    encoding of everything else with each field array that is a column stored by reference to it,
    so :func:`load` rebuilds the result exactly."""
    import csv
    import json

    cols = _table(obj)
    arrays = {}
    data = encode(obj, arrays)
    by_column = {k: {"dtype": str(a.dtype), "shape": list(a.shape)} for k, a in arrays.items()
                 if k in cols and _is_column(cols[k], a)}
    inline = {k: encode(a) for k, a in arrays.items() if k not in by_column}
    meta = {"meanfield_format": FORMAT_VERSION, "data": data, "columns": by_column, "arrays": inline}
    fh.write(CSV_META_PREFIX + json.dumps(meta, allow_nan=False) + "\n")
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(list(cols))
    for row in zip(*cols.values()):
        w.writerow([_csv_cell(v) for v in row])


def _write_csv(obj, path):
    with open(path, "w", newline="") as fh:
        write_csv(obj, fh)


def _read_csv(path):
    import csv
    import json

    with open(path, newline="") as fh:
        first = fh.readline()
        if not first.startswith(CSV_META_PREFIX):
            raise ValueError(f"{path} is not a saved meanfield result (its first line is not "
                             f"'{CSV_META_PREFIX}{{...}}')")
        meta = json.loads(first[len(CSV_META_PREFIX):])
        rows = list(csv.reader(fh))
    if meta.get("meanfield_format", FORMAT_VERSION + 1) > FORMAT_VERSION:
        raise ValueError(f"{path} was written by a newer meanfield (format {meta.get('meanfield_format')})")
    header, body = rows[0], rows[1:]
    arrays = {k: decode(v) for k, v in meta["arrays"].items()}
    for key, spec in meta["columns"].items():
        if key not in header:
            raise ValueError(f"{path}: the column {key!r} is missing")
        j = header.index(key)
        kind = np.dtype(spec["dtype"]).kind
        cells = [r[j] for r in body]
        vals = [c == "True" for c in cells] if kind == "b" else [int(c) if kind in "iu" else float(c)
                                                                   for c in cells]
        arrays[key] = np.array(vals, dtype=spec["dtype"]).reshape(spec["shape"])
    return decode(meta["data"], arrays)


def _csv_cell(v):
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


# ---------------------------------------------------------------------------
# Short reprs.
# ---------------------------------------------------------------------------
def _num(v) -> str:
    v = float(v)
    return f"{v:.10g}"


def _short(name, v) -> str:
    from .calculus import TreeSpec

    if isinstance(v, TreeSpec):
        return str(v)
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return _num(v)
    if isinstance(v, str):
        return repr(v if len(v) <= 72 else v[:69] + "...")
    if isinstance(v, np.ndarray):
        if v.ndim == 0:
            return _short(name, v.item())
        if v.size <= 4 and v.dtype.kind in "biuf":
            return "[" + ", ".join(_short(name, x) for x in v.ravel()) + "]"
        shape = "x".join(str(s) for s in v.shape)
        if v.dtype.kind == "f":
            fin = v[np.isfinite(v)]
            txt = f"({shape}) " + (f"in [{_num(fin.min())}, {_num(fin.max())}]" if fin.size else "no finite value")
            nonfin = v.size - fin.size
            if nonfin:
                n_nan = int(np.isnan(v).sum())
                parts = [f"{n_nan} nan"] if n_nan else []
                if nonfin - n_nan:
                    parts.append(f"{nonfin - n_nan} inf")
                txt += ", " + ", ".join(parts)
            return txt
        if v.dtype.kind == "b":
            return f"({shape}) {int(v.sum())} True"
        if v.dtype.kind in "iu" and v.size:
            return f"({shape}) {v.dtype} in [{v.min()}, {v.max()}]"
        return f"({shape}) {v.dtype}"
    if isinstance(v, (tuple, list)):
        if not v:
            return "()" if isinstance(v, tuple) else "[]"
        if all(isinstance(x, Result) for x in v):
            return f"{len(v)} x {type(v[0]).__name__}"
        if len(v) <= 4 and all(isinstance(x, (int, float, np.number)) for x in v):
            return "(" + ", ".join(_short(name, x) for x in v) + ")"
        return f"{len(v)} items"
    if isinstance(v, dict):
        return "{" + ", ".join(map(str, v)) + "}" if len(v) <= 6 else f"{len(v)} entries"
    if isinstance(v, Result) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
        return type(v).__name__ + "(...)"
    return str(v)


def summarize(obj) -> str:
    """The short repr of a result: one line when it fits in 100 characters, else one field a line."""
    parts = []
    skip_nan = getattr(obj, "_repr_skip_nan", False)
    extra = obj._repr_extra() if hasattr(obj, "_repr_extra") else {}
    for f in dataclasses.fields(obj):
        if f.name.startswith("_") or not f.repr:
            continue
        v = getattr(obj, f.name)
        if f.name == "note" and not v:
            continue
        if skip_nan and isinstance(v, (float, np.floating)) and math.isnan(v):
            continue
        parts.append((f.name, _short(f.name, v)))
    parts += list(extra.items())
    name = type(obj).__name__
    line = f"{name}(" + ", ".join(f"{k}={v}" for k, v in parts) + ")"
    if len(line) <= 100:
        return line
    return f"{name}(\n" + "".join(f"  {k} = {v},\n" for k, v in parts) + ")"


class ShortRepr:
    """Mixin: the short repr of :func:`summarize`, for dataclasses (``repr=False``) that are not saved."""

    def __repr__(self):
        return summarize(self)


class Result:
    """Mixin of every public result: short repr, ``to_dict``, ``save`` / ``load``.

    Subclasses are dataclasses declared with ``repr=False`` (so this repr is
    kept); they may define ``_repr_extra()`` (headline numbers added to the
    repr), ``_repr_skip_nan = True`` (leave NaN scalars, quantities that do not
    exist for this result, out of the repr) and ``_table()`` (the CSV columns).
    """

    def __repr__(self):
        return summarize(self)

    def to_dict(self) -> dict:
        """The fields as plain strict JSON data (nan -> null, inf -> "inf")."""
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.name.startswith("_")}

    def save(self, path):
        """Write to ``path``: ``.json``, ``.npz`` or ``.csv`` (grid arrays as columns), each reloadable with
        :meth:`load`."""
        return save(self, path)

    @classmethod
    def load(cls, path):
        """Read a result saved by :meth:`save`; TypeError if the file holds another kind of result."""
        obj = load(path)
        if not isinstance(obj, cls):
            raise TypeError(f"{path} holds a {type(obj).__name__}, not a {cls.__name__}")
        return obj
