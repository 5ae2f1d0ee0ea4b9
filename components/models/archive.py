"""Archive: store a model with its metrics and lineage under an immutable, versioned path.

Layout: ``<archive_root>/<name>/v<N>/`` holding the model files, ``metrics.json`` and ``lineage.json``
(data set manifest hash, code version, parameters, device used, time). A version is assembled in a
temporary folder and renamed into place, so it is visible complete or not at all; ``os.rename`` onto an
existing non-empty version fails, and heteroflow then takes the next number, so an existing version is
never overwritten, and says which run took the number (:attr:`ArchiveResult.note`). Archived files are made
read-only.

Archiving is idempotent: the lineage records the model's content hash (``model_sha256``), and a model whose
files hash the same as an archived version's is that version (a rerun after a stop that came between the
rename and the rest of the step's bookkeeping, or two identical runs archiving at once, give one version).

Formats: ``model/`` holds PyTorch's files (``model.pt``, ``model.json``, the transformation); ``exports=("onnx",)``
(the step's ``export_formats``) also writes ``onnx/model.onnx`` (:mod:`heteroflow.components.models.onnx`) into the
version before it is renamed into place. The lineage's ``formats`` says which formats the version holds, where,
and what each takes as input. The content hash covers ``model/`` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

from heteroflow.cache.atomic import make_temp_dir
from heteroflow.components.errors import ArchiveError, InvalidParameter, make_folder
from heteroflow.components.core.telemetry import process_alive
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.core.step import ArtifactSpec, ArtifactType, Step, step

__all__ = [
    "ArchiveResult",
    "RUN_ID_ENV",
    "archive",
    "archive_step",
    "check_archive_params",
    "check_model_name",
    "code_version",
    "content_sha256",
    "default_model_name",
    "archive_root_dir",
    "list_models",
    "list_versions",
    "read_version",
]

RUN_ID_ENV = "HETEROFLOW_RUN_ID"
"""The run id recorded in the lineage (``heteroflow run`` sets it; on KFP, the pipeline job's name)."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_VERSION = re.compile(r"^v(\d+)$")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveResult:
    """Where the model was archived.

    Attributes:
        name: model name.
        version: the version number written (1, 2, ...).
        path: ``<archive_root>/<name>/v<version>``.
        lineage: the lineage record written to ``lineage.json`` (an existing version's, when ``existing``).
        existing: the same model (same content hash) was already archived as this version; nothing was written.
        note: when the version first claimed was taken by another writer meanwhile, says so
            (``archived as v2: v1 was taken by run X at ...``); when the model was archived before without an
            export asked for, says so (``the same model as v1, which was archived without onnx``: this new version
            holds it; versions are never changed); else None.
    """

    name: str
    version: int
    path: Path
    lineage: dict[str, Any]
    existing: bool = False
    note: str | None = None


def content_sha256(model_dir: str | os.PathLike[str]) -> str:
    """The sha256 of a model folder's content: every file's relative path and bytes, in path order."""
    import hashlib

    root = Path(model_dir)
    digest = hashlib.sha256()
    for p in sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(p.relative_to(root).as_posix().encode() + b"\0")
        digest.update(str(p.stat().st_size).encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _lineage_of(version_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((version_dir / "lineage.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _same_model(version_dir: Path, digest: str) -> dict[str, Any] | None:
    """The lineage of ``version_dir`` when it holds the model whose content hash is ``digest``, else None (a
    version archived before hashes were recorded is hashed from its files)."""
    if not version_dir.is_dir():
        return None
    lineage = _lineage_of(version_dir)
    recorded = lineage.get("model_sha256")
    if recorded is None and (version_dir / "model").is_dir():
        recorded = content_sha256(version_dir / "model")
    return lineage if recorded == digest else None


def _taken_by(version_dir: Path) -> str:
    lineage = _lineage_of(version_dir)
    who = f"run {lineage['run_id']}" if lineage.get("run_id") else "another writer"
    return f"{who} at {lineage['archived_at']}" if lineage.get("archived_at") else who


def code_version() -> dict[str, str | None]:
    """heteroflow's installed version and, when run from a git checkout, its commit (``-dirty`` if modified)."""
    from importlib import metadata  # imported here: defining a pipeline, or starting a step task, needs it not

    try:
        version = metadata.version("heteroflow")
    except metadata.PackageNotFoundError:  # pragma: no cover - always installed
        version = None
    commit = None
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        commit = sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return {"heteroflow": version, "git_commit": commit}


def archive_root_dir(archive_root: str | os.PathLike[str] | None = None) -> Path:
    """The archive folder: ``archive_root``, else ``<heteroflow home>/archive``."""
    from heteroflow.cache.locations import home_dir

    return Path(archive_root).expanduser() if archive_root else home_dir() / "archive"


def list_models(archive_root: str | os.PathLike[str]) -> list[str]:
    """Model names with at least one archived version, sorted."""
    root = Path(archive_root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _NAME.match(p.name) and list_versions(root, p.name))


def read_version(archive_root: str | os.PathLike[str], name: str, version: int | None = None) -> dict[str, Any]:
    """One archived version: ``{"name", "version", "path", "metrics", "lineage"}`` (the latest without ``version``).

    Raises:
        InvalidParameter: no such model (the message lists the archived ones) or version (lists the versions).
    """
    root = Path(archive_root)
    versions = list_versions(root, name)
    if not versions:
        models = list_models(root)
        raise InvalidParameter(
            f"no archived model {name!r} under {root}; archived: {', '.join(models) if models else 'none yet'}"
        )
    chosen = versions[-1] if version is None else version
    if chosen not in versions:
        raise InvalidParameter(f"{name} has no version v{chosen}; versions: {', '.join(f'v{v}' for v in versions)}")
    folder = root / name / f"v{chosen}"
    out: dict[str, Any] = {"name": name, "version": chosen, "path": str(folder)}
    for key in ("metrics", "lineage"):
        try:
            out[key] = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            out[key] = {}
    return out


def list_versions(archive_root: str | os.PathLike[str], name: str) -> list[int]:
    """Version numbers archived under ``name``, ascending."""
    folder = Path(archive_root, name)
    if not folder.is_dir():
        return []
    return sorted(int(m[1]) for p in folder.iterdir() if (m := _VERSION.match(p.name)) and p.is_dir())


def _make_read_only(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def default_model_name(source_uri: str, model_factory: str = "", dataset_factory: str = "") -> str:
    """The model name when none is given: ``<data set folder name>-<model>``, made a valid model name, where
    ``<model>`` is the model factory's function name (``mlp`` for the built-in model: ``digits-mlp`` for the
    built-in sample; ``digits-images-cnn`` for ``digits_models:cnn`` on a folder ``digits-images``). With a
    ``dataset_factory`` (``package.module:function``, whose data the model trains on instead of the folder's),
    its function name stands for the folder: ``blobs-mlp`` for ``mydata:blobs``, never the folder's own name. A
    factory of your own named ``mlp`` adds its module (``digits-digits_models-mlp`` for ``digits_models:mlp``), so it
    never shares the built-in model's name. The one rule for the CLI, the Python API and compiled pipelines."""
    if dataset_factory:
        source_uri = dataset_factory.rpartition(":")[2].rpartition(".")[2] or dataset_factory
    import re
    import unicodedata

    def ascii_name(text: str, limit: int) -> str:
        # letters with accents as their ASCII letter (café: cafe); other characters a dash, runs of them one (a
        # folder 'café' made 'café-mlp', which archive refused after training; 'Data (2024)' made 'data--2024-mlp')
        plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
        dashed = "".join(c if c.isalnum() or c in "._-" else "-" for c in plain)
        return re.sub(r"-{2,}", "-", dashed).strip("-._")[:limit].strip("-._")

    base = Path(source_uri.rstrip("/").split("://")[-1].split("?")[0]).stem
    func = ascii_name(model_factory.rpartition(":")[2].rpartition(".")[2] if model_factory else "mlp", 20) or "model"
    from heteroflow.components.training.factories import BUILTIN_MODEL

    if model_factory and func == "mlp" and model_factory not in (BUILTIN_MODEL, "heteroflow.components.training:mlp"):
        # a factory of yours named like the built-in model: its module too, so the two never share a name (the
        # README's digits_models:mlp archived as digits-mlp, and the latest digits-mlp needed its module to load)
        func = ascii_name(model_factory.rpartition(":")[0].rpartition(".")[2] + "-mlp", 30) or "model"
    safe = ascii_name(base, 62 - len(func))
    return f"{safe or 'model'}-{func}"


def _remove_dead_incoming(folder: Path) -> None:
    """Remove ``.incoming-<pid>-*`` folders whose writer is gone (a killed archive step leaves one)."""
    for path in folder.glob(".incoming-*"):
        parts = path.name.split("-")
        pid = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
        if pid is not None and process_alive(pid):
            continue
        if pid is None and time.time() - path.stat().st_mtime < 24 * 3600:
            continue  # an old-style name: only when clearly abandoned
        for p in path.rglob("*"):
            with contextlib.suppress(OSError):
                p.chmod(0o700 if p.is_dir() else 0o600)
        shutil.rmtree(path, ignore_errors=True)


def check_model_name(name: str) -> None:
    """Check an archive model name (the check :func:`archive` makes; callers use it to fail before a run).

    Raises:
        InvalidParameter: not 1-63 characters of lowercase letters, digits, ``.``, ``_``, ``-``, starting
            with a letter or digit.
    """
    if name == "":  # the default: derived from the data set folder by default_model_name
        return
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidParameter(
            f"model_name={name!r} is not a valid model name; valid: [a-z0-9][a-z0-9._-]*, up to 63 characters"
        )


def archive(
    model_dir: str | os.PathLike[str],
    archive_root: str | os.PathLike[str],
    *,
    name: str,
    metrics: dict[str, Any],
    lineage: dict[str, Any],
    exports: tuple[str, ...] | list[str] = (),
) -> ArchiveResult:
    """Copy ``model_dir`` into the next free version ``<archive_root>/<name>/v<N>``.

    Args:
        model_dir: train output.
        archive_root: local folder of the archive.
        name: model name: lowercase letters, digits, ``.``, ``_``, ``-``; 1-63 characters.
        metrics: JSON-ready metrics (written to ``metrics.json``).
        lineage: JSON-ready lineage facts (data set hash, parameters, device...); ``code``,
            ``archived_at`` and ``formats`` are added.
        exports: formats to export the model to besides PyTorch's files (``"onnx"``: ``onnx/model.onnx``,
            checked against PyTorch's outputs), written into the version before it becomes visible.

    Returns:
        An :class:`ArchiveResult`.

    Raises:
        InvalidParameter: a bad ``name``, an unknown export format, or onnx not installed for ``onnx``.
        ArchiveError: ``model_dir`` is missing, no free version could be claimed, or an export failed (nothing
            is archived then).
    """
    from heteroflow.components.models.onnx import parse_export_formats

    exports = parse_export_formats(",".join(exports))
    if not name:
        raise InvalidParameter("name is empty; valid: [a-z0-9][a-z0-9._-]*, up to 63 characters")
    check_model_name(name)
    src = Path(model_dir)
    if not src.is_dir():
        raise ArchiveError(f"model folder {src} does not exist; nothing to archive")
    folder = Path(archive_root, name)
    folder.mkdir(parents=True, exist_ok=True)
    digest = content_sha256(src)
    checked: set[int] = set()
    without: list[tuple[int, list[str]]] = []  # versions of the same model that lack an export asked for

    def archived_already(versions: list[int]) -> ArchiveResult | None:
        for v in sorted(set(versions) - checked):
            checked.add(v)
            if (same := _same_model(folder / f"v{v}", digest)) is not None:
                lacking = [f for f in exports if f not in (same.get("formats") or {})]
                if lacking:  # versions are immutable: a new one holds the export (predict --format reads versions)
                    without.append((v, lacking))
                    continue
                return ArchiveResult(name=name, version=v, path=folder / f"v{v}", lineage=same, existing=True)
        return None

    if (done := archived_already(list_versions(folder.parent, name))) is not None:
        return done
    record = {
        **lineage,
        "model_sha256": digest,
        "code": code_version(),
        "archived_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    same_note = None
    if without:
        v, lacking = without[-1]
        record["same_model_as"] = f"v{v}"
        same_note = f"the same model as v{v}, which was archived without {', '.join(lacking)}"
    _remove_dead_incoming(folder)
    tmp = make_temp_dir(folder, prefix=f".incoming-{os.getpid()}-")  # umask-respecting mode, not mkdtemp's 0700
    try:
        shutil.copytree(src, tmp / "model")
        record["formats"] = {"pytorch": {"path": "model", "files": sorted(p.name for p in (tmp / "model").iterdir())}}
        if "onnx" in exports:
            from heteroflow.components.models.onnx import ONNX_FILE, export_onnx

            record["formats"]["onnx"] = export_onnx(tmp / "model", tmp / "onnx" / ONNX_FILE).record(relative_to=tmp)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True, default=str), encoding="utf-8")
        first_taken: tuple[int, str] | None = None  # the version this writer claimed first, and who took it
        for attempt in range(100):
            # Every entry named v<N> counts, folder or not, so a stray file cannot block the numbering.
            taken = [int(m[1]) for p in folder.iterdir() if (m := _VERSION.match(p.name))]
            if (done := archived_already(taken)) is not None:  # another writer archived this very model meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
                return done
            version = max(taken, default=0) + 1
            target = folder / f"v{version}"
            record["version"] = version
            notes = [f"archived as v{version}: v{first_taken[0]} was taken by {first_taken[1]}"] if first_taken is not None else []
            if same_note:
                notes.append(same_note)
            if notes:
                record["version_note"] = "; ".join(notes)
            lineage_path = tmp / "lineage.json"
            lineage_path.unlink(missing_ok=True)  # allowed on a read-only file: the folder is writable
            lineage_path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str), encoding="utf-8")
            _make_read_only(tmp)
            try:
                os.rename(tmp, target)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    # another writer claimed v<version> first: take the next number, and say so
                    if first_taken is None:
                        first_taken = (version, _taken_by(target))
                    continue
                raise
            return ArchiveResult(name=name, version=version, path=target, lineage=record, note=record.get("version_note"))
        raise ArchiveError(f"could not claim a free version under {folder} after {attempt + 1} tries")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def archive_step(
    dataset_dir: str,
    shards_dir: str,
    model_dir: str,
    eval_metrics_path: str,
    archived_path: str,
    *,
    archive_root: str = "",
    model_name: str = "",
    export_formats: str = "",
) -> ArchiveResult:
    """Archive the trained model with its test metrics and lineage under an immutable, versioned path.

    Lineage: the data set (source, sha256, files, bytes) from the prewarm manifest, the preprocess and train
    parameters (read from the artifacts themselves), the device that trained, the run id and the code version.

    Args:
        dataset_dir: prewarm output (holds the data set's manifest).
        shards_dir: preprocess output (``meta.json``).
        model_dir: train output.
        eval_metrics_path: evaluate's metrics (JSON).
        archived_path: file to write ``{"path", "version", "name"}`` to.
        archive_root: archive folder; empty: <heteroflow home>/archive.
        model_name: name of the archived model ([a-z0-9][a-z0-9._-]*); empty: <data set folder name>-mlp for the built-in model, <data set folder name>-<factory function name> for yours (or a dataset_factory's name).
        export_formats: also export the model to these formats, comma-separated: onnx (needs the onnx extra; the ONNX model takes preprocessed features); empty: PyTorch's files only.

    Returns:
        An :class:`ArchiveResult`.

    Raises:
        InvalidParameter: a bad ``model_name`` or ``export_formats``.
        ArchiveError: the model folder is missing, no free version could be claimed, or an export failed.
        DatasetError: ``dataset_dir`` or ``shards_dir`` is not prewarm / preprocess output.
    """
    from heteroflow.cache.prewarm import MANIFEST_NAME, Manifest

    manifest = Manifest.load(Path(dataset_dir) / MANIFEST_NAME)
    try:
        meta = json.loads(Path(shards_dir, "meta.json").read_text(encoding="utf-8"))
        config = json.loads(Path(model_dir, "model.json").read_text(encoding="utf-8"))
        report = json.loads(Path(eval_metrics_path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ArchiveError(
            f"{exc.filename} does not exist; archive needs preprocess's shards, train's model and evaluate's metrics"
        ) from None
    factory = (config.get("model") or {}).get("factory", "")
    name = model_name or default_model_name(manifest.source_uri, "" if factory == "heteroflow.components.training.loop:mlp" else factory,
                                             str((config.get("params") or {}).get("dataset_factory") or ""))
    lineage = {
        "run_id": os.environ.get(RUN_ID_ENV) or None,
        "dataset": {
            "source_uri": manifest.source_uri,
            # the version preprocess actually read (checked against its manifest), else the one prewarm wrote
            "version": meta.get("dataset_version") or getattr(manifest, "version", None),
            "dataset_sha256": meta.get("dataset_sha256") or manifest.dataset_sha256,
            "files": len(manifest.files),
            "total_bytes": manifest.total_bytes,
        },
        "preprocess": {k: meta[k] for k in ("seed", "validation_fraction", "test_fraction", "counts") if k in meta},
        "data": meta.get("report", {}),
        "train": config["params"],
        "device": report.get("device") or config.get("device") or config["params"].get("device_type"),
        "model": config.get("model"),  # the factory reference and its arguments (load_archived rebuilds it)
    }
    if config.get("simulated"):  # a rehearsal's model (--simulate-devices): say so wherever the version is listed
        lineage["device"] = f"{config.get('device_kind')} (simulated, on {lineage['device'] or 'cpu'})"
        lineage["simulated"] = list(config["simulated"])
    dataset_factory = str((config.get("params") or {}).get("dataset_factory") or "")
    if dataset_factory:  # the model trained on the factory's samples: the run's data set is not its lineage
        lineage["dataset"] = {"dataset_factory": dataset_factory, "not_trained_on": manifest.source_uri}
        lineage["data"] = config.get("data") or {}
        lineage.pop("preprocess")
    root = archive_root_dir(archive_root)
    make_folder(root, param="archive_root", value=archive_root,
                valid="a folder this process can write (shared storage on a cluster), or empty for <heteroflow home>/archive")
    result = archive(model_dir, root, name=name, metrics=report, lineage=lineage, exports=export_formats.split(","))
    Path(archived_path).parent.mkdir(parents=True, exist_ok=True)
    Path(archived_path).write_text(json.dumps(_archive_facts(result)), encoding="utf-8")
    return result


# --- the step definition ----------------------------------------------------------------------------------

_HOUR = 3600.0


def _check_export_formats(export_formats: str) -> None:
    from heteroflow.components.models.onnx import check_export_formats

    check_export_formats(export_formats)


def check_archive_params(*, model_name: str = "", export_formats: str = "") -> None:
    """Check the archive step's parameters before a run (the checks :func:`archive_step` makes).

    Raises:
        InvalidParameter: a bad ``model_name`` and a bad ``export_formats``: each one (both in one message).
    """
    from heteroflow.components.errors import Problems

    problems = Problems()
    with problems.check():
        check_model_name(model_name)
    with problems.check():
        _check_export_formats(export_formats)
    problems.raise_all("archive's parameters")


def _archive_facts(result: Any) -> dict[str, Any]:
    """The archive step's facts; the archived Model artifact's metadata too (what the Kubeflow UI's lineage shows:
    the name, version and content hash ``heteroflow runs`` and ``heteroflow archive show`` show)."""
    lineage = result.lineage or {}
    facts = {"path": str(result.path), "version": result.version, "name": result.name}
    facts["model_sha256"] = lineage.get("model_sha256")
    facts["formats"] = sorted(lineage.get("formats") or {"pytorch": {}})
    if lineage.get("run_id"):
        facts["run_id"] = lineage["run_id"]
    dataset_sha = (lineage.get("dataset") or {}).get("dataset_sha256")
    if dataset_sha:
        facts["dataset_sha256"] = dataset_sha
    if result.existing:
        facts["existing"] = True
    if result.note:
        facts["note"] = result.note
    return facts


def _archive_summary(f: dict[str, Any]) -> list[str]:
    formats = f", formats: {', '.join(f['formats'])}" if len(f.get("formats") or ()) > 1 else ""
    if f.get("existing"):
        return [f"archived: {f['path']} (version {f['version']}, already archived: the same model{formats})"] + ([f["note"]] if f.get("note") else [])
    return [f"archived: {f['path']} (version {f['version']}{formats})"] + ([f["note"]] if f.get("note") else [])


ARCHIVE: Step = step(
    archive_step,
    name="archive",
    inputs=[
        ArtifactSpec(name="dataset", type=ArtifactType.DATASET, param="dataset_dir"),
        ArtifactSpec(name="shards", type=ArtifactType.DATASET, param="shards_dir"),
        ArtifactSpec(name="model", type=ArtifactType.MODEL, param="model_dir"),
        ArtifactSpec(name="eval_metrics", type=ArtifactType.METRICS, param="eval_metrics_path"),
    ],
    outputs=[
        ArtifactSpec(
            name="archived",
            type=ArtifactType.MODEL,
            param="archived_path",
            help="where the model was archived",
            metadata=lambda f: {k: v for k, v in f.items() if v is not None},
        )
    ],
    candidates=[Resources(kind="cpu", cpu="1", memory="2Gi")],
    retry=RetryPolicy(retries=2, backoff_seconds=5, max_delay_seconds=60, window_seconds=_HOUR),
    cacheable=False,  # each run archives: a new version, or finds the one holding the same model
    check=check_archive_params,
    facts=_archive_facts,
    summary=_archive_summary,
    ref="heteroflow.components.models.archive:ARCHIVE",
)
