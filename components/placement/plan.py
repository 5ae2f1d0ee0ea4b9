"""Plan (placement): pick the first candidate whose device exists here, and record why others were passed over;
with a node inventory, the policy module (:mod:`heteroflow.components.placement.policies`) chooses and explains.

Inventory: stated by the user (``device_inventory``, JSON; on a cluster the plan pod has no accelerator of its
own to probe), else the local one, as PyTorch sees it: ``cuda`` devices (``torch.cuda.device_count()``), Ascend
``npu`` devices when ``torch_npu`` imports (``torch.npu.device_count()``), and the CPU (always). A candidate is
usable when its device kind is present with at least ``count`` devices. A node inventory (``device_inventory`` names
a YAML file or holds one with ``nodes``) is placed by :func:`plan_on_nodes` with the inventory's policy
(``listed`` by default; ``throughput`` scores by the inventory's throughput table; a packing policy such as ``fgd``,
the default when a candidate or the inventory's workload asks for part of one GPU, places request vectors:
:mod:`heteroflow.components.placement.packplan`), and each placement carries a one-line explanation in the step's
facts (and so in run.json).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.errors import InvalidParameter, InvalidResources, NoCandidateAvailable
from heteroflow.components.resources import Candidates, DeviceKind, Resources, RetryPolicy
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, Step, step

__all__ = ["Inventory", "PlanResult", "check_node_inventory", "check_plan_params", "cluster_inventory", "plan_on_nodes", "Placement", "current_inventory", "local_inventory", "plan", "plan_step"]

SIMULATED_DEVICE_COUNT = 8
"""Devices of a simulated kind (``HETEROFLOW_SIMULATE_DEVICES``) in the inventory: one typical node's worth."""


_INVENTORY_FORMS = ('e.g. {"gpu": 4, "npu": 0}, or per model {"gpu": {"a100-80gb": 2, "t4": 4}, "npu": {"910b3": 8}}, '
                    "or the path of a node inventory file (.yaml, .yml or .json), or kubernetes")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Inventory:
    """Devices available to this process (or, stated, to the job on a cluster).

    Attributes:
        devices: device count per kind (``cpu`` is 1 when present).
        models: per kind, device count per accelerator model (registry key, see
            :mod:`heteroflow.components.devices.accelerators`) when the models are known; a kind missing here is
            known only by its count.
        notes: per kind, why it is absent (e.g. ``torch_npu is not installed``).
        simulated: kinds present only by simulation (``HETEROFLOW_SIMULATE_DEVICES``).
    """

    devices: Mapping[DeviceKind, int]
    models: Mapping[DeviceKind, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    notes: Mapping[DeviceKind, str] = dataclasses.field(default_factory=dict)
    simulated: tuple[DeviceKind, ...] = ()

    @classmethod
    def from_json(cls, text: str, *, source: str = "device_inventory") -> Inventory:
        """An inventory stated by the user: per device kind, a count, or a count per accelerator model
        (``{"gpu": {"a100-80gb": 2, "t4": 4}}``; models as :func:`~heteroflow.components.devices.accelerators.find_accelerator`
        reads them, families excluded). The CPU is always present. Used on a cluster, where the plan pod itself
        has no accelerator to probe.

        Raises:
            InvalidParameter: not a JSON object of device kind -> count >= 0 or model -> count >= 0, an unknown
                model, a family where a model is needed, or a model of another kind.
        """
        from heteroflow.components.core.keys import DuplicateKey, unique_object

        stripped = text.strip()
        if stripped.endswith((".yaml", ".yml", ".json")) and "\n" not in stripped and not stripped.startswith("{"):
            from heteroflow.components.placement.inventory import load_inventory
            from heteroflow.components.placement.views import InvalidInventory

            try:  # a file of the count form: as the same text given inline
                parsed = load_inventory(stripped)
            except InvalidInventory as exc:
                raise InvalidParameter(str(exc)) from None
            devices = parsed.devices_per_kind()
            notes = {k: f"{stripped} lists {n} {k.value} device(s)" for k, n in devices.items() if n == 0}
            return cls(devices=devices, models=parsed.models_per_kind(), notes=notes)
        try:
            data = json.loads(text, object_pairs_hook=unique_object(source))
        except DuplicateKey:
            raise
        except ValueError as exc:
            raise InvalidParameter(f"{source}={text!r} is not JSON ({exc}); valid: {_INVENTORY_FORMS}") from None
        if not isinstance(data, dict):
            raise InvalidParameter(f"{source}={text!r} is not a JSON object; valid: {_INVENTORY_FORMS}")
        return cls.from_mapping(data, source=source)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "device_inventory") -> Inventory:
        """The plan step's view of an inventory given as parsed YAML/JSON (any form
        :mod:`heteroflow.components.placement.inventory` reads): devices per kind and per model, the CPU always present.

        Raises:
            InvalidParameter: the inventory is invalid (the message names the source, the field and what is valid).
        """
        from heteroflow.components.placement.inventory import from_mapping
        from heteroflow.components.placement.views import InvalidInventory

        try:
            parsed = from_mapping(data, source=source)
        except InvalidInventory as exc:
            raise InvalidParameter(str(exc)) from None
        devices = parsed.devices_per_kind()
        notes = {k: f"{source} lists {n} {k.value} device(s)" for k, n in devices.items() if n == 0}
        return cls(devices=devices, models=parsed.models_per_kind(), notes=notes)

    def describe(self, kind: DeviceKind) -> str:
        """What is here of ``kind``, e.g. ``4 gpu device(s): 2 x nvidia-a100-80gb, 2 x nvidia-t4``."""
        n = self.devices.get(kind, 0)
        per_model = self.models.get(kind)
        text = f"{n} {kind.value} device(s)"
        if per_model:
            text += ": " + ", ".join(f"{c} x {m}" for m, c in sorted(per_model.items()))
        return text


def local_inventory() -> Inventory:
    """Probe the devices PyTorch can use in this process, kind by registered kind (:meth:`DeviceKind.probe`).

    PyTorch is imported only when a device file of an accelerator driver exists (``/dev/nvidiactl`` for
    NVIDIA, ``/dev/kfd`` for AMD ROCm, ``/dev/davinci_manager`` for Ascend: each kind names its own): without
    one no device of that kind can be opened, and the probe answers at once without the ~1.5 s import.
    """
    devices: dict[DeviceKind, int] = {}
    notes: dict[DeviceKind, str] = {}
    models: dict[DeviceKind, dict[str, int]] = {}
    for kind in DeviceKind:
        found = kind.probe()
        devices[kind] = found.count
        if found.note:
            notes[kind] = found.note
        if found.names is not None:
            per_model = _registry_models(found.names)
            if per_model is not None:
                models[kind] = per_model
    return Inventory(devices=devices, models=models, notes=notes)


def _registry_models(names: tuple[str, ...]) -> dict[str, int] | None:
    """Count per registry model of devices named as torch names them (``torch.cuda.get_device_name``, e.g.
    ``NVIDIA H200``), or None when one of them is not in the registry (then only the count is known)."""
    from heteroflow.components.devices.accelerators import find_accelerator

    out: dict[str, int] = {}
    for name in names:
        try:
            accel = find_accelerator(name)
        except InvalidResources:
            try:
                accel = find_accelerator(name.removeprefix("NVIDIA ").removeprefix("Tesla "))
            except InvalidResources:
                return None
        if accel.is_family:
            return None
        out[accel.name] = out.get(accel.name, 0) + 1
    return out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """The plan's choice.

    Attributes:
        index: position of the chosen candidate in the list (0 = preferred).
        resources: the chosen candidate.
        device_kind: its kind (``cpu``, ``gpu``, ``npu``).
        torch_device: the ``torch.device`` type to train on (``cpu``, ``cuda``, ``npu``).
        passed_over: for each earlier candidate, why it was not chosen.
    """

    index: int
    resources: Resources
    device_kind: str
    torch_device: str
    passed_over: tuple[str, ...]
    explanation: str = ""
    nodes: tuple[str, ...] = ()
    scores: tuple[dict[str, Any], ...] = ()
    """Per candidate, its :class:`~heteroflow.components.placement.scoring.CandidateScore` as a dict (node inventories)."""
    why: str = ""
    """Why the winner won, one line (node inventories)."""
    pod: dict[str, Any] | None = None
    """What the chosen candidate's pod asks for, placed (node inventories; :func:`~heteroflow.components.placement.podplace.placed_pod_plan`)."""
    packing: dict[str, Any] | None = None
    """Under a packing policy (:mod:`~heteroflow.components.placement.packplan`): the policy, how the candidate list
    picks (``listed`` or ``any``) and, for FGD, where its workload distribution came from."""

    def to_dict(self) -> dict[str, Any]:
        out = {
            "index": self.index,
            "resources": self.resources.to_dict(),
            "device_kind": self.device_kind,
            "torch_device": self.torch_device,
            "passed_over": list(self.passed_over),
            "explanation": self.explanation,
        }
        if self.nodes:
            out["nodes"] = list(self.nodes)
        if self.scores:
            out["scores"] = [dict(x) for x in self.scores]
            out["why"] = self.why
        if self.pod is not None:
            out["pod"] = self.pod
        if self.packing is not None:
            out["packing"] = dict(self.packing)
        return out


def _fits(res: Resources, inv: Inventory) -> tuple[bool, str]:
    """Whether ``res`` can run on ``inv``, and if not, why (one clause). A multi-node candidate runs as a training
    job this machine launches (:mod:`heteroflow.components.training.trainjob`): it fits where cluster credentials are (in a
    pod, or ``HETEROFLOW_KUBECONFIG``); the cluster's gang scheduler decides the rest."""
    if res.nodes > 1:
        from heteroflow.components.training.trainjob import KUBECONFIG_ENV

        if os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get(KUBECONFIG_ENV):
            return True, ""
        return False, (f"needs {res.nodes} nodes: a Kubernetes cluster with the Kubeflow Trainer, and this machine has "
                       f"none (no in-cluster service account, {KUBECONFIG_ENV} unset)")
    from heteroflow.components.replicas import is_mixed

    if is_mixed(res):  # every replica group's kind and count (the candidate's own fields are the first group's)
        short = [why for ok, why in (_fits_kind(g.resources, g.count if g.kind.has_devices else 1, inv)
                                     for g in res.replicas) if not ok]
        return (False, "; and ".join(short)) if short else (True, "")
    return _fits_kind(res, max(res.count or 0, 1), inv)


def _fits_kind(res: Resources, need: int, inv: Inventory) -> tuple[bool, str]:
    """Whether ``need`` devices of ``res``'s kind (of one model it accepts, where the models are known) are here."""
    kind = DeviceKind(res.kind)
    have = inv.devices.get(kind, 0)
    if have < need:
        return False, f"needs {need} {kind.value} device(s); " + (inv.notes.get(kind) or f"{have} {kind.value} device(s) here")
    per_model = inv.models.get(kind)
    if not kind.has_devices or not per_model:
        return True, ""
    wanted = {m.name for m in res.accelerator_models}
    usable = {m: c for m, c in per_model.items() if m in wanted and c >= need}
    if usable:
        return True, ""
    accel = res.accelerator_spec
    memory = f" with >= {res.device_memory} device memory" if res.device_memory is not None else ""
    precision = f" that compute in {res.precision}" if getattr(res, "precision", None) else ""
    asked = accel.display_name if accel is not None else kind.value
    return False, f"needs {need} x {asked}{memory}{precision} on one model; here: {inv.describe(kind)}"


def plan(candidates: Candidates, *, inventory: Inventory | Callable[[], Inventory] = local_inventory) -> Placement:
    """Choose the first candidate that can run here: its device kind is present with ``count`` devices and, when
    the inventory names models, one model the candidate accepts (its accelerator or a member of its family, with
    at least its ``device_memory`` and, for ``precision="bf16"``, bf16 support) has ``count`` devices.

    Args:
        candidates: in preference order.
        inventory: the devices present, or a function returning them (default: probe PyTorch).

    Returns:
        A :class:`Placement`.

    Raises:
        NoCandidateAvailable: no candidate fits; the message says why each was passed over.
    """
    inv = inventory() if callable(inventory) else inventory
    reasons: list[str] = []
    for i, res in enumerate(candidates):
        ok, why = _fits(res, inv)
        if ok:
            kind = DeviceKind(res.kind)
            skipped = f" ({len(reasons)} earlier passed over)" if reasons else ""
            kinds = [DeviceKind(k) for k in getattr(res, "kinds", (kind.value,))]
            return Placement(
                index=i,
                resources=res,
                device_kind=kind.value,
                torch_device=res.torch_device_type,
                passed_over=tuple(reasons),
                explanation=f"candidate {i} ({res.describe()}): the first listed that fits here{skipped}; "
                            + "; ".join(inv.describe(k) for k in kinds),
            )
        reasons.append(f"candidate {i} ({res.describe()}): {why}")
    raise NoCandidateAvailable("no candidate can run here:\n  " + "\n  ".join(reasons))


def check_plan_params(*, device_inventory: str = "", training_profile: str = "") -> None:
    """Check plan's parameters before a run (the checks :func:`plan_step` makes).

    Raises:
        InvalidParameter: ``device_inventory`` is not a JSON object of device kind -> count, a valid node inventory
            (a file's path, or inline with ``nodes``) or ``kubernetes`` with a cluster configured; ``training_profile``
            is not a readable profile (both in one message).
    """
    from heteroflow.components.errors import Problems

    problems = Problems()
    with problems.check():
        if device_inventory.strip() in LIVE_INVENTORY:
            from heteroflow.components.training.trainjob import KUBECONFIG_ENV

            if not os.environ.get(KUBECONFIG_ENV) and not os.environ.get("KUBERNETES_SERVICE_HOST"):
                live_inventory()  # raises, saying what to set
        elif device_inventory.strip():
            nodes = cluster_inventory(device_inventory)
            if nodes is None:
                Inventory.from_json(device_inventory)
            else:
                check_node_inventory(nodes)
    if training_profile:
        from heteroflow.components.training.profiling import read_profile

        with problems.check():
            read_profile(training_profile, field="training_profile")
    problems.raise_all("plan's parameters")


def check_node_inventory(nodes: Any) -> Any:
    """What the plan step needs of a node inventory beyond its parsing: the queue state
    (:data:`~heteroflow.components.placement.scoring.QUEUE_STATE_ENV`) reads and names the inventory's queues, and
    the nodes carry what the inventory's packing policy places by (each node's CPU and memory). Returns the queue
    state.

    Raises:
        InvalidParameter: one of those is not so (one line naming the setting or the node, and what is valid).
    """
    from heteroflow.components.placement.packplan import cluster_of, is_packing_policy
    from heteroflow.components.placement.scoring import QueueState
    from heteroflow.components.placement.views import InvalidInventory

    queue_state = QueueState.from_env()
    queue_state.check_queues(nodes)
    if nodes.policy and is_packing_policy(nodes.policy):
        try:
            cluster_of(nodes, queue_state.used, queue_state.used_by)
        except InvalidInventory as exc:
            raise InvalidParameter(str(exc)) from None
    return queue_state


def cluster_inventory(device_inventory: str) -> Any:
    """The node inventory ``device_inventory`` states, or None when it is the per-kind count form.

    A node inventory (:mod:`heteroflow.components.placement.policies`: nodes with devices, CPU, memory, cost, power, cached
    data sets; queues; throughputs; a policy) is given as a path to its YAML file, or inline as YAML/JSON with a
    ``nodes`` key. The count form (``{"gpu": 4}``) stays as it was.

    Raises:
        InvalidParameter: the node inventory is invalid (the message names the file and line).
    """
    from heteroflow.components.core.keys import DuplicateKey
    from heteroflow.components.placement.fields import load_yaml_with_lines
    from heteroflow.components.placement.inventory import from_mapping, load_inventory
    from heteroflow.components.placement.views import InvalidInventory

    text = device_inventory.strip()
    if text in LIVE_INVENTORY:
        return live_inventory()
    try:
        if text.endswith((".yaml", ".yml", ".json")) and "\n" not in text and not text.startswith("{"):
            inv = load_inventory(text)
            # a file of the count form ({gpu: 4}, the pools' format) is read as the inline count form is (it was
            # "placement needs the node form", while the same text inline worked)
            return inv.for_placement() if inv.nodes else None
        if "nodes" not in text:
            return None
        try:
            data = load_yaml_with_lines(text, where="device_inventory")
        except DuplicateKey:
            raise
        except Exception:  # not YAML: the count form reports it
            return None
        if not isinstance(data, dict) or "nodes" not in data:
            return None
        return from_mapping(data, source="device_inventory").for_placement()
    except InvalidInventory as exc:
        raise InvalidParameter(str(exc)) from None


LIVE_INVENTORY = ("kubernetes", "k8s")
"""``device_inventory`` values that read the live cluster's free capacity through the Kubernetes API."""


def live_inventory() -> Any:
    """The live cluster's free capacity (:func:`~heteroflow.components.placement.clusters.kubernetes_inventory`:
    allocatable minus requested, per node), through ``HETEROFLOW_KUBECONFIG`` or, in a pod, its service account.

    Raises:
        InvalidParameter: no cluster is configured (neither ``HETEROFLOW_KUBECONFIG`` nor an in-cluster service
            account), or the API cannot be reached (the client's error).
    """
    from heteroflow.components.training.trainjob import KUBECONFIG_ENV

    path = os.environ.get(KUBECONFIG_ENV)
    if not path and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise InvalidParameter(f"device_inventory=kubernetes reads the live cluster, and none is configured: set "
                               f"{KUBECONFIG_ENV} to a kubeconfig, or run the plan step in a pod with a service account")
    try:  # pragma: no cover - needs a cluster
        if path:
            from heteroflow.components.placement.clusters import kubernetes_inventory

            return kubernetes_inventory(kubeconfig=path)
        from kubernetes import client, config

        from heteroflow.components.placement.inventory import kubernetes_nodes
        from heteroflow.components.placement.views import PlacementInventory

        config.load_incluster_config()
        api = client.CoreV1Api()
        pods = api.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items
        return PlacementInventory(nodes=tuple(kubernetes_nodes(api.list_node().items, pods)), source="kubernetes (in-cluster)")
    except InvalidParameter:
        raise
    except Exception as exc:  # pragma: no cover - needs a cluster
        raise InvalidParameter(f"device_inventory=kubernetes: the cluster's API could not be read ({type(exc).__name__}: {exc})") from None


def current_inventory(device_inventory: str = "") -> Inventory:
    """The inventory plan uses: ``device_inventory`` (JSON) when given, as stated; else the local one (probes
    PyTorch) plus the device kinds simulated by ``HETEROFLOW_SIMULATE_DEVICES`` (:data:`SIMULATED_DEVICE_COUNT`
    each). A stated inventory describes the cluster, so a simulation (which only lets a kind's steps run on this
    CPU) changes none of its counts: ``{"npu": 1}`` with npu simulated still has one npu.

    Raises:
        InvalidParameter: ``device_inventory`` or the simulation setting does not parse.
    """
    from heteroflow.components.core.failures import simulated_devices

    inv = Inventory.from_json(device_inventory) if device_inventory.strip() else local_inventory()
    simulated = simulated_devices()
    if not simulated:
        return inv
    if device_inventory.strip():  # a new user's trial: {"npu": 1} with npu simulated placed -c npu:count=2 on 8 npus
        return dataclasses.replace(inv, simulated=tuple(DeviceKind(k) for k in simulated if inv.devices.get(DeviceKind(k))))
    from heteroflow.components.devices.accelerators import find_accelerator

    devices = dict(inv.devices)
    models = {k: dict(v) for k, v in inv.models.items()}
    notes = dict(inv.notes)
    for kind_name, model in simulated.items():
        kind = DeviceKind(kind_name)
        devices[kind] = max(devices.get(kind, 0), SIMULATED_DEVICE_COUNT)
        notes.pop(kind, None)
        if model:
            try:
                accel = find_accelerator(model, field=f"simulated {kind_name} model")
            except InvalidResources as exc:
                raise InvalidParameter(str(exc)) from None
            models[kind] = {accel.name: SIMULATED_DEVICE_COUNT}
        else:
            models.pop(kind, None)
    return Inventory(devices=devices, models=models, notes=notes, simulated=tuple(DeviceKind(k) for k in simulated))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """What the plan step decided.

    Attributes:
        indices: per placed call, the index of the chosen candidate (0 = preferred).
        placements: per placed call, the :class:`Placement` as a dict (chosen resources, passed-over reasons).
        inventory: the device counts it placed against, by kind.
        seconds: wall time, seconds.
        explanations: per placed call, one line: what was chosen and why.
        policy: the placement policy used (``listed``: the first candidate that fits).
    """

    indices: dict[str, int]
    placements: dict[str, dict[str, Any]]
    inventory: dict[str, int]
    seconds: float
    explanations: dict[str, str] = dataclasses.field(default_factory=dict)
    policy: str = "listed"
    training_profile: dict[str, Any] | None = None


def plan_step(placement_path: str, *, placements: str, device_inventory: str = "", training_profile: str = "") -> PlanResult:
    """Choose a candidate for each device-bound step: the first whose device is here.

    Args:
        placement_path: file to write the decision to (JSON: per call, the chosen candidate and why each
            earlier one was passed over).
        placements: ``{call: candidates JSON}`` of the calls to place (the engine passes it).
        device_inventory: the devices the job may get, for plan: JSON {"gpu": N, "npu": M} (or per model {"gpu": {"t4": 4}}), the path of a node inventory file (.yaml, .yml or .json: nodes with their devices, queues, a policy), or kubernetes (the live cluster's free capacity); empty: probe with PyTorch where plan runs (set it on a cluster, where the plan pod has no accelerator).
        training_profile: path of a training profile (JSON from heteroflow profile): checked and recorded with the placement; on a node inventory its step times score the candidates.

    Returns:
        A :class:`PlanResult`.

    Raises:
        InvalidParameter: ``placements`` or ``device_inventory`` is malformed.
        NoCandidateAvailable: a call has no candidate that can run; the message says why each was passed over.
    """
    started = time.perf_counter()
    recorded = None
    if training_profile:
        from heteroflow.components.training.profiling import read_profile

        prof = read_profile(training_profile, field="training_profile")
        recorded = {"path": training_profile, **{k: prof.get(k) for k in ("device", "samples_per_second", "key_operators",
                                                                            "peak_memory_bytes", "peak_memory_of")}}
    try:
        wanted = json.loads(placements or "{}")
        if not isinstance(wanted, dict):
            raise TypeError("not an object")
    except (ValueError, TypeError) as exc:
        raise InvalidParameter(f"placements={placements!r} is not a JSON object of call -> candidates ({exc})") from None
    nodes = cluster_inventory(device_inventory) if device_inventory.strip() else None
    chosen: dict[str, Placement] = {}
    if nodes is not None:
        from heteroflow.components.placement.state import PlacementState

        from heteroflow.components.placement.packplan import PackingPlanner, is_packing_policy, shared_gpu_default

        queue_state = check_node_inventory(nodes)  # as the run's check did (a step run on its own checks here)
        parsed = {call: Candidates.from_json(text) for call, text in wanted.items()}
        policy = nodes.policy or ("fgd" if shared_gpu_default(nodes, parsed.values())
                                  else "throughput" if training_profile else "listed")
        packer = (PackingPlanner(nodes, policy, queue_state=queue_state, profile=prof if training_profile else None,
                                 candidates=list(parsed.values())) if is_packing_policy(policy) else None)
        state = PlacementState(nodes, queue_used=queue_state.used, queue_used_by=queue_state.used_by)
        for call, cands in parsed.items():
            # the calls of a pipeline run one after another (evaluate after train): a call's CPU and memory are
            # checked against the nodes' as stated, not held against the next call's; devices stay taken, as before
            host = _host_use(packer.cluster if packer is not None else state)
            try:
                chosen[call] = (packer.place(call, cands) if packer is not None else
                                plan_on_nodes(call, cands, state, policy=policy, profile=prof if training_profile else None,
                                              queue_state=queue_state))
            except NoCandidateAvailable as exc:
                raise NoCandidateAvailable(f"step {call!r}: {exc}") from None
            _restore_host_use(packer.cluster if packer is not None else state, host)
        counts: dict[str, int] = {DeviceKind.host().value: 1}  # the host CPU is always there
        for n in nodes.nodes:
            counts[n.kind] = counts.get(n.kind, 0) + n.devices if DeviceKind.parse(n.kind).has_devices else 1
        inventory_counts = counts
    else:
        policy = "listed"
        inventory = current_inventory(device_inventory)
        for call, candidates_json in wanted.items():
            try:
                chosen[call] = plan(Candidates.from_json(candidates_json), inventory=inventory)
            except NoCandidateAvailable as exc:
                raise NoCandidateAvailable(f"step {call!r}: {exc}") from None
        inventory_counts = {k.value: n for k, n in inventory.devices.items()}
    decision = {call: p.to_dict() for call, p in chosen.items()}
    Path(placement_path).parent.mkdir(parents=True, exist_ok=True)
    Path(placement_path).write_text(json.dumps(decision, indent=2, sort_keys=True), encoding="utf-8")
    return PlanResult(
        indices={call: p.index for call, p in chosen.items()},
        placements=decision,
        inventory=inventory_counts,
        seconds=time.perf_counter() - started,
        explanations={call: p.explanation for call, p in chosen.items()},
        policy=policy,
        training_profile=recorded,
    )


_HOST_KEYS = ("cpu", "memory", "cpu_milli", "memory_mib")
"""A queue's CPU and memory in use, as a :class:`PlacementState` (``queue_used_by``) or a packing
:class:`~heteroflow.components.placement.vectors.Cluster` (``queue_used``) keys them."""


def _queue_host(state: Any) -> dict[str, dict[str, int]]:
    return state.queue_used_by if hasattr(state, "queue_used_by") else state.queue_used


def _host_use(state: Any) -> tuple[Any, Any, dict[str, dict[str, int]]]:
    """The free CPU and memory per node and each queue's CPU and memory in use of a :class:`PlacementState` or a
    packing cluster (:func:`_restore_host_use`)."""
    used = {q: {k: v for k, v in by.items() if k in _HOST_KEYS} for q, by in _queue_host(state).items()}
    return state.cpu_free.copy(), state.mem_free.copy(), used


def _restore_host_use(state: Any, saved: tuple[Any, Any, dict[str, dict[str, int]]]) -> None:
    """Give back the CPU and memory a call took (devices stay taken): the next call of the plan runs at another time."""
    cpu, mem, used = saved
    state.cpu_free[:] = cpu
    state.mem_free[:] = mem
    for q, by in _queue_host(state).items():
        for key in _HOST_KEYS:
            if key in by:
                by[key] = used.get(q, {}).get(key, 0)


def plan_on_nodes(call: str, candidates: Candidates, state: Any, *, policy: str = "listed",
                  profile: Mapping[str, Any] | None = None, queue_state: Any = None) -> Placement:
    """Choose a candidate and node(s) on a node inventory with a placement policy (the simulator's policies),
    scoring every candidate (:func:`~heteroflow.components.placement.scoring.score_candidates`).

    Each candidate becomes a job (device kind, the models it accepts, count, device memory, the run's queue; its
    estimated steps/s per model from the training profile and the inventory's ``throughputs`` row for ``call``);
    the policy filters (queue capability and guarantees included, given ``queue_state``) and picks a model and
    node(s); the ``listed`` policy takes the first candidate that fits, any other the highest score (estimated
    steps/s; ties: the listed order). The chosen devices are taken from ``state`` (so the next call sees them used).
    The placement records every candidate's score and why the winner won.

    Raises:
        NoCandidateAvailable: no candidate fits; each candidate's one-line reason (the limit that holds it) is listed.
    """
    from heteroflow.components.placement.policies import get_policy
    from heteroflow.components.placement.scoring import QueueState, jobs_of, place_groups, score_candidates, winner

    pol = get_policy(policy)
    qs = queue_state or QueueState()
    shares = {i: r.device_share_milli for i, r in enumerate(candidates) if r.device_share_milli}
    scores = score_candidates(candidates, state.inventory, qs, profile, call=call, policy=pol, state=state, gpu_milli=shares)
    picked = winner(scores, policy=pol.name)
    if picked is None:
        raise NoCandidateAvailable("no candidate can run on the node inventory:\n  " + "\n  ".join(
            f"candidate {x.candidate} ({candidates[x.candidate].describe()}): {x.reason}" for x in scores))
    i, why = picked
    res = candidates[i]
    kind = DeviceKind(res.kind)
    table = {m: 1.0 / s for m, s in ((x.model, x.step_seconds) for x in scores) if m and s}
    times = {x.model: x.step_seconds for x in scores if x.model and x.step_seconds}
    tp = dict(state.inventory.throughputs.get(call) or {}) or None
    if times:
        tp = dict(table)
        floor = min(tp.values()) * 1e-3
        tp.update({m: floor for m in state.models if m not in tp})
    # the same decisions as the trial, now taken from the state: one per replica group of a mixed candidate
    placed, _held = place_groups(jobs_of(res, call, queue=qs.queue, throughput=tp), state, pol)
    decision = dataclasses.replace(placed[0], node_names=tuple(dict.fromkeys(n for d in placed for n in d.node_names)),
                                   explanation="; ".join(d.explanation for d in placed))
    passed = tuple(f"candidate {x.candidate} ({candidates[x.candidate].describe()}): {x.reason}"
                   for x in scores if x.candidate < i and not x.feasible)
    others = [f"candidate {x.candidate} ({candidates[x.candidate].describe()}) {x.score:.3g} steps/s"
              for x in scores if x.feasible and x.candidate != i and x.score > 0]
    pref = f"; preferred over {', '.join(others)}" if others and pol.name != "listed" else ""
    win = next(x for x in scores if x.candidate == i)
    return Placement(index=i, resources=res, device_kind=kind.value, torch_device=res.torch_device_type,
                     passed_over=passed, explanation=f"[{pol.name}] candidate {i}: {decision.explanation}{pref}",
                     nodes=decision.node_names, scores=tuple(x.to_dict() for x in scores), why=why,
                     pod=_pod_of(res, decision.model, decision.node_names, win.gpu_milli))


def _pod_of(res: Resources, model: str | None, nodes: tuple[str, ...], gpu_milli: int | None) -> dict[str, Any] | None:
    """The placed pod plan as plain data (requests, limits, node selector, affinity), with the cluster profile the
    task carries (``HETEROFLOW_CLUSTER_PROFILE``) or the default conventions; ``{"error": ...}`` when the chosen
    placement cannot be asked for on that cluster (e.g. a fractional GPU without HAMi)."""
    import warnings

    from heteroflow.components.devices.cluster import ClusterProfile, InvalidProfile
    from heteroflow.components.devices.podplan import DefaultProfileWarning
    from heteroflow.components.placement.podplace import placed_pod_plan
    from heteroflow.components.training.trainjob import PROFILE_ENV

    if model is None:
        return None
    text = os.environ.get(PROFILE_ENV)
    try:
        profile = ClusterProfile.from_dict(json.loads(text), source=PROFILE_ENV) if text else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DefaultProfileWarning)
            plan = placed_pod_plan(res, model=model, nodes=nodes, gpu_milli=gpu_milli, profile=profile)
    except (InvalidResources, InvalidProfile, ValueError) as exc:
        return {"error": str(exc)}
    return {"requests": plan.requests, "limits": plan.limits, "node_selector": plan.node_selector, "affinity": plan.affinity}


# --- the step definition ----------------------------------------------------------------------------------

_HOUR = 3600.0


PLAN: Step = step(
    plan_step,
    name="plan",
    outputs=[ArtifactSpec(name="placement", type=ArtifactType.ARTIFACT, param="placement_path", help="the placement (JSON)")],
    candidates=[Resources(kind="cpu", cpu="500m", memory="512Mi")],
    retry=RetryPolicy(retries=1, backoff_seconds=2, max_delay_seconds=30, window_seconds=_HOUR),
    cacheable=False,  # its result depends on the live inventory
    planner=True,
    placements_param="placements",
    check=check_plan_params,
    ref="heteroflow.components.placement.plan:PLAN",
)
