"""Every policy respects a queue's capability and the other queues' guarantees, in the simulator and in the JCT
replay; a job that cannot start says which limit holds it. Replays of volcano-sh/volcano#921 (a queue of
capability 2 ran 3 jobs once one had stopped) and #1331 (a job of 2 devices stayed pending beside one of 5 that
its queue's capability of 3 can never admit)."""

from __future__ import annotations

import numpy as np
import pytest

from heteroflow.components.placement.policies import InvalidTrace, gavel_throughputs, load_inventory
from heteroflow.components.placement.rounds import place_round
from heteroflow.components.placement.state import Job, PlacementState
from heteroflow.pipelines.jct import replay
from heteroflow.pipelines.simulate import SimJob, simulate

TABLE = gavel_throughputs()
TYPE = "ResNet-18 (batch size 32)"
SIM_POLICIES = ("throughput", "static", "least-loaded", "gavel")
REPLAY_SCHEDULERS = ("fifo", "static", "gavel-style", "heteroflow")


def _hours(hours: float, sf: int = 1) -> float:
    return hours * 3600 * TABLE.of(TYPE, sf)["nvidia-v100"]


def _run(kind: str, policy: str, jobs, inv):
    return simulate(jobs, inv, TABLE, policy) if kind == "simulate" else replay(jobs, inv, TABLE, policy, sigma=0.5, seed=0)


ALL = [("simulate", p) for p in SIM_POLICIES] + [("replay", p) for p in REPLAY_SCHEDULERS]


@pytest.mark.parametrize(("kind", "policy"), ALL, ids=[f"{k}-{p}" for k, p in ALL])
def test_921_capability_caps_running_jobs_after_one_stops(kind: str, policy: str) -> None:
    """volcano#921: capability nvidia.com/gpu = 2, four 1-GPU jobs; once one stops, only one more may start."""
    inv = load_inventory("q.yaml", text="nodes:\n  - {name: g, replicas: 2, devices: {model: v100, count: 4}}\n"
                                        "queues:\n  - {name: team, capability: 2}\n")
    jobs = [SimJob(name=f"j{i}", arrival=0.0, job_type=TYPE, scale_factor=1, steps=_hours(1 + i), queue="team", model="nvidia-v100")
            for i in range(4)]
    r = _run(kind, policy, jobs, inv)
    times, busy = r.timeline
    assert busy.sum(axis=1).max() == pytest.approx(2.0)  # never more than the capability, with 8 devices free
    assert len(r.finish) == 4  # and every job ran
    # 10 device-hours of work through 2 devices: the last finishes at 5 h at the earliest (8 devices: 4 h)
    assert max(r.finish.values()) >= 5 * 3600 * (1 - 1e-6)


@pytest.mark.parametrize(("kind", "policy"), ALL, ids=[f"{k}-{p}" for k, p in ALL])
def test_1331_a_job_above_the_capability_is_named_and_the_other_runs(kind: str, policy: str) -> None:
    """volcano#1331: capability 3; a job of 2 devices runs, a job of 5 can never start and the error says why."""
    inv = load_inventory("q.yaml", text="nodes:\n  - {name: g, replicas: 2, devices: {model: v100, count: 4}}\n"
                                        "queues:\n  - {name: a, capability: 3}\n")
    jobs = [SimJob(name="task1", arrival=0.0, job_type=TYPE, scale_factor=2, steps=_hours(1, 2), queue="a", model="nvidia-v100"),
            SimJob(name="task2", arrival=0.0, job_type=TYPE, scale_factor=4, steps=_hours(1, 4), queue="a", model="nvidia-v100")]
    with pytest.raises(InvalidTrace, match=r"task2.*queue a's capability 3 is below the 4 device\(s\) it needs \(1 other job\(s\) finished\)"):
        _run(kind, policy, jobs, inv)


def test_a_round_names_the_capability_that_holds_a_job() -> None:
    inv = load_inventory("q.yaml", text="nodes:\n  - {name: g, replicas: 2, devices: {model: v100, count: 4}}\n"
                                        "queues:\n  - {name: a, capability: 3}\n")
    state = PlacementState(inv)
    d1, d2 = place_round([Job(name="task1", count=2, queue="a", arrival=0), Job(name="task2", count=5, queue="a", arrival=1)], state, "throughput")
    assert d1.placed and not d2.placed
    assert d2.explanation == "task2 waits: queue a's capability 3 is below the 5 device(s) it needs"
    d3 = place_round([Job(name="task3", count=2, queue="a")], state, "throughput")[0]
    assert d3.explanation == "task3 waits: queue a uses 2 of its capability 3, +2 would exceed it"


GUARANTEED = """\
nodes:
  - {name: g, replicas: 2, devices: {model: v100, count: 4}}
queues:
  - {name: prod, guarantee: 6}
  - {name: batch, reclaimable: false}
"""


@pytest.mark.parametrize(("kind", "policy"), ALL, ids=[f"{k}-{p}" for k, p in ALL])
def test_a_queue_that_is_not_reclaimable_leaves_others_guarantee_free(kind: str, policy: str) -> None:
    """8 devices, 6 guaranteed to prod: batch (not reclaimable) never holds more than 2, even with prod idle."""
    inv = load_inventory("g.yaml", text=GUARANTEED)
    jobs = [SimJob(name=f"b{i}", arrival=0.0, job_type=TYPE, scale_factor=1, steps=_hours(1), queue="batch", model="nvidia-v100")
            for i in range(5)]
    r = _run(kind, policy, jobs, inv)
    _times, busy = r.timeline
    assert busy.sum(axis=1).max() == pytest.approx(2.0)
    assert len(r.finish) == 5


def test_the_replay_says_which_guarantee_holds_a_waiting_job() -> None:
    from heteroflow.pipelines.jct import ClusterView, FifoAgnostic, JobView

    inv = load_inventory("g.yaml", text=GUARANTEED)
    cluster = ClusterView(models=("nvidia-v100",), capacity={"nvidia-v100": 8}, capability={"prod": None, "batch": None},
                          guarantee={"prod": 6, "batch": 0}, reclaimable={"prod": True, "batch": False})
    tp = TABLE.of(TYPE, 1)
    views = [JobView(SimJob(name=f"b{i}", arrival=float(i), job_type=TYPE, scale_factor=1, steps=10.0, queue="batch"),
                     {"nvidia-v100": tp["nvidia-v100"]}, 10.0) for i in range(3)]
    sched = FifoAgnostic()
    alloc = sched.allocate(0.0, views, cluster)
    assert sorted(alloc) == ["b0", "b1"]
    assert sched.waiting["b2"] == "6 device(s) are guaranteed to other queues and queue batch is not reclaimable"
    assert inv.queues["batch"].reclaimable is False


def test_gavel_style_allocation_honours_the_capability_as_a_constraint() -> None:
    from heteroflow.components.placement.policies import max_min_allocation

    tp = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 3.0]])
    scale = np.array([1.0, 1.0, 1.0])
    free = max_min_allocation(tp, scale, np.array([2.0, 2.0]))
    capped = max_min_allocation(tp, scale, np.array([2.0, 2.0]), limits=[(np.array([True, True, False]), 1.0)])
    assert (free[:2] * scale[:2, None]).sum() > 1.0 + 1e-6  # without the limit the two jobs hold more than 1 device
    assert (capped[:2] * scale[:2, None]).sum() <= 1.0 + 1e-6
    assert (capped[2] > 0).any()  # the job outside the queue still runs
