"""Per-point CPU time of critical_line on 10^4 sigma_w values in a fresh process (warm cache): the
first call (which loads the compiled kernels), then three more; and one-point calls. Run by hand."""
import time, numpy as np, meanfield as mf
sw = np.linspace(0.5, 3, 10000)
for name in ("erf", "gelu"):
    ts = []
    for i in range(4):
        t = time.process_time(); mf.critical_line(name, sigma_w=sw); ts.append(time.process_time() - t)
    print(name, " ".join(f"{x*1e6/len(sw):.2f}us" for x in ts))
    ts = []
    for i in range(3):
        t = time.process_time(); mf.critical_line(name, sigma_w=1.5); ts.append(time.process_time() - t)
    print(name, "one point", " ".join(f"{x*1e6:.0f}us" for x in ts))
