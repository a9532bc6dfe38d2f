"""The public API still gives the numbers of tests/golden/public_api.json (issue 24).

The file was written by ``python tests/golden/make_golden.py`` before the
layout refactor; every call listed in ``tests/golden/golden_cases.py`` is
recomputed here and compared at its entry's tolerance (1e-13 relative unless
the entry says why it is looser: roots, fits, Monte Carlo). One test per group
of calls, so that xdist spreads them. Slow: it runs every solver on every
built-in activation and block (numba compiles each architecture once, cold).
"""
import importlib.util
import json
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"


def _cases():
    spec = importlib.util.spec_from_file_location("golden_cases", GOLDEN / "golden_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cases = _cases()
STORED = json.loads((GOLDEN / "public_api.json").read_text())["groups"]


def test_every_group_is_stored():
    assert sorted(STORED) == sorted(cases.GROUPS)


def test_compare_can_fail():
    """The comparison is not vacuous: one ulp passes at 1e-13, 1e-12 does not, NaN only equals NaN."""
    assert cases.compare(1.0, 1.0 + 2.2e-16, 1e-13) == []
    assert cases.compare(1.0, 1.0 + 1e-12, 1e-13)
    assert cases.compare(float("nan"), float("nan"), 1e-13) == []
    assert cases.compare(float("nan"), 1.0, 1e-13)
    assert cases.compare(float("inf"), 1e308, 1e-13)
    assert cases.compare("critical", "ordered", 1e-13)
    assert cases.compare({"a": [1.0, 2.0]}, {"a": [1.0]}, 1e-13)
    assert cases.compare({"a": 1.0}, {"a": 1.0, "b": None}, 1e-13) == []
    assert cases.compare({"a": 1.0}, {"a": 1.0, "b": 0.0}, 1e-13)
    assert cases.compare({"a": 1.0, "b": None}, {"a": 1.0}, 1e-13)
    assert cases.compare(0.0, 1e-299, 1e-13)


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(cases.GROUPS))
def test_public_api_matches_golden(group):
    got = cases.compute(group)
    stored = STORED[group]
    mismatches = [f"{key}: stored, not computed" for key in stored if key not in got]
    mismatches += [f"{key}: computed, not stored" for key in got if key not in stored]
    for key, entry in stored.items():
        if key not in got:
            continue
        mismatches += [f"{key}{m}" for m in cases.compare(entry["value"], got[key]["value"], entry["rtol"],
                                                          entry["atol"])]
    assert not mismatches, f"{len(mismatches)} values moved:\n" + "\n".join(mismatches[:40])
