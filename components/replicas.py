"""Mixed candidates: one training job on replicas of several device kinds at once (issue #29 item 1).

A candidate normally asks for one device kind; a *mixed* candidate asks for replicas of several kinds in the same
job, e.g. two GPUs and four NPUs training one model together. Spellings:

- command line: ``-c gpu:count=2+npu:count=4`` (each part is an ordinary ``KIND[:key=value,...]`` candidate,
  joined by ``+``); a candidate list may mix single-kind and mixed entries: ``-c gpu+npu -c gpu -c cpu``
  ("gpu+npu, else gpu, else cpu");
- Python: ``Candidates([[Replicas("gpu", 2), Replicas("npu", 4)], Resources(kind="gpu"), Resources(kind="cpu")])``
  or ``MixedResources.of([Replicas("gpu", 2), Replicas("npu", 4)])``.

``count`` is the number of replicas (one worker process each): on an accelerator kind one device per replica, as
a single-kind candidate's ``count``; on ``cpu`` the number of CPU worker processes (a single-kind CPU candidate has
no ``count``). A :class:`MixedResources` is a :class:`~heteroflow.components.resources.Resources` whose own fields
are those of its first (most preferred) replica group, so code that reads one kind (records, placement, the
fallback rule) sees that group; :attr:`MixedResources.replicas` lists every group. The training launch
(:mod:`heteroflow.components.training.mixed`) starts one torch elastic agent per group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from heteroflow.components.devices.accelerators import DeviceKind
from heteroflow.components.errors import InvalidResources
from heteroflow.components.resources import Resources

__all__ = ["COMPRESSIONS", "JOB_DEFAULTS", "JOB_OPTIONS", "MixedResources", "Replicas", "is_mixed"]

COMPRESSIONS = ("none", "topk", "powersgd")
"""Compression of the gradient exchange between kinds (:mod:`heteroflow.components.training.hierarchy`)."""
JOB_OPTIONS = ("compression", "topk_ratio", "powersgd_rank", "rebalance_every_steps", "rebalance_every_minutes")
"""Options of the whole mixed job; on the command line they may follow any part's fields
(``gpu:count=2+npu:count=4,compression=topk``)."""


class Replicas:
    """``count`` replicas of one device kind in a mixed candidate.

    Args:
        kind: a registered device kind (``"gpu"``, ``"npu"``, ``"cpu"``, an alias) or a :class:`DeviceKind`.
        count: replicas (worker processes; one device each on an accelerator kind), an integer >= 1.
        **fields: any other :class:`~heteroflow.components.resources.Resources` field of each replica's share
            (``accelerator``, ``cpu``, ``memory``, ``node_selector``, ...).

    Attributes:
        count: the replicas.
        resources: one replica's :class:`Resources` (``count=1`` on an accelerator kind, no count on ``cpu``).

    Raises:
        InvalidResources: a bad kind, count or field (the message names the field and what is valid).
    """

    __slots__ = ("count", "resources")

    def __init__(self, kind: DeviceKind | str, count: int = 1, **fields: Any) -> None:
        name = getattr(kind, "value", kind)  # 'npu', not DeviceKind('npu')
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidResources(f"count={count!r} of {name!r} replicas is not a replica count; valid: an integer >= 1")
        if "count" in fields:
            raise InvalidResources(f"count given twice for {name!r} replicas; give count once")
        if "nodes" in fields and fields["nodes"] != 1:
            raise InvalidResources(_nodes_message(fields["nodes"], name))
        fields.pop("nodes", None)
        parsed = DeviceKind.parse(kind, field="replicas kind")
        res = Resources.from_dict({"kind": parsed, **({"count": 1} if parsed.has_devices else {}), **fields})
        self.count = count
        self.resources = res

    @property
    def kind(self) -> DeviceKind:
        """The device kind."""
        return DeviceKind.parse(self.resources.kind)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Replicas) and (self.count, self.resources) == (other.count, other.resources)

    def __hash__(self) -> int:
        return hash((self.count, self.resources))

    def __repr__(self) -> str:
        return f"Replicas({self.kind.value!r}, {self.count})"

    def describe(self) -> str:
        """``gpu x2 (nvidia-gpu)``, ``cpu x3``."""
        accel = self.resources.accelerator_spec
        return f"{self.kind.value} x{self.count}" + (f" ({accel.name})" if accel is not None else "")

    def to_dict(self) -> dict[str, Any]:
        """``Resources.to_dict()`` of one replica with ``count`` the replicas; :meth:`from_dict` reads it."""
        return {**self.resources.to_dict(), "count": self.count}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, field: str = "replicas") -> Replicas:
        """Build from a mapping of ``kind``, ``count`` and Resources fields.

        Raises:
            InvalidResources: not a mapping, or a bad field (named with ``field``).
        """
        if not isinstance(data, Mapping) or "kind" not in data:
            raise InvalidResources(f"{field}={data!r} is not a mapping with a kind; valid: {{'kind': 'gpu', 'count': 2, ...}}")
        rest = {k: v for k, v in data.items() if k not in ("kind", "count")}
        kind = DeviceKind.parse(data["kind"], field=f"{field}.kind")
        count = data.get("count")
        if count is None or (count == 0 and not kind.has_devices):
            count = 1
        for name in ("device_memory",):
            if rest.get(name) is None:
                rest.pop(name, None)
        if rest.get("accelerator") is None:
            rest.pop("accelerator", None)
        try:
            return cls(kind, count, **rest)
        except InvalidResources as exc:
            raise InvalidResources(f"{field}: {exc}") from None

    @classmethod
    def parse_spec(cls, spec: str, *, whole: str | None = None) -> Replicas:
        """Parse one ``KIND[:key=value,...]`` part of a mixed candidate (``count`` is the replicas).

        Raises:
            InvalidResources: an empty part, a bad kind, key or value (quotes the whole candidate ``whole``).
        """
        where = f"mixed candidate {whole or spec!r}"
        text = spec.strip()
        if not text:
            raise InvalidResources(f"{where}: an empty part between '+' signs; valid: KIND[:key=value,...]+KIND[:...] (e.g. gpu:count=2+npu:count=4)")
        kind_text, _, rest = text.partition(":")
        count = 1
        fields: list[str] = []
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            if eq and key.strip() == "count":
                try:
                    count = int(value)
                except ValueError:
                    raise InvalidResources(f"count={value.strip()!r} in {where} is not an integer; valid: a whole number of replicas >= 1") from None
                if count < 1:
                    raise InvalidResources(f"count={count} in {where}; valid: a whole number of replicas >= 1")
            else:
                fields.append(item)
        try:
            kind = DeviceKind.parse(kind_text.strip(), field="kind")  # "<where>: kind='foo' is not a device kind..."
            parts = [*fields, *(["count=1"] if kind.has_devices else [])]
            one = Resources.parse_spec(kind.value + (":" + ",".join(parts) if parts else ""), _mixed_part=True)
        except InvalidResources as exc:
            msg = str(exc)
            if msg.startswith("unknown resource field"):  # a misspelled job option lands here too
                msg += f"; or an option of the whole job: {', '.join(JOB_OPTIONS)}"
            raise InvalidResources(msg if where in msg else f"{where}: {msg}") from None
        if one.nodes != 1:  # Replicas() refuses it too: checked here, where the user's spelling is known
            raise InvalidResources(f"{where}: {_nodes_message(one.nodes, kind.value)}")
        out = cls.__new__(cls)
        out.count, out.resources = count, one
        return out


def _nodes_message(nodes: Any, kind: str) -> str:
    return (f"nodes={nodes} on {kind} replicas: a mixed candidate runs one elastic agent per kind, and its replicas "
            f"are placed by count; valid: count=N replicas of each kind, no nodes (e.g. gpu:count=2+npu:count=4)")


def _first_fields(first: Replicas) -> dict[str, Any]:
    res = first.resources
    return {f.name: getattr(res, f.name) for f in dataclasses.fields(Resources) if f.init and f.name not in ("count", "nodes")} | {
        "count": first.count if DeviceKind.parse(res.kind).has_devices else None
    }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MixedResources(Resources):
    """A candidate with replicas of several device kinds in one job (see the module docstring).

    Build it with :meth:`of` (or write ``gpu:count=2+npu:count=4``, or a list of :class:`Replicas` in a
    :class:`~heteroflow.components.resources.Candidates`). The inherited fields are the first group's.

    Attributes:
        replicas: the replica groups, most preferred first, one per kind, >= 2 groups.

    Raises:
        InvalidResources: fewer than two groups, a kind given twice, or inherited fields that are not the first
            group's.
    """

    replicas: tuple[Replicas, ...] = ()
    compression: str = "none"
    topk_ratio: float = 0.01
    powersgd_rank: int = 2
    rebalance_every_steps: int = 50
    rebalance_every_minutes: float = 10.0

    def __post_init__(self) -> None:
        Resources.__post_init__(self)
        if isinstance(self.compression, str):  # TopK as topk
            object.__setattr__(self, "compression", self.compression.strip().lower())
        if self.compression not in COMPRESSIONS:
            from heteroflow.components.errors import did_you_mean

            raise InvalidResources(f"compression={self.compression!r}{did_you_mean([str(self.compression)], COMPRESSIONS)} is "
                                   f"unknown; valid: {', '.join(COMPRESSIONS)} (of the exchange between kinds)")
        ratio = self.topk_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise InvalidResources(f"topk_ratio={ratio!r}; valid: a fraction in (0, 1] (of the gradient's entries top-k sends)")
        rank = self.powersgd_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise InvalidResources(f"powersgd_rank={rank!r}; valid: an integer >= 1 (PowerSGD's matrix_approximation_rank)")
        # an option of the other compression would be silently unused: say which compression it belongs to
        for option, method in (("topk_ratio", "topk"), ("powersgd_rank", "powersgd")):
            if getattr(self, option) != JOB_DEFAULTS[option] and self.compression != method:
                raise InvalidResources(
                    f"{option}={getattr(self, option)!r} applies to compression={method}, and this candidate's compression "
                    f"is {self.compression}; valid: add compression={method}, or leave {option} out")
        steps = self.rebalance_every_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InvalidResources(f"rebalance_every_steps={steps!r}; valid: an integer >= 1 (optimizer steps between share measurements)")
        minutes = self.rebalance_every_minutes
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
            raise InvalidResources(f"rebalance_every_minutes={minutes!r}; valid: a number of minutes > 0")
        groups = tuple(self.replicas)
        for i, g in enumerate(groups):
            if not isinstance(g, Replicas):
                raise InvalidResources(f"replicas[{i}]={g!r} is not a Replicas; valid: Replicas('gpu', 2)")
        if len(groups) < 2:
            raise InvalidResources(
                f"a mixed candidate has {len(groups)} replica group(s); valid: two or more kinds, e.g. gpu:count=2+npu:count=4 "
                "(one kind alone is an ordinary candidate: gpu:count=2)"
            )
        seen: dict[str, int] = {}
        for i, g in enumerate(groups):
            if g.kind.value in seen:
                raise InvalidResources(
                    f"kind {g.kind.value!r} is given twice (parts {seen[g.kind.value] + 1} and {i + 1} between '+' signs, "
                    f"replicas[{seen[g.kind.value]}] and replicas[{i}]); valid: each kind once, "
                    "with count=N for N replicas (gpu:count=2+npu:count=4)"
                )
            seen[g.kind.value] = i
        if DeviceKind.parse(self.kind) is not groups[0].kind:
            raise InvalidResources(f"kind={DeviceKind.parse(self.kind).value!r} is not the first replica group's ({groups[0].kind.value}); build it with MixedResources.of")
        object.__setattr__(self, "replicas", groups)

    @classmethod
    def of(cls, replicas: Iterable[Replicas | Mapping[str, Any] | str], **options: Any) -> MixedResources:
        """A mixed candidate from its replica groups (:class:`Replicas`, mappings or ``KIND[:...]`` parts) and the
        job's options (``compression``: none, topk or powersgd; ``topk_ratio``, in (0, 1], the fraction of the
        gradient's entries top-k sends, default 0.01; ``powersgd_rank``, >= 1, default 2; ``rebalance_every_steps``, >= 1;
        ``rebalance_every_minutes``, > 0: shares are re-measured at whichever comes first).

        Raises:
            InvalidResources: as the class says.
        """
        groups: list[Replicas] = []
        for i, g in enumerate(replicas):
            if isinstance(g, Replicas):
                groups.append(g)
            elif isinstance(g, Mapping):
                groups.append(Replicas.from_dict(g, field=f"replicas[{i}]"))
            elif isinstance(g, str):
                groups.append(Replicas.parse_spec(g))
            else:
                raise InvalidResources(f"replicas[{i}]={g!r} is not a Replicas, a mapping or a 'KIND:count=N' part")
        if not groups:
            raise InvalidResources("replicas is empty; valid: two or more Replicas, e.g. [Replicas('gpu', 2), Replicas('npu', 4)]")
        unknown = sorted(set(options) - set(JOB_OPTIONS))
        if unknown:
            raise InvalidResources(f"unknown mixed-job option(s) {', '.join(unknown)}; valid: {', '.join(JOB_OPTIONS)}")
        return cls(**_first_fields(groups[0]), replicas=tuple(groups), **options)

    @classmethod
    def parse_spec(cls, spec: str) -> MixedResources:  # type: ignore[override]
        """Parse ``KIND[:key=value,...]+KIND[:...]`` (e.g. ``gpu:count=2+npu:count=4``).

        Raises:
            InvalidResources: a malformed part (quoted with the whole candidate), a kind twice, one part only.
        """
        parts, options = [], {}
        for part in spec.split("+"):
            if ":" not in part and "," in part:  # gpu+npu,compression=topk: options right after a kind
                part = part.replace(",", ":", 1)
            kind, colon, rest = part.partition(":")
            kept = []
            for item in rest.split(","):
                key, eq, value = item.partition("=")
                if eq and key.strip() in JOB_OPTIONS:
                    key = key.strip()
                    if key in options:
                        raise InvalidResources(f"mixed candidate {spec!r}: {key} is given twice; give it once")
                    whole = key in ("rebalance_every_steps", "powersgd_rank")
                    try:
                        options[key] = value.strip() if key == "compression" else (int(value) if whole else float(value))
                    except ValueError:
                        raise InvalidResources(f"{key}={value.strip()!r} in mixed candidate {spec!r} is not "
                                               + ("a whole number" if whole else "a number")) from None
                else:
                    kept.append(item)
            parts.append(kind + (colon + ",".join(kept) if any(k.strip() for k in kept) else ""))
        groups = [Replicas.parse_spec(p, whole=spec) for p in parts]
        try:
            return cls.of(groups, **options)
        except InvalidResources as exc:  # a kind twice, a bad job option: said with the candidate as written
            raise InvalidResources(f"mixed candidate {spec!r}: {exc}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MixedResources:  # type: ignore[override]
        """Read :meth:`to_dict`'s form (its ``replicas`` list; the other keys repeat the first group).

        Raises:
            InvalidResources: ``replicas`` is not a list of replica mappings.
        """
        groups = data.get("replicas") if isinstance(data, Mapping) else None
        if not isinstance(groups, (list, tuple)):
            raise InvalidResources(f"replicas={groups!r} is not a list; valid: [{{'kind': 'gpu', 'count': 2}}, {{'kind': 'npu', 'count': 4}}]")
        return cls.of(groups, **(data.get("mixed") or {}))

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds' names, in order."""
        return tuple(g.kind.value for g in self.replicas)

    @property
    def total_replicas(self) -> int:
        """Worker processes of the whole job."""
        return sum(g.count for g in self.replicas)

    def describe(self) -> str:
        """``gpu x2 (nvidia-gpu) + npu x4 (ascend-910)``."""
        return " + ".join(g.describe() for g in self.replicas)

    def to_dict(self) -> dict[str, Any]:
        """Resources' dict of the first group plus ``replicas`` (every group's :meth:`Replicas.to_dict`)."""
        options = {k: getattr(self, k) for k in JOB_OPTIONS if getattr(self, k) != JOB_DEFAULTS[k]}
        return {**Resources.to_dict(self), "replicas": [g.to_dict() for g in self.replicas], **({"mixed": options} if options else {})}


JOB_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(MixedResources) if f.name in JOB_OPTIONS}
"""The mixed-job options' defaults (:class:`MixedResources`' own), by name."""


def is_mixed(resources: Any) -> bool:
    """Whether ``resources`` is a mixed candidate."""
    return isinstance(resources, MixedResources)
