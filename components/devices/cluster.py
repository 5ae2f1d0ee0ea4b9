"""The cluster profile: what a particular Kubernetes cluster calls things, read from a YAML file when compiling.

The same candidate (``Ascend 910B3 x1``) is asked for differently on different clusters: under the official
Ascend device plugin it is ``huawei.com/Ascend910`` plus the node label ``node.kubernetes.io/npu.chip.name:
910B3``, under HAMi it is ``huawei.com/Ascend910B3``. A profile says which convention each vendor follows,
which queue and scheduler the cluster uses and which image runs each device kind. Renderers
(``heteroflow.pipelines.k8s.resources``, ``heteroflow.pipelines.kfp.resources``) take a profile; none is read
at import time, and without one they use :data:`DEFAULT_PROFILE` (official plugins, NVIDIA feature discovery
labels, no queue).

Profile file format (YAML; every key optional; any other key is an error that names it and lists the valid
ones)::

    version: 1                      # the format version; only 1 exists
    name: my-cluster                # shown in messages
    vendors:                        # per accelerator vendor: nvidia, ascend, amd, gaudi
      nvidia:
        plugin: official            # official (NVIDIA k8s-device-plugin) | hami
        labels: gfd                 # gfd: nvidia.com/gpu.product (GPU feature discovery)
                                    # gke: cloud.google.com/gke-accelerator | none
      ascend:
        plugin: official            # official (MindCluster: huawei.com/Ascend910 for 910A/B/C) | hami (per chip)
        labels: npu-chip-name       # node.kubernetes.io/npu.chip.name | none
      amd: {plugin: official, labels: amd-labeller}   # amd.com/gpu.product-name | none
      gaudi: {plugin: official, labels: none}         # Gaudi nodes carry no documented model label
    accelerator_tolerations: true   # tolerate each accelerator's usual taint (nvidia.com/gpu Exists NoSchedule)
    tolerations:                    # added to every pod (Kubernetes' Toleration fields)
      - {key: dedicated, operator: Equal, value: ml, effect: NoSchedule}
    queue:
      volcano: training             # pod annotation scheduling.volcano.sh/queue-name
      kueue: team-a                 # pod label kueue.x-k8s.io/queue-name
    scheduler_name: volcano         # pod spec schedulerName (Airflow pods; KFP cannot set it, see below)
    images:                         # container image per device kind (Airflow pods)
      cpu: registry.example.com/heteroflow:cpu
      gpu: registry.example.com/heteroflow:cuda
      npu: registry.example.com/heteroflow:cann
    labels: {team: vision}          # added to every pod
    annotations: {}                 # added to every pod
    training_job: trainjob          # a multi-worker train: trainjob (Kubeflow Trainer v2 TrainJob) | pytorchjob (v1)
    shared_storage:                 # a multi-node train's data, model and checkpoints: a ReadWriteMany PVC
      claim: heteroflow-shared      # mounted at mount_path in the train task's pod and in every node of the job
      mount_path: /mnt/heteroflow
    prices:                         # cost per device-hour, for the run metrics (heteroflow.pipelines.runs.metrics)
      currency: USD
      gpu: 2.50                     # per device kind (cpu: the CPU share one step gets) ...
      nvidia-a100-80gb: 3.20        # ... or per accelerator model (wins over its kind)

Defaults: ``plugin: official`` everywhere; ``labels``: ``gfd`` (nvidia), ``npu-chip-name`` (ascend),
``amd-labeller`` (amd), ``none`` (gaudi); ``accelerator_tolerations: true``; nothing else.

A model label is only written where the resource name alone does not pick the model (``nvidia.com/gpu`` serves
every NVIDIA model, so a T4 needs ``nvidia.com/gpu.product``; HAMi's ``huawei.com/Ascend910B3`` needs no
label). KFP's Kubernetes extension (kfp-kubernetes) cannot set a pod's ``schedulerName`` nor its image per
device kind: on KFP, make the scheduler the namespace default (or inject it with a mutating webhook) and pick
images in the component definitions; Airflow's KubernetesPodOperator sets both.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from heteroflow.components.devices.accelerators import (
    ACCELERATORS,
    LABEL_CONVENTIONS,
    PLUGIN_CONVENTIONS,
    VENDORS,
    DeviceKind,
    find_accelerator,
    label_conventions_for,
)
from heteroflow.components.errors import InvalidResources
from heteroflow.components.devices.scheduling import FrozenMap, Toleration, check_label_value, check_qualified_name

__all__ = [
    "DEFAULT_PROFILE",
    "KUEUE_QUEUE_LABEL",
    "VOLCANO_QUEUE_ANNOTATION",
    "ClusterProfile",
    "InvalidProfile",
    "VendorConvention",
    "load_profile",
]

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # [KQ]; DESIGN.md "Cluster annotations"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"  # [VO]; DESIGN.md "Cluster annotations"

_DEFAULT_LABELS = {"nvidia": "gfd", "ascend": "npu-chip-name", "amd": "amd-labeller", "gaudi": "none"}
_TOP_KEYS = (
    "version",
    "name",
    "vendors",
    "accelerator_tolerations",
    "tolerations",
    "queue",
    "scheduler_name",
    "images",
    "labels",
    "annotations",
    "training_job",
    "shared_storage",
    "prices",
)
TRAINING_JOBS = ("trainjob", "pytorchjob")
"""How a multi-worker train is rendered: Kubeflow Trainer v2 ``TrainJob`` or training-operator v1 ``PyTorchJob``."""
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class InvalidProfile(InvalidResources):
    """A cluster profile file or value is invalid; the message names the file, the field and the valid choices."""


def _price_key(key: str, fail: Any) -> str:
    """A ``prices`` key as the run metrics look it up: a device kind's value (``gpu``) or an accelerator model's (or
    family's: a record names one where the candidate did) registry name (``t4``: ``nvidia-t4``). A misspelled key (``gpuu``) was kept and never matched a run, so its
    device time cost nothing without a word."""
    try:
        return DeviceKind.parse(key, field="prices key").value
    except InvalidResources:
        pass
    try:
        accel = find_accelerator(key, field="prices key")
    except InvalidResources:
        accel = None
    if accel is None:
        import difflib

        kinds = [k.value for k in DeviceKind]
        close = difflib.get_close_matches(key.lower(), [*kinds, *ACCELERATORS], n=1)
        raise fail(f"prices.{key} is neither a device kind nor an accelerator model" + (f" (did you mean {close[0]!r}?)" if close else "")
                   + f"; valid: a kind ({', '.join(kinds)}), a model (e.g. nvidia-t4, ascend-910b3) or currency")
    return accel.name


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class VendorConvention:
    """How one vendor's accelerators are named on this cluster.

    Args:
        plugin: ``"official"`` or ``"hami"`` (see :data:`~heteroflow.components.devices.accelerators.PLUGIN_CONVENTIONS`).
        labels: the node-label convention that tells its models apart (``"gfd"``, ``"gke"``,
            ``"npu-chip-name"``, ``"amd-labeller"`` or ``"none"``).
    """

    plugin: str = "official"
    labels: str = "none"

    @property
    def label_key(self) -> str | None:
        """The node label key of :attr:`labels` (None for ``none``)."""
        return LABEL_CONVENTIONS[self.labels][0]


def _default_vendors() -> Mapping[str, VendorConvention]:
    return FrozenMap((v, VendorConvention(labels=_DEFAULT_LABELS[v])) for v in VENDORS)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterProfile:
    """One cluster's naming conventions, queues, scheduler, images and pod-wide tolerations/labels/annotations.

    Build it with :meth:`from_dict` or :func:`load_profile` (YAML; the format is in this module's docstring).

    Attributes:
        name: shown in messages.
        vendors: per vendor (``nvidia``, ``ascend``, ``amd``, ``gaudi``), its :class:`VendorConvention`.
        accelerator_tolerations: whether pods tolerate their accelerator's usual taint.
        tolerations: added to every pod.
        volcano_queue: the Volcano queue (annotation ``scheduling.volcano.sh/queue-name``), or None.
        kueue_queue: the Kueue LocalQueue (label ``kueue.x-k8s.io/queue-name``), or None.
        scheduler_name: the pod's ``schedulerName`` (e.g. ``volcano``), or None for the default scheduler.
        images: container image per device kind value (``cpu``, ``gpu``, ``npu``).
        labels, annotations: added to every pod.
        training_job: a multi-worker train's rendering, one of :data:`TRAINING_JOBS`.
        shared_claim / shared_mount: the ReadWriteMany PersistentVolumeClaim a multi-node train shares (data,
            model, checkpoints) and where it is mounted, or None (a multi-node candidate then cannot run).
        prices: cost per device-hour by device kind value or accelerator model name (the run metrics' cost).
        currency: the unit of :attr:`prices` (``USD`` unless the profile says otherwise).
        source: the file it was read from (for messages), or None.
    """

    name: str = "default"
    vendors: Mapping[str, VendorConvention] = dataclasses.field(default_factory=_default_vendors)
    accelerator_tolerations: bool = True
    tolerations: tuple[Toleration, ...] = ()
    volcano_queue: str | None = None
    kueue_queue: str | None = None
    scheduler_name: str | None = None
    images: Mapping[str, str] = dataclasses.field(default_factory=FrozenMap)
    labels: Mapping[str, str] = dataclasses.field(default_factory=FrozenMap)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=FrozenMap)
    training_job: str = "trainjob"
    shared_claim: str | None = None
    shared_mount: str | None = None
    prices: Mapping[str, float] = dataclasses.field(default_factory=FrozenMap)
    currency: str = "USD"
    source: str | None = dataclasses.field(default=None, compare=False)

    def vendor(self, vendor: str) -> VendorConvention:
        """The convention for ``vendor`` (one of ``nvidia``, ``ascend``, ``amd``, ``gaudi``); a vendor the profile
        does not configure (a plugin device kind's) gets the defaults: the official plugin, no model label."""
        return self.vendors.get(vendor) or VendorConvention()

    def image_for(self, kind: DeviceKind | str) -> str | None:
        """The image for a device kind, or None when the profile names none."""
        return self.images.get(DeviceKind.parse(kind).value)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "profile") -> ClusterProfile:
        """Build from the parsed YAML mapping.

        Args:
            data: the mapping (see the module docstring for the keys).
            source: where it came from, named in errors (a file path).

        Raises:
            InvalidProfile: not a mapping, an unknown field (named, with the valid ones) or an invalid value.
        """
        try:
            return cls._from_dict(data, source=source)
        except InvalidProfile:
            raise
        except InvalidResources as exc:
            raise InvalidProfile(f"{source}: {exc}") from None

    @classmethod
    def _from_dict(cls, data: Any, *, source: str) -> ClusterProfile:
        def fail(message: str) -> InvalidProfile:
            return InvalidProfile(f"{source}: {message}")

        def mapping(value: Any, where: str, valid: tuple[str, ...] | None) -> Mapping[str, Any]:
            if value is None:
                return {}
            if not isinstance(value, Mapping):
                raise fail(f"{where} is {type(value).__name__}, not a mapping")
            if valid is not None:
                unknown = sorted(map(str, set(value) - set(valid)))
                if unknown:
                    from heteroflow.components.errors import did_you_mean

                    names = ", ".join(repr(u) for u in unknown)
                    raise fail(f"unknown field {names}{did_you_mean(unknown, valid)} in {where}; valid: {', '.join(valid)}")
            return value

        def text(value: Any, where: str) -> str:
            if not isinstance(value, str) or not value.strip():
                raise fail(f"{where}={value!r} is not a non-empty string")
            return value

        top = mapping(data, "the profile (top level)", _TOP_KEYS)
        if data is None:
            raise fail("the file is empty; valid: a mapping with some of " + ", ".join(_TOP_KEYS))
        version = top.get("version", 1)
        if version != 1 or isinstance(version, bool):
            raise fail(f"version={version!r} is unknown; valid: 1")
        name = text(top.get("name", "default"), "name")
        vendors = dict(_default_vendors())
        for vendor, conv in mapping(top.get("vendors"), "vendors", VENDORS).items():
            conv = mapping(conv, f"vendors.{vendor}", ("plugin", "labels"))
            plugin = conv.get("plugin", "official")
            if plugin not in PLUGIN_CONVENTIONS:
                raise fail(f"vendors.{vendor}.plugin={plugin!r} is unknown; valid: {', '.join(PLUGIN_CONVENTIONS)}")
            labels = conv.get("labels", _DEFAULT_LABELS[vendor])
            valid_labels = label_conventions_for(vendor)
            if labels not in valid_labels:
                raise fail(f"vendors.{vendor}.labels={labels!r} is unknown for {vendor}; valid: {', '.join(valid_labels)}")
            vendors[vendor] = VendorConvention(plugin=plugin, labels=labels)
        acc_tol = top.get("accelerator_tolerations", True)
        if not isinstance(acc_tol, bool):
            raise fail(f"accelerator_tolerations={acc_tol!r} is not a boolean; valid: true, false")
        raw_tolerations = top.get("tolerations") or []
        if not isinstance(raw_tolerations, list):
            raise fail(f"tolerations is {type(raw_tolerations).__name__}, not a list")
        tolerations = tuple(Toleration.from_value(t, field=f"tolerations[{i}]") for i, t in enumerate(raw_tolerations))
        queue = mapping(top.get("queue"), "queue", ("volcano", "kueue"))
        volcano = text(queue["volcano"], "queue.volcano") if queue.get("volcano") is not None else None
        kueue = queue.get("kueue")
        if kueue is not None:
            check_label_value(text(kueue, "queue.kueue"), field="queue.kueue")
        scheduler = top.get("scheduler_name")
        if scheduler is not None and (not isinstance(scheduler, str) or not _DNS_SUBDOMAIN.fullmatch(scheduler)):
            raise fail(f"scheduler_name={scheduler!r} is not a scheduler name; valid: a DNS subdomain such as 'volcano'")
        images = {}
        for kind, image in mapping(top.get("images"), "images", tuple(k.value for k in DeviceKind)).items():
            images[kind] = text(image, f"images.{kind}")
        labels = {}
        for key, value in mapping(top.get("labels"), "labels", None).items():
            labels[check_qualified_name(key, field="labels")] = check_label_value(value, field=f"labels[{key!r}]")
        annotations = {}
        for key, value in mapping(top.get("annotations"), "annotations", None).items():
            if not isinstance(value, str):
                raise fail(f"annotations[{key!r}]={value!r} is not a string")
            annotations[check_qualified_name(key, field="annotations")] = value
        training_job = top.get("training_job", "trainjob")
        if training_job not in TRAINING_JOBS:
            raise fail(f"training_job={training_job!r} is unknown; valid: {', '.join(TRAINING_JOBS)}")
        shared = mapping(top.get("shared_storage"), "shared_storage", ("claim", "mount_path"))
        shared_claim = shared_mount = None
        if shared:
            if shared.get("claim") is None:
                raise fail("shared_storage has no claim; valid: shared_storage: {claim: NAME, mount_path: /mnt/heteroflow} "
                           "(a ReadWriteMany PersistentVolumeClaim)")
            shared_claim = text(shared.get("claim"), "shared_storage.claim")
            if not _DNS_SUBDOMAIN.fullmatch(shared_claim):
                raise fail(f"shared_storage.claim={shared_claim!r} is not a PersistentVolumeClaim name; valid: a DNS subdomain")
            shared_mount = text(shared.get("mount_path", "/mnt/heteroflow"), "shared_storage.mount_path")
            if not shared_mount.startswith("/"):
                raise fail(f"shared_storage.mount_path={shared_mount!r} is not absolute; valid: a path such as /mnt/heteroflow")
        prices: dict[str, float] = {}
        raw_prices = dict(mapping(top.get("prices"), "prices", None))
        currency = text(raw_prices.pop("currency", "USD"), "prices.currency")
        for key, price in raw_prices.items():
            if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
                raise fail(f"prices.{key}={price!r} is not a price; valid: a number >= 0 (cost per device-hour in {currency})")
            prices[_price_key(str(key), fail)] = float(price)
        return cls(
            name=name,
            vendors=FrozenMap(vendors),
            accelerator_tolerations=acc_tol,
            tolerations=tolerations,
            volcano_queue=volcano,
            kueue_queue=kueue,
            scheduler_name=scheduler,
            images=FrozenMap(images),
            labels=FrozenMap(labels),
            annotations=FrozenMap(annotations),
            training_job=training_job,
            shared_claim=shared_claim,
            shared_mount=shared_mount,
            prices=FrozenMap(prices),
            currency=currency,
            source=None if source == "profile" else source,
        )

    def to_dict(self) -> dict[str, Any]:
        """The YAML-ready mapping that :meth:`from_dict` reads back into an equal profile."""
        out: dict[str, Any] = {
            "version": 1,
            "name": self.name,
            "vendors": {v: {"plugin": c.plugin, "labels": c.labels} for v, c in self.vendors.items()},
            "accelerator_tolerations": self.accelerator_tolerations,
        }
        if self.tolerations:
            out["tolerations"] = [t.to_dict() for t in self.tolerations]
        queue = {k: v for k, v in (("volcano", self.volcano_queue), ("kueue", self.kueue_queue)) if v is not None}
        if queue:
            out["queue"] = queue
        if self.scheduler_name is not None:
            out["scheduler_name"] = self.scheduler_name
        for key in ("images", "labels", "annotations"):
            if getattr(self, key):
                out[key] = dict(getattr(self, key))
        if self.training_job != "trainjob":
            out["training_job"] = self.training_job
        if self.shared_claim is not None:
            out["shared_storage"] = {"claim": self.shared_claim, "mount_path": self.shared_mount}
        if self.prices:
            out["prices"] = {"currency": self.currency, **self.prices}
        return out


DEFAULT_PROFILE = ClusterProfile()
"""Official device plugins, NVIDIA feature-discovery / Ascend chip / AMD labeller labels, usual accelerator
tolerations, no queue, the default scheduler, no images."""


def load_profile(path: str | os.PathLike[str]) -> ClusterProfile:
    """Read a cluster profile YAML file (the format is in this module's docstring).

    Args:
        path: the file.

    Returns:
        The :class:`ClusterProfile`.

    Raises:
        InvalidProfile: the file cannot be read (the message names the path and the OS reason), is not YAML,
            gives a key twice in one mapping, or holds an unknown field or an invalid value.
    """
    import yaml

    from heteroflow.components.core.keys import DuplicateKey, load_yaml, not_utf8, yaml_problem

    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as handle:
            data = load_yaml(handle.read(), where=f"cluster profile {where}")
    except OSError as exc:
        raise InvalidProfile(f"cluster profile {where}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InvalidProfile(f"cluster profile {where}: {not_utf8(exc)}") from None
    except yaml.YAMLError as exc:
        raise InvalidProfile(f"cluster profile {where}: not valid YAML ({yaml_problem(exc)})") from None
    except DuplicateKey as exc:
        raise InvalidProfile(str(exc)) from None
    return ClusterProfile.from_dict(data, source=where)
