"""The package's import graph: no cycles, no private names taken across modules.

Read from the source with `ast` (nothing is imported), counting imports inside
functions too: a lazy import still ties two modules together.  A private name
(one leading underscore) may be imported only between the modules of one
subpackage (`meanfield/solvers/`, `meanfield/torch/`, `meanfield/verification/`,
...); the flat top-level modules talk through public names.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "meanfield"

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports():
    """(importer, imported module, name or None) for every import in the package."""
    modules = _modules()
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        yield module, alias.name, None
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(module, path, node)
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules:
                        yield module, submodule, None
                    elif source in modules:
                        yield module, source, alias.name


def import_cycles() -> set:
    """The strongly connected components (more than one module) of the import graph."""
    graph = {}
    for importer, imported, _ in imports():
        if importer != imported:
            graph.setdefault(importer, set()).add(imported)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), set()

    def visit(v):  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _subpackage(module: str):
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else None


def private_imports() -> set:
    """(importer, module, name): private names taken from a module of another place."""
    found = set()
    for importer, imported, name in imports():
        if name is None or not name.startswith("_") or name.startswith("__"):
            continue
        same = _subpackage(importer) is not None and _subpackage(importer) == _subpackage(imported)
        if not same:
            found.add((importer, imported, name))
    return found


def test_the_graph_is_read():
    # the checker itself: it sees a module-level and a function-level import
    edges = {(a, b) for a, b, _ in imports()}
    assert ("meanfield.symbolic", "meanfield.calculus") in edges
    assert ("meanfield.cli", "meanfield.solvers") in edges or ("meanfield.cli", "meanfield") in edges


def test_no_import_cycles():
    cycles = sorted(sorted(c) for c in import_cycles())
    assert cycles == [], f"import cycles (modules that import each other, directly or around a loop): {cycles}"


def test_no_private_imports_across_modules():
    found = sorted(private_imports())
    assert found == [], f"private names imported from a module of another place (importer, module, name): {found}"


# Functions over 80 lines (decorators not counted) that exist today and are
# being split (issue 24); must match exactly (a new one fails, and so does one listed that is gone).
# None is left: the last, _gram_quadrature._gram_rows, is split into @njit row steps
# (benchmarks/gram_rows_split.py: the same speed).
MAX_FUNCTION_LINES = 80
KNOWN_LONG_FUNCTIONS = set()


def _long_in(source: str, limit: int) -> dict:
    """{function name: lines} for the functions (nested too) of `source` longer than `limit`;
    lines run from `def` to the last line of the body, decorators not counted."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found[node.name] = lines
    return found


def long_functions(limit: int = MAX_FUNCTION_LINES) -> dict:
    """{(module, function): lines} for every package function longer than `limit`."""
    return {(module, name): lines
            for module, path in _modules().items()
            for name, lines in _long_in(path.read_text(), limit).items()}


def test_long_functions_are_measured():
    # the checker itself, on a known source: decorator lines do not count, nested functions do
    source = "@decorator\n@another\ndef outer():\n    def inner():\n        return 1\n    return inner\n"
    assert _long_in(source, limit=3) == {"outer": 4}
    assert _long_in(source, limit=1) == {"outer": 4, "inner": 2}
    assert _long_in(source, limit=4) == {}


def test_no_function_over_80_lines():
    found = set(long_functions())
    new = found - KNOWN_LONG_FUNCTIONS
    assert new == set(), f"new functions over {MAX_FUNCTION_LINES} lines: {sorted(new)}"
    gone = KNOWN_LONG_FUNCTIONS - found
    assert gone == set(), f"gone, remove from KNOWN_LONG_FUNCTIONS: {sorted(gone)}"
