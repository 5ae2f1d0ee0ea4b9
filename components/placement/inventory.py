"""Cluster inventories: one parser for every form, one value with a view per consumer.

An inventory lists a cluster's accelerator devices (per node, or per device kind), its CPU and memory, and the
queues jobs are submitted to. This module reads it once, into :class:`ClusterInventory`, and the consumers take
their views of that one value:

- the plan step (:mod:`heteroflow.components.placement.plan`): devices per kind and per model
  (:meth:`ClusterInventory.devices_per_kind`, :meth:`ClusterInventory.models_per_kind`);
- the manifests (:mod:`heteroflow.pipelines.k8s.manifests`): :attr:`ClusterInventory.devices`, queues with their
  per-resource guarantees and capabilities, node labels and taints;
- the simulator and the plan step's node placement (:mod:`heteroflow.components.placement.policies`): nodes of one model
  each, queues with every guarantee and capability form below (each kept in its own scope: a model, a device kind,
  any model, CPU, memory), throughputs (:meth:`ClusterInventory.for_placement`, a :class:`PlacementInventory`).

Forms read (YAML; JSON is YAML too). Per device kind, a count or a count per model (the plan step's
``device_inventory``; any key :meth:`DeviceKind.parse` reads)::

    gpu: {nvidia-a100-80gb: 8, nvidia-t4: 4}
    npu: 16
    cpu_cores: 256                      # optional: the CPU (cores or millicores) and memory the queues share
    memory: 2Ti

Nodes, with devices per model or in the one-model form, and the placement fields::

    version: 1
    policy: throughput                  # the placement policy (optional; heteroflow.components.placement.policies,
                                        # or a packing policy: fgd, bestfit, ...; heteroflow.components.placement.packplan)
    workload: pods.csv                  # optional: recent requests (a pod list) for fgd's workload distribution
    nodes:
      - {name: gpu-a100-0, devices: {nvidia-a100-80gb: 8}, cpu: 96, memory: 1Ti,
         labels: {zone: a}, taints: [{key: dedicated, value: ml, effect: NoSchedule}]}
      - name: v100                      # with replicas: N the nodes are v100-0 .. v100-(N-1)
        replicas: 2
        devices: {kind: gpu, model: v100, count: 4, memory: 16Gi}   # memory default: the registry's
        cost_per_hour: 9.92             # whole node, any currency (default 0)
        idle_watts: 300                 # W, node on and no device busy (default 0)
        busy_watts: 250                 # W added per busy device (default 0)
        datasets: [imagenet]            # data sets cached on the node (data locality)
    throughputs: {train: {v100: 10.0}}  # job type -> model -> steps/s

and, in both forms, queues (Volcano ``Queue`` semantics; see :mod:`heteroflow.components.placement.policies` and
:mod:`heteroflow.pipelines.k8s.manifests` for the sources)::

    cohort: heteroflow                  # the Kueue cohort (default: heteroflow)
    queues:
      - name: npu-training              # a DNS label
        kind: npu                       # optional: the device kind it serves (or team: vision)
        guarantee: {ascend-910b3: 8, cpu: 64, memory: 512Gi}   # per model, device kind, cpu, memory;
                                        # a bare number: devices of any model
        capability: {ascend-910b3: 16}  # optional: the elastic maximum (default: no limit)
        reclaimable: true               # default true
        weight: 1                       # Volcano's share weight, >= 1
        priority: 0                     # optional: the queue's priority
        namespaces: [team-vision]       # LocalQueues (default: [default])

and ``kubectl get nodes -o json`` output (a ``List`` or ``NodeList`` of ``Node`` objects): each node's
allocatable CPU, memory and accelerator extended resources (capacity where allocatable is absent), its labels and
taints; the model comes from the node's model label under any label convention (GPU feature discovery's
``nvidia.com/gpu.product``, GKE's ``cloud.google.com/gke-accelerator``, Ascend's ``node.kubernetes.io/npu.chip.name``;
:mod:`heteroflow.components.placement.k8s_nodes`), and a node whose model is not in the registry counts as
CPU-only; a node name given twice is an error.

Guarantees are checked in every scope they count in: a model (one no node has is an error), a device kind (in the
per-kind form too), devices of any model, CPU and memory; the guarantees of all queues together fit each scope's
capacity, and a queue's guarantees within each of its capability's scopes fit that capability (``t4: 4`` and
``v100: 4`` within ``capability: {gpu: 2}`` do not). Aliases of one model in a queue's amounts add up, as a node's
devices do; two keys naming one device kind at the top level (``gpu`` and ``cuda``) are an error.

Every error is an :class:`InvalidInventory` whose message starts with the source (``FILE:LINE:`` where the YAML
gives a line), names the node or queue (``nodes[i]``, ``queues[i]``, with the name once it is read) and the field,
and lists what is valid.

The parser is here; the rest of the inventory lives beside it and is re-exported, so every name keeps its import
path: the values and views (:class:`ClusterInventory`, :class:`Node`, :class:`QueueSpec`, the placement view and
the errors) in :mod:`heteroflow.components.placement.views`, YAML with line numbers and the field checks in
:mod:`heteroflow.components.placement.fields`, Kubernetes nodes in :mod:`heteroflow.components.placement.k8s_nodes`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.devices.accelerators import ACCELERATORS, DeviceKind
from heteroflow.components.devices.quantities import parse_cpu, parse_memory
from heteroflow.components.errors import InvalidResources
from heteroflow.components.placement.fields import (
    _count,
    _line_of,
    _mapping,
    _model,
    _number,
    _quantity,
    dns_label,
    load_yaml_with_lines,
    model_key,
)
from heteroflow.components.placement.k8s_nodes import kubectl_nodes, kubernetes_nodes
from heteroflow.components.placement.views import (
    ANY_DEVICES,
    DEFAULT_QUEUE,
    ClusterInventory,
    InvalidInventory,
    Node,
    PlacementInputError,
    PlacementInventory,
    PlacementNode,
    PlacementQueue,
    QueueSpec,
    _accelerator_kinds,
    _assemble,
    _kinds,
    _where,
    kind_of,
    show_amount,
    within,
)

__all__ = [
    "ANY_DEVICES",
    "ClusterInventory",
    "InvalidInventory",
    "Node",
    "PlacementInputError",
    "PlacementInventory",
    "PlacementNode",
    "PlacementQueue",
    "QueueSpec",
    "from_mapping",
    "kubectl_nodes",
    "kubernetes_nodes",
    "load_inventory",
    "load_yaml_with_lines",
    "model_key",
]

_FIELDS = ("version", "nodes", "queues", "cohort", "cpu_cores", "memory", "policy", "throughputs", "workload")
_NODE_KEYS = ("busy_watts", "cost_per_hour", "cpu", "datasets", "devices", "idle_watts", "labels", "memory", "name",
              "replicas", "taints")
_NODE_DEVICE_KEYS = ("count", "kind", "memory", "model")
_QUEUE_KEYS = ("name", "kind", "team", "guarantee", "capability", "reclaimable", "weight", "priority", "namespaces")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


# --- the parser -----------------------------------------------------------------------------------------------


def load_inventory(source: str | os.PathLike[str], *, text: str | None = None) -> ClusterInventory:
    """Read an inventory from a YAML or JSON file (any form in the module docstring, ``kubectl get nodes -o json``
    output included), or from ``text`` with ``source`` naming it in messages.

    Raises:
        InvalidInventory: the file cannot be read or is not YAML, or holds an invalid value; the message starts
            ``FILE:LINE:``, names the node or queue and the field, and what is valid.
    """
    name = os.fspath(source)
    if text is None:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidInventory(f"{name}: cannot be read ({exc.strerror or exc})") from None
        except UnicodeDecodeError as exc:
            from heteroflow.components.core.keys import not_utf8

            raise InvalidInventory(f"{name}: {not_utf8(exc)}") from None
    from heteroflow.components.core.keys import DuplicateKey

    try:
        data = load_yaml_with_lines(text, where=name)
    except DuplicateKey as exc:
        raise InvalidInventory(str(exc)) from None
    except Exception as exc:  # yaml.YAMLError carries the line in its message
        from heteroflow.components.core.keys import yaml_problem

        raise InvalidInventory(f"{name}: not valid YAML or JSON ({yaml_problem(exc)})") from None
    return from_mapping(data, source=name)


def _is_node_list(data: Mapping[str, Any]) -> bool:
    return data.get("kind") in ("List", "NodeList") and "items" in data


def from_mapping(data: Any, *, source: str = "inventory") -> ClusterInventory:
    """Build an inventory from parsed YAML/JSON (see :func:`load_inventory`; same errors)."""
    if data is None:
        raise InvalidInventory(f"{source}: the file is empty; valid: a mapping with nodes or device kinds, and queues")
    if not isinstance(data, Mapping):
        raise InvalidInventory(f"{_where(source, _line_of(data))}an inventory is a mapping (nodes or device kinds, "
                               f"and queues), not {type(data).__name__}")
    if _is_node_list(data):
        items = data["items"]
        if not isinstance(items, list):
            raise InvalidInventory(f"{source}: items is {type(items).__name__}, not a list of Node objects")
        nodes = kubectl_nodes(items, source=source)
        return _assemble(nodes, source=source)
    stated: dict[str, Any] = {}
    given_as: dict[Any, str] = {}  # the key as written -> its kind
    for key in data:
        if key in _FIELDS:
            continue
        try:
            kind = DeviceKind.parse(key, field=f"{source} key")
        except InvalidResources:
            import difflib

            close = difflib.get_close_matches(str(key), [*_FIELDS, *_kinds()], n=1)
            raise InvalidInventory(
                f"{_where(source, _line_of(data, str(key)))}unknown field {key!r}, and not a device kind"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; valid: {', '.join(_FIELDS)}, or a device kind: {', '.join(_kinds())}"
            ) from None
        if kind.value in stated:  # 'gpu' and 'cuda', or 'gpu' and 'GPU': the second replaced the first
            first = next(k for k in given_as if given_as[k] == kind.value)
            raise InvalidInventory(f"{_where(source, _line_of(data, str(key)))}{first!r} and {key!r} both name device kind "
                                   f"{kind.value!r}; valid: each kind once (its devices in one entry)")
        given_as[key] = kind.value
        stated[kind.value] = _stated_kind(data[key], key, kind.value, source=source, line=_line_of(data, str(key)))
    version = data.get("version", 1)
    if isinstance(version, bool) or version != 1:  # True == 1 in Python
        raise InvalidInventory(f"{_where(source, _line_of(data, 'version'))}version={data.get('version')!r} is unknown; valid: 1")
    raw_nodes = data.get("nodes")
    nodes: list[Node] = []
    if raw_nodes is not None:
        both = [k for k in stated if k in _accelerator_kinds()]
        if both:
            raise InvalidInventory(f"{_where(source, _line_of(data, 'nodes'))}give devices either per node (nodes) or per "
                                   f"device kind ({', '.join(both)}), not both")
        if not isinstance(raw_nodes, list):
            raise InvalidInventory(f"{_where(source, _line_of(data, 'nodes'))}nodes is {type(raw_nodes).__name__}, not a list")
        nodes = _parse_nodes(raw_nodes, source=source)
    # named by file and line, as every other field is (a bad cpu_cores said neither)
    cpu_m = (_quantity(parse_cpu, data["cpu_cores"], "cpu_cores", where=_where(source, _line_of(data, "cpu_cores")))
             if data.get("cpu_cores") is not None else None)
    mem_b = (_quantity(parse_memory, data["memory"], "memory", where=_where(source, _line_of(data, "memory")))
             if data.get("memory") is not None else None)
    try:
        cohort = dns_label(data.get("cohort", "heteroflow"), "cohort")
    except InvalidResources as exc:
        raise InvalidInventory(f"{_where(source, _line_of(data, 'cohort'))}{exc}") from None
    inv = _assemble(nodes, source=source, stated=stated, cpu_millicores=cpu_m, memory_bytes=mem_b, cohort=cohort)
    queues = _parse_queues(data.get("queues"), inv, line=_line_of(data, "queues"))
    throughputs = _parse_throughputs(data.get("throughputs"), source=source, line=_line_of(data, "throughputs"))
    policy = data.get("policy")
    if policy is not None:
        from heteroflow.components.placement.packplan import resolve_policy

        resolve_policy(str(policy), where=_where(source, _line_of(data, "policy")))
    workload = data.get("workload")
    if workload is not None:
        if not isinstance(workload, str) or not workload.strip():
            raise InvalidInventory(f"{_where(source, _line_of(data, 'workload'))}workload={workload!r}; valid: the path of a pod "
                                   "list CSV (name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec])")
        path = Path(workload.strip()).expanduser()
        if not path.is_absolute() and Path(source).is_file():
            path = Path(source).resolve().parent / path
        if not path.is_file():
            raise InvalidInventory(f"{_where(source, _line_of(data, 'workload'))}workload={data['workload']!r}: no such file "
                                   f"({path}); valid: the path of a pod list CSV, relative to the inventory's folder")
        workload = str(path)
    return dataclasses.replace(inv, queues=queues, throughputs=throughputs, policy=None if policy is None else str(policy),
                               workload=workload)


def _stated_kind(value: Any, key: str, kind: str, *, source: str, line: int) -> int | dict[str, int]:
    """One per-kind entry: a count, or (for an accelerator kind) a count per model. Its errors name the source once,
    then the field as the inventory spells it (``inv.yaml:1: gpu='two' is not a device count``; inline:
    ``device_inventory: gpu.t4=-1 ...``), as the nodes' errors do (``nodes[0].devices.t4=-1``)."""
    prefix = _where(source, line)
    field = str(key)
    try:
        if isinstance(value, Mapping) and kind in _accelerator_kinds():
            per_model: dict[str, int] = {}
            for name, n in value.items():
                accel = _model(name, f"{field} model", kind, container=field)
                per_model[accel.name] = per_model.get(accel.name, 0) + _count(n, f"{field}.{name}", noun="device count")
            return per_model
        return _count(value, field, noun="device count")
    except InvalidInventory as exc:
        raise InvalidInventory(f"{prefix}{exc}") from None


def _node_devices(value: Any, i: int, *, source: str, line: int) -> tuple[dict[str, int], int | None]:
    """A node's devices, ``{model: count, ...}`` or the one-model form ``{kind, model, count, memory}``, and the
    one-model form's device memory (bytes) when it states one."""
    field = f"nodes[{i}].devices"
    raw = _mapping(value, field, None, source=source, line=line)
    where = _where(source, _line_of(raw) or line)
    try:
        if "model" in raw or "count" in raw or "kind" in raw:
            raw = _mapping(value, field, _NODE_DEVICE_KEYS, source=source, line=line)
            count = _count(raw.get("count", 0), f"{field}.count", noun="count of devices")
            host = DeviceKind.host().value  # a node without devices: its model is the host kind's name
            if "model" not in raw:  # {kind: gpu, count: 4} read as a CPU-only node, its devices dropped
                if count == 0 or str(raw.get("kind", host)).lower() == host:
                    return {}, None
                examples = [a.name for a in ACCELERATORS.values() if not a.is_family and a.kind.value == str(raw["kind"]).lower()][:3]
                raise InvalidInventory(f"{field}.model is missing: count={count} of kind {raw['kind']!r} needs the model of "
                                       f"its devices; valid: a model name" + (f" (e.g. {', '.join(examples)})" if examples else ""))
            if str(raw["model"]).lower() == host:
                return {}, None
            accel = _model(raw.get("model"), f"{field}.model")  # checked with count 0 too: a misspelling is an error
            if count == 0:
                return {}, None
            if "kind" in raw:
                try:
                    stated = DeviceKind.parse(raw["kind"], field=f"{field}.kind")
                except InvalidResources as exc:
                    raise InvalidInventory(str(exc)) from None
                if stated is not accel.kind:
                    raise InvalidInventory(f"{field}.kind={raw['kind']!r} but {accel.name} is a {accel.kind.value} model")
            mem = _quantity(parse_memory, raw["memory"], f"{field}.memory") if "memory" in raw else None
            return {accel.name: count}, mem
        per_model: dict[str, int] = {}
        for model, c in raw.items():
            accel = _model(model, f"{field} key")
            per_model[accel.name] = per_model.get(accel.name, 0) + _count(c, f"{field}.{model}", noun="device count")
        return per_model, None
    except InvalidInventory as exc:
        raise InvalidInventory(f"{where}{exc}") from None


def _labels(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in value.items()):
        raise InvalidInventory(f"{field}={value!r}; valid: a mapping of label key -> value")
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _taints(value: Any, field: str) -> tuple[dict[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInventory(f"{field}={value!r}; valid: a list of {{key, value, effect}}")
    out = []
    for j, t in enumerate(value):
        if not isinstance(t, Mapping) or not isinstance(t.get("key"), str) or set(t) - {"key", "value", "effect", "timeAdded"}:
            raise InvalidInventory(f"{field}[{j}]={t!r}; valid: a mapping with key, value (optional) and effect")
        if t.get("effect") not in _TAINT_EFFECTS:
            raise InvalidInventory(f"{field}[{j}].effect={t.get('effect')!r}; valid: {', '.join(_TAINT_EFFECTS)}")
        out.append({k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None})
    return tuple(out)


def _parse_nodes(raw_nodes: Sequence[Any], *, source: str) -> list[Node]:
    nodes: list[Node] = []
    seen: dict[str, tuple[int, int]] = {}
    for i, raw in enumerate(raw_nodes):
        line = _line_of(raw)
        where = _where(source, line)
        n = _mapping(raw, f"nodes[{i}]", _NODE_KEYS, source=source, line=line)
        if raw is None:
            raise InvalidInventory(f"{where}nodes[{i}] is empty; valid: a mapping with at least a name")
        base = n.get("name")
        if base is None:  # the name left out (or `name:` with no value), not a name that is None
            raise InvalidInventory(f"{where}nodes[{i}] has no name; valid: name: a non-empty string, unique in the inventory")
        if not isinstance(base, str) or not base.strip():
            raise InvalidInventory(f"{where}nodes[{i}].name={base!r}; valid: a non-empty string")
        try:
            replicas = _count(n.get("replicas", 1), f"nodes[{i}].replicas", minimum=1)
            per_model, mem = _node_devices(n.get("devices"), i, source=source, line=line)
            node_cpu = _quantity(parse_cpu, n["cpu"], f"nodes[{i}].cpu") if n.get("cpu") is not None else None
            node_mem = _quantity(parse_memory, n["memory"], f"nodes[{i}].memory") if n.get("memory") is not None else None
            datasets = n.get("datasets") or []
            if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
                raise InvalidInventory(f"nodes[{i}].datasets={datasets!r}; valid: a list of data set names")
            fields = dict(
                devices=per_model, cpu_millicores=node_cpu, memory_bytes=node_mem,
                device_memory_bytes=mem if mem is not None else min(
                    (ACCELERATORS[m].device_memory_bytes or 0 for m in per_model), default=0),
                labels=_labels(n.get("labels"), f"nodes[{i}].labels"), taints=_taints(n.get("taints"), f"nodes[{i}].taints"),
                cost_per_hour=_number(n.get("cost_per_hour", 0), f"nodes[{i}].cost_per_hour"),
                idle_watts=_number(n.get("idle_watts", 0), f"nodes[{i}].idle_watts"),
                busy_watts=_number(n.get("busy_watts", 0), f"nodes[{i}].busy_watts"),
                datasets=frozenset(datasets),
            )
        except InvalidInventory as exc:
            text = str(exc)
            raise InvalidInventory(text if text.startswith(f"{source}:") else f"{where}{text}") from None
        for name in [base] if replicas == 1 else [f"{base}-{r}" for r in range(replicas)]:
            if name in seen:
                j, first_line = seen[name]
                what = f"the node on line {first_line} (nodes[{j}])" if first_line else f"nodes[{j}]"
                raise InvalidInventory(f"{where}nodes[{i}].name={name!r} duplicates {what}; node names must be unique")
            seen[name] = (i, line)
            nodes.append(Node(name=name, index=i, line=line, **fields))  # type: ignore[arg-type]
    return nodes


def _amounts(value: Any, field: str) -> dict[str, int]:
    """A guarantee/capability -> {model | kind | cpu | memory: amount}; a bare number counts accelerator devices
    of any model under :data:`ANY_DEVICES`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        return {ANY_DEVICES: _count(value, field, noun="device count")}
    out: dict[str, int] = {}
    for key, amount in value.items():
        sub = f"{field}.{key}"
        if key == "cpu":
            out["cpu"] = _quantity(parse_cpu, amount, sub)
        elif key == "memory":
            out["memory"] = _quantity(parse_memory, amount, sub)
        elif key in _kinds():
            out[key] = _count(amount, sub, noun="device count")
        else:  # aliases of one model add up, as a node's devices do ({v100: 2, nvidia-v100: 3}: 5; the last one won)
            model = _model(key, f"{field} key").name
            out[model] = out.get(model, 0) + _count(amount, sub, noun="device count")
    return out


def _show_field(field: str, key: str, amount: int) -> str:
    """``guarantee 4`` for a bare device count, ``guarantee.nvidia-t4=3`` for a keyed amount."""
    return f"{field} {amount}" if key == ANY_DEVICES else f"{field}.{key}={show_amount(key, amount)}"


def _parse_queues(raw: Any, inv: ClusterInventory, *, line: int) -> tuple[QueueSpec, ...]:
    source = inv.source
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidInventory(f"{_where(source, line)}queues is {type(raw).__name__}, not a list")
    out: list[QueueSpec] = []
    seen: dict[str, int] = {}
    # every scope a guarantee can be checked in: a kind of the per-kind form ({gpu: 4}) is its own scope too (it was
    # dropped, so a guarantee of 10 GPUs on 4 passed), and a model no node has (capacity 0) once a queue names it
    scopes = [s for s in dict.fromkeys(["cpu", "memory", *inv.devices, *_kinds(), ANY_DEVICES]) if inv.capacity(s) is not None]
    for i, item in enumerate(raw):
        qline = _line_of(item)
        where = _where(source, qline)
        q = _mapping(item, f"queues[{i}]", _QUEUE_KEYS, source=source, line=qline)
        try:
            name = dns_label(q.get("name"), f"queues[{i}].name")
            if name in seen or name == f"{inv.cohort}-shared":
                raise InvalidInventory(f"queues[{i}].name={name!r} is taken (queues[{seen.get(name)}] or the cohort's shared queue)")
            seen[name] = i
            kind = q.get("kind")
            if kind is not None:
                kind = DeviceKind.parse(kind, field=f"queues[{i}].kind").value
            team = q.get("team")
            if team is not None:
                dns_label(team, f"queues[{i}].team")
            guarantee = _amounts(q.get("guarantee"), f"queues[{i}].guarantee")
            capability = _amounts(q.get("capability"), f"queues[{i}].capability")
            for key, cap in capability.items():  # every guarantee within the capability's scope (t4 + v100 within gpu)
                inside = {k: g for k, g in guarantee.items() if _within(key, k)}
                if sum(inside.values()) > cap:
                    given = " + ".join(_show_field("guarantee", k, g) for k, g in inside.items())
                    raise InvalidInventory(f"queues[{i}] ({name}): {given} is above its {_show_field('capability', key, cap)}"
                                           + ("" if len(inside) == 1 else f" ({show_amount(key, sum(inside.values()))} in all)"))
            reclaimable = q.get("reclaimable", True)
            if not isinstance(reclaimable, bool):
                raise InvalidInventory(f"queues[{i}].reclaimable={reclaimable!r} is not a boolean; valid: true, false")
            priority = q.get("priority")
            if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
                raise InvalidInventory(f"queues[{i}].priority={priority!r} is not an integer")
            weight = q.get("weight", 1)
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise InvalidInventory(f"queues[{i}].weight={weight!r}; valid: an integer >= 1")
            namespaces = q.get("namespaces", ["default"])
            if not isinstance(namespaces, list) or not namespaces:
                raise InvalidInventory(f"queues[{i}].namespaces={namespaces!r}; valid: a non-empty list of namespace names")
            ns = tuple(dns_label(n, f"queues[{i}].namespaces[{j}]") for j, n in enumerate(namespaces))
            again = next((j for j, n in enumerate(ns) if n in ns[:j]), None)
            if again is not None:  # rendered two identical LocalQueues
                raise InvalidInventory(f"queues[{i}].namespaces[{again}]={ns[again]!r} is listed twice; valid: each namespace once")
        except InvalidResources as exc:
            raise InvalidInventory(f"{where}{exc}") from None
        out.append(QueueSpec(name=name, kind=kind, team=team, guarantee=guarantee, capability=capability,
                             reclaimable=reclaimable, weight=weight, priority=priority, namespaces=ns))
        _check_guarantees(out, inv, scopes, index=i, where=where)
    return tuple(out)


_within = within  # moved to views: placement counts usage in the same scopes


def _check_guarantees(queues: Sequence[QueueSpec], inv: ClusterInventory, scopes: Sequence[str], *, index: int, where: str) -> None:
    """The guarantees of the queues so far, summed, fit the capacity: per model, per device kind, over all
    accelerators (with any-model guarantees), CPU and memory (where the inventory states them); the narrowest
    scope first, so the message names the model. A guarantee is capacity reserved for its queue."""
    last = queues[-1]
    named = [k for k in last.guarantee if k not in scopes and k in ACCELERATORS and not ACCELERATORS[k].is_family]
    for scope in [*named, *scopes]:  # a model no node has: capacity 0
        cap = inv.capacity(scope)
        assert cap is not None  # scopes hold only known capacities
        per_queue = {q.name: sum(g for k, g in q.guarantee.items() if _within(scope, k)) for q in queues}
        total = sum(per_queue.values())
        if total <= cap:
            continue
        own = per_queue[last.name]
        if cap == 0 and scope in named:
            have = ", ".join(f"{k}: {n}" for k, n in inv.devices.items()) or "none"
            raise InvalidInventory(
                f"{where}queues[{index}] ({last.name}): guarantee {own} of {scope}, which no node has (the inventory's "
                f"devices: {have}); valid: guarantees of the models, kinds or devices the inventory has")
        of = "" if scope == ANY_DEVICES else f" of {scope}"
        unit = " devices" if scope == ANY_DEVICES else of
        head = (f"guarantee {show_amount(scope, own)}{of} is above the cluster's capacity of {show_amount(scope, cap)}"
                if own > cap else
                f"guarantees add up to {show_amount(scope, total)}{unit}, above the cluster's capacity of {show_amount(scope, cap)}")
        who = ", ".join(f"{name}: {show_amount(scope, g)}" for name, g in per_queue.items() if g)
        raise InvalidInventory(
            f"{where}queues[{index}] ({last.name}): {head}; queues guarantee {show_amount(scope, total)} of {scope} ({who}), "
            f"above the capacity {show_amount(scope, cap)}; valid: guarantees that add up to at most the capacity"
        )


def _parse_throughputs(raw: Any, *, source: str, line: int) -> dict[str, dict[str, float]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidInventory(f"{_where(source, line)}throughputs must map job -> model -> steps/s")
    out: dict[str, dict[str, float]] = {}
    for job, per_model in raw.items():
        where = _where(source, _line_of(raw, str(job)))
        if not isinstance(per_model, Mapping):
            raise InvalidInventory(f"{where}throughputs[{job!r}] must map model -> steps/s")
        row: dict[str, float] = {}
        for m, v in per_model.items():
            mwhere = _where(source, _line_of(per_model, str(m)))
            try:
                row[model_key(m, field=f"throughputs[{job!r}] model")] = _number(v, f"throughputs[{job!r}][{m!r}]")
            except InvalidInventory as exc:
                raise InvalidInventory(f"{mwhere}{exc}") from None
        out[str(job)] = row
    return out
