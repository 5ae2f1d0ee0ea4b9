"""The CustomResourceDefinitions heteroflow emits manifests for, shipped with the package, and validation against them.

The CRD files under ``data/crds/`` beside this module are unmodified upstream copies (Volcano v1.15.1, Kueue v0.19.2,
Fluid v1.0.8, Kubeflow Trainer v1.9.4 and v2.3.0; all Apache-2.0, see ``data/crds/README.md`` and
``data/crds/LICENSE-Apache-2.0.txt``). Core Kubernetes kinds are validated with ``kubernetes-validate`` instead.

:func:`validate_manifest` checks a custom resource against the served version's ``openAPIV3Schema`` with every
object that lists ``properties`` treated as closed (the upstream schemas never set ``additionalProperties: false``,
so a misspelled field would otherwise pass). CEL rules (``x-kubernetes-validations``) are not evaluated.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from heteroflow.cache.errors import InvalidCacheOption

__all__ = ["CRD_FILES", "SCHEMA_DIR", "crd_path", "load_crd", "validate_manifest"]

SCHEMA_DIR = Path(__file__).resolve().parent / "data" / "crds"
"""The folder of the shipped CRD files (package data of ``heteroflow.cache``), with their README and licence."""

#: kind -> the CRD file that defines it (``<group>_<plural>.yaml``).
CRD_FILES: dict[str, str] = {
    "PodGroup": "scheduling.volcano.sh_podgroups.yaml",
    "Queue": "scheduling.volcano.sh_queues.yaml",
    "Job": "batch.volcano.sh_jobs.yaml",
    "ResourceFlavor": "kueue.x-k8s.io_resourceflavors.yaml",
    "ClusterQueue": "kueue.x-k8s.io_clusterqueues.yaml",
    "LocalQueue": "kueue.x-k8s.io_localqueues.yaml",
    "Dataset": "data.fluid.io_datasets.yaml",
    "AlluxioRuntime": "data.fluid.io_alluxioruntimes.yaml",
    "DataLoad": "data.fluid.io_dataloads.yaml",
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
}


def crd_path(kind: str) -> Path:
    """The shipped CRD file of a custom resource kind.

    Args:
        kind: a kind in :data:`CRD_FILES` (``"ClusterQueue"``, ``"Dataset"``...).

    Raises:
        InvalidCacheOption: the kind is not one heteroflow ships a CRD for (the message lists them).
    """
    try:
        return SCHEMA_DIR / CRD_FILES[kind]
    except KeyError:
        raise InvalidCacheOption(f"no CRD shipped for kind {kind!r}; valid: {', '.join(sorted(CRD_FILES))}") from None


@functools.lru_cache(maxsize=None)
def load_crd(path: str | Path) -> dict[str, Any]:
    """Read (and cache) a CRD YAML file."""
    import yaml

    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def _closed(schema: Any) -> Any:
    """A copy of an OpenAPI schema where every object that lists ``properties`` (and does not preserve unknown
    fields) rejects other fields."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def validate_manifest(manifest: Mapping[str, Any], crd_file: str | Path | None = None) -> None:
    """Validate ``manifest`` against the served version's schema in its CRD, unknown fields rejected.

    Args:
        manifest: a custom resource (``apiVersion``, ``kind``, ``metadata``, ``spec``).
        crd_file: the CustomResourceDefinition YAML; default: the shipped CRD of the manifest's kind
            (:func:`crd_path`).

    Raises:
        InvalidCacheOption: the kind or version does not match the CRD, or the manifest breaks its schema (the
            message names the field path).
    """
    import jsonschema

    if crd_file is None:
        crd_file = crd_path(str(manifest.get("kind")))
    crd = load_crd(str(crd_file))
    group, _, version = str(manifest.get("apiVersion", "")).partition("/")
    if manifest.get("kind") != crd["spec"]["names"]["kind"] or group != crd["spec"]["group"]:
        raise InvalidCacheOption(f"{manifest.get('kind')} {manifest.get('apiVersion')} is not the kind of {crd_file}")
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    if version not in served:
        raise InvalidCacheOption(f"{manifest.get('kind')}: version {version!r} is not served; valid: {', '.join(served)}")
    schema = _closed(served[version]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # checked by the API server, not by the CRD
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(dict(manifest)), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path) or "(top)"
        raise InvalidCacheOption(f"{manifest['kind']} {manifest.get('metadata', {}).get('name', '')}: {where}: {first.message}")
