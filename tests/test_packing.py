"""Requests and nodes as resource vectors (components/placement/vectors.py) and the packing policies behind one
score interface (components/placement/packing.py): feasibility, which limit holds a pod, each policy's choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heteroflow.components.placement.packing import PACKING_POLICIES, default_packing_policy, fill, get_packing_policy, place, ranked
from heteroflow.components.placement.vectors import Cluster, InvalidRequest, NodeSpec, QueueLimit, Request
from heteroflow.components.placement.views import InvalidInventory

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "shared_gpu"
ALL = sorted(PACKING_POLICIES)


def node(name: str, gpus: int = 0, model: str | None = None, cpu: int = 32000, mem: int = 131072, **kw) -> NodeSpec:  # type: ignore[no-untyped-def]
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=mem, gpus=gpus, model=model if gpus else None, **kw)


@pytest.mark.parametrize(("fields", "match"), [
    (dict(gpu_milli=1500, num_gpu=1), r"gpu_milli=1500; valid: an integer >= 0 and <= 1000"),
    (dict(num_gpu=2, gpu_milli=500), r"gpu_milli=500 with num_gpu=2; valid: a share below 1000 only with num_gpu=1"),
    (dict(num_gpu=0, gpu_milli=300), r"gpu_milli=300 with num_gpu=0"),
    (dict(num_gpu=1, gpu_milli=0), r"gpu_milli=0 with num_gpu=1"),
    (dict(cpu_milli=-1), r"cpu_milli=-1"),
    (dict(memory_mib=1.5), r"memory_mib=1.5"),
    (dict(models=3), r"models=3; valid: model names separated by '\|'"),
    (dict(single_node="yes"), r"single_node='yes'"),
])
def test_a_bad_request_names_itself_and_the_field(fields: dict, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match) as exc:
        Request(name="job-7", **fields)
    assert "request 'job-7'" in str(exc.value)


def test_request_defaults_models_and_spread_workers() -> None:
    r = Request(name="r", cpu_milli=8000, memory_mib=100, num_gpu=2, models="V100M16|V100M32|V100M32", single_node=False)
    assert r.gpu_milli == 1000 and r.gpu_total_milli == 2000 and r.models == ("V100M16", "V100M32") and not r.shared
    assert [(w.cpu_milli, w.num_gpu) for w in r.workers()] == [(4000, 1), (4000, 1)]
    assert Request(name="c", cpu_milli=500).gpu_milli == 0 and Request(name="s", num_gpu=1, gpu_milli=250).shared


def test_a_bad_node_names_itself_and_the_field() -> None:
    with pytest.raises(InvalidInventory, match=r"node 'n1': model=None with gpus=2; valid: the devices' model name"):
        NodeSpec(name="n1", cpu_milli=1, memory_mib=1, gpus=2)
    with pytest.raises(InvalidInventory, match=r"node 'n1': taints\[0\]"):
        NodeSpec(name="n1", cpu_milli=1, memory_mib=1, taints=({"key": "k", "effect": "Sometimes"},))
    with pytest.raises(InvalidInventory, match="appears twice"):
        Cluster([node("a"), node("a")])


@pytest.mark.parametrize("policy", ALL)
def test_every_policy_scores_feasible_nodes_only_and_places_cpu_only_pods(policy: str) -> None:
    c = Cluster([node("cpu0"), node("t4", 2, "T4"), node("v100", 4, "V100M32", cpu=4000)])
    pol = get_packing_policy(policy)
    r = Request(name="r", cpu_milli=8000, num_gpu=1, models="V100M32|T4")
    s = pol.scores(r, c)
    assert np.isnan(s[0]) and np.isnan(s[2]) and not np.isnan(s[1])  # no GPU; too little CPU
    assert pol.score("cpu0", r, c) is None and pol.score("t4", r, c) == pytest.approx(s[1])
    d = place(r, c, pol, np.random.default_rng(0))
    assert d.placed and d.nodes[0][0] == "t4" and c.gpu_free[1].tolist()[:2].count(0) == 1
    cpu_pod = Request(name="cpu", cpu_milli=30000)
    d = place(cpu_pod, c, pol, np.random.default_rng(0))
    assert d.placed and d.nodes == (("cpu0", ()),)  # t4 kept 24 cores, v100 has 4


@pytest.mark.parametrize("policy", ALL)
def test_every_policy_respects_queue_capability_and_says_so(policy: str) -> None:
    c = Cluster([node("a", 8, "A100")], [QueueLimit(name="team", capability={"gpu_milli": 1500})])
    assert place(Request(name="first", num_gpu=1, queue="team"), c, policy).placed
    d = place(Request(name="second", num_gpu=1, queue="team"), c, policy)
    assert not d.placed and d.reason == "queue 'team' capability gpu_milli=1500 holds it: 1000 used + 1000 requested"
    assert np.isnan(get_packing_policy(policy).scores(Request(name="x", num_gpu=1, queue="team"), c)).all()
    assert place(Request(name="half", num_gpu=1, gpu_milli=500, queue="team"), c, policy).placed  # 1500 fits
    assert place(Request(name="other", num_gpu=1), c, policy).placed  # the default queue has no capability
    with pytest.raises(InvalidRequest, match="queue='nope' is not in cluster; valid: default, team"):
        place(Request(name="lost", num_gpu=1, queue="nope"), c, policy)
    with pytest.raises(InvalidRequest, match=r"capability.gpus is unknown; valid: cpu_milli, memory_mib, gpu_milli"):
        QueueLimit(name="q", capability={"gpus": 1})


def test_a_pod_that_cannot_be_placed_says_which_limit_holds_it() -> None:
    c = Cluster([node("a", 1, "T4"), node("b", 1, "T4"), node("c", 4, "A10", taints=({"key": "dedicated", "value": "ml", "effect": "NoSchedule"},))])
    assert place(Request(name="v", num_gpu=1, models="V100M16|V100M32"), c, "bestfit").reason == \
        "no node with model V100M16|V100M32 (the inventory has T4, A10)"
    assert place(Request(name="big", num_gpu=2, models="T4"), c, "bestfit").reason == "no node of T4 has 2 devices (most: 1)"
    c.allocate(0, Request(name="o1", num_gpu=1, gpu_milli=400), [0])
    c.allocate(1, Request(name="o2", num_gpu=1, gpu_milli=400), [0])
    frag = place(Request(name="f", num_gpu=1, gpu_milli=800, models="T4"), c, "fgd")
    assert not frag.placed and frag.reason.startswith("fragmentation: 1200 GPU milli")
    short = place(Request(name="s", num_gpu=1, cpu_milli=1000, models="T4", memory_mib=10**7), c, "fgd")
    assert short.reason.startswith("insufficient resources: memory 10000000 requested")
    # the tainted node takes only pods that tolerate its taint
    assert place(Request(name="t", num_gpu=4), c, "firstfit").reason == (
        "no node of any model that fits matches its node selector {} and tolerates the node's taints "
        "(tolerations []; c: taint dedicated=ml:NoSchedule)")
    assert place(Request(name="t", num_gpu=4, tolerations=("dedicated=ml",)), c, "firstfit").nodes[0][0] == "c"


def test_a_spread_request_places_one_worker_per_device_all_or_none() -> None:
    c = Cluster([node("a", 1, "T4"), node("b", 1, "T4")])
    assert place(Request(name="pod", num_gpu=2), c, "bestfit").reason == "no node of any model has 2 devices (most: 1)"
    d = place(Request(name="job", num_gpu=2, cpu_milli=2000, single_node=False), c, "bestfit")
    assert d.placed and sorted(n for n, _ in d.nodes) == ["a", "b"] and c.gpu_allocated_milli == 2000
    assert c.cpu_free.tolist() == [31000, 31000]
    c2 = Cluster([node("a", 1, "T4"), node("b", 1, "T4")])
    c2.allocate(1, Request(name="o", num_gpu=1, gpu_milli=500), [0])
    d = place(Request(name="job", num_gpu=2, single_node=False), c2, "bestfit")
    assert not d.placed and "worker job-1" in d.reason and c2.gpu_allocated_milli == 500  # the first worker rolled back
    c3 = Cluster([node("a", 1, "T4"), node("b", 1, "T4")], [QueueLimit(name="q", capability={"gpu_milli": 1500})])
    d = place(Request(name="job", num_gpu=2, single_node=False, queue="q"), c3, "bestfit")
    assert d.reason == "queue 'q' capability gpu_milli=1500 holds it: 0 used + 2000 requested" and c3.gpu_allocated_milli == 0


def test_each_policy_picks_what_it_says() -> None:
    def fresh() -> Cluster:
        c = Cluster([node("empty", 4, "X", cpu=64000), node("used", 4, "X", cpu=64000), node("lowcpu", 4, "X", cpu=8000)],)
        c.allocate(1, Request(name="o", num_gpu=1, gpu_milli=600, cpu_milli=4000), [0])  # used: [400, 1000, 1000, 1000]
        return c

    share = Request(name="r", num_gpu=1, gpu_milli=300, cpu_milli=2000)
    rng = np.random.default_rng(0)
    assert place(share, fresh(), "firstfit", rng).nodes[0][0] == "empty"
    assert {place(share, fresh(), "leastloaded", np.random.default_rng(s)).nodes[0][0] for s in range(10)} == {"empty", "lowcpu"}
    assert place(share, fresh(), "gpupacking", rng).nodes == (("used", (0,)),)  # the partly used device
    assert place(share, fresh(), "power-aware", rng).nodes[0][0] == "used"
    assert place(share, fresh(), "bestfit", rng).nodes == (("lowcpu", (0,)),)  # least CPU and GPU left
    seen = {place(share, fresh(), "random", np.random.default_rng(s)).nodes[0][0] for s in range(20)}
    assert seen == {"empty", "used", "lowcpu"}
    # the ranking a plan step records: best first, each node's score; a node that cannot take it last, with None
    big = Request(name="big", num_gpu=1, cpu_milli=10000)
    table = ranked(big, fresh(), "bestfit")
    assert [n for n, _ in table] == ["used", "empty", "lowcpu"] and table[-1][1] is None
    assert table[0][1] == pytest.approx(get_packing_policy("bestfit").score("used", big, fresh()))


def test_unknown_policy_lists_the_valid_ones_and_defaults_follow_the_workload() -> None:
    with pytest.raises(InvalidInventory, match=r"policy='tetris' is not a packing policy; valid: bestfit, dotprod, fgd"):
        get_packing_policy("tetris")
    assert get_packing_policy("best-fit").name == "bestfit"
    assert default_packing_policy([Request(name="s", num_gpu=1, gpu_milli=500)]) == "fgd"
    assert default_packing_policy([Request(name="w", num_gpu=2)]) == "bestfit"


def test_fill_draws_until_the_arrived_demand_reaches_the_capacity() -> None:
    from heteroflow.pipelines.alibaba import read_nodes, read_pods

    pods = read_pods(EXAMPLES / "pods.csv")
    c = Cluster(read_nodes(EXAMPLES / "nodes.csv"))
    r = fill(pods, c, "bestfit", seed=3)
    assert 0.9 < r.arrived[-1] <= 1.0 and np.all(np.diff(r.arrived) >= 0)
    assert r.final_unallocated == pytest.approx(c.unallocated_share()) and r.placed + r.failed == len(r.arrived)
    assert r.failed == sum(r.reasons.values())
    again = fill(pods, c, "bestfit", seed=3)
    assert np.array_equal(again.unallocated, r.unallocated)  # seeded
    with pytest.raises(InvalidRequest, match="no request asks for a GPU"):
        fill([Request(name="c", cpu_milli=1)], c, "bestfit")
    with pytest.raises(InvalidRequest, match="no GPUs"):
        fill(pods, Cluster([node("cpu-only")]), "bestfit")


@pytest.mark.parametrize("first", ["fgd", "packing", "packplan"])
def test_the_registry_holds_each_policy_class_whichever_module_is_imported_first(first: str) -> None:
    """PACKING_POLICIES maps each name to its class (FgdPolicy included: it registers itself, its module subclassing
    PackingPolicy), in a fresh interpreter that imports fgd, packing or packplan first."""
    import subprocess
    import sys

    code = (f"import heteroflow.components.placement.{first}\n"
            "from heteroflow.components.placement.fgd import FgdPolicy\n"
            "from heteroflow.components.placement.packing import PACKING_POLICIES, PackingPolicy\n"
            "assert PACKING_POLICIES['fgd'] is FgdPolicy, PACKING_POLICIES\n"
            "assert all(isinstance(c, type) and issubclass(c, PackingPolicy) and c.name == n for n, c in PACKING_POLICIES.items())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
