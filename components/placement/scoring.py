"""Scoring a step's candidates at run time: one score per candidate, feasibility, and why the winner won.

The plan step (:mod:`heteroflow.components.placement.plan`) places a device-bound step on a node inventory (the
inventory file, or the live cluster through :func:`~heteroflow.components.placement.clusters.kubernetes_inventory`)
with :func:`score_candidates`:

- *feasible*: the placement policy's filter (:func:`~heteroflow.components.placement.rounds.place_round`: device
  kind and model, device memory, free devices, the queue's capability and the other queues' guarantees, given the
  queue state) finds a model and node(s) for the candidate; otherwise the reason names the limit that holds it;
- *score*: the estimated training throughput there, steps/s (1 / the estimated step time on the model the policy
  chose, :func:`step_seconds_per_model`); 0 when no step time is known for that model;
- the winner: the highest score among the feasible candidates (ties: the listed order); under the ``listed``
  policy, the first feasible one. :func:`winner` says why in one line.

Pluggable: any :class:`~heteroflow.components.placement.policies.Policy` (by registry name, ``module:attribute``
or instance) does the filter and the choice of model and node(s); a policy that defines
``candidate_score(job, decision, state) -> float | None`` replaces the throughput score with its own (a node-level
fragmentation-aware policy scores a candidate by how little it fragments the cluster), and its value is recorded
as the candidate's score.

Step times: from the training profile (``heteroflow profile``: ``step_seconds`` measured on ``device_model`` when
the profile names it, or ``step_seconds_by_model`` when several profiles were merged) and the inventory's
``throughputs`` table for the step (steps/s per model); with both, the profile fixes the absolute time on its model
and the table the ratios between models (``t_m = t_p x tp_p / tp_m``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.components.resources import Candidates, DeviceKind, Resources

__all__ = ["QUEUE_STATE_ENV", "CandidateScore", "QueueState", "score_candidates", "step_seconds_per_model", "winner"]

QUEUE_STATE_ENV = "HETEROFLOW_QUEUE_STATE"
"""A JSON file (or inline JSON) with the queue state the plan step places against (see :meth:`QueueState.from_mapping`)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CandidateScore:
    """One candidate, scored.

    Attributes:
        candidate: its index in the candidate list (0 = listed first).
        score: higher is better: estimated steps/s on the chosen model (or the policy's own ``candidate_score``);
            ``-inf`` when not feasible, 0 when no step time is known.
        feasible: whether the policy found a model and node(s) for it, within the queue's limits.
        reason: one line: where it would run and at what estimated step time, or which limit holds it.
        model: the device model the policy chose (None when not feasible).
        nodes: the node(s) chosen.
        step_seconds: estimated seconds per training step on ``model``, or None when unknown.
        gpu_milli: for a fractional-GPU request, the thousandths of one device it asks for; None: whole devices.
    """

    candidate: int
    score: float
    feasible: bool
    reason: str
    model: str | None = None
    nodes: tuple[str, ...] = ()
    step_seconds: float | None = None
    gpu_milli: int | None = None
    basis: str = "est. steps/s"
    """What the score measures (a policy's own ``candidate_score`` names itself)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"candidate": self.candidate, "score": self.score if math.isfinite(self.score) else None,
                               "feasible": self.feasible, "reason": self.reason}
        if self.model is not None:
            out["model"] = self.model
        if self.nodes:
            out["nodes"] = list(self.nodes)
        if self.step_seconds is not None:
            out["step_seconds"] = self.step_seconds
        if self.gpu_milli is not None:
            out["gpu_milli"] = self.gpu_milli
        if self.feasible:
            out["basis"] = self.basis
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class QueueState:
    """The queue a run is submitted to and what each queue uses now.

    Attributes:
        queue: the queue this run's steps go to (Volcano/Kueue queue name; ``default`` when none).
        used: accelerator devices in use per queue (any model), as Volcano's ``Queue.status.allocated`` counts them.
        used_by: per queue given per key (``{"team-a": {"nvidia-t4": 2, "cpu": 8}}``, as Kueue's ClusterQueue
            ``flavorsUsage`` reports it): devices per model or device kind, CPU (millicores), memory (bytes). Devices
            whose model is not given count against each of the queue's device limits they may fall under (a bare
            count: every one; a kind's: that kind's and its models'), never against its CPU or memory.
    """

    queue: str = "default"
    used: Mapping[str, int] = dataclasses.field(default_factory=dict)
    used_by: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "queue state") -> QueueState:
        """``{"queue": "team-a", "used": {"team-a": 6, "team-b": {"nvidia-t4": 2, "gpu": 1, "cpu": 8, "memory": "32Gi"}}}``
        (both optional): per queue, devices in use of any model, or amounts per model, device kind, cpu and memory.

        Raises:
            InvalidParameter: not a mapping, an unknown key, a queue name that is not a string, a count that is
                not an integer >= 0 (the message names the source and the field).
        """
        if not isinstance(data, Mapping):
            raise InvalidParameter(f"{source}: a queue state is a JSON object like "
                                   '{"queue": "team-a", "used": {"team-a": 6}}, not ' + type(data).__name__)
        unknown = sorted(set(data) - {"queue", "used"})
        if unknown:
            raise InvalidParameter(f"{source}: unknown field(s) {', '.join(map(repr, unknown))}; valid: queue, used")
        queue = data.get("queue", "default")
        if not isinstance(queue, str) or not queue:
            raise InvalidParameter(f"{source}: queue={queue!r} is not a queue name")
        used = data.get("used", {})
        if not isinstance(used, Mapping):
            raise InvalidParameter(f"{source}: used={used!r} is not an object of queue -> devices in use")
        counts: dict[str, int] = {}
        by: dict[str, dict[str, int]] = {}
        for name, n in used.items():
            if isinstance(n, Mapping):
                from heteroflow.components.placement.inventory import _amounts
                from heteroflow.components.placement.views import InvalidInventory

                try:
                    by[str(name)] = _amounts(n, f"used[{name!r}]")
                except InvalidInventory as exc:
                    raise InvalidParameter(f"{source}: {exc}") from None
                counts[str(name)] = sum(v for k, v in by[str(name)].items() if k not in ("cpu", "memory"))
                continue
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise InvalidParameter(f"{source}: used[{name!r}]={n!r} is not a device count; valid: an integer >= 0, or "
                                       "amounts per model, device kind, cpu and memory ({\"nvidia-t4\": 2, \"cpu\": 8})")
            counts[str(name)] = n
        return cls(queue=queue, used=counts, used_by=by)

    @classmethod
    def from_env(cls) -> QueueState:
        """The state :data:`QUEUE_STATE_ENV` names (a JSON file, or inline JSON); empty (``default``, nothing in
        use) when unset.

        Raises:
            InvalidParameter: the file cannot be read or does not parse (named).
        """
        value = os.environ.get(QUEUE_STATE_ENV, "").strip()
        if not value:
            return cls()
        source = f"{QUEUE_STATE_ENV}={value!r}"
        text = value
        if not value.startswith(("{", "[", '"')):
            try:
                text = Path(value).read_text(encoding="utf-8")
            except OSError as exc:
                if not Path(value).exists():  # 'not json': neither, and it says both forms
                    raise InvalidParameter(f"{source} is neither JSON nor a readable file ({exc.strerror or exc}); valid: "
                                           'inline JSON like {"queue": "team-a", "used": {"team-a": 6}}, or the path of '
                                           "a file holding it") from None
                raise InvalidParameter(f"{source}: cannot be read ({exc.strerror or exc})") from None
            except UnicodeDecodeError as exc:
                from heteroflow.components.core.keys import not_utf8

                raise InvalidParameter(f"{source}: {not_utf8(exc)}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidParameter(f"{source}: not JSON ({exc})") from None
        return cls.from_mapping(data, source=source)

    def check_queues(self, inventory: Any) -> None:
        """The run's queue is the inventory's (``default`` always is). A queue in ``used`` that the inventory does
        not list is taken as it is (a state copied from a live cluster lists Volcano's ``root`` and other teams'
        queues, which the inventory need not describe): it limits nothing here.

        Raises:
            InvalidParameter: the run's queue is not in the inventory (named, with the valid ones).
        """
        known = set(getattr(inventory, "queues", {}) or {}) | {"default"}
        source = getattr(inventory, "source", "the inventory")
        valid = ", ".join(sorted(known))
        if self.queue not in known:
            raise InvalidParameter(f"{QUEUE_STATE_ENV}: queue={self.queue!r} is not in {source}; valid: {valid}")


def step_seconds_per_model(profile: Mapping[str, Any] | None, throughputs: Mapping[str, float] | None) -> dict[str, tuple[float, str]]:
    """Estimated seconds per training step per device model, each with where it came from.

    Args:
        profile: a training profile (:func:`~heteroflow.components.training.profiling.read_profile`), or None.
            Read: ``step_seconds_by_model`` (model -> s), else ``step_seconds`` on ``device_model`` (a registry
            key; ``cpu`` for a profile taken on the CPU, which ``device: cpu`` also says).
        throughputs: the inventory's table row for the step, model -> steps/s, or None.

    Returns:
        model -> (seconds per step, source text). With a profile on model p that the table also has, every table
        model gets ``t_p x tp_p / tp_m`` (the profile fixes the scale, the table the ratios); other table models
        ``1 / tp_m``; profiled models their measured time.
    """
    from heteroflow.components.placement.fields import model_key
    from heteroflow.components.placement.views import InvalidInventory

    host = DeviceKind.host().value  # the model name of the host CPU
    measured: dict[str, float] = {}
    if profile:
        by_model = profile.get("step_seconds_by_model")
        if isinstance(by_model, Mapping):
            measured.update({str(m): float(s) for m, s in by_model.items() if isinstance(s, int | float) and s > 0})
        step_s = profile.get("step_seconds")
        from heteroflow.components.devices import is_host_device_type

        device_type = str(profile.get("device", "")).partition(":")[0]
        model = profile.get("device_model") or (host if device_type and is_host_device_type(device_type) else None)
        if isinstance(step_s, int | float) and step_s > 0 and model:
            measured.setdefault(str(model), float(step_s))
    keyed: dict[str, float] = {}
    for m, s in measured.items():
        try:
            keyed[m if m == host else model_key(m, field="profile model")] = s
        except InvalidInventory:
            continue
    out: dict[str, tuple[float, str]] = {m: (s, "profiled") for m, s in keyed.items()}
    table = {m: float(v) for m, v in (throughputs or {}).items() if v and v > 0}
    anchor = next((m for m in keyed if m in table), None)
    for m, tp in table.items():
        if m in out:
            continue
        if anchor is not None:
            out[m] = (keyed[anchor] * table[anchor] / tp, f"profiled on {anchor} x table ratio {table[anchor] / tp:.3g}")
        else:
            out[m] = (1.0 / tp, "throughput table")
    return out


def score_candidates(candidates: Candidates | Sequence[Resources], inventory: Any, queue_state: QueueState | None,
                     profile: Mapping[str, Any] | None, *, call: str = "train", policy: Any = "throughput",
                     state: Any = None, gpu_milli: Mapping[int, int] | None = None) -> list[CandidateScore]:
    """Score each candidate of ``call`` on ``inventory`` with ``policy`` (see the module docstring).

    Args:
        candidates: in the user's order.
        inventory: a :class:`~heteroflow.components.placement.views.PlacementInventory` (the file's, or the live
            cluster's free capacity).
        queue_state: the run's queue and each queue's devices in use (None: ``default``, nothing in use).
        profile: the training profile (step times), or None.
        call: the step's name (its row of the inventory's ``throughputs`` table).
        policy: a policy name, ``module:attribute`` or :class:`~heteroflow.components.placement.policies.Policy`.
        state: a :class:`~heteroflow.components.placement.state.PlacementState` to score against (default: the
            inventory's, with the queue state's usage); it is not changed.
        gpu_milli: per candidate index, the thousandths of one device a fractional request asks for (recorded, and
            rendered as HAMi resources by :func:`~heteroflow.components.placement.podplace.placed_pod_plan`).

    Returns:
        One :class:`CandidateScore` per candidate, in the listed order.

    Raises:
        InvalidInventory: an unknown policy name.
    """
    from heteroflow.components.placement.policies import get_policy
    from heteroflow.components.placement.rounds import place_round
    from heteroflow.components.placement.state import Job, PlacementState

    qs = queue_state or QueueState()
    pol = get_policy(policy)
    if state is None:
        state = PlacementState(inventory, queue_used=qs.used, queue_used_by=qs.used_by)
    times = step_seconds_per_model(profile, inventory.throughputs.get(call))
    out: list[CandidateScore] = []
    for i, res in enumerate(candidates):
        tp = {m: 1.0 / s for m, (s, _src) in times.items()}
        if tp:  # models without a known step time stay allowed, ranked below every known one
            floor = min(tp.values()) * 1e-3
            tp.update({m: floor for m in state.models if m not in tp})
        jobs = jobs_of(res, call, queue=qs.queue, throughput=tp or None)
        job = jobs[0]
        trial = _copy_state(state)
        decisions, held = place_groups(jobs, trial, pol)
        decision = decisions[0] if decisions else held
        milli = (gpu_milli or {}).get(i)
        if held is not None:
            reason = held.explanation.split(": ", 1)[-1]
            if len(jobs) > 1:  # a mixed candidate: the replica group that does not fit
                reason = f"its {job_group(jobs[len(decisions)])} replicas: {reason}"
            out.append(CandidateScore(candidate=i, score=-math.inf, feasible=False, gpu_milli=milli, reason=reason))
            continue
        model = decision.model
        known = times.get(model or "")
        score = 1.0 / known[0] if known else 0.0
        basis = "est. steps/s"
        custom = getattr(pol, "candidate_score", None)
        if callable(custom):
            value = custom(job, decision, trial)
            if value is not None:
                score, basis = float(value), f"{pol.name} score"
        where = " + ".join(f"{d.model} x{j.count}" if j.count else str(d.model) for j, d in zip(jobs, decisions, strict=True))
        timing = (f"est. {known[0]:.4g} s/step ({known[1]})" if known else f"no step time known for {model}")
        node_names = tuple(dict.fromkeys(n for d in decisions for n in d.node_names))
        out.append(CandidateScore(candidate=i, score=score, feasible=True, model=model, nodes=node_names,
                                  step_seconds=known[0] if known else None, gpu_milli=milli, basis=basis,
                                  reason=f"{where} on {', '.join(node_names) or 'the cluster'}: {timing}"))
    return out


def winner(scores: Sequence[CandidateScore], *, policy: str = "throughput") -> tuple[int, str] | None:
    """The winning candidate's index and why it won (one line), or None when none is feasible.

    The ``listed`` policy takes the first feasible candidate; any other the highest score (ties: listed first).
    """
    feasible = [s for s in scores if s.feasible]
    if not feasible:
        return None
    if policy == "listed":
        best = feasible[0]
        others = [s for s in scores if s.candidate < best.candidate]
        why = "the first listed that fits" + (f" ({len(others)} earlier do not)" if others else "")
        return best.candidate, why
    best = max(feasible, key=lambda s: (s.score, -s.candidate))
    rivals = [s for s in feasible if s is not best]
    if not rivals:
        why = "the only feasible candidate" if len(scores) > 1 else "the only candidate"
    elif all(s.score == 0 and s.basis == "est. steps/s" for s in feasible):
        why = "no step time is known for any feasible candidate, so the first listed feasible one"
        best = feasible[0]
    else:
        runner = max(rivals, key=lambda s: (s.score, -s.candidate))
        if best.basis != "est. steps/s":
            margin = f"higher by {best.score - runner.score:.4g}"
        elif runner.score > 0:
            margin = f"{best.score / runner.score:.2f}x"
        else:
            margin = "unlike it, a known step time"
        why = (f"highest score {best.score:.4g} ({best.basis} on {best.model}) vs {runner.score:.4g} for candidate "
               f"{runner.candidate} ({runner.model}): {margin}")
        if best.score == runner.score:
            why = f"score {best.score:.4g} ties candidate {runner.candidate}; listed first"
    return best.candidate, why


def _copy_state(state: Any) -> Any:
    import copy

    trial = copy.copy(state)
    trial.free = state.free.copy()
    trial.cpu_free = state.cpu_free.copy()
    trial.mem_free = state.mem_free.copy()
    trial.queue_used = dict(state.queue_used)
    trial.queue_used_by = {q: dict(v) for q, v in state.queue_used_by.items()}
    trial.device_free_at = {}
    return trial


def jobs_of(res: Resources, call: str, *, queue: str = "default", throughput: Mapping[str, float] | None = None) -> list[Any]:
    """The placement jobs of a candidate: one, or one per replica group of a mixed candidate (each group's kind,
    models, count and its replicas' CPU and memory; the first group is the candidate's own fields)."""
    from heteroflow.components.placement.state import Job
    from heteroflow.components.replicas import is_mixed

    mixed = is_mixed(res)
    groups = [(g.resources, g.count) for g in res.replicas] if mixed else [(res, max(res.count or 0, 1) * res.nodes)]
    jobs = []
    for one, count in groups:
        kind = DeviceKind(one.kind)
        models = frozenset(m.name for m in one.accelerator_models) if one.accelerator_spec is not None else None
        # as the job runs: a mixed group's replicas one pod of one device each (a CPU group's pods together on one
        # node), a single-kind candidate one pod of count devices on each of its nodes (one node: its devices are
        # never split across nodes, a pod's devices are on its node); each pod asks for its own CPU and memory
        pod_devices = (1 if mixed else max(res.count or 0, 1)) if kind.has_devices else 0
        pods = count if mixed and not pod_devices else 1
        jobs.append(Job(name=call, count=count if kind.has_devices else 0, kind=kind.value, models=models, queue=queue,
                        device_memory_bytes=one.device_memory_bytes or 0, throughput=throughput,
                        cpu_millicores=(one.cpu_millicores or 0) * pods, memory_bytes=(one.memory_bytes or 0) * pods,
                        pod_devices=pod_devices, distinct_nodes=not mixed and res.nodes > 1 and kind.has_devices))
    return jobs


def job_group(job: Any) -> str:
    """``npu x4``: a replica group as a mixed candidate's description writes it."""
    return f"{job.kind} x{job.count}" if job.count else str(job.kind)


def place_groups(jobs: Sequence[Any], state: Any, policy: Any) -> tuple[list[Any], Any]:
    """Place a candidate's jobs (:func:`jobs_of`) one after another on ``state`` (changed in place): the decisions,
    and the first decision that is not placed (None when all are; then the state holds them all)."""
    from heteroflow.components.placement.rounds import place_round

    placed = []
    for job in jobs:
        decision = place_round([job], state, policy)[0]
        if not decision.placed:
            return placed, decision
        placed.append(decision)
    return placed, None
