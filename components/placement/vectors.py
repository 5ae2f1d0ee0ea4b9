"""Resources as a scheduler sees them: requests and nodes as resource vectors, and the cluster's free capacity.

A *request* (:class:`Request`) is what one pod asks for: CPU (millicores), memory (MiB), a number of devices and
the share of each device it takes (``gpu_milli``, thousandths of one device, as GPU-sharing schedulers and the
Alibaba 2023 traces express it: ``num_gpu=1, gpu_milli=460`` is 46 % of one GPU; ``num_gpu=2, gpu_milli=1000``
is two whole GPUs), the device models it accepts (``V100M16|V100M32``; none: any), whether its devices must sit
on one node (``single_node``, a pod) or may be spread over nodes (one one-device worker per device, placed
together or not at all), its queue, node selector and tolerations. A CPU-only pod is an ordinary request with
``num_gpu=0``.

A *node* (:class:`NodeSpec`) has the same vector as capacity (CPU, memory, devices of one model, any name from the
inventory: ``G2``, ``T4``, ``V100M32``, ...), labels and taints. :class:`Cluster` holds the free capacity of every
node as numpy arrays, per device as free thousandths (``gpu_free``, shape (nodes, most devices on a node)), and
the queues' capabilities (Volcano's ``capability``: a hard upper bound on what a queue's pods use together, per
resource; https://volcano.sh/en/docs/queue/). Feasibility is vectorised over nodes; the packing policies of
:mod:`heteroflow.components.placement.packing` score the feasible nodes.

Errors: :class:`InvalidRequest` names the request and field and says what is valid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from heteroflow.components.placement.views import InvalidInventory, PlacementInputError

__all__ = ["MILLI", "Cluster", "InvalidRequest", "NodeSpec", "QueueLimit", "Request", "nodes_from_records", "parse_models"]

MILLI = 1000
"""Thousandths of one device: a whole device is 1000 (the Alibaba traces' ``gpu_milli`` unit)."""

_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_RESOURCES = ("cpu_milli", "memory_mib", "gpu_milli")


class InvalidRequest(PlacementInputError):
    """A request (or queue limit) that cannot be placed as written; the message names it and the field."""


def parse_models(value: str | Iterable[str] | None, *, field: str = "models") -> tuple[str, ...]:
    """Allowed device models from ``"V100M16|V100M32"`` (the traces' ``gpu_spec``) or a sequence; duplicates and
    empty parts dropped, order kept. ``None`` or ``""``: any model (empty tuple).

    Raises:
        InvalidRequest: not a string or a sequence of strings.
    """
    if value is None:
        return ()
    if isinstance(value, str):
        parts = value.split("|")
    elif isinstance(value, Iterable):
        parts = list(value)
        if not all(isinstance(p, str) for p in parts):
            raise InvalidRequest(f"{field}={value!r}; valid: model names separated by '|' (e.g. 'V100M16|V100M32') or a list of names")
    else:
        raise InvalidRequest(f"{field}={value!r}; valid: model names separated by '|' (e.g. 'V100M16|V100M32') or a list of names")
    return tuple(dict.fromkeys(p.strip() for p in parts if p.strip()))


def _int(value: Any, field: str, *, minimum: int = 0, maximum: int | None = None, cls: type[Exception] = InvalidRequest) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or value != value:
        raise cls(f"{field}={value!r}; valid: an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else ""))
    if float(value) != int(value) or value < minimum or (maximum is not None and value > maximum):
        raise cls(f"{field}={value!r}; valid: an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else ""))
    return int(value)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """What one pod (or one spread job) asks for.

    Attributes:
        name: for messages.
        cpu_milli: CPU, millicores (>= 0).
        memory_mib: memory, MiB (>= 0).
        num_gpu: devices (>= 0; 0: a CPU-only pod).
        gpu_milli: thousandths of each device it takes, 1..1000 (1000: whole devices). Defaults to 1000 when
            ``num_gpu`` > 0, 0 otherwise. Below 1000 only with ``num_gpu=1`` (a shared device).
        models: accepted device models (any name of the inventory); empty: any model.
        single_node: all devices on one node (a pod); False: spread, one one-device worker per device (CPU and
            memory divided evenly), placed as a gang.
        queue: the queue it is submitted to.
        node_selector: labels a node must carry (Kubernetes ``nodeSelector``).
        tolerations: taint keys it tolerates (``key`` or ``key=value``); NoSchedule/NoExecute taints not tolerated
            exclude a node.
        device_memory_mib: memory each device must have, MiB (0: any); a node stating less
            (:attr:`NodeSpec.device_memory_mib`) is excluded.

    Raises:
        InvalidRequest: a field out of range, naming the request and field.
    """

    name: str = "request"
    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int | None = None
    models: tuple[str, ...] = ()
    single_node: bool = True
    queue: str = "default"
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[str, ...] = ()
    device_memory_mib: int = 0

    def __post_init__(self) -> None:
        w = f"request {self.name!r}: "
        set_ = object.__setattr__
        set_(self, "cpu_milli", _int(self.cpu_milli, f"{w}cpu_milli"))
        set_(self, "device_memory_mib", _int(self.device_memory_mib, f"{w}device_memory_mib"))
        set_(self, "memory_mib", _int(self.memory_mib, f"{w}memory_mib"))
        set_(self, "num_gpu", _int(self.num_gpu, f"{w}num_gpu"))
        if self.gpu_milli is None:
            set_(self, "gpu_milli", MILLI if self.num_gpu else 0)
        gm = _int(self.gpu_milli, f"{w}gpu_milli", maximum=MILLI)
        if self.num_gpu == 0 and gm:
            raise InvalidRequest(f"{w}gpu_milli={gm} with num_gpu=0; valid: gpu_milli=0 for a CPU-only pod, or num_gpu >= 1")
        if self.num_gpu and gm == 0:
            raise InvalidRequest(f"{w}gpu_milli=0 with num_gpu={self.num_gpu}; valid: 1..1000 thousandths of each device")
        if self.num_gpu > 1 and gm < MILLI:
            raise InvalidRequest(f"{w}gpu_milli={gm} with num_gpu={self.num_gpu}; valid: a share below 1000 only with "
                                 "num_gpu=1 (one shared device); several devices are whole (gpu_milli=1000)")
        set_(self, "gpu_milli", gm)
        set_(self, "models", parse_models(self.models, field=f"{w}models"))
        if not isinstance(self.single_node, bool):
            raise InvalidRequest(f"{w}single_node={self.single_node!r}; valid: true (one node) or false (spread)")
        if not isinstance(self.queue, str) or not self.queue:
            raise InvalidRequest(f"{w}queue={self.queue!r}; valid: a queue name")
        if not isinstance(self.node_selector, Mapping):
            raise InvalidRequest(f"{w}node_selector={self.node_selector!r}; valid: a mapping of label -> value")
        set_(self, "node_selector", {str(k): str(v) for k, v in self.node_selector.items()})
        set_(self, "tolerations", tuple(str(t) for t in self.tolerations))

    @property
    def gpu_total_milli(self) -> int:
        """Device thousandths in all: ``num_gpu * gpu_milli``."""
        return self.num_gpu * int(self.gpu_milli or 0)

    @property
    def shared(self) -> bool:
        """Asks for part of one device."""
        return self.num_gpu == 1 and int(self.gpu_milli or 0) < MILLI

    @property
    def key(self) -> tuple:
        """What placement depends on (the name aside): equal keys place alike."""
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.models, self.single_node, self.queue,
                tuple(sorted(self.node_selector.items())), self.tolerations, self.device_memory_mib)

    def workers(self) -> list[Request]:
        """The pods it is placed as: itself, or for a spread request one one-device worker per device."""
        if self.single_node or self.num_gpu <= 1:
            return [self]
        n = self.num_gpu
        return [dataclasses.replace(self, name=f"{self.name}-{i}", cpu_milli=self.cpu_milli // n, memory_mib=self.memory_mib // n,
                                    num_gpu=1, gpu_milli=self.gpu_milli, single_node=True) for i in range(n)]

    def describe(self) -> str:
        """``cpu 8000m, mem 30517 MiB, 1 x 460 milli GPU (V100M16|V100M32)``."""
        gpu = "no GPU" if not self.num_gpu else f"{self.num_gpu} x {self.gpu_milli} milli GPU"
        models = f" ({'|'.join(self.models)})" if self.models else ""
        return f"cpu {self.cpu_milli}m, mem {self.memory_mib} MiB, {gpu}{models}" + ("" if self.single_node else ", spread")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One node's capacity vector.

    Attributes:
        name: unique in the cluster.
        cpu_milli: allocatable CPU, millicores.
        memory_mib: allocatable memory, MiB.
        gpus: devices (0: a CPU-only node).
        model: the devices' model (any name: ``G2``, ``V100M32``); None for a CPU-only node.
        labels: Kubernetes node labels.
        taints: Kubernetes taints, each ``{key, value?, effect}``.
        idle_watts, busy_watts: power when on and idle, and added per busy device, W (power-aware packing).
        device_memory_mib: memory of each of its devices, MiB (0: not stated; no request is held by it).

    Raises:
        InvalidInventory: a field out of range, naming the node and field.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    model: str | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    idle_watts: float = 0.0
    busy_watts: float = 0.0
    device_memory_mib: int = 0

    def __post_init__(self) -> None:
        w = f"node {self.name!r}: "
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInventory(f"node name={self.name!r}; valid: a non-empty string")
        for f in ("cpu_milli", "memory_mib", "gpus", "device_memory_mib"):
            object.__setattr__(self, f, _int(getattr(self, f), f"{w}{f}", cls=InvalidInventory))
        if self.gpus and not (isinstance(self.model, str) and self.model):
            raise InvalidInventory(f"{w}model={self.model!r} with gpus={self.gpus}; valid: the devices' model name (e.g. V100M16)")
        if not self.gpus:
            object.__setattr__(self, "model", None)
        for j, t in enumerate(self.taints):
            if not isinstance(t, Mapping) or "key" not in t or t.get("effect") not in _TAINT_EFFECTS:
                raise InvalidInventory(f"{w}taints[{j}]={t!r}; valid: {{key, value?, effect}} with effect one of {', '.join(_TAINT_EFFECTS)}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueLimit:
    """A queue's capability: the most its pods may use together, per resource (missing: no limit).

    Attributes:
        name: the queue.
        capability: ``cpu_milli``, ``memory_mib`` and/or ``gpu_milli`` (device thousandths) -> amount.

    Raises:
        InvalidRequest: an unknown resource or a negative amount.
    """

    name: str
    capability: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for k, v in self.capability.items():
            if k not in _RESOURCES:
                raise InvalidRequest(f"queue {self.name!r}: capability.{k} is unknown; valid: {', '.join(_RESOURCES)}")
            _int(v, f"queue {self.name!r}: capability.{k}")


def _tolerated(taint: Mapping[str, str], tolerations: Sequence[str]) -> bool:
    if taint.get("effect") == "PreferNoSchedule":
        return True
    key, value = taint.get("key", ""), taint.get("value")
    return any(t == key or (value is not None and t == f"{key}={value}") for t in tolerations)


class Cluster:
    """The nodes' free capacity (numpy arrays) and the queues' usage; placements change it in place.

    Attributes (arrays over nodes, in the order given):
        nodes: the :class:`NodeSpec` values.
        models: device models present (first-seen order); ``model_idx`` (int, -1: CPU-only node) indexes it.
        cpu_cap, cpu_free: millicores; mem_cap, mem_free: MiB; gpu_count: devices.
        gpu_free: shape (nodes, most devices on a node), free thousandths per device (0 past ``gpu_count``).
        version: per node, bumped on every change; epoch: bumped on :meth:`reset` (a policy may cache per-node
            figures keyed by both).
        queues: :class:`QueueLimit` by name; ``queue_used``: per queue, ``{cpu_milli, memory_mib, gpu_milli}``.

    Raises:
        InvalidInventory: no nodes, or duplicate node names.
    """

    def __init__(self, nodes: Sequence[NodeSpec], queues: Sequence[QueueLimit] = (), *, source: str = "cluster") -> None:
        if not nodes:
            raise InvalidInventory(f"{source}: no nodes; valid: at least one node")
        names: dict[str, int] = {}
        for i, n in enumerate(nodes):
            if n.name in names:
                raise InvalidInventory(f"{source}: node name {n.name!r} appears twice (nodes {names[n.name]} and {i}); names must be unique")
            names[n.name] = i
        self.source = source
        self.nodes = tuple(nodes)
        self.index = names
        self.models: tuple[str, ...] = tuple(dict.fromkeys(n.model for n in nodes if n.model))
        mi = {m: i for i, m in enumerate(self.models)}
        self.model_idx = np.array([mi[n.model] if n.model else -1 for n in nodes], dtype=np.int64)
        self.cpu_cap = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_cap = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.gpu_count = np.array([n.gpus for n in nodes], dtype=np.int64)
        g = max(int(self.gpu_count.max()), 1)
        self.gpu_cap = np.where(np.arange(g)[None, :] < self.gpu_count[:, None], MILLI, 0).astype(np.int64)
        self.idle_watts = np.array([n.idle_watts for n in nodes], dtype=np.float64)
        self.busy_watts = np.array([n.busy_watts for n in nodes], dtype=np.float64)
        self.queues = {q.name: q for q in queues}
        self._access: dict[tuple, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        """Every node empty, every queue unused."""
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_free = self.gpu_cap.copy()
        self.version = np.zeros(len(self.nodes), dtype=np.int64)
        self.epoch = getattr(self, "epoch", -1) + 1
        self.queue_used: dict[str, dict[str, int]] = {}

    # --- totals ---------------------------------------------------------------------------------------------

    @property
    def gpu_capacity_milli(self) -> int:
        """All devices, thousandths."""
        return int(self.gpu_cap.sum())

    @property
    def gpu_allocated_milli(self) -> int:
        """Allocated device thousandths."""
        return int(self.gpu_cap.sum() - self.gpu_free.sum())

    def unallocated_share(self) -> float:
        """Share of the cluster's device capacity not allocated (fragmented or idle), 0..1."""
        cap = self.gpu_capacity_milli
        return 1.0 - self.gpu_allocated_milli / cap if cap else 0.0

    # --- feasibility ----------------------------------------------------------------------------------------

    def queue_check(self, request: Request) -> str | None:
        """Why the request's queue cannot take it (its capability would be exceeded), or None.

        Raises:
            InvalidRequest: a queue the cluster does not list (``default`` always exists, unlimited).
        """
        q = self.queues.get(request.queue)
        if q is None:
            if request.queue == "default":
                return None
            raise InvalidRequest(f"request {request.name!r}: queue={request.queue!r} is not in {self.source}; "
                                 f"valid: default, {', '.join(sorted(self.queues))}")
        used = self.queue_used.get(q.name, {})
        ask = {"cpu_milli": request.cpu_milli, "memory_mib": request.memory_mib, "gpu_milli": request.gpu_total_milli}
        for k, cap in q.capability.items():
            if used.get(k, 0) + ask[k] > cap:
                return f"queue {q.name!r} capability {k}={cap} holds it: {used.get(k, 0)} used + {ask[k]} requested"
        return None

    def model_mask(self, request: Request) -> np.ndarray:
        """Nodes of a model the request accepts (bool, shape (nodes,)); every node for a CPU-only request."""
        if not request.num_gpu or not request.models:
            return np.ones(len(self.nodes), dtype=bool)
        return np.isin(self.model_idx, [self.models.index(m) for m in request.models if m in self.models])

    def memory_mask(self, request: Request) -> np.ndarray:
        """Nodes whose devices have the memory the request asks of each (bool, shape (nodes,)): a node stating less
        is excluded, one stating none is not."""
        need = request.device_memory_mib if request.num_gpu else 0
        if not need:
            return np.ones(len(self.nodes), dtype=bool)
        return np.array([not (0 < n.device_memory_mib < need) for n in self.nodes], dtype=bool)

    def access(self, request: Request) -> np.ndarray:
        """Nodes the request may use at all (bool, shape (nodes,)): its models, device memory, node selector and
        tolerations."""
        memory = request.device_memory_mib if request.num_gpu else 0
        key = (request.models if request.num_gpu else (), tuple(sorted(request.node_selector.items())), request.tolerations, memory)
        got = self._access.get(key)
        if got is None:
            ok = self.model_mask(request) & self.memory_mask(request)
            for i, n in enumerate(self.nodes):
                if ok[i] and (any(n.labels.get(k) != v for k, v in request.node_selector.items())
                              or not all(_tolerated(t, request.tolerations) for t in n.taints)):
                    ok[i] = False
            got = self._access[key] = ok
        return got

    def gpu_fits(self, request: Request) -> np.ndarray:
        """Nodes with ``num_gpu`` devices of ``gpu_milli`` free each (bool, shape (nodes,))."""
        if not request.num_gpu:
            return np.ones(len(self.nodes), dtype=bool)
        return (self.gpu_free >= request.gpu_milli).sum(axis=1) >= request.num_gpu

    def feasible(self, request: Request) -> np.ndarray:
        """Nodes that can take the (single-node) request now (bool, shape (nodes,)); all False when its queue's
        capability would be exceeded."""
        if self.queue_check(request) is not None:
            return np.zeros(len(self.nodes), dtype=bool)
        return (self.access(request) & (self.cpu_free >= request.cpu_milli) & (self.mem_free >= request.memory_mib)
                & self.gpu_fits(request))

    def why_not(self, request: Request) -> str:
        """Which limit holds a request no node can take: its queue's capability, no node with its model (or
        selector, taints, device count), fragmentation (enough free in total, on no one node) or insufficient
        resources."""
        q = self.queue_check(request)
        if q is not None:
            return q
        models = "|".join(request.models) or "any model"
        by_model = self.model_mask(request)
        if not by_model.any():
            return f"no node with model {models} (the inventory has {', '.join(self.models) or 'no devices'})"
        if request.num_gpu and request.device_memory_mib and not (by_model & self.memory_mask(request)).any():
            most = max(self.nodes[i].device_memory_mib for i in np.flatnonzero(by_model))
            return f"no node of {models} has {request.device_memory_mib} MiB of device memory (most: {most} MiB)"
        if request.num_gpu:
            by_model = by_model & self.memory_mask(request) & (self.gpu_count >= (request.num_gpu if request.single_node else 1))
            if not by_model.any():
                most = int(self.gpu_count[self.model_mask(request)].max())
                return f"no node of {models} has {request.num_gpu} devices (most: {most})"
        acc = by_model & self.access(request)
        if not acc.any():
            shut = [self.nodes[i] for i in np.flatnonzero(by_model)[:3]]
            why = "; ".join(f"{n.name}: " + (", ".join(f"taint {t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}"
                                                     for t in n.taints) or "labels " + str(dict(n.labels))) for n in shut)
            return (f"no node of {models} that fits matches its node selector {dict(request.node_selector)} and tolerates "
                    f"the node's taints (tolerations {list(request.tolerations)}; {why})")
        need = {"cpu": request.cpu_milli, "memory": request.memory_mib, "GPU": request.gpu_total_milli}
        free = {"cpu": int(self.cpu_free[acc].sum()), "memory": int(self.mem_free[acc].sum()),
                "GPU": int(self.gpu_free[acc].sum())}
        short = [k for k in need if need[k] > free[k]]
        if short:
            return (f"insufficient resources: {', '.join(f'{k} {need[k]} requested, {free[k]} free' for k in short)} "
                    f"on the nodes it may use ({models})")
        return (f"fragmentation: {free['GPU']} GPU milli, {free['cpu']} cpu milli free on the nodes of {models}, but no one "
                f"node has {request.num_gpu} x {request.gpu_milli} milli GPU with {request.cpu_milli}m cpu and "
                f"{request.memory_mib} MiB free together")

    # --- changes --------------------------------------------------------------------------------------------

    def allocate(self, node: int, request: Request, devices: Sequence[int]) -> None:
        """Take ``request`` on ``node`` from ``devices`` (device indices on the node, ``num_gpu`` of them).

        Raises:
            InvalidRequest: the node cannot take it (a caller's bug or a stale decision).
        """
        devices = list(devices)
        if (len(devices) != request.num_gpu or self.cpu_free[node] < request.cpu_milli or self.mem_free[node] < request.memory_mib
                or any(self.gpu_free[node, d] < request.gpu_milli for d in devices) or len(set(devices)) != len(devices)):
            raise InvalidRequest(f"request {request.name!r} ({request.describe()}) does not fit node {self.nodes[node].name!r} on devices {devices}")
        self.cpu_free[node] -= request.cpu_milli
        self.mem_free[node] -= request.memory_mib
        for d in devices:
            self.gpu_free[node, d] -= request.gpu_milli
        self.version[node] += 1
        u = self.queue_used.setdefault(request.queue, {"cpu_milli": 0, "memory_mib": 0, "gpu_milli": 0})
        u["cpu_milli"] += request.cpu_milli
        u["memory_mib"] += request.memory_mib
        u["gpu_milli"] += request.gpu_total_milli

    def release(self, node: int, request: Request, devices: Sequence[int]) -> None:
        """Give back what :meth:`allocate` took."""
        self.cpu_free[node] += request.cpu_milli
        self.mem_free[node] += request.memory_mib
        for d in devices:
            self.gpu_free[node, d] += request.gpu_milli
        self.version[node] += 1
        u = self.queue_used[request.queue]
        u["cpu_milli"] -= request.cpu_milli
        u["memory_mib"] -= request.memory_mib
        u["gpu_milli"] -= request.gpu_total_milli

    def best_fit_devices(self, node: int, request: Request) -> tuple[int, ...]:
        """The ``num_gpu`` devices with the least free share that still fits (packs shared devices; whole-device
        requests take free devices in index order): the GPU-sharing device plugin's default choice."""
        if not request.num_gpu:
            return ()
        free = self.gpu_free[node]
        cand = [d for d in np.argsort(free, kind="stable") if free[d] >= request.gpu_milli]
        return tuple(int(d) for d in cand[: request.num_gpu])


def nodes_from_records(rows: Iterable[Mapping[str, Any]], *, source: str = "nodes") -> list[NodeSpec]:
    """:class:`NodeSpec` values from mappings with ``name``, ``cpu_milli``, ``memory_mib``, ``gpus``, ``model``
    (and optionally ``labels``, ``taints``, ``idle_watts``, ``busy_watts``).

    Raises:
        InvalidInventory: a missing field, naming the row and field.
    """
    out = []
    for i, r in enumerate(rows):
        missing = [k for k in ("name", "cpu_milli", "memory_mib") if k not in r]
        if missing:
            raise InvalidInventory(f"{source}: node {i}: missing field(s) {', '.join(missing)}; valid fields: name, cpu_milli, "
                                   "memory_mib, gpus, model, labels, taints, idle_watts, busy_watts")
        out.append(NodeSpec(name=str(r["name"]), cpu_milli=r["cpu_milli"], memory_mib=r["memory_mib"], gpus=r.get("gpus", 0),
                            model=r.get("model") or None, labels=dict(r.get("labels") or {}), taints=tuple(r.get("taints") or ()),
                            idle_watts=float(r.get("idle_watts", 0.0)), busy_watts=float(r.get("busy_watts", 0.0))))
    return out
