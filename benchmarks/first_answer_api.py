"""CPU time of a first critical_point / critical_line (10 points) in fresh processes, beyond
`import meanfield`: cold (empty MEANFIELD_CACHE_DIR) and warm (the cache the cold run left).

    python benchmarks/first_answer_api.py

Run it from the folder whose `meanfield` you mean to time (python -c puts the working folder first
on sys.path). One JSON line per row.
"""
import os, subprocess, sys, tempfile, json
SN = """
import time
c0 = time.process_time()
import meanfield as mf, numpy as np
c1 = time.process_time()
{call}
c2 = time.process_time()
print(c1 - c0, c2 - c1)
"""
out = {}
for act in ("erf", "gelu", "tanh"):
    for what, call in (("critical_point", f"mf.critical_point(activation={act!r})"),
                       ("critical_line10", f"mf.critical_line(activation={act!r}, sigma_w=np.linspace(1, 2, 10))")):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, MEANFIELD_CACHE_DIR=d, MEANFIELD_QUIET="1")
            for kind in ("cold", "warm"):
                r = subprocess.run([sys.executable, "-c", SN.format(call=call)], env=env, capture_output=True, text=True)
                imp, c = map(float, r.stdout.split()[-2:])
                print(json.dumps(dict(act=act, what=what, kind=kind, import_cpu=round(imp, 3), call_cpu=round(c, 3))), flush=True)
