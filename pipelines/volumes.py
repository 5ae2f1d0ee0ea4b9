"""A call's step-level options, as a KFP user writes them: environment variables, volumes, ordering, image, packages.

Used through :meth:`heteroflow.pipelines.graph.Pipeline.add`::

    from heteroflow.pipelines.volumes import ConfigMapVolume, CreatePVC, PVC, SecretVolume

    workspace = CreatePVC("workspace", size="5Gi")              # kfp.kubernetes.CreatePVC; DeletePVC at the end
    prep = p.add(PREPARE, env={"LOG_LEVEL": "debug"}, volumes={"/mnt/workspace": workspace})
    train = p.add(TRAIN, volumes={"/mnt/workspace": workspace, "/etc/train": ConfigMapVolume("train-config")},
                  base_image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", packages_to_install=["timm==1.0.9"])
    train.after(prep)                                           # ordering without data

What each engine makes of them:

==================  =====================================  ===========================  ===========================
option              KFP (compiled)                         Airflow (kubernetes mode)    local engines
==================  =====================================  ===========================  ===========================
``env``             ``set_env_variable``                   ``env_vars``                 the step's environment
``CreatePVC``       ``kubernetes.CreatePVC`` (name suffix  a PVC created by             a folder of the run
                    ``<workflow>-<name>``), ``mount_pvc``,  ``create-pvc-<name>``,      (``volumes/<name>``),
                    ``kubernetes.DeletePVC`` after the      mounted, deleted by          deleted when the run ends
                    last call that mounts it               ``delete-pvc-<name>``
``PVC``             ``mount_pvc``                          ``V1Volume`` claim           refused (no claim here):
                                                                                        give ``local_path=``
``ConfigMapVolume`` ``use_config_map_as_volume``           ``V1Volume`` config map      ``local_files`` written
``SecretVolume``    ``use_secret_as_volume``               ``V1Volume`` secret          ``local_files`` written
``after``           reads the call's route: waits, and     an edge                      the order of the run
                    does not run after its failure
``base_image``      the component's ``base_image``         the pod's ``image``          ignored (this Python)
``packages``        ``packages_to_install``                ``pip install`` first        not installed (a warning)
==================  =====================================  ===========================  ===========================

A step opens a mounted path through :func:`heteroflow.components.core.mounts.local_path`, which maps it to the
run's folder under a local engine. Where an engine cannot express an option, the error names the engine and what
to do instead.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.core.mounts import MOUNTS_ENV
from heteroflow.components.errors import InvalidParameter

__all__ = [
    "PVC",
    "ConfigMapVolume",
    "CreatePVC",
    "SecretVolume",
    "Volume",
    "call_mounts",
    "check_env",
    "check_packages",
    "check_volumes",
    "created_pvcs",
    "local_mounts",
    "make_local_volumes",
    "remove_local_volumes",
    "run_after",
    "step_env",
    "warn_local_packages",
]

_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SUFFIX = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
_RESERVED_ENV = ("HETEROFLOW_",)


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _K8S_NAME.match(value):
        raise InvalidParameter(f"{what}={value!r} is not a Kubernetes name; valid: [a-z0-9]([-a-z0-9.]*[a-z0-9]), up to 253 characters")
    return value


def _files(value: Mapping[str, str] | None, what: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidParameter(f"{what}.local_files={value!r} is not a mapping; valid: {{'file name': 'content'}}")
    for key, text in value.items():
        if not isinstance(key, str) or not key or "/" in key or key in (".", ".."):
            raise InvalidParameter(f"{what}.local_files: {key!r} is not a file name (a ConfigMap or Secret key, no '/')")
        if not isinstance(text, str):
            raise InvalidParameter(f"{what}.local_files[{key!r}] is a {type(text).__name__}; valid: the file's text")
    return dict(value)


@dataclasses.dataclass(frozen=True, slots=True)
class CreatePVC:
    """A PersistentVolumeClaim the pipeline creates for each run, mounts into the calls that name it, and deletes
    when the last of them has ended (KFP's ``kubernetes.CreatePVC`` / ``mount_pvc`` / ``DeletePVC``).

    Args:
        name: the claim's name suffix (KFP's ``pvc_name_suffix``: the claim is ``<run>-<name>``), lowercase letters,
            digits and ``-``, up to 42 characters; also the local folder's name.
        size: storage request, a Kubernetes quantity (``"5Gi"``).
        access_modes: ``ReadWriteOnce`` (default), ``ReadOnlyMany``, ``ReadWriteMany``, ``ReadWriteOncePod``.
        storage_class_name: the StorageClass; None: the cluster's default.
        delete_at_end: delete the claim after the last call that mounts it (default True; KFP's ``DeletePVC``).

    Raises:
        InvalidParameter: a bad name, size or access mode (the message names the field and the valid forms).
    """

    name: str
    size: str
    access_modes: tuple[str, ...] = ("ReadWriteOnce",)
    storage_class_name: str | None = None
    delete_at_end: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SUFFIX.match(self.name):
            raise InvalidParameter(f"CreatePVC name={self.name!r} is not valid; valid: [a-z0-9]([-a-z0-9]*[a-z0-9]), up to 42 characters")
        from heteroflow.components.devices.quantities import parse_memory

        try:
            if not parse_memory(self.size, field="size"):
                raise InvalidParameter("zero")
        except (InvalidParameter, ValueError) as exc:
            raise InvalidParameter(f"CreatePVC {self.name!r}: size={self.size!r} is not a positive storage quantity (e.g. '5Gi'): {exc}") from None
        modes = (self.access_modes,) if isinstance(self.access_modes, str) else tuple(self.access_modes)
        bad = [m for m in modes if m not in _ACCESS_MODES]
        if not modes or bad:
            raise InvalidParameter(f"CreatePVC {self.name!r}: access_modes={list(modes)!r}; valid: one or more of {', '.join(_ACCESS_MODES)}")
        object.__setattr__(self, "access_modes", modes)
        if self.storage_class_name is not None:
            _name(self.storage_class_name, f"CreatePVC {self.name!r}: storage_class_name")
        if not isinstance(self.delete_at_end, bool):
            raise InvalidParameter(f"CreatePVC {self.name!r}: delete_at_end={self.delete_at_end!r}; valid: True or False")

    def manifest(self, claim_name: str) -> dict[str, Any]:
        """The PersistentVolumeClaim object (``v1``) named ``claim_name``, as Airflow's kubernetes mode creates it."""
        spec: dict[str, Any] = {"accessModes": list(self.access_modes), "resources": {"requests": {"storage": self.size}}}
        if self.storage_class_name is not None:
            spec["storageClassName"] = self.storage_class_name
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim_name}, "spec": spec}


@dataclasses.dataclass(frozen=True, slots=True)
class PVC:
    """An existing PersistentVolumeClaim, mounted (KFP's ``kubernetes.mount_pvc``).

    Args:
        name: the claim's name.
        local_path: the folder local engines use for it (they cannot reach a claim); None: local runs refuse the call.
    """

    name: str
    local_path: str | None = None

    def __post_init__(self) -> None:
        _name(self.name, "PVC name")


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigMapVolume:
    """A ConfigMap's keys as files (KFP's ``kubernetes.use_config_map_as_volume``).

    Args:
        name: the ConfigMap's name.
        optional: the pod starts even if the ConfigMap does not exist.
        local_files: ``{key: text}`` that local engines write into the mount's folder in its place (a local run has
            no cluster to read the ConfigMap from); None: local runs refuse the call unless ``optional``.
    """

    name: str
    optional: bool = False
    local_files: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        _name(self.name, "ConfigMapVolume name")
        object.__setattr__(self, "local_files", _files(self.local_files, f"ConfigMapVolume {self.name!r}"))


@dataclasses.dataclass(frozen=True, slots=True)
class SecretVolume:
    """A Secret's keys as files (KFP's ``kubernetes.use_secret_as_volume``).

    Args:
        name: the Secret's name.
        optional: the pod starts even if the Secret does not exist.
        local_files: ``{key: text}`` for local engines (never put real credentials in code: read them from your own
            environment); None: local runs refuse the call unless ``optional``.
    """

    name: str
    optional: bool = False
    local_files: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        _name(self.name, "SecretVolume name")
        object.__setattr__(self, "local_files", _files(self.local_files, f"SecretVolume {self.name!r}"))


Volume = CreatePVC | PVC | ConfigMapVolume | SecretVolume
_VOLUME_TYPES = (CreatePVC, PVC, ConfigMapVolume, SecretVolume)


def check_env(call: str, env: Any) -> dict[str, str]:
    """``env`` of a call, checked: ``{NAME: value}`` with string values (numbers and bools are written as text).

    Raises:
        InvalidParameter: not a mapping, a bad variable name, a ``HETEROFLOW_*`` name (heteroflow sets those), or a
            value that is not a string, number or bool.
    """
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise InvalidParameter(f"{call}: env={env!r} is not a mapping; valid: {{'NAME': 'value'}}")
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise InvalidParameter(f"{call}: env {name!r} is not an environment variable name; valid: [A-Za-z_][A-Za-z0-9_]*")
        if name.startswith(_RESERVED_ENV):
            raise InvalidParameter(f"{call}: env {name!r}: HETEROFLOW_* variables are set by heteroflow; use another name")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float)):
            value = str(value)
        if not isinstance(value, str):
            raise InvalidParameter(f"{call}: env {name}={value!r} is a {type(value).__name__}; valid: a string (or a number)")
        out[name] = value
    return out


def check_volumes(call: str, volumes: Any) -> dict[str, Volume]:
    """``volumes`` of a call, checked: ``{mount path: volume}``.

    Raises:
        InvalidParameter: not a mapping, a mount path that is not absolute or is nested in another, or a value that
            is not a volume (the message lists the valid types).
    """
    if volumes is None:
        return {}
    if not isinstance(volumes, Mapping):
        raise InvalidParameter(f"{call}: volumes={volumes!r} is not a mapping; valid: {{'/mount/path': CreatePVC(...) | PVC(...) | ConfigMapVolume(...) | SecretVolume(...)}}")
    out: dict[str, Volume] = {}
    for path, volume in volumes.items():
        if not isinstance(path, str) or not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or path == "/":
            raise InvalidParameter(f"{call}: mount path {path!r} is not a normalised absolute path (e.g. '/mnt/data')")
        if not isinstance(volume, _VOLUME_TYPES):
            raise InvalidParameter(
                f"{call}: volumes[{path!r}] is a {type(volume).__name__}; valid: CreatePVC, PVC, ConfigMapVolume, SecretVolume"
            )
        out[path.rstrip("/")] = volume
    paths = sorted(out)
    for a, b in zip(paths, paths[1:]):
        if b.startswith(a + "/"):
            raise InvalidParameter(f"{call}: mount path {b!r} is inside {a!r}; mount each volume at its own path")
    return out


def check_packages(call: str, packages: Any) -> tuple[str, ...]:
    """``packages_to_install`` of a call, checked: pip requirement strings (never ``heteroflow`` itself, which is not
    on PyPI: the image provides it).

    Raises:
        InvalidParameter: not a list of non-empty strings, or one names heteroflow.
    """
    if packages is None:
        return ()
    if isinstance(packages, str) or not isinstance(packages, Iterable):
        raise InvalidParameter(f"{call}: packages_to_install={packages!r} is not a list; valid: ['timm==1.0.9', ...]")
    out = tuple(packages)
    for item in out:
        if not isinstance(item, str) or not item.strip():
            raise InvalidParameter(f"{call}: packages_to_install holds {item!r}; valid: pip requirement strings")
        if re.split(r"[\s\[<>=!~;@]", item.strip(), maxsplit=1)[0].lower() == "heteroflow":
            raise InvalidParameter(f"{call}: packages_to_install names {item!r}: heteroflow is not on PyPI; the image provides it")
    return out


def created_pvcs(calls: Iterable[Any]) -> dict[str, tuple[CreatePVC, list[str]]]:
    """``{name: (the CreatePVC, the calls that mount it, in order)}`` over ``calls``.

    Raises:
        InvalidParameter: two different CreatePVC values with the same name.
    """
    out: dict[str, tuple[CreatePVC, list[str]]] = {}
    for call in calls:
        for volume in getattr(call, "volumes", {}).values():
            if isinstance(volume, CreatePVC):
                known = out.get(volume.name)
                if known is not None and known[0] != volume:
                    raise InvalidParameter(f"two different CreatePVC values are named {volume.name!r} ({known[0]} and {volume}); name each once")
                if known is None:
                    out[volume.name] = (volume, [])
                if call.name not in out[volume.name][1]:
                    out[volume.name][1].append(call.name)
    return out


def local_mounts(call: Any, *, engine: str) -> dict[str, str]:
    """The folders a local engine gives ``call``'s volumes: ``{mount path: folder}``, a folder of the run relative to
    the run folder (a CreatePVC is ``volumes/<name>``, shared by the run's calls; a ConfigMap or Secret
    ``volumes/<call>-configmap-<name>``), or an existing PVC's ``local_path``. This is what
    :data:`~heteroflow.components.core.mounts.MOUNTS_ENV` carries; :func:`make_local_volumes` creates them.

    Raises:
        InvalidParameter: an existing PVC without ``local_path``, or a ConfigMap or Secret without ``local_files``
            that is not optional (the message names the engine and the alternative).
    """
    out: dict[str, str] = {}
    for path, volume in call_mounts(call).items():
        if isinstance(volume, CreatePVC):
            out[path] = f"volumes/{volume.name}"
        elif isinstance(volume, PVC):
            if volume.local_path is None:
                raise InvalidParameter(
                    f"{call.name}: the {engine} engine cannot mount the existing PVC {volume.name!r} (there is no cluster "
                    f"here); give PVC({volume.name!r}, local_path='/a/local/folder'), or run it on KFP or Airflow's "
                    "kubernetes mode"
                )
            out[path] = str(Path(volume.local_path).resolve())
        else:
            kind = "ConfigMap" if isinstance(volume, ConfigMapVolume) else "Secret"
            if volume.local_files is None and not volume.optional:
                raise InvalidParameter(
                    f"{call.name}: the {engine} engine cannot read the {kind} {volume.name!r} (there is no cluster here); "
                    f"give {type(volume).__name__}({volume.name!r}, local_files={{'key': 'text'}}) or optional=True, or "
                    "run it on KFP or Airflow's kubernetes mode"
                )
            out[path] = f"volumes/{call.name}-{kind.lower()}-{volume.name}"
    return out


def make_local_volumes(calls: Iterable[Any], run_dir: str | Path, *, engine: str) -> None:
    """Create the folders of :func:`local_mounts` for ``calls`` in ``run_dir``, ConfigMaps' and Secrets' with their
    ``local_files`` (Secrets' files readable by the owner only).

    Raises:
        InvalidParameter: as :func:`local_mounts`.
    """
    for call in calls:
        volumes = call_mounts(call)
        for path, folder in local_mounts(call, engine=engine).items():
            target = Path(run_dir, folder)
            target.mkdir(parents=True, exist_ok=True)
            volume = volumes[path]
            for key, text in (getattr(volume, "local_files", None) or {}).items():
                file = target / key
                file.write_text(text, encoding="utf-8")
                if isinstance(volume, SecretVolume):
                    file.chmod(0o600)


def warn_local_packages(calls: Iterable[Any], *, engine: str) -> None:
    """Warn once per call that a local engine does not install its ``packages_to_install`` (it runs steps in this
    Python, which must have them)."""
    import warnings

    for call in calls:
        packages = list(getattr(call, "packages_to_install", ()) or ())
        if packages:
            warnings.warn(
                f"{call.name}: the {engine} engine does not install packages_to_install ({', '.join(packages)}): this "
                "environment must have them",
                UserWarning,
                stacklevel=3,
            )


def step_env(call: Any, *, engine: str) -> dict[str, str]:
    """The environment a local engine adds for ``call``: its ``env`` and, for its volumes, :data:`MOUNTS_ENV`."""
    env = dict(getattr(call, "env", {}) or {})
    found = local_mounts(call, engine=engine)
    if found:
        env[MOUNTS_ENV] = json.dumps(found, sort_keys=True)
    return env


def run_after(pipeline: Any, call: Any) -> list[str]:
    """The calls ``call`` starts after without reading from them (:meth:`~heteroflow.pipelines.graph.Call.after`).

    Raises:
        InvalidParameter: a name that is not a call of ``pipeline`` before ``call``.
    """
    order = [c.name for c in pipeline.calls]
    names = list(getattr(call, "run_after", ()) or ())
    for name in names:
        if name not in order or order.index(name) >= order.index(call.name):
            raise InvalidParameter(
                f"{call.name}: after({name!r}): not a call before it in pipeline {pipeline.name!r}; valid: {', '.join(order[: order.index(call.name)]) or '(none)'}"
            )
    return names


def call_mounts(call: Any) -> dict[str, Volume]:
    """``call``'s volumes (``{}`` for a call made before volumes existed)."""
    return dict(getattr(call, "volumes", {}) or {})


def remove_local_volumes(run_dir: str | Path) -> None:
    """Delete a run's local volume folders (``<run_dir>/volumes``): what DeletePVC is on a local engine."""
    shutil.rmtree(Path(run_dir) / "volumes", ignore_errors=True)
