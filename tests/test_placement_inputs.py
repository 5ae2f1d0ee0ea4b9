"""Placement and inventory inputs a user can write, each a defect a review found with its own small input: the plan
step split a one-node job's devices across nodes, GPU feature discovery's A100/H100 labels read as no model, a
bound pod's non-integer extended or storage request crashed the live-cluster reader, guarantees above a kind's
capacity, for absent models or above a capability under another key were accepted, and aliases of one kind or
model overwrote each other instead of adding up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteroflow.components.errors import NoCandidateAvailable
from heteroflow.components.placement.plan import plan_step
from heteroflow.components.resources import Candidates

TWO_T4_NODES = """version: 1
nodes:
  - {name: a, devices: {t4: 4}, cpu: 16, memory: 64Gi}
  - {name: b, devices: {t4: 4}, cpu: 16, memory: 64Gi}
"""


def _plan(tmp_path: Path, candidates: list[str], inventory: str) -> dict:
    (tmp_path / "inv.yaml").write_text(inventory)
    plan_step(str(tmp_path / "p.json"), placements=json.dumps({"train": Candidates(candidates).to_json()}),
              device_inventory=str(tmp_path / "inv.yaml"))
    return json.loads((tmp_path / "p.json").read_text())["train"]


# --- a one-node job is one pod: its devices are on one node -----------------------------------------------------


def test_a_one_node_job_is_never_split_across_nodes(tmp_path: Path) -> None:
    """8 GPUs on one node (nodes=1, the default) on two nodes of 4: it was placed 'on 2 nodes' as one pod asking
    nvidia.com/gpu: 8, which no node can ever schedule."""
    with pytest.raises(NoCandidateAvailable, match=r"one pod: its 8 device\(s\) on one node, and no node has them free \(most on one node: 4\)"):
        _plan(tmp_path, ["gpu:count=8"], TWO_T4_NODES)
    assert _plan(tmp_path, ["gpu:count=8", "gpu:count=4"], TWO_T4_NODES)["nodes"] == ["a"]  # the next candidate fits one node
    # two nodes of 4 each, asked for as such (nodes=2): a worker a node
    assert sorted(_plan(tmp_path, ["gpu:count=4,nodes=2"], TWO_T4_NODES)["nodes"]) == ["a", "b"]
    # any count above one node's devices, not only twice a node
    with pytest.raises(NoCandidateAvailable, match="most on one node: 4"):
        _plan(tmp_path, ["gpu:count=6"], TWO_T4_NODES)
