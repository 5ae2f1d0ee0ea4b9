"""Hierarchical, share-weighted gradient exchange of a mixed job (issue #29 items 1, 2, 5).

Groups (:class:`Hierarchy`)
    Every replica knows its device kind; the ranks of one kind form a *kind group* (its native backend on a real
    cluster: ``nccl`` for GPUs, ``hccl`` for Ascend NPUs; on this machine and for simulated kinds a gloo subgroup
    stands in), and the lowest rank of each kind is its *leader*. The leaders form the *cross-kind group*, always
    gloo on host tensors: no stock library runs a collective between NCCL and HCCL devices (the hierarchical
    all-reduce of KAITIAN, 2025, and of Whale, ATC'22).

One exchange (:func:`hierarchical_hook`, a DDP communication hook [DH])
    1. rank ``r`` scales its bucket by its share ``b_r / B`` (its samples over the global batch's), so the sum
       over ranks is the gradient of the whole global batch's mean loss (the built-in hooks average, which
       weights every rank alike);
    2. sum within the kind group (to every member);
    3. the leaders sum across kinds, on CPU copies, optionally compressed; uncompressed, each leader sends its
       bucket to every other leader and receives theirs (gloo ``isend`` / ``irecv``: one message each way, where
       gloo's ring all-reduce takes several round trips; see :func:`_exchange_start`) and sums the parts in leader
       order, so every leader gets the same sum bit for bit;
       - ``topk``: each leader sends its ``k = ceil(ratio * n)`` largest-magnitude entries (values float32 and
         indices int32) with error feedback: what it did not send is added to its next exchange (Stich et al.
         2018, "Sparsified SGD with Memory", NeurIPS; Lin et al. 2018, "Deep Gradient Compression", ICLR); the
         values are already share-weighted, so the sum of what arrives weights each kind by its share; with SGD
         and momentum, DGC's momentum correction and factor masking (:func:`_topk_select`);
       - ``powersgd``: torch's ``powerSGD_hook`` (Vogels et al. 2019, NeurIPS) on the cross-kind group, with
         ``matrix_approximation_rank`` ``rank``; it averages, so the bucket is first multiplied by the number of
         leaders;
    4. each leader broadcasts the result to its kind group.

    A kind with one replica and no compression sends each bucket across kinds asynchronously (the hook returns
    a future it completes itself), so the exchange of one bucket overlaps the backward pass of the next, as
    DDP's own all-reduce does [DH]; the step's last bucket (which DDP would wait for at once) waits in the hook
    for its own exchange and the earlier ones, sums them and completes their futures, so no callback runs on
    gloo's threads (which would wait for the GIL). The other cases wait for each step of the exchange in the
    hook.

    :attr:`HookState.bytes_sent` counts what one leader sends across kinds per exchange: the bucket's float32
    bytes uncompressed; values plus indices for top-k; the P and Q factors (and the uncompressed tensors) for
    PowerSGD. The simulated slow-down of a kind (:class:`~heteroflow.components.training.shares.SlowDown`) runs in
    each hook call, for the compute since the last one, so each bucket leaves when a device at that speed would
    have it ready.

Sources: [DH] DDP communication hooks, https://pytorch.org/docs/stable/ddp_comm_hooks.html.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = ["CROSS_COMPRESSIONS", "POWERSGD_CARRIED", "Hierarchy", "HookState", "check_compression", "hierarchical_hook"]

POWERSGD_CARRIED = ("iter", "rng", "error_dict", "p_memory_dict", "q_memory_dict")
"""The fields of torch's ``PowerSGDState`` that change from step to step and that a checkpoint keeps (its
``__getstate__`` keeps every slot but the process group; the others are hyperparameters or statistics)."""

CROSS_COMPRESSIONS = ("none", "topk", "powersgd")
"""Compression of the cross-kind exchange: none, top-k with error feedback, torch's PowerSGD."""


def check_compression(compression: str, topk_ratio: float, powersgd_rank: int) -> None:
    """Check the cross-kind compression's settings (a mixed job's and :class:`HookState`'s).

    Raises:
        InvalidParameter: ``compression`` not one of :data:`CROSS_COMPRESSIONS`, ``topk_ratio`` not a fraction in
            (0, 1], or ``powersgd_rank`` not an integer >= 1 (the message names the field and what is valid).
    """
    if compression not in CROSS_COMPRESSIONS:
        raise InvalidParameter(f"compression={compression!r} is unknown; valid: {', '.join(CROSS_COMPRESSIONS)}")
    if isinstance(topk_ratio, bool) or not isinstance(topk_ratio, (int, float)) or not 0 < topk_ratio <= 1:
        raise InvalidParameter(f"topk_ratio={topk_ratio!r}; valid: a fraction in (0, 1]")
    if isinstance(powersgd_rank, bool) or not isinstance(powersgd_rank, int) or powersgd_rank < 1:
        raise InvalidParameter(f"powersgd_rank={powersgd_rank!r}; valid: an integer >= 1")


@dataclasses.dataclass
class Hierarchy:
    """This rank's place in the kind groups and the cross-kind group (build with :meth:`build`; every rank
    calls it, in the same order).

    Attributes:
        rank / world: global rank and world size.
        kind: this rank's device kind; kinds: every rank's kind, by rank.
        kind_ranks: the ranks of this kind; kind_index: this rank's index among them.
        leaders: the lowest rank of each kind, in order of first rank.
        kind_group / cross_group: the process groups (None where the group has one member).
    """

    rank: int
    world: int
    kind: str
    kinds: list[str]
    kind_ranks: list[int]
    kind_index: int
    leaders: list[int]
    kind_group: Any = None
    cross_group: Any = None

    @property
    def is_leader(self) -> bool:
        return self.rank == self.kind_ranks[0]

    @classmethod
    def build(cls, kind: str, *, kind_backend: str | None = None) -> Hierarchy:
        """Exchange kinds over the world group and create the subgroups (a collective: every rank calls it).

        Args:
            kind: this rank's device kind.
            kind_backend: the backend of the kind groups (nccl/hccl on a cluster); default: the host kind's
                (gloo), which the group across kinds always uses.
        """
        import torch.distributed as dist

        from heteroflow.components.devices import cross_kind_backend

        across = cross_kind_backend()
        kind_backend = kind_backend or across

        rank, world = dist.get_rank(), dist.get_world_size()
        kinds: list[Any] = [None] * world
        dist.all_gather_object(kinds, kind)
        order = list(dict.fromkeys(kinds))
        by_kind = {k: [r for r in range(world) if kinds[r] == k] for k in order}
        leaders = [by_kind[k][0] for k in order]
        kind_group = cross_group = None
        for k in order:  # every rank creates every group, in the same order (new_group is collective)
            members = by_kind[k]
            g = dist.new_group(members, backend=kind_backend) if len(members) > 1 else None
            if k == kind:
                kind_group = g
        if len(leaders) > 1:
            cg = dist.new_group(leaders, backend=across)
            cross_group = cg if rank in leaders else None
        return cls(rank=rank, world=world, kind=kind, kinds=[str(k) for k in kinds], kind_ranks=by_kind[kind],
                   kind_index=by_kind[kind].index(rank), leaders=leaders, kind_group=kind_group, cross_group=cross_group)


@dataclasses.dataclass
class HookState:
    """The state :func:`hierarchical_hook` reads and updates.

    Attributes:
        hierarchy: the groups.
        shares: samples of each rank in the global batch (by rank; set again when shares are rebalanced).
        compression: one of :data:`CROSS_COMPRESSIONS`.
        topk_ratio: the fraction of entries top-k sends, (0, 1].
        powersgd_rank: PowerSGD's ``matrix_approximation_rank``, >= 1. Torch's PowerSGD state (error feedback,
            warm-started factors, iteration count, generator) lives on each kind's leader; a checkpoint keeps it
            per kind (:meth:`powersgd_state`, :meth:`load_powersgd_state`), moved with its parameters when DDP's
            bucket layout changes (:func:`_powersgd_relayout`).
        topk_momentum: top-k's momentum correction (DGC): the SGD momentum taken out of the optimizer, which
            the exchange accumulates instead (:func:`_topk_select`); 0.0: top-k accumulates the gradient. The
            velocity and the residual live in this state, on each kind's leader; a checkpoint keeps them per kind
            (:meth:`topk_state`, :meth:`load_topk_state`).
        slowdown: the simulated slow-down of this kind (None: full speed).
        bytes_sent / bytes_uncompressed: what this rank sent across kinds, and what it would have sent
            uncompressed (bytes, summed over exchanges).
        step_started: when the compute now running began (by :attr:`clock`; reset after each hook call).
        step_busy: busy seconds of this step so far: compute by :attr:`clock` over the simulated speed (what
            throughput, and so the shares, are measured by).
        step_busy_wall: busy wall time of this step so far: compute's wall time and the simulated slow-down's
            sleep, ``(1/speed - 1)`` times that wall time (what utilization is).
        step_hook_own: wall time of this step's hook calls that wait for no peer (the asynchronous path: scaling
            the bucket, starting its exchange), which delays this replica's next bucket like compute does.
        step_weight: this step's weight when it is not the share's (a partial global batch); None otherwise.
        param_positions: ``id(parameter) -> position`` in the model's parameters, which top-k's residual and
            velocity are laid out by when DDP moves a parameter to another place in its bucket (:func:`_relayout`);
            empty: kept by position in the bucket.
        clock: what measures compute for the shares: ``time.perf_counter`` (wall time, what a step waits for;
            :mod:`~heteroflow.components.training.mixed` uses it on every device), or ``time.thread_time`` (this
            thread's CPU time: steadier on a loaded machine, but blind to the compute's waits for a core).
    """

    hierarchy: Hierarchy
    shares: list[int]
    compression: str = "none"
    topk_ratio: float = 0.01
    powersgd_rank: int = 2
    topk_momentum: float = 0.0
    slowdown: Any = None
    bytes_sent: int = 0
    bytes_uncompressed: int = 0
    step_started: float = 0.0
    step_busy: float = 0.0
    step_busy_wall: float = 0.0
    step_hook_own: float = 0.0
    clock: Any = time.perf_counter
    param_positions: dict[int, int] = dataclasses.field(default_factory=dict)
    step_weight: float | None = None
    phase_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    _started_wall: float = 0.0
    _hooks: int = 0
    _residuals: dict[int, Any] = dataclasses.field(default_factory=dict)
    _velocity: dict[int, Any] = dataclasses.field(default_factory=dict)
    _layouts: dict[int, tuple[tuple[int, int], ...]] = dataclasses.field(default_factory=dict)  # of the two above
    _powersgd: Any = None
    _powersgd_layouts: dict[int, tuple[tuple[int, tuple[int, ...]], ...]] = dataclasses.field(default_factory=dict)
    _received: dict[tuple[int, int], Any] = dataclasses.field(default_factory=dict)  # (bucket, leader): receive buffer
    _pending: list[Any] = dataclasses.field(default_factory=list)  # this step's exchanges still in flight

    def __post_init__(self) -> None:
        check_compression(self.compression, self.topk_ratio, self.powersgd_rank)
        if self.compression == "powersgd" and self.hierarchy.cross_group is not None:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            self._powersgd = powerSGD_hook.PowerSGDState(
                process_group=self.hierarchy.cross_group, matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=2, min_compression_rate=2, use_error_feedback=True, warm_start=True,
                random_seed=0)

    def begin_step(self) -> None:
        """Mark the start of a step's compute."""
        self.step_busy = self.step_busy_wall = self.step_hook_own = 0.0
        self._hooks = 0
        self.resume()

    def resume(self) -> None:
        """Compute (re)starts now: at the step's start and when a hook call returns."""
        self.step_started, self._started_wall = self.clock(), time.perf_counter()

    def end_compute(self) -> None:
        """The compute since the last mark is over (each hook call: a bucket of gradients is ready): add it to the
        step's busy time and sleep this kind's slow-down for it, so the bucket leaves when a device at this speed
        would have it ready."""
        compute = self.clock() - self.step_started
        now = time.perf_counter()
        wall = now - self._started_wall
        # the sleep follows the compute's wall time (a loaded machine stretches both kinds' compute alike, so the
        # slower kind keeps its speed ratio in wall time); the shares follow :attr:`clock` (this thread's CPU time
        # on the CPU: steadier under load), scaled by the same speed
        speed = self.slowdown.speed if self.slowdown is not None else 1.0
        busy_wall = self.slowdown.pause(wall) if self.slowdown is not None else wall
        self.step_busy += compute / speed
        self.step_busy_wall += busy_wall
        self.add_phase("compute", wall)
        if busy_wall > wall:
            self.add_phase("slowdown", time.perf_counter() - now)
        self.resume()

    def end_backward(self) -> None:
        """Backward returned. With no hook call this step its compute ends here; otherwise the time since the last
        hook call was DDP waiting for the exchange and copying gradients (exchange, not compute)."""
        if self._hooks == 0:
            self.end_compute()
        else:
            self.add_phase("exchange_wait", time.perf_counter() - self._started_wall)

    def add_phase(self, name: str, seconds: float) -> None:
        """Add ``seconds`` (wall time) to phase ``name`` of :attr:`phase_seconds`."""
        self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + seconds

    def topk_state(self) -> dict[str, Any]:
        """What a top-k exchange carries from step to step on this leader, as CPU copies: ``{"residuals": {bucket
        index: 1-D float32 tensor}, "velocity": {...}, "layouts": {bucket index: ((parameter position, entries),
        ...)}}`` (empty dicts before the first exchange, or off a leader)."""
        return {"residuals": {i: t.clone() for i, t in self._residuals.items()},
                "velocity": {i: t.clone() for i, t in self._velocity.items()}, "layouts": dict(self._layouts)}

    def load_topk_state(self, blob: Mapping[str, Any]) -> None:
        """Take back what :meth:`topk_state` gave (a resumed run goes on with the residual and velocity the
        checkpointed step had, so it matches the uninterrupted run). A bucket is checked when first exchanged: its
        parameters are moved to the bucket's layout then (:func:`_relayout`), and one whose size differs from what
        was saved starts from zero, as :func:`_topk_select` does."""
        self._residuals = {int(i): t.clone() for i, t in (blob.get("residuals") or {}).items()}
        self._velocity = {int(i): t.clone() for i, t in (blob.get("velocity") or {}).items()}
        self._layouts = {int(i): tuple(tuple(x) for x in v) for i, v in (blob.get("layouts") or {}).items()}

    def powersgd_state(self) -> dict[str, Any]:
        """What torch's PowerSGD carries from step to step on this leader (:data:`POWERSGD_CARRIED`: the error
        feedback and the warm-started P and Q factors per bucket index, its iteration count and random generator),
        copied; empty off a leader or without PowerSGD. The process group and the hyperparameters are not in it
        (they come with the job)."""
        ps = self._powersgd
        if ps is None:
            return {}
        import copy

        return {**{slot: copy.deepcopy(getattr(ps, slot)) for slot in POWERSGD_CARRIED}, "layouts": dict(self._powersgd_layouts)}

    def load_powersgd_state(self, blob: Mapping[str, Any]) -> None:
        """Take back what :meth:`powersgd_state` gave, into this leader's PowerSGD state (its process group and
        hyperparameters kept). A resumed run then compresses its next step as the uninterrupted run would: without
        it, the first ``start_powerSGD_iter`` steps after a resume are sent uncompressed and the error feedback and
        factors restart from zero. Slots missing from ``blob`` are left as they are; nothing happens without
        PowerSGD."""
        ps = self._powersgd
        if ps is None:
            return
        import copy

        for slot in POWERSGD_CARRIED:
            if slot in blob:
                setattr(ps, slot, copy.deepcopy(blob[slot]))
        self._powersgd_layouts = {int(i): tuple((int(pos), tuple(shape)) for pos, shape in v)
                                  for i, v in (blob.get("layouts") or {}).items()}

    def weight(self) -> float:
        """This rank's weight in the step's update: :attr:`step_weight` when set (an epoch's last, partial global
        batch: :meth:`GlobalSampler.weight <heteroflow.components.training.shares.GlobalSampler.weight>`), else
        its share of the global batch."""
        if self.step_weight is not None:
            return self.step_weight
        return self.shares[self.hierarchy.rank] / sum(self.shares)


def _powersgd_bytes(state: HookState, bucket: Any, rank: int) -> int:
    """Bytes one leader sends in a PowerSGD exchange of ``bucket`` (torch's rule: a tensor of 2+ dimensions
    viewed as ``n x m`` is compressed to P ``n x r`` and Q ``m x r`` when ``(n + m) * r * min_rate < n * m``)."""
    ps = state._powersgd
    if ps is None or ps.iter < ps.start_powerSGD_iter:
        return bucket.buffer().numel() * 4
    total = 0
    for t in bucket.gradients():
        if t.ndimension() > 1:
            n, m = t.shape[0], t.numel() // t.shape[0]
            r = min(n, m, rank)
            if (n + m) * r * ps.min_compression_rate < n * m:
                total += (n + m) * r * 4
                continue
        total += t.numel() * 4
    return total


def _topk_select(state: HookState, flat: Any, index: int) -> tuple[Any, Any]:
    """What one leader sends of bucket ``index`` in a top-k exchange: the values (float32) and indices (int64) of
    the ``k = ceil(topk_ratio * n)`` largest magnitudes of its accumulator, ``flat`` being this step's
    share-weighted gradient (1-D, ``n`` entries; not modified).

    Error feedback (Stich et al. 2018, "Sparsified SGD with Memory", NeurIPS): the accumulator keeps what was not
    sent and adds the next step's to it. With :attr:`HookState.topk_momentum` ``m > 0`` (the optimizer's momentum,
    taken out of it: ``mixed._take_momentum``), momentum correction and momentum factor masking as in Lin et al.
    2018, "Deep Gradient Compression", ICLR, section 3.2 and Algorithm 2: the velocity ``u = m * u + g``
    accumulates, not the gradient ``g``, and both ``u`` and the accumulator are zeroed where they were sent.
    Without the correction the accumulated gradient reaches the optimizer's momentum late and in bursts, each then
    applied about ``1 / (1 - m)`` times over (SGD with momentum 0.9 at top-k 1% collapsed to a constant prediction
    in ``benchmarks/hetero.py``); without the masking the velocity of a sent entry goes on pushing the stale
    direction (the same collapse, measured). With density 1 this is SGD *without* momentum, since every entry of
    ``u`` is zeroed every step.
    """
    m = state.topk_momentum
    if m:
        velocity = state._velocity.get(index)
        if velocity is None or velocity.shape != flat.shape:
            velocity = state._velocity[index] = flat.clone()
        else:
            velocity.mul_(m).add_(flat)
        flat = velocity
    acc = state._residuals.get(index)
    if acc is None or acc.shape != flat.shape:
        acc = state._residuals[index] = flat.clone()
    else:
        acc.add_(flat)
    k = max(1, math.ceil(state.topk_ratio * acc.numel()))
    _, idx = acc.abs().topk(k, sorted=False)
    values = acc[idx]
    acc[idx] = 0.0  # what stays is the next exchange's residual
    if m:
        velocity[idx] = 0.0
    return values, idx


def _layout(state: HookState, bucket: Any) -> tuple[tuple[int, int], ...] | None:
    """Where each parameter's gradient lies in ``bucket``'s flat buffer: ``((position in the model's parameters,
    entries), ...)`` in buffer order; None when :attr:`HookState.param_positions` does not know a parameter or the
    sizes do not add up to the buffer."""
    params = bucket.parameters()
    layout = tuple((state.param_positions.get(id(p), -1), p.numel()) for p in params)
    if not layout or any(pos < 0 for pos, _ in layout) or sum(n for _, n in layout) != bucket.buffer().numel():
        return None
    return layout


def _relayout(state: HookState, index: int, layout: tuple[tuple[int, int], ...] | None) -> None:
    """Move bucket ``index``'s top-k residual and velocity to ``layout`` when the bucket's parameters moved since
    they were kept. DDP rebuilds its buckets after the first step in the order the gradients became ready
    (``torch.nn.parallel.DistributedDataParallel``; torch's PowerSGD hook waits ``start_powerSGD_iter`` steps for
    this reason), and a resumed run's first step has the first layout again: kept by position in the flat bucket,
    a residual would be added to other parameters' gradients. A parameter not in the kept layout starts from zero.
    """
    import torch

    if layout is None:
        return
    old = state._layouts.get(index)
    state._layouts[index] = layout
    if old is None or old == layout:
        return
    for store in (state._residuals, state._velocity):
        flat = store.get(index)
        if flat is None:
            continue
        if flat.numel() != sum(n for _, n in old):
            del store[index]
            continue
        pieces, offset = {}, 0
        for pos, n in old:
            pieces[pos] = flat[offset:offset + n]
            offset += n
        store[index] = torch.cat([pieces[pos] if pos in pieces and pieces[pos].numel() == n
                                  else torch.zeros(n, dtype=flat.dtype) for pos, n in layout])


def _shape_layout(state: HookState, bucket: Any) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """``bucket``'s parameters as ``((position in the model's parameters, shape), ...)`` in buffer order (what
    PowerSGD's per-bucket memory is laid out by); None as for :func:`_layout`."""
    layout = tuple((state.param_positions.get(id(p), -1), tuple(p.shape)) for p in bucket.parameters())
    if not layout or any(pos < 0 for pos, _ in layout):
        return None
    return layout


def _powersgd_segments(layout: tuple[tuple[int, tuple[int, ...]], ...], rank: int, min_rate: float) -> dict[str, list[tuple[int, int]]]:
    """Where each parameter's part lies in PowerSGD's three per-bucket memories, ``{"error": [(position, entries),
    ...], "p": [...], "q": [...]}`` in memory order, as torch's ``powerSGD_hook`` lays them out: the error feedback
    as the flat bucket; P (``n x r``) and Q (``m x r``) only for the gradients it compresses (each viewed as ``n x
    m`` with ``n`` its first dimension, ``r = min(n, m, rank)``, compressed when ``_should_compress`` says so),
    grouped by matrix shape in the order each shape first appears, then in bucket order."""
    import math

    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    error = [(pos, math.prod(shape)) for pos, shape in layout]
    by_shape: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for pos, shape in layout:
        n = shape[0] if shape else 1
        m = math.prod(shape) // n if n else 0
        r = min(n, m, rank)
        if _should_compress(n, m, r, min_rate)[0]:
            by_shape.setdefault((n, m), []).append((pos, n * r, m * r))
    ordered = [item for items in by_shape.values() for item in items]
    return {"error": error, "p": [(pos, pn) for pos, pn, _ in ordered], "q": [(pos, qm) for pos, _, qm in ordered]}


def _moved(flat: Any, old: list[tuple[int, int]], new: list[tuple[int, int]]) -> Any:
    """``flat`` (laid out as ``old``) laid out as ``new``; None when the two do not hold the same parts."""
    import torch

    if sorted(old) != sorted(new) or flat.numel() != sum(n for _, n in old):
        return None
    pieces, offset = {}, 0
    for pos, n in old:
        pieces[pos] = flat[offset:offset + n]
        offset += n
    return torch.cat([pieces[pos] for pos, _ in new]) if new else flat


def _powersgd_relayout(state: HookState, index: int, layout: tuple[tuple[int, tuple[int, ...]], ...] | None) -> None:
    """PowerSGD's counterpart of :func:`_relayout`: move bucket ``index``'s error feedback and warm-started P and
    Q to ``layout`` when the bucket's parameters moved since they were kept (a resumed run's first step has DDP's
    first layout again). Memories that do not fit are dropped: torch's hook then starts them again (the error
    feedback from zero, P and Q from its generator), as on its first compressed step."""
    ps = state._powersgd
    if layout is None or ps is None:
        return
    old = state._powersgd_layouts.get(index)
    state._powersgd_layouts[index] = layout
    if old is None or old == layout:
        return
    before = _powersgd_segments(old, ps.matrix_approximation_rank, ps.min_compression_rate)
    after = _powersgd_segments(layout, ps.matrix_approximation_rank, ps.min_compression_rate)
    error = ps.error_dict.get(index)
    if error is not None:
        moved = _moved(error, before["error"], after["error"])
        if moved is None:
            del ps.error_dict[index]
        else:
            ps.error_dict[index] = moved
    if index in ps.p_memory_dict and index in ps.q_memory_dict:
        p = _moved(ps.p_memory_dict[index], before["p"], after["p"])
        q = _moved(ps.q_memory_dict[index], before["q"], after["q"])
        if p is None or q is None:
            del ps.p_memory_dict[index], ps.q_memory_dict[index]
        else:
            ps.p_memory_dict[index], ps.q_memory_dict[index] = p, q


def _topk_exchange(state: HookState, buffer: Any, index: int) -> Any:
    import torch
    import torch.distributed as dist

    group = state.hierarchy.cross_group
    values, idx = _topk_select(state, buffer.detach().to("cpu", torch.float32), index)
    k = values.numel()
    n = dist.get_world_size(group)
    all_values = [torch.empty_like(values) for _ in range(n)]
    all_idx = [torch.empty(k, dtype=torch.int32) for _ in range(n)]
    dist.all_gather(all_values, values, group=group)
    dist.all_gather(all_idx, idx.to(torch.int32), group=group)
    out = torch.zeros(buffer.numel(), dtype=torch.float32)
    for v, i in zip(all_values, all_idx):
        out.index_add_(0, i.long(), v)
    state.bytes_sent += k * (4 + 4)
    return out


def _exchange_start(state: HookState, cpu: Any, index: int) -> tuple[list[Any], list[Any]]:
    """Start the cross-kind exchange of one bucket: this leader sends its (share-weighted) bucket ``cpu`` to every
    other leader and receives theirs (gloo ``isend`` / ``irecv``, tagged with the bucket's index). Returns the
    works and every leader's part in leader order (None for this leader's own, ``cpu``).

    Why not ``all_reduce``: between two processes gloo's ring all-reduce of a 1 MB bucket runs several
    notification round trips, each a wake-up of gloo's I/O thread and then of its worker; on 2 cores it took
    1.9-2.5 ms at the median and 4-6 ms at the 90th percentile, against 0.5-0.6 ms / 0.7-0.8 ms for one send
    and one receive each way (the same 1 MB; 0.2 ms / 0.4 ms for 256 KB; 130 calls each, idle and with 2 ms
    pauses between calls). A leader sends ``(K - 1)`` buckets for ``K`` kinds (a ring sends about 2); kinds are
    few.
    """
    import torch
    import torch.distributed as dist

    h = state.hierarchy
    ops, parts = [], []
    for peer in h.leaders:
        if peer == h.rank:
            parts.append(None)
            continue
        other = state._received.get((index, peer))
        if other is None or other.shape != cpu.shape or other.dtype != cpu.dtype:
            other = state._received[(index, peer)] = torch.empty_like(cpu)
        parts.append(other)
        ops.append(dist.P2POp(dist.isend, cpu, peer, group=h.cross_group, tag=index))
        ops.append(dist.P2POp(dist.irecv, other, peer, group=h.cross_group, tag=index))
    state.bytes_sent += (len(h.leaders) - 1) * cpu.numel() * cpu.element_size()
    return dist.batch_isend_irecv(ops), parts


def _exchange_finish(cpu: Any, works: list[Any], parts: list[Any]) -> None:
    """Wait for the exchange :func:`_exchange_start` began and sum every leader's part into ``cpu``, in leader
    order (so every leader computes the same floating-point sum: bitwise equal results)."""
    for work in works:
        work.wait()
    if len(parts) == 2:  # a + b: the same on both leaders (IEEE addition commutes)
        cpu.add_(parts[1] if parts[0] is None else parts[0])
        return
    total = None
    for part in parts:
        t = cpu if part is None else part
        total = t.clone() if total is None else total.add_(t)
    cpu.copy_(total)


def _finish_pending(state: HookState) -> None:
    """Complete this step's earlier buckets' exchanges (their futures, returned to DDP, get their results)."""
    pending, state._pending = state._pending, []
    for fut, buffer, cpu, works, parts in pending:
        _exchange_finish(cpu, works, parts)
        if cpu.data_ptr() != buffer.data_ptr():
            buffer.copy_(cpu)
        fut.set_result(buffer)


def hierarchical_hook(state: HookState, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations
    """The DDP communication hook of a mixed job (see the module docstring): share-weighted, within each kind,
    then across kinds between leaders (optionally compressed), then back within each kind. Returns a completed
    future of the bucket's gradient (the whole global batch's)."""
    import torch
    import torch.distributed as dist

    state.end_compute()
    state._hooks += 1
    h = state.hierarchy
    t0 = time.perf_counter()
    buffer = bucket.buffer()
    buffer.mul_(state.weight())
    if h.kind_group is not None:
        dist.all_reduce(buffer, group=h.kind_group)
    t1 = time.perf_counter()
    state.add_phase("exchange_kind", t1 - t0)
    if h.cross_group is not None and h.kind_group is None and state.compression == "none":
        # the kind's only replica: its leader sends the bucket across kinds without waiting (gloo runs it on its
        # own threads) and backward goes on to the next bucket; the step's last bucket completes them all
        n = buffer.numel()
        state.bytes_uncompressed += n * 4
        cpu = buffer.detach().to("cpu")
        works, parts = _exchange_start(state, cpu, bucket.index())
        if bucket.is_last():
            # the step's last bucket: DDP would wait for its future right away, and a future's callback (and
            # so backward's end) waited for gloo's thread to get the GIL: 4.5 ms a step after the slower
            # replica's last bucket, against 1.6-2.4 ms for a blocking all-reduce here, 0.3 ms (median, the
            # faster replica at 46:18) for this exchange (benchmarks/hetero.py). The wait is the peer's, not this
            # replica's own time (not in step_hook_own)
            state.step_hook_own += t1 - t0
            state.add_phase("exchange_cross", time.perf_counter() - t1)
            t2 = time.perf_counter()
            _finish_pending(state)
            _exchange_finish(cpu, works, parts)
            if cpu.data_ptr() != buffer.data_ptr():
                buffer.copy_(cpu)
            state.add_phase("exchange_wait", time.perf_counter() - t2)
            state.resume()
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(buffer)
            return done
        # an earlier bucket: its future is completed by the last bucket's call, after its exchange arrived (no
        # callback on gloo's threads, which would wait for the GIL)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        state._pending.append((fut, buffer, cpu, works, parts))
        t2 = time.perf_counter()
        state.add_phase("exchange_cross", t2 - t1)
        state.step_hook_own += t2 - t0
        state.resume()
        return fut
    if h.cross_group is not None:
        n = buffer.numel()
        state.bytes_uncompressed += n * 4
        if state.compression == "topk":
            _relayout(state, bucket.index(), _layout(state, bucket))
            buffer.copy_(_topk_exchange(state, buffer, bucket.index()))
        elif state.compression == "powersgd":
            state.bytes_sent += _powersgd_bytes(state, bucket, state.powersgd_rank)
            buffer.mul_(dist.get_world_size(h.cross_group))  # the hook averages; the parts are already weighted
            _powersgd_relayout(state, bucket.index(), _shape_layout(state, bucket))
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            result = powerSGD_hook.powerSGD_hook(state._powersgd, bucket).wait()
            if result.data_ptr() != buffer.data_ptr():
                buffer.copy_(result)
        else:
            cpu = buffer.detach().to("cpu")
            _exchange_finish(cpu, *_exchange_start(state, cpu, bucket.index()))
            if cpu.data_ptr() != buffer.data_ptr():
                buffer.copy_(cpu)
    t2 = time.perf_counter()
    state.add_phase("exchange_cross", t2 - t1)
    if h.kind_group is not None:
        dist.broadcast(buffer, src=h.kind_ranks[0], group=h.kind_group)
    state.add_phase("exchange_kind", time.perf_counter() - t2)
    state.resume()
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer)
    return fut

