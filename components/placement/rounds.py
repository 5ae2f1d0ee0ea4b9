"""A placement round and reclaim: :func:`place_round` filters, scores and picks with a
:class:`~heteroflow.components.placement.policies.Policy` for each pending job and explains each decision;
:func:`reclaim` chooses the running jobs to preempt, Volcano-style. Split out of
:mod:`heteroflow.components.placement.policies`, which resolves these names on first use (this module imports it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from heteroflow.components.devices.accelerators import DeviceKind
from heteroflow.components.devices.registry import has_devices
from heteroflow.components.placement.views import ANY_DEVICES, kind_of, show_amount, within
from heteroflow.components.placement.policies import Policy, get_policy
from heteroflow.components.placement.state import Decision, Job, PlacementState, _relative_throughput

__all__ = ["Running", "place_round", "reclaim"]


# --- a round --------------------------------------------------------------------------------------------------


def _allowed_models(job: Job, state: PlacementState) -> np.ndarray:
    ok = np.ones(len(state.models), dtype=bool)
    on_host = job.kind is not None and not has_devices(job.kind)
    for i, m in enumerate(state.models):
        if not has_devices(m):  # a node without accelerators: its model is the CPU kind's name
            ok[i] = on_host
            continue
        if on_host:
            ok[i] = False
        elif job.models is not None and m not in job.models:
            ok[i] = False
        elif job.throughput is not None and job.throughput.get(m, 0.0) <= 0:
            ok[i] = False
    if job.kind is not None and not on_host:
        from heteroflow.components.devices.accelerators import ACCELERATORS

        for i, m in enumerate(state.models):
            if ok[i] and ACCELERATORS[m].kind.value != job.kind:
                ok[i] = False
    return ok


def _take_nodes(job: Job, state: PlacementState, policy: Policy, model_idx: int, mask: np.ndarray) -> list[tuple[int, int]]:
    """Nodes for ``job.count`` devices of one model: one node when one has room, else a gang across nodes."""
    need = max(job.count, 1) if has_devices(job.kind) else 0
    cand = np.flatnonzero(mask & (state.model_of == model_idx))
    if need == 0:
        if cand.size == 0:
            return []
        scores = policy.node_scores(job, state, cand)
        return [(int(cand[int(np.argmax(scores))]), 0)]
    free = state.room(job)  # a job in pods: the devices of the pods each node holds
    whole = cand[free[cand] >= need]
    if whole.size:
        scores = policy.node_scores(job, state, whole)
        return [(int(whole[int(np.argmax(scores))]), need)]
    part = cand[free[cand] > 0]
    if int(free[part].sum()) < need:
        return []
    order = part[np.argsort(-policy.node_scores(job, state, part), kind="stable")]
    taken: list[tuple[int, int]] = []
    for n in order:
        k = int(min(free[n], need))
        taken.append((int(n), k))
        need -= k
        if need == 0:
            break
    return taken


def _fmt_s(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def _unit(key: str) -> str:
    return {"cpu": " CPU", "memory": " of memory"}.get(key, " device(s)" if key == ANY_DEVICES else f" {key} device(s)")


def _over_limit(q: Any, state: PlacementState, asks: Mapping[str, int]) -> str | None:
    """Why ``q``'s capability holds a job asking ``asks`` (key -> amount; only the keys given are checked), or None.
    An amount of 0 never exceeds a limit (a CPU-only job is not held by a device capability)."""
    for key, cap in q.limits().items():
        ask = asks.get(key, 0)
        if not ask:
            continue
        used = state.used_in(q.name, key)
        if used + ask <= cap:
            continue
        if key == ANY_DEVICES:  # the bare-number form, as it always read
            return (f"queue {q.name}'s capability {cap} is below the {ask} device(s) it needs" if ask > cap
                    else f"queue {q.name} uses {used} of its capability {cap}, +{ask} would exceed it")
        show = lambda n: show_amount(key, n)  # noqa: E731
        return (f"queue {q.name}'s capability.{key}={show(cap)} is below the {show(ask)}{_unit(key)} it needs" if ask > cap
                else f"queue {q.name} uses {show(used)}{_unit(key)} of its capability.{key}={show(cap)}, +{show(ask)} would exceed it")
    return None


def _scope_free(state: PlacementState, scope: str) -> int | None:
    """Free capacity in ``scope`` (devices of a model, a kind or any model; CPU; memory); None where unknown."""
    if scope in ("cpu", "memory"):
        arr, stated = (state.cpu_free, [n.cpu_millicores for n in state.inventory.nodes]) if scope == "cpu" else \
            (state.mem_free, [n.memory_bytes for n in state.inventory.nodes])
        known = np.array([x is not None for x in stated], dtype=bool)
        return int(arr[known].sum()) if known.any() else None
    models = np.array([has_devices(m) and within(scope, m) for m in state.models], dtype=bool)
    return int(state.free[models[state.model_of]].sum()) if len(state.model_of) else 0


def _borrowing(q: Any, state: PlacementState, asks: Mapping[str, int]) -> str | None:
    """Whether the job (``asks``: scope -> amount) uses capacity other queues are guaranteed beyond ``q``'s own
    unmet guarantee, in any scope it asks in; the first such scope as one line, or None."""
    inv = state.inventory
    if not any(o.guarantees or o.guarantee for o in inv.queues.values()):  # nothing is guaranteed to anyone
        return None
    for scope, ask in asks.items():
        if not ask:
            continue
        free = _scope_free(state, scope)
        if free is None:
            continue
        reserved = sum(max(sum(g for k, g in o.guaranteed().items() if within(scope, k)) - state.used_in(o.name, scope), 0)
                       for o in inv.queues.values() if o.name != q.name)
        own_left = max(sum(g for k, g in q.guaranteed().items() if within(scope, k)) - state.used_in(q.name, scope), 0)
        if free - ask < reserved and ask > own_left:
            if scope == ANY_DEVICES:
                return f"{free} free devices, {reserved} guaranteed to other queues"
            return f"{show_amount(scope, free)}{_unit(scope) if scope in ('cpu', 'memory') else f' {scope} device(s)'} free, " \
                   f"{show_amount(scope, reserved)} guaranteed to other queues"
    return None


def _quota_text(q: Any, state: PlacementState) -> str:
    """``queue team-a uses 4 (guarantee 2, capability 8)``; keyed amounts as the inventory writes them."""
    g, c = q.guaranteed(), q.limits()
    if set(g) <= {ANY_DEVICES} and set(c) <= {ANY_DEVICES}:
        cap_text = "" if q.capability is None else f", capability {q.capability}"
        return f"queue {q.name} uses {state.queue_used.get(q.name, 0)} (guarantee {q.guarantee}{cap_text})"
    show = lambda d: ", ".join(f"{k if k != ANY_DEVICES else 'devices'}={show_amount(k, v)}" for k, v in d.items())  # noqa: E731
    return (f"queue {q.name} uses {state.queue_used.get(q.name, 0)} device(s) (guarantee {show(g) or 'none'}"
            + (f"; capability {show(c)}" if c else "") + ")")


def _device_asks(model: str, need: int) -> dict[str, int]:
    """The scopes a job of ``need`` devices of ``model`` counts in: the model, its kind, any model."""
    return {model: need, kind_of(model): need, ANY_DEVICES: need}


def _place_on_host(job: Job, state: PlacementState, policy: Policy, q: Any) -> Decision:
    """A job asking for no device: any node with its CPU and memory free, as the Kubernetes scheduler places a
    CPU pod; nodes without accelerators first (the accelerator nodes' CPU stays for their devices' jobs)."""
    inv = state.inventory
    fit = (state.cpu_free >= job.cpu_millicores) & (state.mem_free >= job.memory_bytes)
    if not len(fit) or not fit.any():
        stated = np.array([n.cpu_millicores is not None for n in inv.nodes], dtype=bool)  # not the unknown's stand-in
        free_cpu = show_amount("cpu", int(state.cpu_free[stated].max())) if stated.any() else "not stated"
        return Decision(job=job.name, placed=False, model=None, explanation=(
            f"{job.name} waits: no node has {show_amount('cpu', job.cpu_millicores)} CPU and "
            f"{show_amount('memory', job.memory_bytes)} of memory free" + (f" (most CPU free: {free_cpu})" if len(fit) else "")))
    host_only = np.array([not has_devices(m) for m in state.models], dtype=bool)[state.model_of]
    idx = np.flatnonzero(fit & host_only) if (fit & host_only).any() else np.flatnonzero(fit)
    node = int(idx[int(np.argmax(policy.node_scores(job, state, idx)))])
    model = DeviceKind.host().value
    state.take(job, model, [(node, 0)])
    name = inv.nodes[node].name
    tp_text = (f"{job.throughput.get(model, 0.0):.3g} steps/s" if job.throughput is not None else "throughput unknown")
    reason = "the first listed that fits" if policy.name == "listed" else "CPU and memory free"
    extras = [_quota_text(q, state)] if inv.queues else []
    extras.append(f"{state.cost[node]:.2f}/device-h")
    on = ("" if not has_devices(inv.nodes[node].model) else
          f" (a {inv.nodes[node].model} node: " + ("no node without accelerators has room)" if host_only.any()
                                                   else "the inventory lists no node without accelerators)"))
    return Decision(job=job.name, placed=True, model=model, nodes=((node, 0),), node_names=(name,),
                    explanation=f"{job.name} -> {model} on {name}{on}: {reason}, {tp_text}; " + ", ".join(extras))


def place_round(jobs: Sequence[Job], state: PlacementState, policy: Policy | str = "throughput") -> list[Decision]:
    """Place ``jobs`` on ``state`` (updated in place: free devices, CPU and memory, queue usage, device free times).

    Jobs are taken in :meth:`Policy.order`; later jobs backfill what earlier ones cannot use. For each job:
    filter (model allowed by the job and its throughput, device memory, free devices, the node's free CPU and
    memory, the queue's capability and other queues' guarantees, each per key as the inventory states it: per
    model, per device kind, any model, CPU, memory), score the models (:meth:`Policy.model_scores`, or the
    estimated finish time when the job has ``steps`` and ``state.device_free_at`` is known), pick a model, then the
    best node(s) (:meth:`Policy.node_scores`). A job asking for no device goes to any node with its CPU and memory
    free (:func:`_place_on_host`).

    Returns:
        One :class:`Decision` per job, in placement order.
    """
    policy = get_policy(policy)
    out: list[Decision] = []
    inv = state.inventory
    for job in policy.order(jobs, state):
        q = inv.queue(job.queue)
        need = max(job.count, 1) if has_devices(job.kind) else 0
        host = job.host_asks
        held = _over_limit(q, state, {ANY_DEVICES: need, **host})
        if held is not None:
            out.append(Decision(job=job.name, placed=False, model=None, explanation=f"{job.name} waits: {held}"))
            continue
        host_borrow = _borrowing(q, state, host)
        if host_borrow is not None and not q.reclaimable:
            out.append(Decision(job=job.name, placed=False, model=None,
                                explanation=f"{job.name} waits: {host_borrow}, and queue {q.name} is not reclaimable"))
            continue
        if need == 0 and job.kind is not None:
            out.append(_place_on_host(job, state, policy, q))
            continue
        allowed = _allowed_models(job, state)
        if not allowed.any():
            why = "no model in the inventory can run it" + (f" (it names {job.requested_model})" if job.requested_model else "")
            out.append(Decision(job=job.name, placed=False, model=None, explanation=f"{job.name} waits: {why}"))
            continue
        # quota, per model: the queue's capability per model and kind; others' unmet guarantees stay free unless
        # this queue's jobs are reclaimable
        held_by: list[str] = []
        keyed = any(k not in (ANY_DEVICES, "cpu", "memory") for k in q.limits())
        for i in np.flatnonzero(allowed) if keyed or not q.reclaimable else ():  # else nothing depends on the model
            m = state.models[int(i)]
            why = _over_limit(q, state, {m: need, kind_of(m): need}) if has_devices(m) else None
            if why is None and not q.reclaimable and has_devices(m):
                b = _borrowing(q, state, _device_asks(m, need))
                why = None if b is None else f"{b}, and queue {q.name} is not reclaimable"
            if why is not None:
                allowed[i] = False
                held_by.append(why)
        if not allowed.any():
            out.append(Decision(job=job.name, placed=False, model=None, explanation=f"{job.name} waits: {held_by[0]}"))
            continue
        mem_ok = state.mem >= job.device_memory_bytes if job.device_memory_bytes else np.ones(len(state.mem), dtype=bool)
        room = state.free > 0 if need else np.ones(len(state.free), dtype=bool)
        host_ok = ((state.cpu_free >= job.cpu_millicores) & (state.mem_free >= job.memory_bytes)
                   if job.cpu_millicores or job.memory_bytes else True)
        usable = state.room(job)  # a job in pods: the devices of the pods each node holds
        mask = mem_ok & room & host_ok & (usable > 0 if need else True) & allowed[state.model_of]
        free_by_model = np.bincount(state.model_of[mask], weights=usable[mask], minlength=len(state.models))
        fits = allowed & (free_by_model >= need) if need else allowed & (np.bincount(state.model_of[mask], minlength=len(state.models)) > 0)
        rel = _relative_throughput(job, state)
        scores = policy.model_scores(job, state, allowed)
        finish = None
        if policy.wait_for_faster and job.steps is not None and job.throughput is not None and state.device_free_at and need:
            finish = np.full(len(state.models), np.inf)
            start = np.full(len(state.models), np.inf)
            for i, m in enumerate(state.models):
                times = state.device_free_at.get(m)
                tp = job.throughput.get(m, 0.0)
                if allowed[i] and times is not None and times.size >= need and tp > 0:
                    start[i] = max(float(np.partition(times, need - 1)[need - 1]), state.now)
                    finish[i] = start[i] + job.steps / tp
            scores = np.where(np.isfinite(finish), -finish, -np.inf)
        choice = int(np.argmax(scores)) if np.isfinite(scores).any() else -1
        if choice < 0:
            out.append(Decision(job=job.name, placed=False, model=None, explanation=f"{job.name} waits: no model it may use"))
            continue
        model = state.models[choice]
        if finish is not None and not fits[choice]:
            # wait for the faster model: hold its devices from their free time on (later jobs see them taken)
            times = state.device_free_at[model]
            k = np.argpartition(times, need - 1)[:need]
            times[k] = finish[choice]
            alt = np.where(fits & np.isfinite(finish), finish, np.inf)
            alt_text = (f" vs {_fmt_s(float(alt.min()) - state.now)} on free {state.models[int(np.argmin(alt))]}"
                        if np.isfinite(alt).any() else "")
            out.append(Decision(job=job.name, placed=False, model=model, explanation=(
                f"{job.name} waits for {model} (x{need} free in {_fmt_s(start[choice] - state.now)}): done in "
                f"{_fmt_s(finish[choice] - state.now)} there{alt_text}")))
            continue
        if not fits[choice]:
            # no finish estimate: take the best model that fits now
            fit_scores = np.where(fits, scores, -np.inf)
            if not np.isfinite(fit_scores).any():
                dev_ok = mem_ok & room & allowed[state.model_of]  # free devices, whatever CPU or memory holds them
                dev_free = np.bincount(state.model_of[dev_ok], weights=state.free[dev_ok], minlength=len(state.models))
                best_free = int(dev_free[allowed].max()) if allowed.any() else 0
                mem_note = f" with >= {job.device_memory_bytes / 2**30:.0f} GiB device memory" if job.device_memory_bytes else ""
                out.append(Decision(job=job.name, placed=False, model=model, explanation=(
                    f"{job.name} waits: needs {need} free device(s){mem_note} of one model among "
                    f"{', '.join(m for m, a in zip(state.models, allowed, strict=True) if a)}; most free: {best_free}"
                    + _host_note(job, state, mem_ok & room & allowed[state.model_of], np.broadcast_to(host_ok, mem_ok.shape))
                    + _pods_note(job, state, best_free, int(free_by_model[allowed].max()) if allowed.any() else 0,
                                 int(state.free[dev_ok].max()) if dev_ok.any() else 0))))
                continue
            choice = int(np.argmax(fit_scores))
            model = state.models[choice]
        taken = _take_nodes(job, state, policy, choice, mask)
        if not taken:
            out.append(Decision(job=job.name, placed=False, model=model, explanation=f"{job.name} waits: no {model} node fits"))
            continue
        borrowed = need > 0 and (_borrowing(q, state, _device_asks(model, need)) is not None or host_borrow is not None)
        state.take(job, model, taken)
        if finish is not None and model in state.device_free_at:
            times = state.device_free_at[model]
            k = np.argpartition(times, need - 1)[:need]
            times[k] = finish[choice]
        names = tuple(inv.nodes[n].name for n, _ in taken)
        where = names[0] if len(names) == 1 else f"{len(names)} nodes ({names[0]}, ...)"
        tp_text = (f"{job.throughput.get(model, 0.0):.3g} steps/s = {rel[choice]:.2f} of its best"
                   if job.throughput is not None else "throughput unknown")
        reason = {
            "static": "the model it names",
            "least-loaded": "the least-loaded model",
            "listed": "the first listed that fits",
        }.get(policy.name, "finishes first" if finish is not None else "fastest that fits")
        extras = []
        if finish is not None:
            extras.append(f"done in {_fmt_s(finish[choice] - state.now)}")
        if job.dataset and any(job.dataset in inv.nodes[n].datasets for n, _ in taken):
            extras.append(f"{job.dataset} cached")
        if inv.queues:
            extras.append(_quota_text(q, state) + (", borrowed" if borrowed else ""))
        node0 = taken[0][0]
        extras.append(f"{state.cost[node0]:.2f}/device-h")
        out.append(Decision(job=job.name, placed=True, model=model, nodes=tuple(taken), node_names=names, borrowed=borrowed,
                            explanation=f"{job.name} -> {model if not need else f'{model} x{need}'} on {where}: {reason}, {tp_text}; " + ", ".join(extras)))
    return out


def _host_note(job: Job, state: PlacementState, device_ok: np.ndarray, host_ok: np.ndarray) -> str:
    """``; the nodes with those devices free lack its 8 CPU or 32Gi of memory`` where only the CPU or memory holds it."""
    if not (job.cpu_millicores or job.memory_bytes) or not (device_ok & ~host_ok).any():
        return ""
    return (f"; nodes with devices free lack its {show_amount('cpu', job.cpu_millicores)} CPU or "
            f"{show_amount('memory', job.memory_bytes)} of memory")


def _pods_note(job: Job, state: PlacementState, free: int, held: int, one_node: int = 0) -> str:
    """``; pods of 1 device, 6 CPU and 0 of memory each: the nodes' CPU and memory hold 4 device(s)`` where a job in
    pods gets fewer devices than are free; for a job of one pod (``pod_devices`` = ``count``) that its devices are on
    one node, and the most one node has free (``one_node``)."""
    if job.pod_devices and job.pod_devices >= job.count > 1 and not job.distinct_nodes:
        return f"; one pod: its {job.count} device(s) on one node, and no node has them free (most on one node: {one_node})"
    if not job.pod_devices or held >= free:
        return ""
    where = " on distinct nodes" if job.distinct_nodes else ""
    return (f"; pods of {job.pod_devices} device(s), {show_amount('cpu', job.cpu_millicores)} CPU and "
            f"{show_amount('memory', job.memory_bytes)} of memory each{where}: the nodes hold {held} device(s) of them")


# --- reclaim --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Running:
    """A running job, as :func:`reclaim` sees it: its nodes, queue, priority, start time and whether it borrowed."""

    job: Job
    nodes: tuple[tuple[int, int], ...]
    started: float
    borrowed: bool


def reclaim(job: Job, running: Sequence[Running], state: PlacementState) -> tuple[list[Running], str]:
    """Running jobs to preempt so ``job`` can start, Volcano's *reclaim* action: only jobs that borrowed capacity
    (their queue beyond its guarantee) in a reclaimable queue, and only for a job whose queue is under its
    guarantee or whose (queue priority, priority) is higher. Victims: lowest priority first, newest first.

    Returns:
        (victims, one-line explanation); no victims when that cannot make room.
    """
    inv = state.inventory
    q = inv.queue(job.queue)
    need = max(job.count, 1)
    under = state.queue_used.get(q.name, 0) + need <= q.guarantee
    mine = (q.priority, job.priority)
    pool = [r for r in running
            if r.job.queue != q.name and inv.queue(r.job.queue).reclaimable
            and state.queue_used.get(r.job.queue, 0) > inv.queue(r.job.queue).guarantee
            and (under or (inv.queue(r.job.queue).priority, r.job.priority) < mine)]
    pool.sort(key=lambda r: (inv.queue(r.job.queue).priority, r.job.priority, -r.started))
    allowed = _allowed_models(job, state)
    free = state.free_per_model()
    for i, m in enumerate(state.models):
        if not allowed[i]:
            continue
        victims: list[Running] = []
        got = int(free[i])
        over = {name: state.queue_used.get(name, 0) - inv.queue(name).guarantee for name in inv.queues}
        for r in pool:
            if got >= need:
                break
            if not any(state.model_of[n] == i for n, _ in r.nodes) or over.get(r.job.queue, 0) <= 0:
                continue
            victims.append(r)
            got += sum(k for n, k in r.nodes if state.model_of[n] == i)
            over[r.job.queue] = over.get(r.job.queue, 0) - r.job.count
        if got >= need and victims:
            names = ", ".join(f"{v.job.name} ({v.job.queue})" for v in victims)
            why = "its queue is under its guarantee" if under else "it has the higher priority"
            return victims, f"{job.name} reclaims {m} from {names}: {why} and they borrowed capacity"
    return [], f"{job.name}: nothing reclaimable makes room"
