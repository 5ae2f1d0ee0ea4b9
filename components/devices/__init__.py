"""Device kinds as data: what heteroflow knows about ``cpu``, ``gpu``, ``npu`` and any kind a plugin adds.

Owns:
    - :class:`DeviceKind` (``kind.py``): one object per device kind. It is a ``str`` (equal to, and hashed
      like, its name, so records, JSON and compiled YAML show ``"gpu"``) that carries everything heteroflow
      needs to know about the kind: aliases, detection and device counting, the PyTorch device type and the
      module to import first, the ``torch.distributed`` backend, selecting a replica's device (``set_device``,
      ``torch_device``, ``ddp_device_ids``), bf16 / synchronize / peak-memory hooks, the
      default accelerator family and Kubernetes extended resource, node-label keys, failure patterns for the
      classifier and its simulated form.
    - the registry (``registry.py``): :func:`register`, :func:`unregister`, :func:`get`, :func:`all_kinds`,
      :func:`for_torch_device_type`, :func:`host_kind`, :func:`cross_kind_backend`; third-party kinds load from the entry-point group ``heteroflow.devices``
      (:data:`ENTRY_POINT_GROUP`), lazily, once.
    - the three built-in registrations (``builtin.py``): :data:`CPU`, :data:`GPU`, :data:`NPU`.
    - the accelerator-model registry (``accelerators.py``: every model, its extended resource per device plugin,
      node labels, memory), the cluster profile's device-plugin and label conventions (``cluster.py``) and a
      candidate's pod plan (``podplan.py``: requests, limits, node selector and tolerations).
    - the parts of the resource model the pod plan and the cluster conventions build on (re-exported by
      :mod:`heteroflow.components.resources`): Kubernetes quantities (``quantities.py``: parsing and rendering
      CPU and memory exactly) and the pod's scheduling fields (``scheduling.py``: :class:`FrozenMap`, qualified
      names and label values, tolerations, affinity).

May import: :mod:`heteroflow.components.errors`, :mod:`heteroflow.components.resources`,
:mod:`heteroflow.components.core.keys` and the standard library (``podplan`` also asks
:mod:`heteroflow.components.training.trainjob`, inside a function, for a multi-node candidate's job). PyTorch (and ``torch_npu``)
are imported lazily, inside the methods that need them. Nothing else in heteroflow branches on a kind's name:
it asks the kind object.
"""

from __future__ import annotations

from heteroflow.components.devices.kind import DeviceKind, FailurePattern, Probe
from heteroflow.components.devices.registry import (
    ENTRY_POINT_GROUP,
    all_kinds,
    cross_kind_backend,
    find,
    for_torch_device_type,
    get,
    has_devices,
    host_kind,
    is_host_device_type,
    register,
    unregister,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "DeviceKind",
    "FailurePattern",
    "Probe",
    "all_kinds",
    "cross_kind_backend",
    "find",
    "for_torch_device_type",
    "get",
    "has_devices",
    "host_kind",
    "is_host_device_type",
    "register",
    "unregister",
]
