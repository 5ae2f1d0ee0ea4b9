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
from heteroflow.components.training.shares import (GlobalSampler, ShareEstimator, SlowDown, equal_shares, shares_from_throughput,
                                                   simulated_speeds, step_seconds, worth_changing)


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
    t = Candidates(["gpu+npu,compression=topk,topk_ratio=0.05", "gpu+npu:compression=powersgd,powersgd_rank=4"])
    assert (t[0].topk_ratio, t[0].powersgd_rank, t[1].powersgd_rank, t[1].topk_ratio) == (0.05, 2, 4, 0.01)
    assert Candidates.from_json(t.to_json()) == t and t[0].to_dict()["mixed"] == {"compression": "topk", "topk_ratio": 0.05}


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("gpu:count=2+gpu:count=1", "mixed candidate 'gpu:count=2+gpu:count=1': kind 'gpu' is given twice (parts 1 and 2 between '+' signs"),
        # nodes on a part: refused as the candidate is read (it passed, and failed late in plan with a DeviceKind repr)
        ("gpu+npu:nodes=2", "mixed candidate 'gpu+npu:nodes=2': nodes=2 on npu replicas: a mixed candidate runs one elastic agent "
                            "per kind, and its replicas are placed by count; valid: count=N replicas of each kind, no nodes"),
        ("gpu:nodes=3,count=2+cpu", "mixed candidate 'gpu:nodes=3,count=2+cpu': nodes=3 on gpu replicas"),
        ("gpu+npu,compression=zip", "mixed candidate 'gpu+npu,compression=zip': compression='zip' is unknown"),
        ("gpu:count=2+foo:count=1", "mixed candidate 'gpu:count=2+foo:count=1': kind='foo' is not a device kind; valid kinds: cpu, gpu, npu"),
        ("gpu+", "empty part"),
        ("gpu:count=x+npu", "count='x'"),
        ("gpu:count=0+npu", "count=0"),
        ("gpu:memry=1Gi+npu", "memry"),
        ("gpux+npu", "did you mean 'gpu'"),
        ("gpu+npu,compression=zip", "compression='zip'"),
        ("gpu+npu,rebalance_every_steps=0", "rebalance_every_steps=0"),
        ("gpu+npu,rebalance_every_minutes=-1", "rebalance_every_minutes=-1"),
        ("gpu+npu:compression=topk,compression=none", "compression is given twice"),
        ("gpu+npu,topk_ratio=0", "topk_ratio=0.0; valid: a fraction in (0, 1]"),
        ("gpu+npu,topk_ratio=2", "topk_ratio=2.0; valid: a fraction in (0, 1]"),
        ("gpu+npu,topk_ratio=x", "topk_ratio='x' in mixed candidate 'gpu+npu,topk_ratio=x' is not a number"),
        ("gpu+npu,powersgd_rank=0", "powersgd_rank=0; valid: an integer >= 1"),
        ("gpu+npu,powersgd_rank=1.5", "powersgd_rank='1.5' in mixed candidate 'gpu+npu,powersgd_rank=1.5' is not a whole number"),
        ("gpu+npu,compression=top-k", "compression='top-k' (did you mean 'topk'?) is unknown; valid: none, topk, powersgd (of the exchange between kinds)"),
        # an option the candidate's compression would not use
        ("gpu+npu,topk_ratio=0.05", "topk_ratio=0.05 applies to compression=topk, and this candidate's compression is none; valid: add compression=topk, or leave topk_ratio out"),
        ("gpu+npu,compression=powersgd,topk_ratio=0.05", "topk_ratio=0.05 applies to compression=topk, and this candidate's compression is powersgd"),
        ("gpu+npu,compression=topk,powersgd_rank=4", "powersgd_rank=4 applies to compression=powersgd, and this candidate's compression is topk"),
        # a job option on a candidate of one kind, with its colon or a comma after the kind
        ("gpu:compression=topk", "candidate 'gpu:compression=topk': compression is an option of a mixed candidate, whose kinds train one job "
                                 "together and exchange gradients (kinds joined by '+', e.g. gpu+npu,compression=topk)"),
        ("gpu,topk_ratio=0.05", "candidate 'gpu,topk_ratio=0.05': topk_ratio is an option of a mixed candidate"),
        # a misspelled job option: the valid list names the job's options too
        ("gpu+npu,compresion=topk", "unknown resource field(s) compresion (did you mean 'compression'?); valid: kind,"),
        ("gpu+npu:acelerator=a100", "unknown resource field(s) acelerator (did you mean 'accelerator'?); valid: kind,"),
        ("gpu+npu,topk_ration=0.05", "; or an option of the whole job: compression, topk_ratio, powersgd_rank, rebalance_every_steps"),
        # a misspelled job option on a candidate of one kind: the suggestion says it is a mixed candidate's (the last
        # release suggested 'compression' alone, an option this candidate cannot take)
        ("gpu:compresion=fp16", "(did you mean 'compression'?); valid: kind, count, nodes, cpu, memory, cpu_limit, memory_limit, "
                                "device_memory, device_share, accelerator, precision, node_selector, tolerations, affinity, labels, "
                                "annotations; compression is an option of a mixed candidate only, whose kinds train one job "
                                "together (kinds joined by '+', e.g. gpu+npu,compression=...)"),
        ("gpu,topk_ration=0.1", "(did you mean 'topk_ratio'?); valid: kind, count, nodes, cpu, memory, cpu_limit, memory_limit, device_memory, "
                                "device_share, accelerator, precision, node_selector, tolerations, affinity, labels, annotations; "
                                "topk_ratio is an option of a mixed candidate only"),
    ],
)
def test_bad_mixed_spellings_name_the_field(spec, names):
    with pytest.raises(InvalidResources, match=None) as err:
        Candidates([spec])
    assert names in str(err.value)
    assert str(err.value).count("option of a mixed candidate only") <= (0 if "+" in spec else 1)  # once, and not in a mixed one's


@pytest.mark.parametrize("spec", ["gpu:precison=bf16", "gpu:tolerations_=x", "gpu:acelerator=t4"])
def test_a_misspelled_field_closer_to_a_resource_field_says_nothing_of_mixed_options(spec):
    with pytest.raises(InvalidResources) as err:  # 'precison' is close to 'compression' too, but closer to 'precision'
        Candidates([spec])
    assert str(err.value).startswith("unknown resource field(s)") and "mixed" not in str(err.value)


def test_the_compression_is_read_in_any_case_and_a_kinds_fields_may_follow_a_comma():
    (mixed, single) = Candidates(["gpu+npu,compression=TopK,topk_ratio=0.05", "gpu,count=2"])
    assert mixed.compression == "topk" and mixed.topk_ratio == 0.05
    assert single == Candidates(["gpu:count=2"])[0]


def test_python_errors_name_the_field():
    with pytest.raises(InvalidResources, match="two or more kinds"):
        MixedResources.of([Replicas("gpu", 2)])
    with pytest.raises(InvalidResources, match="count=0 of 'npu' replicas"):
        Replicas("npu", 0)
    from heteroflow.components.devices.accelerators import DeviceKind

    with pytest.raises(InvalidResources, match=r"^nodes=2 on npu replicas: a mixed candidate runs one elastic agent per kind"):
        Replicas(DeviceKind.parse("npu"), 2, nodes=2)  # the kind by name, not DeviceKind('npu')
    with pytest.raises(InvalidResources, match=r"^replicas\[1\]: nodes=2 on npu replicas"):
        MixedResources.of([{"kind": "gpu"}, {"kind": "npu", "nodes": 2}])
    assert Replicas("npu", 2, nodes=1) == Replicas("npu", 2)
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
    for bad, what in (("npu@2", "is out of range"), ("npu@0", "is out of range"), ("npu@fast", "is not a number")):
        speed = bad.partition("@")[2]
        with pytest.raises(InvalidParameter, match=rf"speed '{speed}' {what}; valid: a number in \(0, 1\].*e\.g\. npu@0\.5"):
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


def test_shares_minimise_the_slowest_replicas_step():
    # 2:1 of 64: 43:21 (steps of 43 and 42 sample-times); largest-remainder rounding gave 42:22 (44)
    assert shares_from_throughput(64, [1.0, 0.5]) == [43, 21]
    for batch, tput in ((64, [1.0, 0.5]), (100, [3.0, 1.0, 0.7]), (17, [5.0, 1.0]), (64, [1.0, 1e-9])):
        best = shares_from_throughput(batch, tput)
        slowest = max(b / t for b, t in zip(best, tput))
        # no other split of the batch into positive integers finishes sooner (two replicas: all splits)
        if len(tput) == 2:
            assert all(max(b / tput[0], (batch - b) / tput[1]) >= slowest - 1e-12 for b in range(1, batch))


def test_shares_change_only_when_the_saving_pays_for_the_new_shapes():
    tput = [2000.0, 1000.0]
    assert step_seconds([43, 21], tput) == pytest.approx(43 / 2000)
    assert step_seconds([32, 32], tput) == pytest.approx(32 / 1000)
    # equal -> balanced saves a third of every step: worth it even with few steps left
    assert worth_changing([32, 32], [43, 21], tput, remaining_steps=10)
    # 42:22 -> 43:21 saves 1/44 of a step: pays after 44 steps (a step's set-up), not after 30
    assert worth_changing([42, 22], [43, 21], tput, remaining_steps=200)
    assert not worth_changing([42, 22], [43, 21], tput, remaining_steps=30)
    assert not worth_changing([43, 21], [43, 21], tput, remaining_steps=1000)
    assert worth_changing([63, 1], [43, 21], [2000.0, 0.0], remaining_steps=1)  # no estimate for the current


def _synthetic_steps(rng, est, seconds_per_sample, shares, steps, outliers=0.0):
    """Feed ``est`` ``steps`` steps of replicas at ``seconds_per_sample`` with 5% noise; with probability
    ``outliers`` a step takes 20x as long (a process descheduled, a page fault)."""
    for _ in range(steps):
        for r, (sps, n) in enumerate(zip(seconds_per_sample, shares)):
            busy = sps * n * rng.uniform(0.95, 1.05)
            if rng.random() < outliers:
                busy *= 20
            est.record(r, busy, n)


def test_share_estimator_ignores_noisy_steps_and_smooths():
    rng = np.random.default_rng(0)
    truth = [1 / 2000, 1 / 1000]  # speeds 1.0 and 0.5: 43:21 of 64
    # one noisy step in ten (20x slower) on either replica: the median of a 5-step window gives 43:21 or a
    # neighbour unless 3 of its 5 steps are noisy (under 1% of windows); a mean is thrown off by any one
    results = []
    for _ in range(200):
        est = ShareEstimator(2)
        _synthetic_steps(rng, est, truth, [32, 32], 5, outliers=0.1)
        windows = [w for w in est._window]
        mean_tput = [sum(n for _, n, _ in w) / sum(b for b, _, _ in w) for w in windows]
        results.append((shares_from_throughput(64, est.estimate()), shares_from_throughput(64, mean_tput)))
    assert sum(abs(med[0] - 43) > 2 for med, _ in results) <= 6
    assert sum(abs(mean[0] - 43) > 2 for _, mean in results) > 40
    # smoothing: a window where the slow replica looked 3x slower moves the shares only part of the way
    est = ShareEstimator(2, smoothing=0.5)
    _synthetic_steps(rng, est, truth, [43, 21], 5)
    assert shares_from_throughput(64, est.estimate()) == [43, 21]
    _synthetic_steps(rng, est, [truth[0], truth[1] * 3], [43, 21], 5)
    moved = shares_from_throughput(64, est.estimate())
    assert 43 < moved[0] < shares_from_throughput(64, [2000, 1000 / 3])[0]
    # the first step after a share change (new shapes: set-up) is left out when the window has others
    est = ShareEstimator(2, smoothing=1.0)
    est.record(0, 1.0, 10, first_at_share=True)
    est.record(1, 0.01, 10, first_at_share=True)
    for _ in range(3):
        est.record(0, 0.01, 10)
        est.record(1, 0.01, 10)
    assert est.estimate() == pytest.approx([1000.0, 1000.0])
    # an empty window keeps the last estimate
    assert est.estimate() == pytest.approx([1000.0, 1000.0])
    with pytest.raises(InvalidParameter, match="smoothing=0"):
        ShareEstimator(2, smoothing=0)


def test_global_sampler_batches_do_not_depend_on_the_layout():
    sampler = GlobalSampler(100, 16, seed=3)
    assert sampler.steps_per_epoch == 7  # 6 whole batches and a last one of 4 samples, as one process trains
    for step in (0, 5, 6, 7, 13):
        whole = sampler.batch(step)
        for shares in ([16], [12, 4], [4, 4, 8], [1, 1, 14]):
            weights = [sampler.weight(step, shares, r) for r in range(len(shares))]
            parts = [sampler.part(step, shares, r) for r, w in enumerate(weights) if w > 0]
            assert np.array_equal(np.concatenate(parts), whole)
            assert sum(weights) == pytest.approx(1.0)
    # epoch e is default_rng(seed + e)'s permutation, as the single-process loader's
    assert np.array_equal(sampler.batch(7), np.random.default_rng(4).permutation(100)[:16])
    with pytest.raises(InvalidParameter, match="sum to 15"):
        sampler.part(0, [8, 7], 0)
    with pytest.raises(InvalidParameter, match=r"batch_sizes\[1\]=-4 is not a batch size"):
        sampler.part(0, [20, -4], 0)  # sums to 16, but a share is not a size
    with pytest.raises(InvalidParameter, match="rank=2 has no share; shares has 2 entries"):
        sampler.part(0, [12, 4], 2)


def test_an_epochs_last_partial_batch_is_split_by_the_shares_and_weighted_by_its_parts():
    from heteroflow.components.training.batches import EpochBatches

    sampler = GlobalSampler(100, 16, seed=3)
    last = sampler.batch(6)
    assert len(last) == 4 and np.array_equal(last, np.random.default_rng(3).permutation(100)[96:])
    assert sampler.sizes(6, [12, 4]) == [3, 1]  # 4 * 12/16 and 4 * 4/16
    assert sampler.sizes(6, [1, 1, 14]) == [0, 0, 4]  # 0.25, 0.25, 3.5: the largest remainder gets the sample
    assert [sampler.weight(6, [12, 4], r) for r in (0, 1)] == [0.75, 0.25]
    assert [sampler.weight(5, [12, 4], r) for r in (0, 1)] == [0.75, 0.25]  # a whole batch: the shares
    # a replica with no sample of the partial batch takes a stand-in (every replica takes every step), weight 0
    assert np.array_equal(sampler.part(6, [1, 1, 14], 0), last[:1]) and sampler.weight(6, [1, 1, 14], 0) == 0.0
    # the same split as a single-kind DDP run with those per-rank batch sizes (EpochBatches with parts)
    for shares in ([12, 4], [4, 4, 8], [1, 1, 14]):
        for r in range(len(shares)):
            ranks = EpochBatches(100, 16, 3, rank=r, world_size=len(shares), parts=tuple(shares))
            assert all(np.array_equal(np.asarray(a), sampler.part(b, shares, r)) for b, a in enumerate(ranks))


def test_slowdown_waits_in_proportion_to_compute():
    slow = SlowDown(0.25)
    t0 = time.perf_counter()
    busy = slow.pause(0.02)
    waited = time.perf_counter() - t0
    assert busy == pytest.approx(0.08)
    assert waited >= 0.06  # slept three times the compute (a lower bound only: never an upper one)
    with pytest.raises(InvalidParameter, match="speed=1.5"):
        SlowDown(1.5)
