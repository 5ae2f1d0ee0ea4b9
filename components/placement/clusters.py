"""Clusters and throughputs to place on: Gavel's measured throughput table, inventory files, uniform clusters, the
Alibaba PAI machine list and the live Kubernetes cluster, each as placement's view of an inventory (one model per
node). Split out of :mod:`heteroflow.components.placement.policies`, which re-exports these names."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from heteroflow.components.devices.accelerators import ACCELERATORS, DeviceKind
from heteroflow.components.placement.inventory import (
    InvalidInventory,
    PlacementInputError,
    kubernetes_nodes,
)
from heteroflow.components.placement.inventory import PlacementInventory as ClusterInventory
from heteroflow.components.placement.inventory import PlacementNode as Node
from heteroflow.components.placement.inventory import model_key as _model_key

__all__ = [
    "DATA_DIR",
    "InvalidTrace",
    "ThroughputTable",
    "gavel_throughputs",
    "inventory_from_mapping",
    "kubernetes_inventory",
    "load_inventory",
    "pai_inventory",
    "uniform_inventory",
]

DATA_DIR = Path(__file__).parent / "data"
"""Data shipped with the package (each folder has its LICENSE and a README naming source and commit)."""


class InvalidTrace(PlacementInputError):
    """A job trace that cannot be replayed."""

# --- throughput table -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ThroughputTable:
    """Steps/s per (job type, scale factor) and device model.

    Attributes:
        models: device models (registry keys), the columns.
        rows: ``{(job type, scale factor): steps/s per model}``; 0.0 = cannot run (does not fit).
    """

    models: tuple[str, ...]
    rows: Mapping[tuple[str, int], tuple[float, ...]]

    def of(self, job_type: str, scale_factor: int) -> dict[str, float]:
        """Steps/s of ``job_type`` with ``scale_factor`` devices on each model.

        Raises:
            KeyError: the job type and scale factor are not in the table.
        """
        return dict(zip(self.models, self.rows[(job_type, scale_factor)], strict=True))

    @property
    def job_types(self) -> list[str]:
        return sorted({t for t, _ in self.rows})


def gavel_throughputs(path: str | Path | None = None) -> ThroughputTable:
    """Gavel's measured isolated throughputs (steps/s) of 26 job types with 1/2/4/8 workers on K80, P100, V100.

    Source: stanford-futuredata/gavel ``scheduler/simulation_throughputs.json`` (commit c4fa400, MIT), reduced to
    the isolated (``null``) entries; shipped as ``heteroflow/components/placement/data/gavel/derived_isolated_throughputs.csv``.

    Raises:
        InvalidTrace: a row that is not ``model,scale_factor,k80,p100,v100`` numbers (the message names the line).
    """
    import csv

    path = Path(path) if path is not None else DATA_DIR / "gavel" / "derived_isolated_throughputs.csv"
    rows: dict[tuple[str, int], tuple[float, ...]] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        models = tuple(_model_key(h.removesuffix("_steps_per_s"), field=f"{path}:1 column") for h in header[2:])
        for lineno, row in enumerate(reader, start=2):
            try:
                rows[(row[0], int(row[1]))] = tuple(float(v) for v in row[2:])
            except (ValueError, IndexError):
                raise InvalidTrace(f"{path}:{lineno}: {row!r} is not model,scale_factor,steps/s per model") from None
    return ThroughputTable(models=models, rows=rows)


# --- the inventory (parsed by heteroflow.components.placement.inventory) ----------------------------------------------


def load_inventory(source: str | Path, *, text: str | None = None) -> ClusterInventory:
    """Read an inventory file (or ``text``, ``source`` naming it) and return its placement view
    (:func:`heteroflow.components.placement.inventory.load_inventory`, then
    :meth:`~heteroflow.components.placement.inventory.ClusterInventory.for_placement`).

    Raises:
        InvalidInventory: the message starts ``FILE:LINE:`` and names the node or queue, the field and what is
            valid: unknown keys, unknown or family models, negative or fractional counts, duplicate node names, a
            queue guarantee above its capability or guarantees above the cluster's capacity, throughputs for
            unknown models, more than one model on a node.
    """
    from heteroflow.components.placement import inventory

    return inventory.load_inventory(source, text=text).for_placement()


def inventory_from_mapping(data: object, *, source: str = "inventory") -> ClusterInventory:
    """The placement view of an inventory from parsed YAML/JSON (see :func:`load_inventory`; same errors)."""
    from heteroflow.components.placement import inventory

    return inventory.from_mapping(data, source=source).for_placement()


# Prices per GPU-hour are those Gavel uses for its cost policies (GCP on-demand, 2020): K80 0.45, P100 1.46,
# V100 2.48 (gavel scheduler/utils.py); T4 0.35 (GCP price list, 2020).
DEVICE_DEFAULTS: Mapping[str, tuple[float, float, float]] = {
    # model: (busy watts per device, idle watts per device, price per device-hour)
    "nvidia-k80": (150.0, 25.0, 0.45),
    "nvidia-p100": (250.0, 30.0, 1.46),
    "nvidia-v100": (300.0, 40.0, 2.48),
    "nvidia-t4": (70.0, 10.0, 0.35),
}
HOST_IDLE_WATTS = 150.0
"""Idle power of a server without its accelerators, W (an assumption: typical 2-socket server at idle)."""


def uniform_inventory(per_model: Mapping[str, int], *, devices_per_node: int = 4, source: str = "inventory") -> ClusterInventory:
    """Nodes of ``devices_per_node`` devices each, ``per_model[model]`` devices per model, with
    :data:`DEVICE_DEFAULTS` power and prices (Gavel's cluster: ``{"k80": 36, "p100": 36, "v100": 36}``).

    Raises:
        InvalidInventory: unknown model, or a count that is not a multiple of ``devices_per_node``.
    """
    nodes: list[Node] = []
    for name, n in per_model.items():
        model = _model_key(name, field=f"{source} model")
        if n % devices_per_node:
            raise InvalidInventory(f"{source}: {n} {model} devices is not a multiple of {devices_per_node} per node")
        busy, idle, price = DEVICE_DEFAULTS.get(model, (250.0, 30.0, 1.0))
        for i in range(n // devices_per_node):
            nodes.append(Node(
                name=f"{model.removeprefix('nvidia-')}-{i}", kind=ACCELERATORS[model].kind.value, model=model,
                devices=devices_per_node, device_memory_bytes=ACCELERATORS[model].device_memory_bytes or 0,
                cost_per_hour=price * devices_per_node, idle_watts=HOST_IDLE_WATTS + idle * devices_per_node,
                busy_watts=busy - idle,
            ))
    return ClusterInventory(nodes=tuple(nodes), source=source)


_PAI_MODELS = {"V100": ("nvidia-v100", 16), "V100M32": ("nvidia-v100", 32), "P100": ("nvidia-p100", 16),
               "T4": ("nvidia-t4", 16), "MISC": ("nvidia-k80", 12)}
"""Alibaba PAI gpu_type -> (registry model, GiB per device). ``MISC`` is "older GPUs (K40m, K80, M60)" in the
trace's documentation; it is modelled as K80. ``V100M32`` is the 32 GB V100."""


def pai_inventory(path: str | Path | None = None, *, replicate: int = 1) -> ClusterInventory:
    """The Alibaba PAI machine list (cluster-trace-gpu-v2020 ``pai_machine_spec.csv``, CC BY 4.0, Weng et al.,
    NSDI'22) as an inventory: 1,897 machines, 6,742 GPUs. ``replicate`` copies the list (names suffixed ``/r``)
    to model a larger cluster.

    Raises:
        InvalidInventory: a row that is not ``machine,gpu_type,cap_cpu,cap_mem,cap_gpu`` (names the line), an
            unknown gpu_type, or a duplicate machine name.
    """
    import csv

    path = Path(path) if path is not None else DATA_DIR / "alibaba_pai" / "pai_machine_spec.csv"
    base: list[Node] = []
    seen: set[str] = set()
    with open(path, newline="", encoding="utf-8") as fh:
        for lineno, row in enumerate(csv.reader(fh), start=1):
            try:
                machine, gpu_type, cap_cpu, cap_mem, cap_gpu = row
                cpu, mem, ngpu = int(float(cap_cpu)), int(float(cap_mem)), int(float(cap_gpu))
            except ValueError:
                raise InvalidInventory(f"{path}:{lineno}: {row!r} is not machine,gpu_type,cap_cpu,cap_mem,cap_gpu") from None
            if machine in seen:
                raise InvalidInventory(f"{path}:{lineno}: machine {machine!r} is listed twice")
            seen.add(machine)
            if ngpu < 0:
                raise InvalidInventory(f"{path}:{lineno}: cap_gpu={ngpu} is negative")
            if gpu_type == "CPU" or ngpu == 0:
                host = DeviceKind.host().value  # a machine without GPUs: the host kind, its model named as it
                base.append(Node(name=machine, kind=host, model=host, devices=0, cpu_millicores=cpu * 1000,
                                 memory_bytes=mem * 2**30, idle_watts=HOST_IDLE_WATTS))
                continue
            if gpu_type not in _PAI_MODELS:
                raise InvalidInventory(f"{path}:{lineno}: gpu_type={gpu_type!r} is unknown; valid: CPU, {', '.join(_PAI_MODELS)}")
            model, gib = _PAI_MODELS[gpu_type]
            busy, idle, price = DEVICE_DEFAULTS[model]
            base.append(Node(name=machine, kind=ACCELERATORS[model].kind.value, model=model, devices=ngpu, device_memory_bytes=gib * 2**30,
                             cpu_millicores=cpu * 1000, memory_bytes=mem * 2**30, cost_per_hour=price * ngpu,
                             idle_watts=HOST_IDLE_WATTS + idle * ngpu, busy_watts=busy - idle))
    nodes = base if replicate == 1 else [dataclasses.replace(n, name=f"{n.name}/{r}") for r in range(replicate) for n in base]
    return ClusterInventory(nodes=tuple(nodes), source=str(path))


def kubernetes_inventory(*, kubeconfig: str | None = None) -> ClusterInventory:  # pragma: no cover - needs a cluster
    """The live cluster's free capacity through the Kubernetes API (allocatable minus requested), with the
    kubeconfig at ``kubeconfig`` (default: ``$HETEROFLOW_KUBECONFIG``, else the client's default lookup)."""
    from kubernetes import client, config

    path = kubeconfig or os.environ.get("HETEROFLOW_KUBECONFIG")
    config.load_kube_config(config_file=path) if path else config.load_kube_config()
    api = client.CoreV1Api()
    nodes = api.list_node().items
    pods = api.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    return ClusterInventory(nodes=tuple(kubernetes_nodes(nodes, pods)), source=f"kubernetes ({path or 'default kubeconfig'})")
