"""The cluster side of the cache tier: Fluid Dataset, AlluxioRuntime and DataLoad manifests for a data set, and
data-locality hints as preferred node affinity.

On a Kubernetes cluster with Fluid (https://github.com/fluid-cloudnative/fluid, CRDs ``data.fluid.io/v1alpha1``),
a data set is cached by an AlluxioRuntime bound to a Dataset of the same name; a DataLoad warms it (Fluid's
counterpart of prewarm); pods mount the Dataset's volume (a PVC named like the Dataset). Fluid labels every
node that holds cache for the Dataset with ``fluid.io/s-<namespace>-<name>: "true"`` (see Fluid's
``utils.GetDatasetLabelName`` / node label tests), which :func:`locality_affinity` turns into a *preferred*
node affinity for device-bound steps: the scheduler favours nodes that hold the data, and still runs the step
elsewhere when none fits.

Credentials never appear in a manifest: a source URL that carries them is refused, and the under storage's
keys come from a Kubernetes Secret through ``encryptOptions`` (``valueFrom.secretKeyRef``).

The builders are side-effect free and return plain dicts (the manifests as ``kubectl apply`` takes them);
:func:`validate_manifest` checks one against its CRD's OpenAPI schema with every object that lists
``properties`` treated as closed, so a misspelled field fails instead of passing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from heteroflow.cache.crds import validate_manifest
from heteroflow.cache.errors import DatasetError, InvalidCacheOption
from heteroflow.cache.redact import credential_kinds, redact_url

__all__ = [
    "FLUID_API_VERSION",
    "S3_SECRET_KEYS",
    "alluxio_runtime",
    "data_load",
    "fluid_dataset",
    "fluid_manifests",
    "fluid_node_label",
    "locality_affinity",
    "validate_manifest",
]

FLUID_API_VERSION = "data.fluid.io/v1alpha1"
# Alluxio's S3 credential properties, set from Secret keys of the same names (Fluid's S3 examples).
S3_SECRET_KEYS = ("aws.accessKeyId", "aws.secretKey")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MEDIA = ("MEM", "SSD", "HDD")


def _check_name(name: str, what: str) -> None:
    if len(name) > 63 or not _DNS1123.match(name):
        raise InvalidCacheOption(
            f"{what} {name!r} is not a valid Kubernetes name; valid: lower-case letters, digits and '-', starting and "
            "ending with a letter or digit, at most 63 characters"
        )


def _meta(name: str, namespace: str) -> dict[str, Any]:
    _check_name(name, "name")
    _check_name(namespace, "namespace")
    return {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "heteroflow"}}


def fluid_dataset(
    name: str,
    source_uri: str,
    *,
    namespace: str = "default",
    credentials_secret: str = "",
    secret_keys: Sequence[str] = (),
    options: Mapping[str, str] | None = None,
    read_only: bool = True,
) -> dict[str, Any]:
    """A Fluid ``Dataset`` that mounts ``source_uri`` (the under storage Alluxio caches).

    Args:
        name: the Dataset's name (also the name of its AlluxioRuntime and of the PVC pods mount).
        source_uri: the under storage: ``s3://bucket/path``, ``https://host/path/``, ``hdfs://...``, ``local:///...``.
        namespace: the Kubernetes namespace.
        credentials_secret: a Secret holding the under storage's keys; empty: no credentials (public data, or
            credentials the cluster provides, e.g. an IAM role).
        secret_keys: the Alluxio properties to set from the Secret's keys of the same names; default for
            ``s3://``: :data:`S3_SECRET_KEYS`.
        options: extra Alluxio mount options (e.g. ``alluxio.underfs.s3.endpoint``); never credentials.
        read_only: mount read-only (a data set is input).

    Raises:
        DatasetError: ``source_uri`` carries credentials (give them as ``credentials_secret``).
        InvalidCacheOption: a name that is not a Kubernetes name.
    """
    if credential_kinds(source_uri):
        raise DatasetError(
            f"the data set URL {redact_url(source_uri)} carries credentials; a Fluid Dataset must not: put them in a "
            "Kubernetes Secret and give its name as credentials_secret"
        )
    mount: dict[str, Any] = {"mountPoint": source_uri, "name": name, "readOnly": read_only}
    if options:
        mount["options"] = dict(options)
    if credentials_secret:
        _check_name(credentials_secret, "credentials_secret")
        keys = tuple(secret_keys) or (S3_SECRET_KEYS if source_uri.startswith(("s3://", "s3a://")) else ())
        if not keys:
            raise InvalidCacheOption(
                f"credentials_secret={credentials_secret!r} needs secret_keys for {source_uri.split('://')[0]}:// (the "
                "Alluxio properties to set from the Secret's keys)"
            )
        mount["encryptOptions"] = [
            {"name": key, "valueFrom": {"secretKeyRef": {"name": credentials_secret, "key": key}}} for key in keys
        ]
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "Dataset",
        "metadata": _meta(name, namespace),
        "spec": {"mounts": [mount], "accessModes": ["ReadOnlyMany" if read_only else "ReadWriteMany"]},
    }


def alluxio_runtime(
    name: str,
    *,
    namespace: str = "default",
    replicas: int = 1,
    medium: str = "MEM",
    path: str = "/dev/shm",
    quota: str = "2Gi",
    high: str = "0.95",
    low: str = "0.7",
) -> dict[str, Any]:
    """A Fluid ``AlluxioRuntime`` (the cache workers) for the Dataset ``name``.

    Args:
        name: the Dataset's name (a runtime binds to the Dataset of its own name).
        namespace: the Kubernetes namespace.
        replicas: cache workers (>= 1).
        medium: the cache tier's storage medium: MEM, SSD or HDD.
        path: where a worker keeps its cache on the node (``/dev/shm`` for MEM).
        quota: cache size per worker, a Kubernetes quantity (``2Gi`` = 2 x 2^30 bytes).
        high: usage ratio at which a worker starts evicting (``"0.95"``).
        low: usage ratio eviction brings it back to (``"0.7"``).

    Raises:
        InvalidCacheOption: a bad name, medium, replica count or quota.
    """
    if replicas < 1:
        raise InvalidCacheOption(f"replicas={replicas} is out of range; valid: 1 or more")
    if medium not in _MEDIA:
        raise InvalidCacheOption(f"medium={medium!r} is not a Fluid medium; valid: {', '.join(_MEDIA)}")
    if not re.fullmatch(r"\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?", quota):
        raise InvalidCacheOption(f"quota={quota!r} is not a Kubernetes quantity; valid forms: 2Gi, 500Mi, 10G")
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "AlluxioRuntime",
        "metadata": _meta(name, namespace),
        "spec": {
            "replicas": replicas,
            "tieredstore": {"levels": [{"mediumtype": medium, "path": path, "quota": quota, "high": high, "low": low}]},
        },
    }


def data_load(
    name: str,
    *,
    dataset: str,
    namespace: str = "default",
    paths: Sequence[str] = ("/",),
    replicas: int = 1,
    load_metadata: bool = True,
) -> dict[str, Any]:
    """A Fluid ``DataLoad`` that warms the Dataset ``dataset`` (Fluid's prewarm).

    Args:
        name: the DataLoad's name.
        dataset: the Dataset to warm (same namespace).
        namespace: the Kubernetes namespace.
        paths: paths inside the Dataset to load (``/``: all of it).
        replicas: cache replicas per loaded block.
        load_metadata: sync the under storage's metadata first (sees files added since the Dataset was made).
    """
    _check_name(dataset, "dataset")
    if replicas < 1:
        raise InvalidCacheOption(f"replicas={replicas} is out of range; valid: 1 or more")
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "DataLoad",
        "metadata": _meta(name, namespace),
        "spec": {
            "dataset": {"name": dataset, "namespace": namespace},
            "loadMetadata": load_metadata,
            "target": [{"path": p, "replicas": replicas} for p in paths],
        },
    }


def fluid_manifests(name: str, source_uri: str, *, namespace: str = "default", credentials_secret: str = "",
                    replicas: int = 1, medium: str = "MEM", quota: str = "2Gi") -> list[dict[str, Any]]:
    """Dataset, AlluxioRuntime and DataLoad for one data set, in the order to apply them."""
    return [
        fluid_dataset(name, source_uri, namespace=namespace, credentials_secret=credentials_secret),
        alluxio_runtime(name, namespace=namespace, replicas=replicas, medium=medium, quota=quota),
        data_load(f"{name}-warm"[:63].rstrip("-"), dataset=name, namespace=namespace),
    ]


def fluid_node_label(dataset: str, namespace: str = "default") -> str:
    """The label Fluid puts on every node holding cache of ``dataset``: ``fluid.io/s-<namespace>-<dataset>``."""
    return f"fluid.io/s-{namespace}-{dataset}"


def locality_affinity(*, nodes: Sequence[str] = (), dataset: str = "", namespace: str = "default",
                      weight: int = 100) -> dict[str, Any]:
    """Data-locality hints as a Kubernetes ``affinity`` (camelCase, as in a pod spec): *preferred* node affinity
    towards the nodes holding the data set.

    Args:
        nodes: node names known to hold the data (``kubernetes.io/hostname``), e.g. from ``heteroflow cache status``
            on each node or from the Alluxio workers' hosts.
        dataset: a Fluid Dataset: prefer the nodes Fluid labelled as holding its cache.
        namespace: the Dataset's namespace.
        weight: the preference's weight, 1-100 (Fluid's own webhook uses 100 for cache nodes).

    Returns:
        ``{"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [...]}}``; ``{}`` with no hint.

    Raises:
        InvalidCacheOption: ``weight`` outside 1-100.
    """
    if not 1 <= weight <= 100:
        raise InvalidCacheOption(f"weight={weight} is out of range; valid: 1 to 100 (Kubernetes' preferred affinity weight)")
    terms = []
    if dataset:
        terms.append({"weight": weight, "preference": {"matchExpressions": [
            {"key": fluid_node_label(dataset, namespace), "operator": "In", "values": ["true"]}]}})
    if nodes:
        terms.append({"weight": weight, "preference": {"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(set(nodes))}]}})
    if not terms:
        return {}
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}
