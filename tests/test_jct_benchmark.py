"""The JCT replay without foreknowledge (heteroflow.pipelines.jct) and the benchmark built on it: schedulers never
see a job's true work, the noise model is what the docstring says, baselines read no estimate, and the benchmark
fits on seeds 0-4 and reports on seeds 5-9 the lines a script reads."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from heteroflow.components.placement.clusters import gavel_throughputs, uniform_inventory
from heteroflow.pipelines.jct import (
    SCHEDULERS,
    ForeknowledgeError,
    HeteroflowScheduler,
    JobView,
    Scheduler,
    _expected_remaining,
    estimate_steps,
    replay,
)
from heteroflow.pipelines.traces import generate_gavel_trace

TABLE = gavel_throughputs()
GAVEL = uniform_inventory({"k80": 36, "p100": 36, "v100": 36}, source="gavel")
SMALL = uniform_inventory({"k80": 4, "p100": 4, "v100": 4}, source="small")


def _trace(n: int = 40, seed: int = 0):
    return generate_gavel_trace(n, jobs_per_hour=6, seed=seed, table=TABLE, models=("nvidia-k80", "nvidia-p100", "nvidia-v100"))


def _small_trace(n: int = 30, seed: int = 1):
    # at most 4 workers, so every job fits the 12-device cluster; contention makes preemption matter
    return [j for j in generate_gavel_trace(n, jobs_per_hour=12, seed=seed, table=TABLE) if j.scale_factor <= 4]


class Spy(HeteroflowScheduler):
    """heteroflow's policy, recording every job view it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, float, tuple]] = []

    def allocate(self, now, jobs, cluster):
        for j in jobs:
            self.seen.append((j.name, j.estimated_steps, tuple(getattr(j, a) for a in JobView.__slots__)))
        return super().allocate(now, jobs, cluster)


def test_schedulers_see_estimates_never_the_true_work() -> None:
    jobs = _small_trace()
    truth = {j.name: j.steps for j in jobs}
    est = estimate_steps(jobs, sigma=0.5, seed=3)
    spy = Spy()
    r = replay(jobs, SMALL, TABLE, spy, sigma=0.5, seed=3)
    assert len(r.finish) == len(jobs) and spy.seen
    for name, estimated, values in spy.seen:
        assert estimated == est[name] != truth[name]
        # no attribute of a view holds the true work (the estimate differs from it by the noise)
        assert not any(isinstance(v, float) and math.isclose(v, truth[name], rel_tol=1e-12) for v in values)
    view = JobView(jobs[0], TABLE.of(jobs[0].job_type, jobs[0].scale_factor), est[jobs[0].name])
    with pytest.raises(ForeknowledgeError, match="its true work is hidden from schedulers"):
        _ = view.true_steps
    with pytest.raises(AttributeError):
        view.steps  # noqa: B018  (the trace's attribute does not exist on a view)


class Peeker(Scheduler):
    name = "peeker"

    def allocate(self, now, jobs, cluster):
        sorted(jobs, key=lambda j: j.true_steps)
        return {}


def test_a_scheduler_that_reads_the_true_work_fails_the_replay() -> None:
    with pytest.raises(ForeknowledgeError):
        replay(_small_trace(10), SMALL, TABLE, Peeker(), sigma=0.5, seed=0)


class Greedy(Scheduler):
    """Gives every job a V100 whether there is one or not."""

    name = "greedy"

    def allocate(self, now, jobs, cluster):
        return {j.name: {"nvidia-v100": 1.0} for j in jobs}


def test_an_allocation_beyond_the_cluster_is_refused() -> None:
    from heteroflow.pipelines.jct import InvalidAllocation

    with pytest.raises(InvalidAllocation, match=r"greedy: \d+ nvidia-v100 devices allocated, 4 exist"):
        replay(_small_trace(30), SMALL, TABLE, Greedy(), sigma=0.5, seed=0)


def test_noise_model_is_log_normal_with_the_stated_sigma_and_seeded() -> None:
    jobs = generate_gavel_trace(2000, jobs_per_hour=6, seed=0, table=TABLE)
    for sigma in (0.5, 1.0):
        est = estimate_steps(jobs, sigma=sigma, seed=5)
        logs = np.log([est[j.name] / j.steps for j in jobs])
        assert abs(np.mean(logs)) < 4 * sigma / math.sqrt(len(jobs))
        assert np.std(logs) == pytest.approx(sigma, rel=0.06)
        assert est == estimate_steps(jobs, sigma=sigma, seed=5) != estimate_steps(jobs, sigma=sigma, seed=6)
    assert estimate_steps(jobs, sigma=0.0, seed=5) == {j.name: float(j.steps) for j in jobs}  # sigma 0: the oracle
    with pytest.raises(ValueError, match=r"sigma=-1 is not a standard deviation"):
        estimate_steps(jobs, sigma=-1, seed=0)


def test_baselines_read_no_estimate_and_heteroflow_does() -> None:
    jobs = _small_trace(40, seed=2)
    for name in ("fifo", "static", "gavel-style"):
        few = jobs[:15] if name == "gavel-style" else jobs  # its LP per event is the slow part
        a = replay(few, SMALL, TABLE, name, sigma=0.0, seed=0)
        b = replay(few, SMALL, TABLE, name, sigma=1.0, seed=0)
        assert a.finish == b.finish, name
    a = replay(jobs, SMALL, TABLE, "heteroflow", sigma=0.0, seed=0)
    b = replay(jobs, SMALL, TABLE, "heteroflow", sigma=1.0, seed=0)
    assert a.finish != b.finish  # its order follows the (noisier) estimates


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_job_finishes_no_faster_than_alone_on_its_best_model(name: str) -> None:
    jobs = _small_trace(30, seed=4)
    r = replay(jobs, SMALL, TABLE, name, sigma=0.5, seed=4)
    assert sorted(r.finish) == sorted(j.name for j in jobs)
    for j in jobs:
        best = max(TABLE.of(j.job_type, j.scale_factor).values())
        assert r.jct[j.name] >= j.steps / best * (1 - 1e-6)
        assert r.queueing[j.name] >= 0
    times, busy = r.timeline
    assert (busy <= np.array([4, 4, 4]) + 1e-6).all()  # never more devices than the cluster has


def test_preemption_pays_the_restart_cost_and_only_heteroflow_preempts() -> None:
    jobs = _small_trace(40, seed=2)
    assert replay(jobs, SMALL, TABLE, "fifo", sigma=0.5, seed=0).preemptions == 0
    cheap = replay(jobs, SMALL, TABLE, "heteroflow", sigma=0.5, seed=0, restart_s=0.0)
    dear = replay(jobs, SMALL, TABLE, "heteroflow", sigma=0.5, seed=0, restart_s=600.0)
    assert cheap.preemptions > 0
    assert dear.avg_jct > cheap.avg_jct


def test_expected_remaining_is_srpt_within_the_estimate_and_las_beyond() -> None:
    assert _expected_remaining(100.0, 30.0, 0.0) == pytest.approx(70.0)
    assert _expected_remaining(100.0, 0.0, 0.5) == pytest.approx(100.0 * math.exp(0.125))  # the log-normal's mean
    beyond = [_expected_remaining(100.0, a, 0.5) for a in (200.0, 400.0, 800.0)]
    assert beyond[0] < beyond[1] < beyond[2]  # overrun: the longer it has run, the longer it is expected to run
    with pytest.raises(ValueError, match=r"preempt_margin=0 is out of range"):
        HeteroflowScheduler(preempt_margin=0)


def test_heteroflow_beats_fifo_on_a_loaded_gavel_cluster() -> None:
    """A tiny seeded run of the benchmark's setup: the structural claim (a heterogeneity-aware, preemptive policy
    lowers the mean JCT against heterogeneity-agnostic FIFO), not the reported figure."""
    jobs = _trace(60, seed=0)
    fifo = replay(jobs, GAVEL, TABLE, "fifo", sigma=0.5, seed=0)
    hf = replay(jobs, GAVEL, TABLE, "heteroflow", sigma=0.5, seed=0)
    assert hf.avg_jct < fifo.avg_jct


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_benchmark_quick_fits_on_0_4_reports_on_5_9_and_prints_the_lines() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "placement.py"), "--quick", "--jobs", "40"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "fit (seeds 0-4, sigma 0.5" in text and "seeds 5-9" in text
    assert re.search(r"sigma 0 \(oracle: estimate = true work\)", text)
    for seed in range(5, 10):
        assert f"\nseed {seed}: 40 jobs" in text
    assert "\nseed 0: " not in text  # the fit's seeds are not reported
    fifo = re.search(r"^avg JCT vs fifo \(no foreknowledge\): (\d+\.\d\d)x$", text, re.M)
    gavel = re.search(r"^avg JCT vs gavel-style \(no foreknowledge\): (\d+\.\d\d)x$", text, re.M)
    assert fifo and gavel
    assert float(fifo.group(1)) > 0 and float(gavel.group(1)) > 0
