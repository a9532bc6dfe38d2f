r"""Compile the symbolic recursions of :mod:`meanfield.symbolic` to numba.

One source of truth: the numeric solvers never re-derive a recursion. For an
:class:`~meanfield.calculus.Architecture`, :func:`compiled` takes the sympy
expressions of :func:`meanfield.recursion` (``kernel``, ``kernel12``,
``chi_J``, ``chi_K``, ``chi_Delta``), rewrites them in the variances
``W = sigma_w**2`` and ``T = sigma_b**2`` (the calculus only ever uses the
squares), adds the partial derivatives the solvers need (:data:`FUNCTIONS`),
prints each one as Python source with the ``math`` module (after common
subexpression elimination) and compiles it with numba, behind one ``cfunc``

    fns(which, K, K12, W, T, mu, eps) -> float

that evaluates function number ``which`` (``mu`` and ``eps`` stay runtime
arguments, so one compilation serves every residual strength and
LayerScale). The solver kernels of :mod:`meanfield._kernels` take that
cfunc as a first-class function argument, so they are compiled once for
all architectures.

Unevaluated Gaussian expectations (activations without closed forms) become
calls to the compiled engine of :mod:`meanfield._quadrature_numba`
(:func:`~meanfield._quadrature_numba.one_point` for E[f(h)],
:func:`~meanfield._quadrature_numba.two_point` for two points): the generated
module compiles only its integrands, as C functions over batches of nodes
registered under names that hold its cache key, and names them to the
engine by symbol, so the engine (the rule of
:mod:`meanfield.quadrature_rule`: piecewise exp-sinh/tanh-sinh, split at the
integrand's breakpoints, refined until its error estimate passes, NaN if it
never does) is compiled once for every network, and the module, holding no
address of the process, is cached by numba. Integrand bodies are
rewritten to avoid float64 overflow (a stable softplus).

Two engines
-----------
The generated module and :mod:`meanfield._kernels` are plain Python with
numba decorators. Until numba is loaded, small calls run both sources in
CPython (decorators removed, numpy scalars and a guarded ``math`` giving
numba's numpy error model): a first answer in a fresh process costs no
compilation and no numba import. Large calls, and every call once a process
has spent :data:`INTERPRETED_BUDGET_S` CPU seconds interpreting
(:data:`INTERPRETED_BUDGET_COLD_S` where numba's cache is empty, so that the
switch would compile), use numba (see :class:`CompiledRecursion`). The
kernels and the closed-form expressions run the same IEEE operations in the
same order in both engines (libm functions may differ by an ulp). Gaussian
expectations without a closed form are the exception: CPython evaluates a
numpy twin of the integrand on all nodes of a level at once
(:func:`meanfield.quadrature_rule.quad_levels`, ~30 us instead of ~1 ms per
expectation), so the sums run in another order and numpy's SIMD functions
differ from libm's by an ulp: the engines agree to ~1e-15 of E|f|, which is
1e-15 relative unless the integrand cancels (tests/test_engines.py).

Caching
-------
``cache=True`` needs a real source file, so the generated module is written
to ``$MEANFIELD_CACHE_DIR`` (default ``$XDG_CACHE_HOME/meanfield`` or
``~/.cache/meanfield``; a temporary directory when that is not writable;
:mod:`meanfield._cache`)
under a name that hashes the architecture, the sources of the symbolic
layer, the quadrature rule and the numba and Python versions, and imported
from there; numba's caches sit next to it (the kernels' in ``numba/`` of
the same folder, or under ``$NUMBA_CACHE_DIR``; never in the package
folder). A second process skips
both the sympy code generation and the compilation.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import warnings
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np
import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.printing.numpy import SciPyPrinter
from sympy.printing.pycode import PythonCodePrinter

from . import symbols as S
from .calculus import Architecture, as_architecture
from .stable_forms import stable_form
from .gaussian import GaussianExpectation, GaussianExpectation2, RULE_U, RULE_W, pieces, two_point_cuts
from .symbolic import recursion

__all__ = ["W", "T", "ARGS", "FUNCTIONS", "CompiledRecursion", "compiled", "generate_source",
           "cache_dir", "cache_key", "quiet_numba"]

#: sigma_w**2 and sigma_b**2: the compiled functions take variances.
W, T = sp.symbols("W T")
#: argument order of every compiled function
ARGS = (S.K, S.K12, W, T, S.mu, S.eps)


def _expressions(rec) -> dict:
    """name -> sympy expression in ARGS for every function the solvers use."""
    to_var = {S.sigma_w: sp.sqrt(W), S.sigma_b: sp.sqrt(T)}

    def v(e):
        return sp.sympify(e).subs(to_var)

    F, F12, X, XD = v(rec.kernel), v(rec.kernel12), v(rec.chi_J), v(rec.chi_Delta)
    chiK = sp.diff(F, S.K)
    return {
        "kernel": F,
        "kernel12": F12,
        "chi_J": X,
        "chi_K": chiK,
        "chi_Delta": XD,
        # pair state (BatchNorm): the rest of the 2x2 Jacobian of (K, K12) -> (K', K12')
        "dkernel_dK12": sp.diff(F, S.K12),
        "dkernel12_dK": sp.diff(F12, S.K),
        "dkernel12_dK12": sp.diff(F12, S.K12),
        # critical lines and points: Newton on (K, W, T)
        "dkernel_dW": sp.diff(F, W),
        "dkernel_dT": sp.diff(F, T),
        "dchiJ_dK": sp.diff(X, S.K),
        "dchiJ_dW": sp.diff(X, W),
        "dchiJ_dT": sp.diff(X, T),
        "dchiK_dK": sp.diff(chiK, S.K),
        "dchiK_dW": sp.diff(chiK, W),
        "dchiK_dT": sp.diff(chiK, T),
    }


#: names of the compiled expression functions, in the order the kernels index them
from ._fnindex import FUNCTIONS  # noqa: E402


# ---------------------------------------------------------------------------
# Code generation.
# ---------------------------------------------------------------------------
_JIT = 'njit(error_model="numpy", nogil=True)'
#: the compiled Gaussian-expectation engine, imported by modules that have expectations without a closed form
_ENGINE_IMPORT = ("from meanfield._quadrature_numba import (ONE_POINT_SIGNATURE, TWO_POINT_SIGNATURE, one_point, "
                  "register, symbol_address, two_point)")
_CFUNC = 'cfunc(_SIG, cache=True, error_model="numpy", nopython=True)'


class _Printer(PythonCodePrinter):
    """Python/math printer; unknown functions (our placeholders) print as calls."""

    def __init__(self):
        super().__init__({"allow_unknown_functions": True, "fully_qualified_modules": True})

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_Integer(self, expr):
        # numba types integer literals as int64: larger ones (high derivatives of gelu_tanh
        # carry 1.2e20) fail to compile; as floats they are what the arithmetic makes of them
        if abs(int(expr)) >= 2 ** 63:
            return repr(float(expr))
        return super()._print_Integer(expr)

    def _print_Heaviside(self, expr):  # H(0) = 1/2, as sympy's default
        a = self._print(expr.args[0])
        return f"(0.5 if ({a}) == 0 else (1.0 if ({a}) > 0 else 0.0))"

    def _print_DiracDelta(self, expr):
        # weak-sense delta terms only appear multiplied by functions that
        # vanish where the delta sits (x delta(x)); numerically they are 0.
        return "0.0"


class _NumpyPrinter(SciPyPrinter):
    """numpy printer for the interpreted twins of the integrands (arrays in, arrays out).

    SciPy's, so that erf, erfc, gamma, ... print as ``scipy.special`` ufuncs (numpy has none;
    the plain NumPy printer fell back to ``math.erf``, which fails on arrays: a user activation
    such as erf(x) + x/2 raised TypeError on its first, interpreted call)."""

    def __init__(self):
        super().__init__({"allow_unknown_functions": True, "fully_qualified_modules": True})

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_NumberSymbol(self, expr):
        # numpy's constants, or the value: SciPy's printer names scipy.constants (pi, golden_ratio),
        # which the generated module does not import
        return "numpy.pi" if expr == sp.pi else repr(float(expr))

    _print_Pi = _print_GoldenRatio = _print_NumberSymbol

    def _print_DiracDelta(self, expr):  # as _Printer: weak-sense delta terms are 0 numerically
        return "0.0"

    def _print_Function(self, expr):
        if expr.func.__name__ == "_softplus":
            return f"_softplus_np({self._print(expr.args[0])})"
        return super()._print_Function(expr)


class _Gen:
    """Collects helper functions (activation bodies, quadratures) for one module."""

    def __init__(self, key: str):
        self.key = key  # the module's cache key: its integrands' C symbols hold it
        self.lines = []
        self.bodies = {}  # expression name -> the lines of its branch of FNS
        self.one = {}   # f body -> quadrature name
        self.two = {}
        self.printer = _Printer()
        self.numpy_printer = _NumpyPrinter()
        self.scipy = False  # whether a numpy twin calls scipy.special (imported only then: ~0.3 s)

    def _numpy_body(self, name, variables, expr) -> bool:
        """The integrand's numpy twin ``name`` (run by the interpreted engine on all nodes at
        once), from the same expression as the compiled body; False where numpy has no
        printing of some function (the interpreted engine then calls the scalar body)."""
        sub = {v: sp.Symbol(f"_v{i}") for i, v in enumerate(variables)}
        try:
            code = self.numpy_printer.doprint(stable_form(sp.sympify(expr).subs(sub)))
        except Exception:  # sympy printer errors have no common base class
            return False
        if ("Not supported" in code or "\n" in code or "math." in code
                or code.replace("scipy.special.", "").count("scipy.")):
            return False   # the interpreted engine then calls the scalar body node by node
        self.scipy = self.scipy or "scipy." in code
        self.lines += ["# the numpy twin of the integrand (interpreted engine only; numba never sees it)",
                       f"def {name}({', '.join(str(s) for s in sub.values())}):",
                       f"    return {code}", ""]
        return True

    def _body(self, name, variables, expr):
        """The integrand ``name`` (a jitted scalar function) and ``name_c``, its C function over a
        batch of nodes (numba ``cfunc``, cached), registered with the JIT linker under
        :meth:`symbol` so that the engine of :mod:`meanfield._quadrature_numba` can call it
        from cached code."""
        sub = {v: sp.Symbol(f"_v{i}") for i, v in enumerate(variables)}
        code = self.doprint(stable_form(sp.sympify(expr).subs(sub)))
        # the scalar body (the interpreted engine maps it where numpy cannot print the integrand),
        # and the C function over a batch of nodes that the compiled engine calls
        one = len(sub) == 1
        self.lines += [f"@{_JIT}", f"def {name}({', '.join(str(s) for s in sub.values())}):", f"    return {code}", "",
                       f'@cfunc({"ONE_POINT_SIGNATURE" if one else "TWO_POINT_SIGNATURE"}, cache=True, '
                       'error_model="numpy", nopython=True)',
                       f"def {name}_c({'h' if one else '_v0, v'}, out, n):",
                       "    for i in range(n):",
                       f"        out[i] = {name}({'h[i]' if one else '_v0, v[i]'})",
                       "", f'register("{self.symbol(name)}", {name}_c)', ""]

    def symbol(self, name: str) -> str:
        """The C symbol of integrand ``name`` of this module (unique per cache key)."""
        return f"meanfield_{self.key}{name}"

    def _check(self, code, expr):
        if "# Not supported" in code or "Not supported in Python" in code:
            raise ValueError(f"cannot compile {expr} to numba: the printer does not support it ({code!r})")

    def doprint(self, expr) -> str:
        """Python/math source of ``expr``; ValueError for anything numba cannot run."""
        unknown = [f for f in expr.atoms(AppliedUndef)
                   if not f.func.__name__.startswith(("_E1_", "_E2_", "_softplus"))]
        if unknown or expr.has(sp.Derivative, sp.Integral):
            bad = unknown or list(expr.atoms(sp.Derivative, sp.Integral))
            raise ValueError(f"cannot compile {expr} to numba: undefined or unevaluated {bad[0]} "
                             "(activations must be explicit functions of one variable)")
        try:
            code = self.printer.doprint(expr)
        except Exception as err:  # sympy printer errors have no common base class
            raise ValueError(f"cannot compile {expr} to numba: {err}") from None
        self._check(code, expr)
        return code

    def quad1(self, f: sp.Lambda) -> str:
        """E[f(h)], h ~ N(0, K), compiled: the engine of :func:`meanfield.gaussian.expect`
        (split at 0 and the breakpoints of f, refined, NaN if not converged)."""
        key = sp.srepr(f)
        if key not in self.one:
            i = len(self.one)
            fname, qname = f"_f1_{i}", f"_E1_{i}"
            info = pieces(f)
            self._body(fname, f.variables, info.expr)
            cuts = ", ".join(repr(c) for c in info.float_cuts)
            self.lines += [
                f"_CUTS_{i} = np.array([{cuts}], dtype=np.float64)",
                "",
            ]
            if self._numpy_body(f"_f1v_{i}", f.variables, info.expr):
                # the interpreted engine rebinds _E1_{i} to the numpy engine on this twin
                self.lines += [f"_E1_{i}_NUMPY = (_f1v_{i}, _CUTS_{i})", ""]
            else:
                # no numpy printing: the interpreted engine maps the scalar body over the nodes
                self.lines += [f"_E1_{i}_SCALAR = ({fname}, _CUTS_{i})", ""]
            self.lines += [
                f"@{_JIT}",
                f"def {qname}(K):",
                "    # NaN where K < 0 or the rule did not converge at its finest level (the solvers report it)",
                f'    return one_point(symbol_address("{self.symbol(fname)}"), _CUTS_{i}, K)',
                "",
            ]
            self.one[key] = qname
        return self.one[key]

    def quad2(self, f: sp.Lambda) -> str:
        """E[f(u, v)] compiled: the nested engine of :func:`meanfield.gaussian.expect2`
        (:func:`meanfield._quadrature_numba.two_point`), the integrand a C function over
        batches of nodes; its breakpoints in u
        and in v are located once, here, at code generation
        (:func:`meanfield.gaussian.two_point_cuts`)."""
        key = sp.srepr(f)
        if key not in self.two:
            i = len(self.two)
            fname, qname = f"_f2_{i}", f"_E2_{i}"
            self._body(fname, f.variables, f.expr)
            cuts_u, cuts_v = two_point_cuts(f)
            self.lines += [
                f"_CUTS2U_{i} = np.array([{', '.join(repr(c) for c in cuts_u)}], dtype=np.float64)",
                f"_CUTS2V_{i} = np.array([{', '.join(repr(c) for c in (0.0, *cuts_v))}], dtype=np.float64)",
                "",
            ]
            if self._numpy_body(f"_f2v_{i}", f.variables, f.expr):
                # the interpreted engine rebinds _E2_{i} to the numpy engine on this twin
                self.lines += [f"_E2_{i}_NUMPY = (_f2v_{i}, _CUTS2U_{i}, _CUTS2V_{i})", ""]
            else:
                self.lines += [f"_E2_{i}_SCALAR = ({fname}, _CUTS2U_{i}, _CUTS2V_{i})", ""]
            self.lines += [
                f"@{_JIT}",
                f"def {qname}(K1, K2, K12):",
                f'    return two_point(symbol_address("{self.symbol(fname)}"), _CUTS2U_{i}, _CUTS2V_{i}, K1, K2, K12)',
                "",
            ]
            self.two[key] = qname
        return self.two[key]

    def function(self, name: str, expr) -> None:
        """The body of expression ``name`` (statements and a return, indented for FNS)."""
        expr = sp.sympify(expr)
        # Replace quadratures by placeholder calls before CSE, so that CSE never
        # reaches inside a Lambda.
        repl = {}
        for ge in expr.atoms(GaussianExpectation):
            repl[ge] = sp.Function(self.quad1(ge.args[0]))(ge.args[1])
        for ge in expr.atoms(GaussianExpectation2):
            repl[ge] = sp.Function(self.quad2(ge.args[0]))(*ge.args[1:])
        if repl:
            expr = expr.xreplace(repl)
        # each body its own names: all bodies are branches of one function
        replacements, (reduced,) = sp.cse([expr], symbols=sp.numbered_symbols(f"_c{len(self.bodies)}_"))
        body = [f"        {sym} = {self.doprint(sub)}" for sym, sub in replacements]
        self.bodies[name] = body + [f"        return {self.doprint(reduced)}"]

    def dispatcher(self) -> list:
        """FNS(which, K, K12, W, T, mu, eps), the one cfunc the kernels call: every expression of
        :data:`FUNCTIONS` is a branch of it, so that numba compiles (and finalises, and caches) one
        function rather than one per expression; and each expression by name, for Python callers."""
        params = ", ".join(str(a) for a in ARGS)
        lines = [f"@{_CFUNC}", f"def FNS(which, {params}):"]
        for i, name in enumerate(FUNCTIONS):
            lines += [f"    if which == {i}:  # {name}", *self.bodies[name]]
        lines += ["    return math.nan", "", ""]
        for i, name in enumerate(FUNCTIONS):
            lines += [f"def {name}({params}):", f"    return FNS({i}, {params})", "", ""]
        return lines


def _rule_digest() -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(RULE_U).tobytes())
    h.update(np.ascontiguousarray(RULE_W).tobytes())
    return h.hexdigest()[:16]


def generate_source(arch) -> str:
    """The Python source of the compiled expressions of ``arch``.

    The module defines ``FNS(which, K, K12, W, T, mu, eps)``, a numba
    ``cfunc`` evaluating function number ``which`` of :data:`FUNCTIONS` (the
    solver kernels of :mod:`meanfield._kernels` take it as their first
    argument), one Python function per name in :data:`FUNCTIONS`
    (``f(K, K12, W, T, mu, eps)``, calling FNS), and the integrands of its
    Gaussian expectations (C functions, see :mod:`meanfield._quadrature_numba`).
    """
    arch = as_architecture(arch)
    exprs = _expressions(recursion(arch))
    gen = _Gen(cache_key(arch))
    for name in FUNCTIONS:
        gen.function(name, exprs[name])
    rec = recursion(arch)

    header = [
        f'"""Generated by meanfield.numeric for: {arch}. Do not edit."""',
        f"# numba {_numba_version()}; python {sys.version.split()[0]}; rule {_rule_digest()}",
        "# whether K12 feeds back (the pair state), read by meanfield.numeric without re-deriving",
        f"PAIR = {S.K12 in rec.state}",
        "import functools  # the numpy twins print Max/Min as functools.reduce(numpy.maximum, ...)",
        "import math",
        "from numba import cfunc, njit, types",
        "import numpy",
        "import numpy as np",
        *([_ENGINE_IMPORT] if gen.one or gen.two else []),
        *(["import scipy.special  # the numpy twins' erf, gamma, ..."] if gen.scipy else []),
        "",
        "",
        f"@{_JIT}",
        "def _softplus(a):",
        "    # log(1 + exp(a)) without overflow",
        "    if a > 0.0:",
        "        return a + math.log1p(math.exp(-a))",
        "    return math.log1p(math.exp(a))",
        "",
        "",
        "def _softplus_np(a):",
        "    # _softplus on arrays (interpreted engine): the same operations, 0 + x == x",
        "    return np.maximum(a, 0.0) + np.log1p(np.exp(-np.abs(a)))",
        "",
        "_SIG = types.float64(types.int64, *([types.float64] * 6))",
        "",
    ]
    return "\n".join(header + gen.lines + gen.dispatcher())


# ---------------------------------------------------------------------------
# Loading (with the on-disk cache).
# ---------------------------------------------------------------------------
def cache_dir() -> Path:
    """Where generated modules (and numba's caches next to them) live (see :mod:`meanfield._cache`)."""
    from ._cache import cache_dir as _cache_dir

    return _cache_dir()


_LOCK = threading.Lock()
#: the files whose text shapes a generated module (the primitives' rules included)
_KEY_SOURCES = ("_fnindex.py", "symbols.py", "activations.py", "gap.py", "gaussian.py", "stable_forms.py", "calculus.py",
                "symbolic.py", "numeric.py", "quadrature_rule.py", "_quadrature_numba.py", *(f"layers/{p.name}" for p in sorted((Path(__file__).parent / "layers").glob("*.py"))))


@lru_cache(maxsize=1)
def _numba_version() -> str:
    """numba's version without importing numba (0.3-1 s: the warm path must not pay it)."""
    try:
        from importlib.metadata import version

        return version("numba")
    except Exception:  # not installed as a distribution: ask the module
        import numba

        return numba.__version__


@lru_cache(maxsize=1)
def _sources_digest() -> str:
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in _KEY_SOURCES:
        h.update((here / name).read_bytes())
    h.update(f"{_numba_version()} {sys.version} {_rule_digest()}".encode())
    return h.hexdigest()


def cache_key(arch: Architecture) -> str:
    """Cache key of an architecture's generated module: everything its source depends on
    (the architecture's spec, the sources of the symbolic layer, numba and Python versions),
    computed without deriving the recursion."""
    h = hashlib.sha256()
    h.update(repr(arch).encode())
    for phi in arch.activations():  # the repr shows expressions by str(); srepr is exact
        h.update(sp.srepr(phi.expr).encode())
    h.update(_sources_digest().encode())
    return h.hexdigest()[:24]


def _canonical(arch: Architecture) -> Architecture:
    """The architecture with mu and eps at fixed values: they are runtime arguments of the
    compiled code, so every residual strength and LayerScale shares one module."""
    if isinstance(arch, Architecture):
        # (activation_params are already applied to the Activation object)
        return arch.with_(mu=1.0 if arch.residual else None, eps=0.1, activation_params=())
    return arch.with_(mu=None if arch.mu is None else 1.0, eps=None if arch.eps is None else 0.1,
                      depth=None, name=None)


def _source_path(arch: Architecture) -> Path:
    """The generated module of a canonical architecture on disk (written now if it is not there)."""
    modname = f"meanfield_expr_{cache_key(arch)}"
    path = cache_dir() / f"{modname}.py"
    if not path.exists():
        source = generate_source(arch)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)  # atomic: concurrent processes never see half a file
    return path


def _load(arch: Architecture, path: Path):
    """Import the generated module with numba (compiles its cfunc, or loads it from numba's cache)."""
    modname = path.stem
    if modname in sys.modules:
        return sys.modules[modname]
    if not any(path.parent.glob(f"__pycache__/{modname}*.nbi")):
        from . import _kernels
        from ._cache import compile_notice

        from ._cache import kernels_cold, module_cache_cold

        names = ", ".join(phi.name for phi in arch.activations())
        what = f"the {names} recursion" + ("" if str(arch) == names else f" ({arch})")
        # say it once: what compiles now with the module (CPU seconds measured on 2 cores,
        # benchmarks/README.md): the module ~1-5 s, the solver kernels ~25 s, the quadrature engine ~17 s
        also, seconds = [], 5
        if kernels_cold(_kernels):
            also, seconds = ["the solver kernels"], seconds + 25
        if "_quadrature_numba" not in sys.modules and _ENGINE_IMPORT in path.read_text() \
                and module_cache_cold("_quadrature_numba"):
            also, seconds = also + ["the quadrature engine"], seconds + 20
        parts = [what, *also]
        compile_notice(", ".join(parts[:-1]) + " and " + parts[-1] if also else what, f"{seconds} s",
                       covers=tuple(also))
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        with quiet_numba():
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return module


@contextmanager
def quiet_numba():
    """Silence numba's 'first-class function type is experimental' warning.

    The solver kernels take the compiled expressions as first-class function
    arguments (so that they are compiled once for all architectures); numba
    flags that feature as experimental on every compilation and cache load.
    """
    from numba.core.errors import NumbaExperimentalFeatureWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaExperimentalFeatureWarning)
        yield


# ---------------------------------------------------------------------------
# Interpreted twins: the same generated source and the same kernel source, run by
# CPython without numba (small requests in a process that has not loaded numba).
# ---------------------------------------------------------------------------
def _identity_decorator(*args, **kwargs):
    if args and callable(args[0]) and not kwargs:
        return args[0]
    return lambda f: f


class _AnyType:
    """Stands in for ``numba.types`` in interpreted modules (signatures are not needed there)."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self


_NUMBA_SHIM = {"njit": _identity_decorator, "cfunc": _identity_decorator, "types": _AnyType()}


class _IEEEMath:
    """``math`` for the interpreted twins, with numba's numpy error model.

    CPython's math raises where numba returns inf or NaN (exp overflow,
    log(0), sqrt(-1)); these wrappers return what numba returns. Normal
    arguments go to the same libm functions, so the values are libm's. Float
    results come back as numpy scalars, so that the arithmetic after them
    also follows numba's model (x / 0 is inf, 0 ** -1.5 is inf: with Python
    floats ``1 / math.sqrt(K)`` at K = 0 raised ZeroDivisionError).
    """

    def __init__(self):
        import math

        f64 = np.float64

        def as_numpy(f):
            def g(*args):
                out = f(*args)
                return f64(out) if type(out) is float else out
            return g

        for k in dir(math):
            if not k.startswith("_"):
                v = getattr(math, k)
                setattr(self, k, as_numpy(v) if callable(v) else v)

        def guard(f, on_overflow, on_domain):
            def g(x):
                try:
                    return f64(f(x))
                except OverflowError:
                    return f64(on_overflow(x))
                except ValueError:
                    return f64(on_domain(x))
            return g

        nan, inf = math.nan, math.inf
        self.exp = guard(math.exp, lambda x: inf, lambda x: nan)
        self.expm1 = guard(math.expm1, lambda x: inf, lambda x: nan)
        self.cosh = guard(math.cosh, lambda x: inf, lambda x: nan)
        self.sinh = guard(math.sinh, lambda x: math.copysign(inf, x), lambda x: nan)
        for name in ("log", "log2", "log10"):
            setattr(self, name, guard(getattr(math, name), lambda x: inf, lambda x: -inf if x == 0 else nan))
        self.log1p = guard(math.log1p, lambda x: inf, lambda x: -inf if x == -1 else nan)
        for name in ("sqrt", "acos", "asin", "acosh", "atanh"):
            setattr(self, name, guard(getattr(math, name), lambda x: inf, lambda x: nan))


def _exec_interpreted(name: str, path: Path, source: str, package: str | None = None):
    import types

    module = types.ModuleType(name)
    module.__file__ = str(path)
    if package:
        module.__package__ = package
    exec(compile(source, str(path), "exec"), module.__dict__)
    module.math = _IEEE_MATH  # numba's error model (the functions look math up at call time)
    return module


_IEEE_MATH = _IEEEMath()


@lru_cache(maxsize=1)
def _kernels_interpreted():
    """meanfield._kernels run by CPython: its source with ``njit`` the identity."""
    path = Path(__file__).parent / "_kernels.py"
    src = path.read_text()
    src = src.replace("from numba import njit\n", "from meanfield.numeric import _identity_decorator as njit\n")
    src = src.replace("from ._cache import install_locator\n", "")
    src = src.replace("\ninstall_locator()", "\npass")
    return _exec_interpreted("meanfield._kernels_interpreted", path, src, "meanfield")


@lru_cache(maxsize=64)
def _expressions_interpreted(path: Path):
    src = path.read_text()
    src = src.replace("from numba import cfunc, njit, types\n",
                      "from meanfield.numeric import _NUMBA_SHIM\n"
                      "cfunc, njit, types = _NUMBA_SHIM['cfunc'], _NUMBA_SHIM['njit'], _NUMBA_SHIM['types']\n")
    # the compiled engine is numba's; here every expectation is rebound to the numpy engine below
    src = src.replace(_ENGINE_IMPORT + "\n", "ONE_POINT_SIGNATURE = TWO_POINT_SIGNATURE = one_point = two_point = None\n"
                                              "register = symbol_address = lambda *args: None\n")
    module = _exec_interpreted(path.stem + "_interpreted", path, src)
    # Gaussian expectations: the numpy engine on all nodes at once (a scalar engine in
    # CPython would cost ~1 ms per one-point expectation, the solvers need 10^3 - 10^4 of them;
    # ~0.5 s per two-point one). An integrand without a numpy twin is mapped over the nodes.
    from .gaussian import interpreted_expect, interpreted_expect2

    for name in [n for n in vars(module) if n.startswith(("_E1_", "_E2_")) and n.endswith(("_NUMPY", "_SCALAR"))]:
        f, *cuts = getattr(module, name)
        if name.endswith("_SCALAR"):
            f = np.vectorize(f, otypes=[np.float64])
        make = interpreted_expect if name.startswith("_E1_") else interpreted_expect2
        setattr(module, name[:name.rindex("_")], make(f, *cuts))
    return module


class _Slow(Exception):
    """The interpreted evaluation ran past its time budget: use the compiled code."""


#: a process spends at most this long (CPU seconds, all calls together) in interpreted kernels
#: when numba's caches are warm (loading them costs ~1-2 s); then numba takes over (a loop of
#: many small calls gets numba's per-point speed)
INTERPRETED_BUDGET_S = 0.5
#: the same budget when switching would compile (20-60 s CPU): interpreting is worth more of the
#: compile's cost (rent before buying: a process never pays more than the compile twice over
#: for calls numba would have answered), and most sessions never reach it
INTERPRETED_BUDGET_COLD_S = 8.0
#: calls whose arrays hold more than this many elements go to numba directly
INTERPRETED_MAX_ELEMENTS = 50_000


#: wall seconds this process has spent in interpreted kernels (all architectures)
_INTERPRETED_SPENT = [0.0]


def _budgeted(fns, deadline):
    """fns that raises _Slow once ``deadline`` (process_time) has passed (checked every 256 calls)."""
    from time import process_time

    count = [0]
    f64 = np.float64

    def FNS(which, K, K12, W, T, mu, eps):
        count[0] += 1
        if count[0] & 255 == 0 and process_time() > deadline:
            raise _Slow
        # numpy scalars: x / 0 is inf or NaN (numba's numpy error model), not ZeroDivisionError
        return fns(which, f64(K), f64(K12), f64(W), f64(T), f64(mu), f64(eps))

    return FNS


def _ieee(fns):
    f64 = np.float64

    def FNS(which, K, K12, W, T, mu, eps):
        return fns(which, f64(K), f64(K12), f64(W), f64(T), f64(mu), f64(eps))

    return FNS


class CompiledRecursion:
    """The compiled expressions of one architecture, ready for the solver kernels.

    ``fns`` is the numba cfunc ``fns(which, K, K12, W, T, mu, eps)`` over
    the functions of :data:`FUNCTIONS`; ``mu`` and ``eps`` are the architecture's
    values (0 where it has none); ``pair`` says whether K12 feeds back
    (BatchNorm). ``call(kernel_name, *args)`` runs a kernel of
    :mod:`meanfield._kernels` on these expressions.

    Two engines run the same two sources (the generated expressions and the
    kernels): numba, and CPython (the decorators removed). Until numba is
    loaded in the process, a small call (arrays of at most
    :data:`INTERPRETED_MAX_ELEMENTS` elements) is answered by CPython, within a
    budget of :data:`INTERPRETED_BUDGET_S` CPU seconds per process
    (:data:`INTERPRETED_BUDGET_COLD_S` while numba's cache is empty); past it, on a
    floating-point exception (CPython raises where numba's numpy error model
    returns inf or NaN) or for a larger call, numba takes over and stays in
    charge for the architecture. Both engines do the same IEEE operations in
    the same order; they differ only where a libm function does (about 1 ulp).
    ``MEANFIELD_ENGINE=numba`` (or ``python``) forces one engine.
    """

    def __init__(self, architecture, path, mu, eps, pair, normalises, channels):
        self.architecture = architecture
        self.path = Path(path)
        self.mu = mu
        self.eps = eps
        self.pair = pair
        #: a layer divides by a variance of its input (read once from the tree: the solvers' 0/0 checks)
        self.normalises = normalises
        #: the pair is two channels of one token (the Mixer), not two inputs
        self.channels = channels
        self._module = None
        self._compiled_only = os.environ.get("MEANFIELD_ENGINE", "") == "numba"

    def __repr__(self):
        return f"<CompiledRecursion {self.architecture} ({'numba' if self._module else 'not loaded'})>"

    def with_mu(self, mu: float) -> "CompiledRecursion":
        """The same compiled code at another residual strength."""
        import copy

        c = copy.copy(self)
        c.mu = float(mu)
        return c

    # -- numba --------------------------------------------------------------
    @property
    def module(self):
        """The generated module imported with numba (compiled or loaded from the cache on first use)."""
        if self._module is None:
            with _LOCK:
                self._module = _load(_canonical(self.architecture), self.path)
        return self._module

    @property
    def fns(self):
        return self.module.FNS

    @property
    def fast_fns(self):
        """``fns`` behind numba's wrapper-address protocol (what :meth:`fast_call` passes)."""
        f = self.__dict__.get("_fast_fns")
        if f is None:
            f = self.__dict__["_fast_fns"] = _Address(self.fns)
        return f

    @property
    def source_path(self) -> str:
        return str(self.path)

    # -- CPython ------------------------------------------------------------
    @property
    def interpreted(self):
        """The generated module run by CPython (no numba)."""
        return _expressions_interpreted(self.path)

    def _interpreted_ok(self, args) -> bool:
        if self._compiled_only or _ENGINE_FORCED == "numba":
            return False
        if _ENGINE_FORCED == "python":
            return True
        if (_NUMBA_READY[0] and self._module is not None) or _INTERPRETED_SPENT[0] >= self._budget():
            return False
        n = 0
        for a in args:
            if isinstance(a, np.ndarray):
                n += a.size
        return n <= INTERPRETED_MAX_ELEMENTS

    def _budget(self) -> float:
        """CPU seconds the process may interpret (all calls): :data:`INTERPRETED_BUDGET_S` when
        numba would load this module and the kernels from its cache, else
        :data:`INTERPRETED_BUDGET_COLD_S` (it would compile them)."""
        b = self.__dict__.get("_budget_s")
        if b is None:
            b = INTERPRETED_BUDGET_S if _numba_cache_warm(self.path) else INTERPRETED_BUDGET_COLD_S
            self.__dict__["_budget_s"] = b
        return b

    def _interpret(self, kernel, args):
        """Run the kernel in CPython; None when numba must take over."""
        from time import process_time

        t0 = process_time()  # CPU time: a loaded machine must not push small calls to numba
        fn = getattr(_kernels_interpreted(), kernel)
        forced = _ENGINE_FORCED == "python"
        fns = self.interpreted.FNS
        if forced:
            fns = _ieee(fns)
        else:
            fns = _budgeted(fns, t0 + self._budget() - _INTERPRETED_SPENT[0])
        try:
            with np.errstate(all="ignore"):
                return fn(fns, *args), True
        except (_Slow, ArithmeticError, ValueError):
            if forced:
                raise
            self._compiled_only = True
            return None, False
        finally:
            _INTERPRETED_SPENT[0] += process_time() - t0

    # -- calls --------------------------------------------------------------
    def fast_call(self, kernel: str, *args):
        """``meanfield._kernels.<kernel>(fns, *args)`` (``pair`` is not inserted) without numba's
        per-call type dispatch after the first call.

        numba's dispatcher re-types every argument on each call (the cfunc
        argument alone costs ~10 us). The first call goes through it
        (compiling or loading the kernel) and records the compiled entry
        point of the specialisation it chose; later calls enter it directly.
        The caller's contract: every call for one kernel passes arguments of
        the same types (float64 scalars, bools, C-contiguous float64 arrays).
        """
        ep = _ENTRIES.get(kernel)
        if ep is not None and self._module is not None:
            return ep(self.fast_fns, *args)
        out, fn = self._dispatch(kernel, args)
        if fn is not None:
            try:
                ov = fn.overloads.get(tuple(fn.typeof_pyval(a) for a in (self.fns, *args)))
            except Exception:  # an optimisation only: the dispatcher stays correct
                ov = None
            if ov is not None:
                _ENTRIES[kernel] = ov.entry_point
        return out

    def call(self, kernel: str, *args):
        """``meanfield._kernels.<kernel>(fns, *args)`` (``pair`` is inserted where the kernel takes it)."""
        if kernel in _PAIRED:
            args = (self.pair, *args)
        return self._dispatch(kernel, args)[0]

    def _dispatch(self, kernel: str, args):
        """(result, numba dispatcher or None): the interpreted engine where it may answer, else numba."""
        if self._interpreted_ok(args):
            out, ok = self._interpret(kernel, args)
            if ok:
                return out, None
        from . import _kernels

        fns = self.fns  # the module first: where it compiles, its notice names the kernels too
        fn = getattr(_kernels, kernel)
        if _kernels_cold(fn):
            from ._cache import compile_notice

            compile_notice("the solver kernels", "10-30 s")
        with quiet_numba():
            out = fn(fns, *args)
        _NUMBA_READY[0] = True
        return out, fn

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.module, name)


#: MEANFIELD_ENGINE=numba / python forces one engine (tests, benchmarks); read at import
_ENGINE_FORCED = os.environ.get("MEANFIELD_ENGINE", "").lower()
#: set once a numba kernel has run in this process: from then on numba answers every call
_NUMBA_READY = [False]


def _numba_cache_warm(path: Path) -> bool:
    """Whether numba's caches hold this generated module and the solver kernels (looked up on
    disk, without importing numba: the answer decides whether to import it)."""
    try:
        if not any(path.parent.glob(f"__pycache__/{path.stem}*.nbi")):
            return False
        return _kernels_cache_warm()
    except OSError:
        return False


@lru_cache(maxsize=1)
def _kernels_cache_warm() -> bool:
    """Whether numba's cache holds the solver kernels and the quadrature engine."""
    from ._cache import numba_cache_dir

    env = os.environ.get("NUMBA_CACHE_DIR")
    root = Path(env) if env else numba_cache_dir()
    find = root.rglob if env else (lambda pattern: root.glob(f"*/{pattern}"))
    return all(any(find(f"{name}.*.nbi")) for name in ("_kernels", "_quadrature_numba"))


def _kernels_cold(fn) -> bool:
    from ._cache import kernel_needs_compile

    try:
        return kernel_needs_compile(fn)
    except Exception:  # a courtesy notice must never break a computation
        return False


_ENTRIES: dict = {}


class _Address:
    """A cfunc seen through numba's wrapper-address protocol.

    Unboxing a ``CFunc`` argument re-checks its signature on every call
    (~5 us); this object hands numba the address it already knows. Same
    machine code, same numbers.
    """

    __slots__ = ("_addr", "_sig")

    def __init__(self, cfunc):
        self._addr = cfunc.address
        self._sig = cfunc._sig

    def __wrapper_address__(self):
        return self._addr

    def signature(self):
        return self._sig


#: kernels whose second argument is the ``pair`` flag
_PAIRED = frozenset({"fixed_point", "fixed_point_many", "profile", "profile_many", "depth_samples", "reached",
                     "h_line", "line_robust", "critical_line_many"})


@lru_cache(maxsize=128)
def _compiled(arch: Architecture) -> CompiledRecursion:
    arch.require_values("the numeric solvers")
    canonical = _canonical(arch)
    path = _source_path(canonical)
    pair = _module_pair(path)
    mu = float(arch.mu) if arch.mu is not None else 0.0
    eps = float(arch.eps) if arch.eps is not None else 0.0
    return CompiledRecursion(arch, path, mu, eps, pair, bool(arch.normalises), arch.pair_axis == "channels")


@lru_cache(maxsize=128)
def _module_pair(path: Path) -> bool:
    """Whether K12 feeds back, read from the generated module's header (no re-derivation)."""
    with open(path) as f:
        for line in f:
            if line.startswith("PAIR = "):
                return line.strip() == "PAIR = True"
    raise RuntimeError(f"{path} has no PAIR line: remove it (meanfield cache clear)")


def compiled(arch=None, **kwargs) -> CompiledRecursion:
    """The numba-compiled recursions of ``arch`` (cached in memory and on disk)."""
    return _compiled(as_architecture(arch, **kwargs))
