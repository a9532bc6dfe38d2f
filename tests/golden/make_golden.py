"""Write tests/golden/public_api.json: golden values of the public API (issue 24).

Run by hand from the repository root (not by pytest)::

    python tests/golden/make_golden.py            # every group
    python tests/golden/make_golden.py kernels    # only these groups (the others kept from the file)

The calls are listed in ``golden_cases.py``; ``tests/test_golden.py`` recomputes
them and compares. Regenerate only when a value changes on purpose, and list
the changed keys with their evidence in the commit (``git diff --stat`` of the
JSON file, and the test's failure messages before regenerating).
"""
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))   # this checkout's meanfield, not an installed one

import golden_cases  # noqa: E402

OUT = HERE / "public_api.json"


def main(argv):
    names = argv or list(golden_cases.GROUPS)
    unknown = [n for n in names if n not in golden_cases.GROUPS]
    if unknown:
        raise SystemExit(f"unknown groups {unknown}; allowed: {list(golden_cases.GROUPS)}")
    data = json.loads(OUT.read_text()) if OUT.exists() and argv else {"groups": {}}
    total = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        data["groups"][name] = golden_cases.compute(name)
        n = sum(golden_cases.count_values(e["value"]) for e in data["groups"][name].values())
        print(f"{name:24s} {len(data['groups'][name]):4d} calls {n:6d} values {time.perf_counter() - t0:7.1f} s",
              flush=True)
    data["groups"] = {k: data["groups"][k] for k in golden_cases.GROUPS if k in data["groups"]}
    import meanfield
    data["about"] = ("golden values of meanfield's public API: tests/golden/make_golden.py writes them, "
                     "tests/test_golden.py checks them (docs/architecture.md)")
    data["version"] = meanfield.__version__
    # allow_nan: NaN and inf are results too (json.load reads them back)
    OUT.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
    n = sum(golden_cases.count_values(e["value"]) for g in data["groups"].values() for e in g.values())
    calls = sum(len(g) for g in data["groups"].values())
    print(f"wrote {OUT}: {calls} calls, {n} values, {time.perf_counter() - total:.1f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1:])
