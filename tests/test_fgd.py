"""FGD (components/placement/fgd.py): the fragmentation measure against hand-computed values and against a
loop written from the definition (Weng et al., ATC'23; the reference simulator's frag.go), and its placements."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from heteroflow.components.placement.fgd import FgdPolicy, TypicalRequests, node_fragmentation
from heteroflow.components.placement.packing import get_packing_policy, place
from heteroflow.components.placement.vectors import Cluster, InvalidRequest, NodeSpec, Request

T1 = Request(name="t1", cpu_milli=1000, num_gpu=1, gpu_milli=500)  # half a GPU
T2 = Request(name="t2", cpu_milli=2000, num_gpu=1, gpu_milli=1000)  # one whole GPU
T3 = Request(name="t3", cpu_milli=1000)  # CPU only
WORKLOAD = [T1] * 5 + [T2] * 3 + [T3] * 2  # p = 0.5, 0.3, 0.2


def tiny() -> Cluster:
    """A: 2 GPUs of X, 8 cores, one device already 70 % used (free [1000, 300], 7 cores). B: 2 free GPUs of Y, 4 cores."""
    c = Cluster([NodeSpec(name="A", cpu_milli=8000, memory_mib=64000, gpus=2, model="X"),
                 NodeSpec(name="B", cpu_milli=4000, memory_mib=64000, gpus=2, model="Y")])
    c.allocate(0, Request(name="old", cpu_milli=1000, num_gpu=1, gpu_milli=700), [1])
    return c


def test_typical_requests_are_the_workload_distribution_cut_at_the_coverage() -> None:
    d = TypicalRequests.from_requests(WORKLOAD)
    assert d.p.tolist() == pytest.approx([0.5, 0.3, 0.2]) and d.gpu_milli.tolist() == [500, 1000, 0]
    cut = TypicalRequests.from_requests(WORKLOAD, coverage=0.75)  # 5 < 7.5, 8 >= 7.5: two types, renormalised
    assert cut.p.tolist() == pytest.approx([5 / 8, 3 / 8]) and len(cut) == 2
    with pytest.raises(InvalidRequest, match="coverage"):
        TypicalRequests.from_requests(WORKLOAD, coverage=1.5)
    with pytest.raises(InvalidRequest, match="no requests"):
        TypicalRequests.from_requests([])


def test_fragmentation_and_score_equal_the_hand_computed_values() -> None:
    c = tiny()
    d = TypicalRequests.from_requests(WORKLOAD)
    # A: free 1300; t1 fits (device 0), fragments 300; t2 fits, 300; t3 (no GPU) 1300 -> .5*300 + .3*300 + .2*1300
    # B: free 2000; t1, t2 fit with no device too small -> 0; t3 2000 -> .2*2000
    assert node_fragmentation(c, d).tolist() == pytest.approx([500.0, 400.0])
    fgd = FgdPolicy(d)
    # 400 milli on A's device 0 -> [600, 300], 6 cores: t1 fits (frag 300), t2 not (900), t3 900 -> 600: +100
    # on B -> [600, 1000], 3 cores: t1 0, t2 fits (frag 600), t3 1600 -> 500: +100; A's device 1 (300 free) cannot
    r = Request(name="r", cpu_milli=1000, num_gpu=1, gpu_milli=400)
    assert fgd.delta("A", r, c) == pytest.approx(100.0) and fgd.delta("B", r, c) == pytest.approx(100.0)
    assert fgd.score("A", r, c) == pytest.approx(-100.0)
    # a whole GPU: A -> [0, 300]: nothing fits, 300 -> -200; B -> [0, 1000], 3 cores: t1 0, t2 0, t3 1000 -> 200: -200
    w = Request(name="w", cpu_milli=1000, num_gpu=1)
    assert [fgd.delta(n, w, c) for n in "AB"] == pytest.approx([-200.0, -200.0])
    # 2.5 cores, no GPU: A keeps 4.5 cores, nothing changes (0); B keeps 1.5 < t2's 2: t2 2000, t3 2000 -> 1000: +600
    cpu = Request(name="cpu", cpu_milli=2500)
    assert [fgd.delta(n, cpu, c) for n in "AB"] == pytest.approx([0.0, 600.0])
    # FGD puts it on A; best fit (least CPU and GPU left) on B
    assert place(cpu, tiny(), FgdPolicy(d)).nodes[0][0] == "A"
    assert place(cpu, tiny(), "bestfit").nodes[0][0] == "B"


def _frag_by_definition(c: Cluster, i: int, d: TypicalRequests) -> float:
    """frag.go's NodeGpuShareFragAmountScore, written as a loop."""
    free = [int(x) for x in c.gpu_free[i][: c.gpu_count[i]]]
    total, cpu, model, out = sum(free), int(c.cpu_free[i]), c.nodes[i].model, 0.0
    for t in range(len(d)):
        m, n, ms = int(d.gpu_milli[t]), int(d.num_gpu[t]), d.models[t]
        if m == 0 or (ms and model not in ms):
            out += d.p[t] * total
        elif sum(f >= m for f in free) >= n and cpu >= d.cpu_milli[t]:
            out += d.p[t] * sum(f for f in free if f < m)
        else:
            out += d.p[t] * total
    return out


def test_fragmentation_matches_the_definition_on_random_states_and_cached_scores_stay_fresh() -> None:
    rng = np.random.default_rng(7)
    nodes = [NodeSpec(name=f"n{i}", cpu_milli=int(rng.choice([8000, 32000, 64000])), memory_mib=1 << 18,
                      gpus=int(g), model=str(rng.choice(["P", "Q"])) if g else None) for i, g in enumerate(rng.choice([0, 1, 2, 4, 8], size=30))]
    c = Cluster(nodes)
    pods = [Request(name=f"p{i}", cpu_milli=int(rng.choice([0, 2000, 6000, 12000])), num_gpu=n,
                    gpu_milli=int(rng.choice([100, 250, 500, 800])) if n == 1 and rng.random() < 0.5 else (1000 if n else 0),
                    models=str(rng.choice(["", "P", "Q", "P|Q"])) if n else "") for i, n in enumerate(rng.choice([0, 1, 1, 1, 2, 4], size=60))]
    d = TypicalRequests.from_requests(pods)
    fgd = FgdPolicy(d)
    for p in pods[:40]:
        place(p, c, fgd, rng)
    assert c.gpu_allocated_milli > 0
    assert node_fragmentation(c, d).tolist() == pytest.approx([_frag_by_definition(c, i, d) for i in range(len(nodes))])
    for p in pods[40:]:
        cached, fresh = fgd.scores(p, c), FgdPolicy(d).scores(p, c)
        assert np.array_equal(np.isnan(cached), np.isnan(fresh)) and np.allclose(cached[~np.isnan(cached)], fresh[~np.isnan(fresh)])
        # the score is the negative increase of the node's fragmentation, checked by placing on a copy
        ok = np.flatnonzero(~np.isnan(fresh))
        if len(ok) and not p.shared:
            i, c2 = int(ok[-1]), copy.deepcopy(c)
            c2.allocate(i, p, c2.best_fit_devices(i, p))
            assert -fresh[i] == pytest.approx(_frag_by_definition(c2, i, d) - _frag_by_definition(c, i, d))
        place(p, c, fgd, rng)


def test_fgd_places_a_shared_request_on_the_device_that_fragments_least() -> None:
    c = Cluster([NodeSpec(name="A", cpu_milli=64000, memory_mib=1 << 18, gpus=2, model="X")])
    c.allocate(0, Request(name="old", num_gpu=1, gpu_milli=500), [0])  # free [500, 1000]
    d = TypicalRequests.from_requests([Request(name="half", num_gpu=1, gpu_milli=500)] * 3 + [Request(name="one", num_gpu=1)])
    dec = place(Request(name="r", num_gpu=1, gpu_milli=500), c, FgdPolicy(d))
    # device 0 -> [0, 1000]: nothing is a fragment; device 1 would leave [500, 500] and no whole GPU
    assert dec.placed and dec.nodes == (("A", (0,)),) and c.gpu_free[0].tolist() == [0, 1000]


def test_fgd_is_a_registered_packing_policy_and_learns_its_distribution_from_prepare() -> None:
    pol = get_packing_policy("fgd")
    assert isinstance(pol, FgdPolicy) and pol.dist is None
    pol.prepare(WORKLOAD)
    assert pol.dist is not None and pol.dist.p.tolist() == pytest.approx([0.5, 0.3, 0.2])
