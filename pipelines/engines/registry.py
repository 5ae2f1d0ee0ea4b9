"""Engines: what runs a pipeline, behind one interface (:class:`Engine`), chosen by name from a registry.

=============  =====================================================================================  ===============
engine         what runs each step attempt                                                            needs
=============  =====================================================================================  ===============
``kfp-local``  kfp.local's SubprocessRunner: one process per task, the KFP rendering of the            ``[kfp]``
               pipeline (the same graph a cluster runs); :func:`heteroflow.pipelines.kfp.local.run_local`
``inprocess``  this process, one call after another (quick iteration, tests);                         (nothing)
               :func:`heteroflow.pipelines.engines.inprocess.run_inprocess`
``kfp``        a Kubeflow Pipelines backend: the pipeline is compiled and submitted                   ``[kfp]``
               (:func:`heteroflow.pipelines.kfp.submit.submit_package`); the record is the submission's
``airflow``    a real Airflow 3 on SQLite, ``airflow dags test`` style (:mod:`heteroflow.dags.engine`;    ``[airflow]``
               registered through the entry point, as imports go ``dags -> pipelines``)
=============  =====================================================================================  ===============

The builtin engines are registered in code (:data:`BUILTIN_ENGINES`); other packages add theirs through the
entry-point group ``heteroflow.engines`` (:data:`ENTRY_POINT_GROUP`; each entry names an :class:`Engine` object,
class or zero-argument factory), loaded once, on the first lookup that needs them. Adding an engine is one module and
one entry point: ``heteroflow.run(engine=...)`` and ``heteroflow run --engine`` find it.

This module imports nothing heavy at import time (the console script reads :data:`DEFAULT_ENGINE` from it): each
engine imports its runner when it runs.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from heteroflow.components.errors import HeteroflowError, InvalidParameter

if TYPE_CHECKING:
    from heteroflow.pipelines.graph import Pipeline
    from heteroflow.pipelines.runs.records import RunRecord, StepSummary

__all__ = [
    "BUILTIN_ENGINES",
    "DEFAULT_ENGINE",
    "ENTRY_POINT_GROUP",
    "KFP_HOST_ENV",
    "KFP_IMAGE_ENV",
    "OPTIONAL_OPTIONS",
    "Engine",
    "EngineUnavailable",
    "check_installed",
    "engine_names",
    "get_engine",
    "register_engine",
]

DEFAULT_ENGINE = "kfp-local"
"""The engine ``heteroflow.run`` and ``heteroflow run`` use unless told otherwise."""

BUILTIN_ENGINES = ("kfp-local", "inprocess", "kfp")
"""The engines this module registers (``airflow`` comes through :data:`ENTRY_POINT_GROUP`, from ``heteroflow.dags``)."""

ENTRY_POINT_GROUP = "heteroflow.engines"
"""Entry-point group of engines other packages add (pyproject.toml: ``[project.entry-points."heteroflow.engines"]``)."""

OPTIONAL_OPTIONS = ("on_progress", "echo_engine_output")
"""Run options an engine may leave unhonoured; each engine lists those it honours in ``Engine.options``."""

KFP_HOST_ENV = "HETEROFLOW_KFP_HOST"
"""The Kubeflow Pipelines endpoint the ``kfp`` engine submits to when no ``host=`` is given (as ``heteroflow submit``)."""

KFP_IMAGE_ENV = "HETEROFLOW_KFP_IMAGE"
"""The step image the ``kfp`` engine compiles with when no ``image=`` is given: how ``heteroflow run --engine kfp``,
which has no engine options on its command line, names it."""


class EngineUnavailable(HeteroflowError, ImportError):
    """An engine needs a module that is not installed; the message names the ``pip install 'heteroflow[...]'`` to run."""


@runtime_checkable
class Engine(Protocol):
    """What runs a pipeline.

    Attributes:
        name: the registry key (``heteroflow run --engine NAME``): ``[a-z][a-z0-9-]*``.
        description: one line for ``--help``.
        extra: the heteroflow extra that installs what the engine needs (``kfp`` -> ``pip install
            'heteroflow[kfp]'``), or None.
        modules: top-level modules that must be importable (checked by :func:`check_installed`).
        options: which of :data:`OPTIONAL_OPTIONS` the engine honours; ``heteroflow.run`` warns about the others.
    """

    name: str
    description: str
    extra: str | None
    modules: tuple[str, ...]
    options: frozenset[str]

    def run(
        self,
        pipeline: Pipeline,
        params: Mapping[str, Any] | None,
        *,
        run_dir: str | os.PathLike[str] | None,
        simulate_devices: Sequence[str] | str | None,
        inject_faults: Sequence[str] | str | None,
        on_progress: Callable[[list[StepSummary]], None] | None,
        echo_engine_output: bool,
        source: str | None,
        **options: Any,
    ) -> RunRecord:
        """Run ``pipeline`` with ``params`` and return (and write) its record.

        Args:
            source: the ``module:attribute`` the pipeline was loaded from, or None (a Pipeline value); engines that
                run the pipeline in other processes import it from there (the value's calls' candidates may differ
                from the imported ones': ``-c`` on the default pipeline; ``airflow`` gives them the value's).
            options: engine-specific settings; an engine raises :class:`InvalidParameter` naming any it does not
                know, and listing those it does.

        Raises:
            InvalidParameter / DatasetError: bad arguments, checked before anything runs.
            KeyboardInterrupt: see :func:`heteroflow.pipelines.engines.runner.run`.
        """
        ...


def check_installed(engine: Engine) -> None:
    """Check that ``engine``'s modules can be imported.

    Raises:
        EngineUnavailable: one is missing; the message names the engine, the module and the extra to install.
    """
    for module in engine.modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            how = f"pip install 'heteroflow[{engine.extra}]'" if engine.extra else f"pip install {module}"
            raise EngineUnavailable(f"engine={engine.name!r} needs the module {module!r}, which is not installed; run: {how}")


def _no_options(engine: str, options: Mapping[str, Any], known: Sequence[str] = ()) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        valid = ", ".join(known) if known else "none"
        raise InvalidParameter(f"engine={engine!r} has no option {unknown[0]!r}; valid engine options: {valid}")


# --- the builtin engines -------------------------------------------------------------------------------------


class KfpLocalEngine:
    """``kfp-local``: :func:`heteroflow.pipelines.kfp.local.run_local` (options: ``parallel``, ``prestart``)."""

    name = "kfp-local"
    description = "kfp.local's SubprocessRunner: the steps as KFP components, one process each"
    extra: str | None = "kfp"
    modules = ("kfp",)
    options = frozenset(OPTIONAL_OPTIONS)

    def run(self, pipeline: Pipeline, params: Mapping[str, Any] | None, *, run_dir: Any, simulate_devices: Any, inject_faults: Any,
            on_progress: Any, echo_engine_output: bool, source: str | None = None, **options: Any) -> RunRecord:
        _no_options(self.name, options, ("parallel", "prestart"))
        from heteroflow.pipelines.kfp.local import run_local

        return run_local(
            params,
            pipeline=pipeline,
            run_dir=run_dir,
            simulate_devices=simulate_devices,
            inject_faults=inject_faults,
            on_progress=on_progress,
            echo_engine_output=echo_engine_output,
            **options,
        )


class InprocessEngine:
    """``inprocess``: :func:`heteroflow.pipelines.engines.inprocess.run_inprocess` (option: ``sleep``, how to wait between
    retries)."""

    name = "inprocess"
    description = "this process, one step after another (quick iteration)"
    extra: str | None = None
    modules: tuple[str, ...] = ()
    options: frozenset[str] = frozenset()

    def run(self, pipeline: Pipeline, params: Mapping[str, Any] | None, *, run_dir: Any, simulate_devices: Any, inject_faults: Any,
            on_progress: Any, echo_engine_output: bool, source: str | None = None, **options: Any) -> RunRecord:
        _no_options(self.name, options, ("sleep",))
        from heteroflow.pipelines.engines.inprocess import run_inprocess

        return run_inprocess(pipeline, params, run_dir=run_dir, simulate_devices=simulate_devices, inject_faults=inject_faults, **options)


class KfpEngine:
    """``kfp``: compile the pipeline into the run folder (``pipeline.yaml``) and submit it to a Kubeflow Pipelines
    backend (:func:`heteroflow.pipelines.kfp.submit.submit_package`).

    Options: ``host`` (default ``$HETEROFLOW_KFP_HOST``), ``experiment``, ``run_name``, ``namespace``, ``image``
    (the step image; default the rendering's). The returned record is the submission's: status ``submitted``, no
    steps yet, ``results["kfp"]`` holding ``run_id`` and ``url``; the run itself is watched in the Kubeflow UI.
    Simulated devices and injected faults are a local testing aid and are refused here.

    Raises:
        InvalidParameter: no host (neither ``host=`` nor ``$HETEROFLOW_KFP_HOST``), testing settings, a bad argument.
            The image: ``image=``, else ``$HETEROFLOW_KFP_IMAGE``, else the rendering's placeholder (with a warning).
        SubmitError: the endpoint cannot be reached or refuses the run.
    """

    name = "kfp"
    description = "a Kubeflow Pipelines backend (host= or $HETEROFLOW_KFP_HOST): compile and submit"
    extra: str | None = "kfp"
    modules = ("kfp",)
    options: frozenset[str] = frozenset()

    def run(self, pipeline: Pipeline, params: Mapping[str, Any] | None, *, run_dir: Any, simulate_devices: Any, inject_faults: Any,
            on_progress: Any, echo_engine_output: bool, source: str | None = None, **options: Any) -> RunRecord:
        import time
        from pathlib import Path

        _no_options(self.name, options, ("host", "experiment", "run_name", "namespace", "image"))
        host = options.get("host") or os.environ.get(KFP_HOST_ENV)
        if not host:
            raise InvalidParameter(
                f"engine 'kfp' needs a Kubeflow Pipelines endpoint: set {KFP_HOST_ENV} (the command line reads it), or "
                "pass host='http://...' to heteroflow.run (e.g. http://localhost:8080 through a port-forward of ml-pipeline-ui)"
            )
        if simulate_devices or inject_faults:
            raise InvalidParameter("engine='kfp' runs on the cluster's devices: simulate_devices and inject_faults are local testing settings")
        from heteroflow.pipelines.kfp.render import compile_pipeline, kfp_arguments
        from heteroflow.pipelines.runs.records import RunRecord, new_run_id, prepare_run_dir, run_id_for
        from heteroflow.pipelines.kfp.submit import submit_package

        args = pipeline.arguments(dict(params or {}))
        pipeline.check(args)
        run_id = new_run_id()
        folder = prepare_run_dir(Path(run_dir) if run_dir is not None else Path.cwd() / "heteroflow-runs" / run_id)
        run_id = run_id_for(folder, run_dir, run_id)
        package = folder / "pipeline.yaml"
        started = time.time()
        image = options.get("image") or os.environ.get(KFP_IMAGE_ENV)
        compile_kwargs = {"image": image} if image else {}
        if not compile_kwargs:
            import warnings

            from heteroflow.pipelines.kfp.render import DEFAULT_IMAGE

            warnings.warn(
                f"engine 'kfp': every step uses the placeholder image {DEFAULT_IMAGE}, which a cluster cannot pull; "
                f"set {KFP_IMAGE_ENV}=registry/heteroflow:tag (the command line reads it), or pass image= to heteroflow.run "
                "(an image with heteroflow[all] installed)",
                UserWarning,
                stacklevel=3,
            )
        compile_pipeline(pipeline, str(package), **compile_kwargs)
        submitted = submit_package(
            package,
            host=host,
            arguments={k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in kfp_arguments(pipeline, args).items()},
            experiment=options.get("experiment") or "heteroflow",
            run_name=options.get("run_name"),
            namespace=options.get("namespace"),
        )
        record = RunRecord(
            run_id=run_id,
            pipeline=pipeline.name,
            status="submitted",
            run_dir=str(folder),
            started_at=started,
            wall_seconds=time.time() - started,
            params=dict(args),
            steps=[],
            fallbacks=[],
            metrics={},
            results={"kfp": {"host": host, **submitted}},
            placement={},
        )
        record.write()
        return record


# --- the registry --------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Engine] = {}
_ENTRY_POINTS_LOADED = False
_BROKEN: dict[str, str] = {}


def register_engine(engine: Engine, *, replace: bool = False) -> Engine:
    """Add ``engine`` to the registry under ``engine.name`` and return it.

    Raises:
        InvalidParameter: ``engine`` lacks a field of :class:`Engine`, or its name is taken (and not ``replace``).
    """
    missing = [f for f in ("name", "description", "extra", "modules", "options", "run") if not hasattr(engine, f)]
    if missing:
        raise InvalidParameter(f"engine {engine!r} lacks {', '.join(missing)}; an engine has name, description, extra, modules, options and run()")
    if engine.name in _REGISTRY and not replace and _REGISTRY[engine.name] is not engine:
        raise InvalidParameter(f"engine={engine.name!r} is registered already; registered: {', '.join(_REGISTRY)}")
    _REGISTRY[engine.name] = engine
    return engine


for _builtin in (KfpLocalEngine(), InprocessEngine(), KfpEngine()):
    register_engine(_builtin)


def _load_entry_points() -> None:
    """Register the engines of the ``heteroflow.engines`` entry points, once. An entry that cannot be loaded (its
    package is broken or half installed, or it names an engine of another name) registers nothing and is remembered
    with the reason, which :func:`get_engine` gives when that name is asked for; one that names a builtin engine is
    ignored."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in _REGISTRY:
            continue
        try:
            value = entry.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the other engines
            _BROKEN[entry.name] = f"entry point {entry.name} = {entry.value} of {ENTRY_POINT_GROUP} cannot be loaded: {type(exc).__name__}: {exc}"
            continue
        engine = value() if isinstance(value, type) or (callable(value) and not hasattr(value, "run")) else value
        if getattr(engine, "name", None) != entry.name:
            _BROKEN[entry.name] = (
                f"entry point {entry.name} = {entry.value} of {ENTRY_POINT_GROUP} names an engine called "
                f"{getattr(engine, 'name', None)!r}; the entry's name and the engine's name must be the same"
            )
            continue
        register_engine(engine)


def engine_names() -> tuple[str, ...]:
    """The registered engines' names: the builtin ones first, then those of entry points, sorted."""
    _load_entry_points()
    return (*[n for n in BUILTIN_ENGINES if n in _REGISTRY], *sorted(n for n in _REGISTRY if n not in BUILTIN_ENGINES))


def get_engine(name: str, *, check: bool = True) -> Engine:
    """The engine called ``name``.

    Args:
        check: also check that what it needs is installed (:func:`check_installed`).

    Raises:
        InvalidParameter: no engine has that name; the message lists the registered ones.
        EngineUnavailable: ``check`` and a module it needs is missing, or its entry point cannot be loaded (the
            message says why).
    """
    if name not in _REGISTRY:
        _load_entry_points()
    if name in _BROKEN:
        raise EngineUnavailable(f"engine={name!r} is registered but unusable: {_BROKEN[name]}")
    try:
        engine = _REGISTRY[name]
    except (KeyError, TypeError):
        from heteroflow.components.errors import did_you_mean

        hint = did_you_mean([str(name)], engine_names()) if isinstance(name, str) else ""
        raise InvalidParameter(f"engine={name!r}{hint} is unknown; valid: {', '.join(engine_names())}") from None
    if check:
        check_installed(engine)
    return engine
