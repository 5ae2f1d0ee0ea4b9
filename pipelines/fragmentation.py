"""Pod packing replays for ``heteroflow simulate``: a fractional-GPU inventory and workload, packing policies, and
the share of GPUs they leave unallocated (the FGD paper's experiment, Weng et al., USENIX ATC'23).

Inputs: an inventory (an Alibaba 2023 node list CSV, or a heteroflow inventory YAML whose nodes state ``cpu``,
``memory`` and devices) and a workload (an Alibaba 2023 pod list CSV: ``name, cpu_milli, memory_mib, num_gpu,
gpu_milli[, gpu_spec]``). :func:`replay` draws pods with replacement until the arrived GPU demand reaches the
capacity (:func:`~heteroflow.components.placement.packing.fill`) under each policy, the same draws for every one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heteroflow.components.placement.packing import FillResult, default_packing_policy, fill
from heteroflow.components.placement.vectors import Cluster, NodeSpec, Request
from heteroflow.components.placement.views import InvalidInventory

__all__ = ["PackingReplay", "packing_cluster", "replay"]

_MIB = 1 << 20


def packing_cluster(spec: str | Path) -> Cluster:
    """The cluster of an Alibaba 2023 node list (CSV) or a heteroflow inventory YAML (each node's ``cpu``,
    ``memory`` and devices of one model; ``labels`` and ``taints`` kept).

    Raises:
        InvalidInventory: unreadable, a missing column (named), or a YAML node without CPU or memory.
    """
    from heteroflow.pipelines.alibaba import detect_csv, read_nodes

    if str(spec) == "gavel":  # Gavel's setup as whole nodes of 4 devices (CPU and memory as the inventory states them)
        from heteroflow.components.placement.clusters import uniform_inventory

        inv = uniform_inventory({"k80": 36, "p100": 36, "v100": 36}, source="gavel (36 K80 + 36 P100 + 36 V100)")
        return Cluster([NodeSpec(name=n.name, cpu_milli=n.cpu_millicores or 0, memory_mib=(n.memory_bytes or 0) // _MIB, gpus=n.devices,
                                 model=n.model if n.devices else None) for n in inv.nodes], source=inv.source)
    path = Path(spec)
    if path.suffix.lower() == ".csv" or (path.is_file() and detect_csv(path) == "alibaba-nodes"):
        return Cluster(read_nodes(path), source=str(path))  # names the missing columns of a CSV that is no node list
    from heteroflow.components.placement.inventory import load_inventory

    inv = load_inventory(path)
    nodes = []
    for n in inv.nodes:
        if n.cpu_millicores is None or n.memory_bytes is None:
            lacking = " and ".join(f for f, v in (("cpu", n.cpu_millicores), ("memory", n.memory_bytes)) if v is None)
            raise InvalidInventory(f"{path}: node {n.name!r} states no {lacking}; a packing replay needs both per node "
                                   "(nodes[].cpu, nodes[].memory)")
        if len(n.devices) > 1:
            raise InvalidInventory(f"{path}: node {n.name!r} has devices of {len(n.devices)} models; a packing replay takes one model per node")
        model, count = next(iter(n.devices.items()), (None, 0))
        nodes.append(NodeSpec(name=n.name, cpu_milli=n.cpu_millicores, memory_mib=n.memory_bytes // _MIB, gpus=count, model=model,
                              labels=dict(n.labels), taints=tuple(n.taints), idle_watts=n.idle_watts, busy_watts=n.busy_watts))
    return Cluster(nodes, source=str(path))


@dataclasses.dataclass(kw_only=True)
class PackingReplay:
    """Per policy, the fills of every seed.

    Attributes:
        results: policy name -> one :class:`FillResult` per seed.
        default: the policy the workload gets by default (``fgd`` for shared GPUs).
    """

    results: dict[str, list[FillResult]]
    default: str

    def median_unallocated(self, policy: str) -> float:
        """Median over seeds of the share of GPUs left unallocated at full arrived demand (0..1)."""
        return float(np.median([r.final_unallocated for r in self.results[policy]]))


def replay(pods: Sequence[Request], cluster: Cluster, policies: Sequence[str] | None = None, *, seeds: Sequence[int] = (0,),
           explain: int = 0) -> PackingReplay:
    """Fill ``cluster`` with pods drawn from ``pods`` under each policy (default: the workload's default policy,
    then ``bestfit`` and ``random`` for comparison), once per seed; ``explain``: keep the first decisions' explanations.

    Raises:
        InvalidInventory: an unknown policy name (lists the valid ones).
        InvalidRequest: an empty workload or one asking for no GPU.
    """
    default = default_packing_policy(pods)
    names = list(dict.fromkeys(policies or [default, "bestfit", "random"]))
    return PackingReplay(results={n: [fill(pods, cluster, n, seed=s, explain=explain) for s in seeds] for n in names}, default=default)
