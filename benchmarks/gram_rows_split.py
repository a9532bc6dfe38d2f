"""The compiled Gram-row kernel ``_gram_quadrature._gram_rows`` before and after its split into
@njit helpers (issue 24: no function over 80 lines), side by side in one run.

    python benchmarks/gram_rows_split.py BEFORE_DIR AFTER_DIR [--rounds 3] [--json FILE]

Each checkout runs in its own fresh process (``PYTHONPATH`` = the checkout, its own
``NUMBA_CACHE_DIR`` and ``MEANFIELD_CACHE_DIR`` under ``$BENCH_TMP`` or /tmp), the two alternated
``--rounds`` times (before, after, before, after, ...). Workloads: ``meanfield.kernels`` (NNGP +
NTK) for tanh and SiLU (two-point moments by the Hermite series of meanfield/_gram_quadrature.py,
whose first level is summed by ``_gram_rows``), n = 500 and n = 1000 Gaussian inputs of dimension 64
with row norms in [0.1, 3], depth 10, sigma_w = 1.5, sigma_b = 0.1. Per workload: one warm-up call
(compiles), then the best of 3 calls (CPU time of the process, ``time.process_time``);
``_gram_rows`` is wrapped to count its calls and add up its CPU time inside those calls, and the
arguments of its calls in the last run are replayed alone (best of 5 per call, summed over the
calls). The results' bytes are hashed, so that the two checkouts can be checked to give the same
numbers bit for bit. In the same processes, BEFORE's ``_gram_rows`` (its source, compiled there
without cache) and the checkout's own are timed alternately on those arguments (best of 8 each,
summed over the calls; the outputs compared bit for bit): in AFTER's process that is old against new
under the same load, in BEFORE's the control (old against itself: the noise of the comparison).
Reported: min over rounds, and after / before.
"""
import argparse
import json
import os
import subprocess
import sys
import time

WORKER = r"""
import hashlib, json, os, time
import numpy as np
import meanfield as mf
import meanfield._gram_quadrature as G

inner = G._gram_rows
calls = []
spent = [0.0]


def timed(*args):
    t = time.process_time()
    r = inner(*args)
    spent[0] += time.process_time() - t
    calls.append(args)
    return r


G._gram_rows = timed
OLD = None
if os.environ.get("OLD_SOURCE"):
    import ast
    from numba import njit
    src = open(os.environ["OLD_SOURCE"]).read()
    node = [d for d in ast.parse(src).body
            if isinstance(d, ast.FunctionDef) and d.name == "_gram_rows"][0]
    text = "\n".join(src.splitlines()[node.lineno - 2:node.end_lineno])
    text = text.replace("cache=True", "cache=False")
    ns = {"np": np, "njit": njit}
    exec(text, ns)
    OLD = ns["_gram_rows"]
res = {"file": G.__file__}
for act in ("tanh", "silu"):
    for n in (500, 1000):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, 64)) * rng.uniform(0.1, 3.0, size=(n, 1))
        run = lambda: mf.kernels(act, x, depth=10, sigma_w=1.5, sigma_b=0.1)
        run()                                   # warm-up: compiles (or loads numba's cache)
        best, best_rows = float("inf"), float("inf")
        for _ in range(3):
            calls.clear()
            spent[0] = 0.0
            t = time.process_time()
            r = run()
            best = min(best, time.process_time() - t)
            best_rows = min(best_rows, spent[0])
        # _gram_rows alone, on the arguments of the last run's calls (out and state are overwritten)
        alone = 0.0
        for args in calls:
            b = float("inf")
            for _ in range(5):
                t = time.process_time()
                inner(*args)
                b = min(b, time.process_time() - t)
            alone += b
        if OLD is not None:
            # the old kernel (compiled from the other checkout's source in this process) and the
            # new one, interleaved call by call on the same arguments: the same load for both
            t_new, t_old, same = 0.0, 0.0, True
            for args in calls:
                best2 = [float("inf"), float("inf")]
                for rep in range(8):
                    # alternate which goes first
                    for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
                        t = time.process_time()
                        (inner, OLD)[which](*args)
                        best2[which] = min(best2[which], time.process_time() - t)
                inner(*args)
                o_new, s_new = args[-2].copy(), args[-1].copy()
                OLD(*args)
                same &= np.array_equal(o_new.view(np.int64), args[-2].view(np.int64))
                same &= np.array_equal(s_new, args[-1])
                t_new += best2[0]
                t_old += best2[1]
            res_inproc = {"new_s": t_new, "old_s": t_old, "ratio": t_new / t_old,
                          "bit_identical": same}
        h = hashlib.sha256(np.ascontiguousarray(r.nngp).tobytes()
                           + np.ascontiguousarray(r.ntk).tobytes())
        res[f"{act} n={n}"] = {"kernels_s": best, "gram_rows_in_kernels_s": best_rows,
                               "gram_rows_alone_s": alone, "gram_rows_calls": len(calls),
                               "sha256": h.hexdigest()}
        if OLD is not None:
            res[f"{act} n={n}"]["in_process"] = res_inproc
print("RESULT " + json.dumps(res))
"""


def worker(tree, tag, old_source=""):
    tmp = os.environ.get("BENCH_TMP", "/tmp")
    env = dict(os.environ, PYTHONPATH=tree, OLD_SOURCE=old_source, OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
               NUMBA_CACHE_DIR=os.path.join(tmp, f"gram_rows_split_{tag}_numba"),
               MEANFIELD_CACHE_DIR=os.path.join(tmp, f"gram_rows_split_{tag}_cache"))
    # run from a neutral folder: ``python -c`` puts the current folder ahead of PYTHONPATH
    out = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp)
    line = [s for s in out.stdout.splitlines() if s.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    runs = {"before": [], "after": []}
    load = []
    for _ in range(a.rounds):
        for tag, tree in (("before", a.before), ("after", a.after)):
            old = os.path.join(os.path.abspath(a.before), "meanfield", "_gram_quadrature.py")
            runs[tag].append(worker(os.path.abspath(tree), tag, old))
            load.append(os.getloadavg()[0])
    cases = [k for k in runs["before"][0] if k != "file"]
    keys = ("kernels_s", "gram_rows_in_kernels_s", "gram_rows_alone_s")
    table = {}
    for c in cases:
        row = {}
        for k in keys:
            b = min(r[c][k] for r in runs["before"])
            f = min(r[c][k] for r in runs["after"])
            row[k] = {"before": b, "after": f, "ratio": f / b}
        row["gram_rows_calls"] = runs["after"][0][c]["gram_rows_calls"]
        row["bit_identical"] = len({r[c]["sha256"] for t in runs for r in runs[t]}) == 1
        for tag, key in (("after", "in_process"), ("before", "in_process_control")):
            ip = [r[c]["in_process"] for r in runs[tag]]
            row[key] = {"old_s": min(x["old_s"] for x in ip), "new_s": min(x["new_s"] for x in ip),
                        "bit_identical": all(x["bit_identical"] for x in ip)}
            row[key]["ratio"] = row[key]["new_s"] / row[key]["old_s"]
        table[c] = row
    print(f"files: before {runs['before'][0]['file']}, after {runs['after'][0]['file']}")
    print(f"load average (1 min) after each process: {', '.join(f'{x:.2f}' for x in load)}")
    print("| workload | kernels before / after (s) | ratio | _gram_rows in kernels | ratio "
          "| _gram_rows alone | ratio | same process, old / new | ratio "
          "| control: old / old | ratio | calls | same bits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c, row in table.items():
        cells = [f"{row[k]['before']:.3f} / {row[k]['after']:.3f} | {row[k]['ratio']:.3f}"
                 for k in keys]
        for key in ("in_process", "in_process_control"):
            ip = row[key]
            cells.append(f"{ip['old_s']:.4f} / {ip['new_s']:.4f} | {ip['ratio']:.3f}")
        same = row["bit_identical"] and row["in_process"]["bit_identical"]
        print(f"| {c} | " + " | ".join(cells) + f" | {row['gram_rows_calls']} | {same} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                       "cpus": os.cpu_count(), "rounds": a.rounds, "load_average_1min": load,
                       "results": table, "runs": runs}, fh, indent=1)


if __name__ == "__main__":
    main()
