"""Dask: phase diagrams, the suite and AutoInit sweeps on a LocalCluster give the serial run's numbers, bit for bit.

One LocalCluster (2 worker processes, 1 thread each, CPU) serves the module;
the test that kills a worker runs last. References are the single-process
runs of the same functions: the claim under test is that sharding,
scheduling, checkpointing and a lost worker change nothing.
"""
import json
import os
import signal
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("distributed")

import meanfield as mf  # noqa: E402
from meanfield.verification import autoinit_sweep, phase_diagram, run_suite  # noqa: E402
from meanfield.verification import distributed as mfd  # noqa: E402
from meanfield.verification import _sharded  # noqa: E402
from meanfield.verification._batched import _bytes_per_init  # noqa: E402

pytestmark = pytest.mark.torch

ERF = mf.Architecture("erf")
SW = np.linspace(0.5, 3.0, 4)
SB = np.linspace(0.0, 1.0, 3)
PD = dict(depth=5, width=32, n_init=6, device="cpu")

CASES = [
    {"id": "relu-profile", "kind": "profile", "title": "ReLU critical", "arch": {"activation": "relu"},
     "sigma_w": 1.4142135623730951, "sigma_b": 0.0, "depth": 5, "width": 32, "n_init": 6},
    {"id": "erf-grid", "kind": "phase_diagram", "title": "erf grid", "arch": {"activation": "erf"},
     "sigma_w": [0.6, 2.0, 3], "sigma_b": [0.0, 0.6, 3], "depth": 5, "width": 32, "n_init": 6},
    {"id": "tanh-profile", "kind": "profile", "title": "tanh", "arch": {"activation": "tanh"},
     "sigma_w": 1.2, "sigma_b": 0.1, "depth": 4, "width": 32, "n_init": 6},
]


@pytest.fixture(scope="module")
def client():
    cluster = mfd.local_cluster(2, gpus=0)  # a LocalCluster: 2 processes, 1 thread each
    assert isinstance(cluster, distributed.LocalCluster)
    c = distributed.Client(cluster)
    assert c.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")) == {w: None for w in c.scheduler_info()["workers"]}
    yield c
    c.close()
    cluster.close()


def _same(a, b):
    return all(np.array_equal(getattr(a, k), getattr(b, k), equal_nan=True) for k in ("chi_J", "chi_J_se", "K"))


# ---------------------------------------------------------------------------
# No cluster needed.
# ---------------------------------------------------------------------------
def test_plan_shards_cover_every_point_and_init_once():
    shards = mfd.plan_shards(7, 10, 3, 4)
    hits = np.zeros((10, 7), dtype=int)
    for s in shards:
        hits[s.i0:s.i1, s.p0:s.p1] += 1
    assert (hits == 1).all() and len({s.name for s in shards}) == len(shards) == 3 * 3


@pytest.mark.slow
def test_init_chunking_is_bit_identical_serially():
    # the property the sharding rests on: splitting initialisations into passes changes no bit
    ref = phase_diagram(ERF, SW, SB, **PD)
    for chunk in (1, 4):
        assert _same(phase_diagram(ERF, SW, SB, init_chunk=chunk, **PD), ref)


def test_meminfo_and_budget(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n")
    assert mfd.meminfo_available(f) == 8000000 * 1024
    assert mfd.meminfo_available(tmp_path / "absent") is None
    b = mfd.memory_budget("cpu")
    avail = mfd.meminfo_available()
    assert b == (0.5 * avail if avail else mfd.DEFAULT_CPU_BUDGET)
    with pytest.raises(ValueError, match="fraction"):
        mfd.memory_budget("cpu", fraction=0)


def test_connect_rejects_bad_scheduler():
    for bad in ("local:0", "local:two", "", None):
        with pytest.raises(ValueError, match="scheduler"):
            with mfd.connect(bad):
                pass


def test_checkpoint_needs_client(tmp_path):
    with pytest.raises(ValueError, match="client"):
        phase_diagram(ERF, SW, SB, checkpoint=tmp_path, **PD)


# ---------------------------------------------------------------------------
# On the LocalCluster.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_phase_diagram_on_cluster_is_bit_identical(client):
    ref = phase_diagram(ERF, SW, SB, **PD)
    for init_chunk in (None, 4):  # 6 shards of 1 initialisation; shards of 4 + 2
        res = phase_diagram(ERF, SW, SB, client=client, init_chunk=init_chunk, **PD)
        assert _same(res, ref), init_chunk
        assert res.device == "cpu" and res.n_init == 6 and res.chi_J.shape == (4, 3)


@pytest.mark.slow
def test_deep_wide_float32_phase_diagram_on_cluster_is_bit_identical(client):
    kw = dict(depth=20, width=512, n_init=4, device="cpu", dtype=torch.float32, input_dim=784)
    sw, sb = np.array([0.8, 1.6, 2.4]), np.array([0.0, 0.5])
    ref = phase_diagram(ERF, sw, sb, **kw)
    assert _same(phase_diagram(ERF, sw, sb, client=client, init_chunk=1, **kw), ref)


@pytest.mark.slow
def test_worker_budgets_respect_their_memory_limit(client):
    limits = client.run(lambda dask_worker: dask_worker.memory_manager.memory_limit)
    budget = _sharded._cluster_budget(client, "cpu")
    assert 0 < budget <= 0.5 * min(limits.values())


@pytest.mark.slow
def test_phase_diagram_split_over_points_matches_the_same_serial_split(client):
    # a budget that holds 5 of the 12 points per initialisation forces shards over points (with a warning)
    T = 1
    need = [_bytes_per_init(P, 1, T, PD["width"], 1, False, True, torch.float64) for P in (0, 1)]
    budget = need[0] + 5.5 * (need[1] - need[0])
    with pytest.warns(RuntimeWarning, match="point_chunk=5"):
        res = mfd.phase_diagram_distributed(client, ERF, SW, SB, PD["depth"], PD["width"], PD["n_init"], 1, "cpu",
                                            0, torch.float64, layer=PD["depth"] - 2, budget=budget)
    assert _same(res, phase_diagram(ERF, SW, SB, point_chunk=5, **PD))


@pytest.mark.slow
def test_phase_diagram_resumes_only_missing_shards(client, tmp_path):
    ref = phase_diagram(ERF, SW, SB, **PD)
    first = phase_diagram(ERF, SW, SB, client=client, checkpoint=tmp_path, **PD)
    files = sorted((tmp_path / "shards").glob("*.npz"))
    assert len(files) == 6 and _same(first, ref)
    assert not list((tmp_path / "shards").glob("*.tmp*"))
    files[1].unlink()
    files[4].write_bytes(b"truncated")  # a damaged file is recomputed, not trusted
    done = []
    again = mfd.phase_diagram_distributed(client, ERF, SW, SB, PD["depth"], PD["width"], PD["n_init"], 1, "cpu", 0,
                                          torch.float64, layer=PD["depth"] - 2, checkpoint=tmp_path,
                                          _on_shard=done.append)
    assert sorted(s.name + ".npz" for s in done) == sorted([files[1].name, files[4].name])
    assert _same(again, ref)
    with pytest.raises(ValueError, match="different phase diagram"):
        phase_diagram(ERF, SW, SB, client=client, checkpoint=tmp_path, **dict(PD, n_init=4))


def _data(results):
    def strip(d):
        return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items() if "seconds" not in k}

    return {r["id"]: (r["status"], strip(r.get("data", {}))) for r in results}


def _assert_same_data(a, b, key=""):
    """Monte-Carlo numbers ("mc", "se") equal bit for bit; everything derived from theory to 1e-12.

    The theory side is evaluated by whichever engine a process has ready (interpreted numpy
    for small first calls, compiled numba once loaded; numeric.py), and the two sum in
    different orders: a fresh Dask worker and a test process that has loaded numba agree to
    rounding, not bit for bit."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), key
        for k in a:
            _assert_same_data(a[k], b[k], k if k in ("mc", "se") else key)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), key
        for u, v in zip(a, b):
            _assert_same_data(u, v, key)
    elif isinstance(a, float) and key not in ("mc", "se"):
        assert isinstance(b, float) and (a == b or np.isclose(a, b, rtol=1e-12, atol=0) or
                                         (np.isnan(a) and np.isnan(b))), (key, a, b)
    else:
        assert a == b or (isinstance(a, float) and np.isnan(a) and np.isnan(b)), (key, a, b)


@pytest.mark.slow
def test_suite_on_cluster_gives_the_serial_results(client, tmp_path):
    serial = run_suite(CASES, tmp_path / "serial", device="cpu", progress=False, plots=False)
    dist = run_suite(CASES, tmp_path / "dask", device="cpu", progress=False, plots=False, client=client)
    assert serial["summary"]["ok"] and dist["summary"]["ok"]
    _assert_same_data(_data(dist["results"]), _data(serial["results"]))
    assert not any(r.get("resumed") for r in dist["results"])
    for c in CASES:
        saved = json.loads((tmp_path / "dask" / "cases" / f"{c['id']}.json").read_text())
        assert saved["status"] == "pass" and saved["hash"]
    again = run_suite(CASES, tmp_path / "dask", device="cpu", progress=False, plots=False, client=client)
    assert all(r.get("resumed") for r in again["results"])


@pytest.mark.slow
def test_autoinit_sweep_on_cluster_matches_serial(client, tmp_path):
    kw = dict(depth=4, width=64, input_dim=16, batch=16, steps=4, seed=3, device="cpu", progress=False)
    sw, lr = [1.0, 2.0], [0.01, 0.05]
    serial = autoinit_sweep(sw, lr, **kw)
    dist = autoinit_sweep(sw, lr, client=client, checkpoint=tmp_path, **kw)
    for k in ("J_before", "J_after", "loss", "steps", "converged"):
        assert np.array_equal(getattr(serial, k), getattr(dist, k), equal_nan=True), k
    assert (serial.status == "ok").all() and serial.J_after.shape == (2, 2, 3)
    # the networks are what the docstring says: ReLU, fan-in scaling, so J^{l,l+1} ~ sigma_w^2 / 2 before tuning
    assert np.allclose(serial.J_before[:, 0].mean(-1), np.array(sw) ** 2 / 2, rtol=0.3)
    assert (np.abs(serial.J_after[1] - 1) < np.abs(serial.J_before[1] - 1)).all()  # AutoInit moves J towards 1
    assert len(list(tmp_path.glob("point_*.json"))) == 4
    resumed = autoinit_sweep(sw, lr, checkpoint=tmp_path, **kw)  # everything from the checkpoint, no client
    assert np.array_equal(resumed.J_after, serial.J_after)


@pytest.mark.slow
def test_cli_verify_with_scheduler_address(client, tmp_path, capsys):
    from meanfield.cli import main

    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps({"cases": CASES[:1]}))
    from meanfield.verification.__main__ import main as suite_main

    rc = suite_main(["--cases", str(cases), "--device", "cpu", "--out", str(tmp_path / "out"), "--no-plots",
                     "--scheduler", client.scheduler.address])
    assert rc == 0, capsys.readouterr()
    assert json.loads((tmp_path / "out" / "cases" / "relu-profile.json").read_text())["status"] == "pass"
    assert main(["verify", "--scheduler", "local:zero", "--device", "cpu", "--out", str(tmp_path / "x")]) == 2


# ---------------------------------------------------------------------------
# A worker dies mid-run (last: the cluster has to restart it).
# ---------------------------------------------------------------------------
class _Killer(threading.Thread):
    """SIGKILL one worker process that is computing a task, as soon as ``ready()`` says so."""

    def __init__(self, client, ready=lambda: True):
        super().__init__(daemon=True)
        self.client, self.ready, self.victim, self.stop = client, ready, None, threading.Event()
        self.pids = client.run(os.getpid)

    def run(self):
        while not self.stop.is_set():
            if self.ready():
                busy = [w for w, tasks in self.client.processing().items() if tasks]
                if busy:
                    os.kill(self.pids[busy[0]], signal.SIGKILL)
                    self.victim = busy[0]
                    return
            time.sleep(0.002)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(5)


@pytest.mark.slow
def test_killed_worker_loses_no_shard(client, tmp_path):
    client.wait_for_workers(2, timeout=120)
    kw = dict(PD, n_init=16, width=128, depth=8)
    ref = phase_diagram(ERF, SW, SB, **kw)
    done, at_kill = [], []
    with _Killer(client) as killer:
        def on_shard(s):
            if killer.victim and not at_kill:
                at_kill.append(len(done))
            done.append(s.name)

        res = mfd.phase_diagram_distributed(client, ERF, SW, SB, kw["depth"], kw["width"], kw["n_init"], 1, "cpu",
                                            0, torch.float64, layer=kw["depth"] - 2, init_chunk=1,
                                            checkpoint=tmp_path, _on_shard=on_shard)
    assert killer.victim is not None and at_kill and at_kill[0] < 16  # killed with shards still to deliver
    assert sorted(done) == sorted(set(done)) and len(done) == 16  # each shard delivered exactly once
    assert len(list((tmp_path / "shards").glob("*.npz"))) == 16
    assert _same(res, ref)


@pytest.mark.slow
def test_suite_survives_a_killed_worker(client, tmp_path):
    client.wait_for_workers(2, timeout=120)
    ckpt = tmp_path / "cases"
    with _Killer(client, ready=lambda: ckpt.exists() and any(ckpt.glob("*.json"))) as killer:
        out = run_suite(CASES, tmp_path, device="cpu", progress=False, plots=False, client=client)
    statuses = {r["id"]: r["status"] for r in out["results"]}
    # the cluster reruns the lost case; if it had not, the rerun computes exactly what is missing
    if not out["summary"]["ok"]:
        out = run_suite(CASES, tmp_path, device="cpu", progress=False, plots=False, client=client)
        statuses = {r["id"]: r["status"] for r in out["results"]}
    assert killer.victim is not None
    assert statuses == {c["id"]: "pass" for c in CASES}
    assert sorted(p.stem for p in ckpt.glob("*.json")) == sorted(c["id"] for c in CASES)
