"""The Alibaba GPU cluster trace of 2023 (``cluster-trace-gpu-v2023``, Weng et al., USENIX ATC'23): its node list
and pod lists, read into resource vectors (:mod:`heteroflow.components.placement.vectors`).

Formats (CSV with a header; github.com/alibaba/clusterdata ``cluster-trace-gpu-v2023/README.md``):

- node list (``openb_node_list_*.csv``): ``sn`` (or ``name``), ``cpu_milli``, ``memory_mib``, ``gpu``, ``model``
  (any model name: G2, G3, T4, P100, V100M16, V100M32, A10, ...; empty for a CPU-only node).
- pod list (``openb_pod_list_*.csv``): ``name``, ``cpu_milli``, ``memory_mib``, ``num_gpu``, ``gpu_milli``
  (thousandths of each device), optionally ``gpu_spec`` (allowed models, ``V100M16|V100M32``), ``qos``,
  ``pod_phase``, ``creation_time``, ``deletion_time``, ``scheduled_time`` (s).

The data is for research use (no licence upstream): read it where it lies (``../shared/data/alibaba_gpu_v2023``),
never copy it into the project. Missing columns are named in the error. The readers live in
:mod:`heteroflow.components.placement.podlists` (the plan step reads workload files too) and are re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from heteroflow.components.placement.podlists import NODE_COLUMNS, POD_COLUMNS, detect_csv, read_nodes, read_pods

__all__ = ["DATA_ENV", "NODE_COLUMNS", "POD_COLUMNS", "data_dir", "detect_csv", "read_nodes", "read_pods"]

DATA_ENV = "HETEROFLOW_ALIBABA_2023"
"""Environment variable naming the folder of the Alibaba 2023 node and pod lists (overrides the search)."""


def data_dir(start: str | Path | None = None) -> Path | None:
    """The folder of the Alibaba 2023 lists: ``$HETEROFLOW_ALIBABA_2023``, else the first
    ``shared/data/alibaba_gpu_v2023`` beside the project root or one of its parents (``../shared`` of a checkout;
    a worktree one level deeper finds ``../../shared``); None when there is none (a user's clone)."""
    import os

    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env) if Path(env).is_dir() else None
    root = Path(start) if start is not None else Path(__file__).resolve().parents[1]
    for parent in [root, *root.parents][:3]:
        cand = parent.parent / "shared" / "data" / "alibaba_gpu_v2023"
        if cand.is_dir():
            return cand
    return None
