"""Run a pipeline on this machine with kfp.local (``SubprocessRunner(use_venv=False)``) and record the run.

A run gets a folder (default ``./heteroflow-runs/<run id>``) holding:

- ``run.json``: the run record (status, parameters, per-step device/attempts/seconds, metrics, archive path),
  written atomically when the run ends;
- ``steps/<step>/attempt-<n>.json``: one record per attempt, written by the steps themselves;
- ``kfp/``: kfp.local's pipeline root (every task's artifacts), and ``kfp.log``: everything kfp.local printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.cache.errors import DatasetError
from heteroflow.cache.prewarm import atomic_write_bytes
from heteroflow.components.datasets import SUPPORTED_SUFFIXES, export_digits
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.resources import Candidates
from heteroflow.components.telemetry import RUN_DIR_ENV, AttemptRecord, read_step_records

__all__ = [
    "STEP_ORDER",
    "Parameter",
    "RunRecord",
    "StepSummary",
    "coerce_overrides",
    "pipeline_parameters",
    "run_local",
]

STEP_ORDER = ("prewarm", "preprocess", "plan", "train", "evaluate", "archive")


@dataclasses.dataclass(frozen=True, slots=True)
class Parameter:
    """One pipeline parameter: name, Python type (str/int/float/bool), default (``inspect.Parameter.empty``
    when required) and its help line."""

    name: str
    type: type
    default: Any
    help: str

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


def pipeline_parameters(pipeline_func: Any) -> dict[str, Parameter]:
    """The parameters of a ``@dsl.pipeline`` function, from its signature and its docstring's ``Args:``."""
    func = getattr(pipeline_func, "pipeline_func", pipeline_func)
    helps: dict[str, str] = {}
    for line in (inspect.getdoc(func) or "").splitlines():
        name, sep, text = line.strip().partition(":")
        if sep and name.isidentifier():
            helps[name] = text.strip()
    out = {}
    for p in inspect.signature(func).parameters.values():
        out[p.name] = Parameter(p.name, p.annotation, p.default, helps.get(p.name, ""))
    return out


def coerce_overrides(overrides: Mapping[str, str], params: Mapping[str, Parameter]) -> dict[str, Any]:
    """Turn ``name=value`` strings into typed values.

    Raises:
        InvalidParameter: an unknown name (the message lists the valid ones) or a value of the wrong type.
    """
    out: dict[str, Any] = {}
    for name, raw in overrides.items():
        if name not in params:
            raise InvalidParameter(f"unknown parameter {name!r}; valid: {', '.join(sorted(params))}")
        typ = params[name].type
        try:
            if typ is bool:
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                value: Any = raw.lower() in ("true", "1")
            else:
                value = typ(raw)
        except ValueError:
            raise InvalidParameter(f"parameter {name}={raw!r} is not a valid {typ.__name__}") from None
        out[name] = value
    return out


@dataclasses.dataclass(slots=True, kw_only=True)
class StepSummary:
    """One step of a run: status (``succeeded``, ``failed``, ``running``, ``not run``), the device of its last
    attempt, attempts, seconds of the last attempt, the step's own compute seconds, error, details."""

    name: str
    status: str
    device: str | None = None
    attempts: int = 0
    seconds: float | None = None
    compute_seconds: float | None = None
    error: str | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_records(cls, name: str, records: list[AttemptRecord]) -> StepSummary:
        if not records:
            return cls(name=name, status="not run")
        last = records[-1]
        return cls(
            name=name,
            status=last.status,
            device=last.device,
            attempts=len(records),
            seconds=last.seconds,
            compute_seconds=last.compute_seconds,
            error=next((r.error for r in reversed(records) if r.error), None),
            details=last.details,
        )


@dataclasses.dataclass(slots=True, kw_only=True)
class RunRecord:
    """The record of one local run, written to ``<run_dir>/run.json``.

    Attributes:
        run_id: ``YYYYmmdd-HHMMSS-xxxx``.
        status: ``succeeded`` when every step succeeded, ``interrupted`` after Ctrl-C or SIGTERM, else ``failed``.
        run_dir: the run's folder.
        started_at: Unix time, seconds.
        wall_seconds: wall time of the whole run, seconds.
        params: the pipeline arguments used.
        steps: one summary per step, in pipeline order.
        metrics: test metrics (accuracy, per-class precision and recall) and train throughput.
        archive: where the model was archived (``path``, ``version``), if it was.
        placement: the plan step's decision.
    """

    run_id: str
    status: str
    run_dir: str
    started_at: float
    wall_seconds: float
    params: dict[str, Any]
    steps: list[StepSummary]
    metrics: dict[str, Any]
    archive: dict[str, Any]
    placement: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def step(self, name: str) -> StepSummary:
        return next(s for s in self.steps if s.name == name)

    @property
    def compute_seconds(self) -> float:
        """Sum of the steps' own compute time (their work, without process start, imports and orchestration)."""
        return sum(s.compute_seconds or 0.0 for s in self.steps)


def check_local_dataset(uri: str) -> None:
    """Fail early, with a message that says what to do, when a local data set folder is missing or empty.

    For other URLs only the fsspec driver is checked here (a missing one, e.g. s3fs for ``s3://``, fails
    at once instead of after the prewarm step's retries); their content is checked by the prewarm step.

    Raises:
        DatasetError: the folder does not exist, is empty, or holds no .csv/.npz file.
    """
    if "://" in uri and not uri.startswith("file://"):
        import fsspec

        protocol = uri.split("://", 1)[0]
        try:
            fsspec.get_filesystem_class(protocol)
        except ImportError as exc:
            raise DatasetError(f"cannot read {uri}: {exc} (pip install the fsspec driver for {protocol}://)") from None
        except ValueError:
            raise DatasetError(
                f"cannot read {uri}: {protocol}:// is not a known fsspec protocol; give a local folder or an "
                "fsspec URL (file://, s3://, gs://, memory://, alluxiofs://...)"
            ) from None
        return
    path = Path(uri.removeprefix("file://")).expanduser()
    if not path.exists():
        raise DatasetError(f"data set folder {path} does not exist; pass --dataset DIR with .csv or .npz files")
    if path.is_file():
        files = [path]
    else:
        files = [p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")]
        if not files:
            raise DatasetError(f"data set folder {path} is empty; put .csv or .npz files in it")
    if not any(p.suffix.lower() in SUPPORTED_SUFFIXES for p in files):
        raise DatasetError(
            f"data set {path} has no .csv or .npz file; supported formats: .csv (header row, a 'label' column "
            "or the last column as class) and .npz (arrays x, y)"
        )


def check_params(args: Mapping[str, Any]) -> None:
    """Check the default pipeline's arguments before anything runs, with the steps' own checks, so a bad
    value fails at once instead of after a step's retries.

    Raises:
        InvalidParameter: the first argument out of range, named, with what is valid.
    """
    from heteroflow.components.archive import check_model_name
    from heteroflow.components.preprocess import check_split_params
    from heteroflow.components.train import check_train_params

    check_train_params(
        epochs=args["epochs"],
        batch_size=args["batch_size"],
        learning_rate=args["learning_rate"],
        hidden_units=args["hidden_units"],
        checkpoint_every_steps=args["checkpoint_every_steps"],
    )
    check_split_params(validation_fraction=args["validation_fraction"], test_fraction=args["test_fraction"])
    check_model_name(args["model_name"])
    if args["device_inventory"].strip():
        from heteroflow.components.plan import Inventory

        Inventory.from_json(args["device_inventory"])
    if args["num_workers"] < 0:
        raise InvalidParameter(f"num_workers={args['num_workers']} is out of range; valid: 0 (all given cores) or more")


def default_model_name(dataset_uri: str) -> str:
    """``digits-mlp`` for the built-in sample, else ``<data set folder name>-mlp`` made a valid model name."""
    base = Path(dataset_uri.rstrip("/").split("://")[-1]).stem.lower()
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in base).strip("-._")[:58]
    return f"{safe or 'model'}-mlp"


def prepare_run_dir(folder: Path) -> Path:
    """Create the run folder; refuse a file, or a folder that already holds a run (its records would mix).

    Raises:
        InvalidParameter: ``folder`` is a file or holds an earlier run.
    """
    if folder.exists() and not folder.is_dir():
        raise InvalidParameter(f"run folder {folder} is a file; give --output a new or empty folder")
    if folder.is_dir() and any((folder / name).exists() for name in ("run.json", "steps", "kfp")):
        raise InvalidParameter(f"run folder {folder} already holds a run; give --output a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def collect(run_dir: Path) -> list[StepSummary]:
    """Summaries of the steps recorded so far under ``run_dir``, in pipeline order."""
    records = read_step_records(run_dir)
    names = list(STEP_ORDER) + sorted(set(records) - set(STEP_ORDER))
    return [StepSummary.from_records(n, records.get(n, [])) for n in names]


def run_local(
    params: Mapping[str, Any] | None = None,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    candidates: Candidates | None = None,
    on_progress: Callable[[list[StepSummary]], None] | None = None,
    echo_engine_output: bool = False,
) -> RunRecord:
    """Run the default pipeline with kfp.local and return (and write) its :class:`RunRecord`.

    Args:
        params: pipeline arguments; unset ones take the pipeline's defaults. Without ``dataset_uri`` the
            built-in digits sample is exported (once) and used.
        run_dir: the run's folder; default ``./heteroflow-runs/<run id>``.
        candidates: train/evaluate candidates; default: the pipeline's.
        on_progress: called about twice a second with the step summaries so far.
        echo_engine_output: print kfp.local's own output instead of writing it to ``<run_dir>/kfp.log``.

    Raises:
        InvalidParameter: an unknown parameter name.
        DatasetError: a local data set folder that is missing, empty or holds no supported file.
        KeyboardInterrupt: the run was interrupted; the step subprocesses were stopped and ``run.json``
            records status ``interrupted``.
    """
    from kfp import local

    from heteroflow.pipelines.default import build_default_pipeline

    pipeline = build_default_pipeline(candidates=candidates)
    spec = pipeline_parameters(pipeline)
    args = dict(params or {})
    unknown = sorted(set(args) - set(spec))
    if unknown:
        raise InvalidParameter(f"unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(sorted(spec))}")
    if not args.get("dataset_uri"):
        args["dataset_uri"] = str(export_digits())
    elif "://" not in args["dataset_uri"]:
        args["dataset_uri"] = str(Path(args["dataset_uri"]).expanduser().resolve())
    check_local_dataset(args["dataset_uri"])
    if "model_name" not in args:
        args["model_name"] = default_model_name(args["dataset_uri"])
    for name, p in spec.items():
        if name not in args and not p.required:
            args[name] = p.default
    check_params(args)

    run_id = new_run_id()
    folder = prepare_run_dir(Path(run_dir) if run_dir is not None else Path.cwd() / "heteroflow-runs" / run_id)
    started = time.time()
    t0 = time.perf_counter()

    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            on_progress(collect(folder))  # type: ignore[misc]

    watcher = threading.Thread(target=watch, daemon=True) if on_progress else None
    # Each lightweight component writes its source into `mktemp -d` and leaves it there; point TMPDIR of the
    # step subprocesses into the run folder and remove that folder when the run ends.
    # This process keeps its own temporary folder: tempfile caches the first one it resolves, and it must not
    # cache the scratch folder, which is removed at the end of the run.
    tempfile.gettempdir()
    scratch = folder / "tmp"
    scratch.mkdir(exist_ok=True)
    old_env = {name: os.environ.get(name) for name in (RUN_DIR_ENV, "TMPDIR")}
    os.environ[RUN_DIR_ENV] = str(folder)
    os.environ["TMPDIR"] = str(scratch)
    try:
        if watcher:
            watcher.start()
        with contextlib.ExitStack() as stack:
            if not echo_engine_output:
                log = stack.enter_context(open(folder / "kfp.log", "w", encoding="utf-8"))
                stack.enter_context(contextlib.redirect_stdout(log))
                stack.enter_context(contextlib.redirect_stderr(log))
            with warnings.catch_warnings():
                # Our steps run in this environment on purpose; kfp warns about the image name otherwise.
                warnings.filterwarnings("ignore", message=".*custom or non-Python base image.*")
                local.init(
                    runner=local.SubprocessRunner(use_venv=False),
                    pipeline_root=str(folder / "kfp"),
                    raise_on_error=False,
                )
                pipeline(**args)
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM turned into it by the CLI): stop the step subprocesses too, so none trains on
        # as an orphan; their checkpoints stay, and the same command resumes.
        _terminate_children()
        interrupted = True
    else:
        interrupted = False
    finally:
        stop.set()
        if watcher:
            watcher.join()
        for name, value in old_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(scratch, ignore_errors=True)

    steps = collect(folder)
    by_name = {s.name: s for s in steps}
    if interrupted:
        status = "interrupted"
    elif all(by_name[n].status == "succeeded" for n in STEP_ORDER):
        status = "succeeded"
    else:
        status = "failed"
    metrics: dict[str, Any] = {}
    if by_name["evaluate"].status == "succeeded":
        metrics.update(by_name["evaluate"].details)
    if by_name["train"].status == "succeeded":
        for key in ("samples_per_second", "validation_accuracy", "resumed_from_step", "steps"):
            metrics[f"train_{key}"] = by_name["train"].details.get(key)
    record = RunRecord(
        run_id=run_id if run_dir is None else folder.name,
        status=status,
        run_dir=str(folder),
        started_at=started,
        wall_seconds=time.perf_counter() - t0,
        params=args,
        steps=steps,
        metrics=metrics,
        archive=dict(by_name["archive"].details) if by_name["archive"].status == "succeeded" else {},
        placement=dict(by_name["plan"].details),
    )
    atomic_write_bytes(folder / "run.json", json.dumps(record.to_dict(), indent=2, default=str).encode())
    if interrupted:
        raise KeyboardInterrupt
    if on_progress:
        on_progress(steps)
    return record


def _terminate_children(grace_seconds: float = 5.0) -> None:
    """SIGTERM every descendant process, then SIGKILL those still alive after ``grace_seconds``."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_seconds)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
