"""Mixed candidates (#29 item 1), simulated speeds (item 7), shares and the global sampler (items 2, 3): the parts
that need no worker process."""

from __future__ import annotations

import time

import numpy as np
import pytest

from heteroflow.components.core.fallback import cannot_run
from heteroflow.components.errors import InvalidParameter, InvalidResources
from heteroflow.components.replicas import MixedResources, Replicas, is_mixed
from heteroflow.components.resources import Candidates, Resources
from heteroflow.components.training.shares import GlobalSampler, SlowDown, equal_shares, shares_from_throughput, simulated_speeds


def test_cli_spelling_and_python_spelling_are_the_same_candidate():
    cli = Candidates(["gpu:count=2+npu:count=4", "gpu", "cpu"])
    py = Candidates([[Replicas("gpu", 2), Replicas("npu", 4)], Resources(kind="gpu"), Resources(kind="cpu")])
    assert cli == py
    mixed = cli[0]
    assert is_mixed(mixed) and not is_mixed(cli[1])
    assert mixed.kinds == ("gpu", "npu") and mixed.total_replicas == 6
    assert [g.count for g in mixed.replicas] == [2, 4]
    assert mixed.kind == "gpu" and mixed.count == 2  # the first group, for code that reads one kind
    assert mixed.describe() == "gpu x2 (nvidia-gpu) + npu x4 (ascend-910)"


def test_mixed_candidate_round_trips_through_json_and_dicts_with_its_options():
    c = Candidates(["gpu:count=1,accelerator=T4+cpu:count=3,cpu=2,compression=topk,rebalance_every_steps=7", "cpu"])
    back = Candidates.from_json(c.to_json())
    assert back == c
    m = back[0]
    assert m.compression == "topk" and m.rebalance_every_steps == 7 and m.rebalance_every_minutes == 10.0
    assert m.replicas[0].resources.accelerator == "nvidia-t4"
    assert m.replicas[1].count == 3 and m.replicas[1].resources.cpu_millicores == 2000
    assert Resources.from_dict(m.to_dict()) == m
    assert Resources.parse_spec("gpu+npu,compression=powersgd").compression == "powersgd"


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("gpu:count=2+gpu:count=1", "kind 'gpu' is given twice"),
        ("gpu+", "empty part"),
        ("gpu:count=x+npu", "count='x'"),
        ("gpu:count=0+npu", "count=0"),
        ("gpu:memry=1Gi+npu", "memry"),
        ("gpux+npu", "did you mean 'gpu'"),
        ("gpu+npu,compression=zip", "compression='zip'"),
        ("gpu+npu,rebalance_every_steps=0", "rebalance_every_steps=0"),
        ("gpu+npu,rebalance_every_minutes=-1", "rebalance_every_minutes=-1"),
        ("gpu+npu:compression=topk,compression=none", "compression is given twice"),
    ],
)
def test_bad_mixed_spellings_name_the_field(spec, names):
    with pytest.raises(InvalidResources, match=None) as err:
        Candidates([spec])
    assert names in str(err.value)


def test_python_errors_name_the_field():
    with pytest.raises(InvalidResources, match="two or more kinds"):
        MixedResources.of([Replicas("gpu", 2)])
    with pytest.raises(InvalidResources, match="count=0 of 'npu' replicas"):
        Replicas("npu", 0)
    with pytest.raises(InvalidResources, match="unknown mixed-job option"):
        MixedResources.of([Replicas("gpu"), Replicas("npu")], compresion="topk")
    with pytest.raises(InvalidResources, match=r"replicas\[1\]"):
        MixedResources.of([Replicas("gpu"), 3])


def test_cpu_replicas_are_worker_processes():
    m = MixedResources.of([Replicas("gpu", 1), Replicas("cpu", 2)])
    assert m.replicas[1].count == 2 and m.replicas[1].resources.count == 0


def test_fallback_rule_checks_every_kind_of_a_mixed_candidate():
    m = Resources.parse_spec("gpu:count=2+npu:count=4")
    assert cannot_run(m, {"gpu": 2, "npu": 4}) is None
    assert "npu" in (cannot_run(m, {"gpu": 8, "npu": 3}) or "")
    assert "gpu" in (cannot_run(m, {"gpu": 1, "npu": 4}) or "")


def test_simulated_speeds_spelling():
    env = {"HETEROFLOW_SIMULATE_DEVICES": "gpu,npu:ascend-910b3@0.5"}
    assert simulated_speeds(env) == {"gpu": 1.0, "npu": 0.5}
    from heteroflow.components.core.failures import simulated_devices

    assert simulated_devices(env) == {"gpu": "", "npu": "ascend-910b3"}
    for bad in ("npu@2", "npu@0", "npu@fast"):
        with pytest.raises(InvalidParameter, match="valid: a number in \\(0, 1\\]"):
            simulated_speeds({"HETEROFLOW_SIMULATE_DEVICES": bad})


def test_shares_follow_throughput_and_keep_the_global_batch():
    assert shares_from_throughput(96, [200.0, 100.0]) == [64, 32]
    assert shares_from_throughput(10, [1.0, 1.0, 1.0]) == [4, 3, 3]
    assert equal_shares(7, 2) == [4, 3]
    s = shares_from_throughput(64, [1e6, 1.0])  # a very slow replica still takes one sample
    assert s == [63, 1]
    assert sum(shares_from_throughput(257, [3.3, 1.7, float("nan"), 0.0])) == 257
    with pytest.raises(InvalidParameter, match="batch_size=2 is smaller than the 3 replicas"):
        shares_from_throughput(2, [1.0, 1.0, 1.0])


def test_global_sampler_batches_do_not_depend_on_the_layout():
    sampler = GlobalSampler(100, 16, seed=3)
    assert sampler.steps_per_epoch == 6
    for step in (0, 5, 6, 13):
        whole = sampler.batch(step)
        for shares in ([16], [12, 4], [4, 4, 8], [1, 1, 14]):
            parts = [sampler.part(step, shares, r) for r in range(len(shares))]
            assert np.array_equal(np.concatenate(parts), whole)
    # epoch e is default_rng(seed + e)'s permutation, as the single-process loader's
    assert np.array_equal(sampler.batch(6), np.random.default_rng(4).permutation(100)[:16])
    with pytest.raises(InvalidParameter, match="sum to 15"):
        sampler.part(0, [8, 7], 0)


def test_slowdown_waits_in_proportion_to_compute():
    slow = SlowDown(0.25)
    t0 = time.perf_counter()
    busy = slow.pause(0.02)
    waited = time.perf_counter() - t0
    assert busy == pytest.approx(0.08)
    assert waited >= 0.06  # slept three times the compute (a lower bound only: never an upper one)
    with pytest.raises(InvalidParameter, match="speed=1.5"):
        SlowDown(1.5)
