"""Where meanfield keeps compiled code, and how a user sees and clears it.

Two kinds of compiled code are cached on disk, both under one folder
(:func:`cache_dir`):

- the generated module of each architecture's recursions
  (``meanfield_expr_<hash>.py``, from :mod:`meanfield.numeric`) and numba's
  cache of it (``__pycache__/``, next to the module);
- the series derivatives of its critical points as mpmath source
  (``meanfield_expr_<hash>.series3-v1.json``, from
  :func:`meanfield.solvers._expansion._derivatives`: sympy differentiation
  costs a fresh process ~0.5-1.5 s);
- numba's cache of the package's solver kernels (:mod:`meanfield._kernels`)
  and quadrature engine (:mod:`meanfield._quadrature_numba`), in ``numba/``.
  It is redirected there by :func:`install_locator`, so that nothing is ever
  written into the installed package folder (a read-only site-packages
  works, and two environments never share stale kernels).

The folder is ``$MEANFIELD_CACHE_DIR`` if set, else
``$XDG_CACHE_HOME/meanfield`` or ``~/.cache/meanfield``; when that cannot be
written, a per-user folder in the system's temporary directory. If the user
sets ``NUMBA_CACHE_DIR``, numba's own rule places the kernels' cache there.
A first use by numba compiles (about 1-5 s of CPU per network on a 2-core
machine, after ~25 s once for the kernels and ~17 s once for the quadrature
engine of :mod:`meanfield._quadrature_numba`); later processes load from the
cache in a second or two. Small requests never wait for that: they run the same
generated module in CPython (:class:`meanfield.numeric.CompiledRecursion`),
which needs only the generated ``.py`` file (sympy, well under a second).
``meanfield cache info`` prints the folder and its size; ``meanfield cache
clear`` empties it (the next call recompiles).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["cache_dir", "numba_cache_dir", "install_locator", "info", "clear", "compile_notice",
           "kernel_needs_compile", "kernels_cold", "module_cache_cold"]

_PACKAGE = Path(__file__).resolve().parent


def _configured_dir() -> Path:
    env = os.environ.get("MEANFIELD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "meanfield"


def _fallback_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"meanfield-cache-{os.getuid() if hasattr(os, 'getuid') else 0}"


def cache_dir(create: bool = True) -> Path:
    """The cache folder (see the module docstring); created and checked writable when ``create``."""
    base = _configured_dir()
    if not create:
        return base
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
        return base
    except OSError:
        fallback = _fallback_dir()
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def numba_cache_dir() -> Path:
    """Where numba caches the package's own kernels: ``cache_dir()/numba``."""
    return cache_dir() / "numba"


# ---------------------------------------------------------------------------
# numba: send the cache of functions defined in this package to cache_dir().
# ---------------------------------------------------------------------------
_INSTALLED = False


def install_locator() -> None:
    """Make numba cache the package's ``cache=True`` functions under :func:`numba_cache_dir`.

    numba's default puts the cache in ``__pycache__`` next to the source
    file, i.e. inside the installed package. A locator class is put first in
    numba's list; it only answers for files of this package and steps aside
    when the user has set ``NUMBA_CACHE_DIR``. Must run before the
    ``@njit(cache=True)`` decorators (``meanfield._kernels`` calls it first).
    """
    global _INSTALLED
    if _INSTALLED:
        return
    from numba.core import caching, config

    base = getattr(caching, "UserProvidedCacheLocator", None) or caching._UserProvidedCacheLocator
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl

    class MeanfieldCacheLocator(base):
        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(numba_cache_dir() / self.get_suitable_cache_subpath(py_file))

        @classmethod
        def from_function(cls, py_func, py_file):
            if config.CACHE_DIR or not os.path.exists(py_file):
                return None
            try:
                Path(py_file).resolve().relative_to(_PACKAGE)
            except ValueError:
                return None
            self = cls(py_func, py_file)
            try:
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    impl._locator_classes.insert(0, MeanfieldCacheLocator)
    _INSTALLED = True


# ---------------------------------------------------------------------------
# The one line a user sees before a long compile.
# ---------------------------------------------------------------------------
_NOTICED: set = set()


def compile_notice(what: str, seconds: str = "10-40 s", covers: tuple = ()) -> None:
    """Tell the user (stderr, one line, once per ``what`` per process) that a compile is starting.

    ``covers``: further compiles this line announces (not noticed again). Silenced by ``MEANFIELD_QUIET=1``.
    """
    if what in _NOTICED:
        return
    _NOTICED.update((what,) + tuple(covers))
    if os.environ.get("MEANFIELD_QUIET", "") not in ("", "0"):
        return
    try:
        print(f"meanfield: compiling {what} once (about {seconds}); cached in {cache_dir()}", file=sys.stderr,
              flush=True)
    except (OSError, ValueError):  # stderr closed: the notice is a courtesy
        pass


def kernel_needs_compile(dispatcher) -> bool:
    """True when a cached numba dispatcher has nothing on disk yet (its first call compiles)."""
    if dispatcher.signatures:
        return False
    cache = getattr(dispatcher, "_cache", None)
    index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    return bool(index) and not os.path.exists(index)


def kernels_cold(module) -> bool:
    """True when none of ``module``'s cached kernels is compiled in this process or on disk."""
    from numba.core import config

    disp = [v for v in vars(module).values() if hasattr(v, "_cache") and hasattr(v, "signatures")]
    if any(d.signatures for d in disp):
        return False
    if config.CACHE_DIR:
        return all(kernel_needs_compile(d) for d in disp)
    return not any(numba_cache_dir().glob(f"*/{module.__name__.rsplit('.', 1)[-1]}.*.nbi"))


def module_cache_cold(name: str) -> bool:
    """True when numba's cache holds nothing of the package module ``name`` (for example
    ``"_quadrature_numba"``), looked up on disk without importing it (importing compiles it)."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return not any(Path(env).rglob(f"{name}.*.nbi"))
    return not any(numba_cache_dir().glob(f"*/{name}.*.nbi"))


# ---------------------------------------------------------------------------
# meanfield cache info / clear.
# ---------------------------------------------------------------------------
def _ours(base: Path):
    """The entries of ``base`` that meanfield wrote (nothing else is listed or removed)."""
    if not base.is_dir():
        return []
    out = []
    for p in base.iterdir():
        if p.name.startswith("meanfield_expr_") or p.name == "numba":
            out.append(p)
        elif p.name == "__pycache__" and p.is_dir():
            out += [q for q in p.iterdir() if q.name.startswith("meanfield_expr_")]
    return out


def _size(p: Path) -> tuple[int, int]:
    if p.is_file() or p.is_symlink():
        return 1, p.lstat().st_size
    n = b = 0
    for root, _, files in os.walk(p):
        for f in files:
            try:
                b += os.lstat(os.path.join(root, f)).st_size
                n += 1
            except OSError:
                pass
    return n, b


def info() -> dict:
    """The cache folder, how it was chosen, and what it holds (files, bytes, architectures)."""
    base = cache_dir(create=False)
    used = base
    if not base.is_dir() or not os.access(base, os.W_OK):
        fb = _fallback_dir()
        if fb.is_dir():
            used = fb
    files = size = 0
    for p in _ours(used):
        n, b = _size(p)
        files += n
        size += b
    modules = len([p for p in _ours(used) if p.suffix == ".py" and p.parent == used])
    source = ("MEANFIELD_CACHE_DIR" if os.environ.get("MEANFIELD_CACHE_DIR") else
              "XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "default (~/.cache/meanfield)")
    return {"path": str(used), "chosen_by": source, "files": files, "bytes": size,
            "architectures": modules, "numba_cache_dir_env": os.environ.get("NUMBA_CACHE_DIR") or None}


def clear() -> dict:
    """Remove what meanfield cached (generated modules and numba caches); returns what was removed."""
    before = info()
    base = Path(before["path"])
    for p in _ours(base):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                p.unlink()
            except OSError:
                pass
    return {"path": str(base), "files": before["files"], "bytes": before["bytes"]}
