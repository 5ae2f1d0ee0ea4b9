"""One way to run a pipeline, whatever the engine: :func:`run` (``heteroflow.run``; ``heteroflow run`` calls it).

The engine is looked up by name in :mod:`heteroflow.pipelines.engines.registry`' registry (``kfp-local``, ``inprocess``,
``kfp``, ``airflow`` and those other packages register through the ``heteroflow.engines`` entry points). The local
engines write the same run folder and ``run.json`` (:mod:`heteroflow.pipelines.runs.records`) and start every step
attempt through :func:`heteroflow.components.core.runtime.run_step`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.engines.registry import BUILTIN_ENGINES, DEFAULT_ENGINE, OPTIONAL_OPTIONS, get_engine
from heteroflow.pipelines.graph import Pipeline, load_pipeline
from heteroflow.pipelines.runs.records import RunRecord, StepSummary

__all__ = ["DEFAULT_PIPELINE_SOURCE", "ENGINES", "resolve_pipeline", "run"]

ENGINES = BUILTIN_ENGINES
"""The builtin engines' names (kept for code written before the registry; :func:`heteroflow.pipelines.engines.registry.engine_names`
lists every registered one)."""

DEFAULT_PIPELINE_SOURCE = "heteroflow.pipelines.default:default_pipeline"
"""Where engines that run the pipeline in other processes import the default pipeline from."""


def resolve_pipeline(pipeline: Pipeline | str | None) -> Pipeline:
    """A Pipeline from a Pipeline, a ``module:attribute`` reference (:func:`load_pipeline`), or None (the default
    pipeline).

    Raises:
        InvalidParameter: a reference that does not name a pipeline, or a value of another type.
    """
    if pipeline is None:
        from heteroflow.pipelines.default import default_pipeline

        return default_pipeline()
    if isinstance(pipeline, str):
        return load_pipeline(pipeline)
    if not isinstance(pipeline, Pipeline):
        raise InvalidParameter(f"pipeline={pipeline!r} is not a heteroflow Pipeline; valid: a Pipeline, 'module:attribute', or None")
    return pipeline


def run(
    pipeline: Pipeline | str | None = None,
    params: Mapping[str, Any] | None = None,
    *,
    engine: str = DEFAULT_ENGINE,
    run_dir: str | os.PathLike[str] | None = None,
    simulate_devices: Sequence[str] | str | None = None,
    inject_faults: Sequence[str] | str | None = None,
    on_progress: Callable[[list[StepSummary]], None] | None = None,
    echo_engine_output: bool = False,
    source: str | None = None,
    **engine_options: Any,
) -> RunRecord:
    """Run ``pipeline`` on this machine and return (and write) its :class:`~heteroflow.pipelines.runs.records.RunRecord`.

    Args:
        pipeline: a Pipeline, ``module:attribute`` of one (or of a function returning one), or None for the
            default pipeline.
        params: pipeline arguments by name (see ``heteroflow params``); unset ones take their defaults.
        engine: a registered engine's name (:func:`heteroflow.pipelines.engines.registry.engine_names`): ``kfp-local``,
            ``inprocess``, ``kfp``, ``airflow``, or one an installed package registers.
        run_dir: the run folder; default ``./heteroflow-runs/<run id>``.
        simulate_devices / inject_faults: testing settings (:mod:`heteroflow.components.core.failures`).
        on_progress: called about twice a second with the step summaries so far (engines that honour it:
            ``kfp-local``; the others warn and ignore it).
        echo_engine_output: print the engine's own output as it comes (``kfp-local``: instead of writing it to the
            run folder's ``kfp.log``; ``airflow``: as well as to its ``airflow.log``; the others warn and ignore it).
        source: the ``module:attribute`` a Pipeline value was loaded from (the ``airflow`` engine imports it in
            Airflow's processes, and gives its calls the value's candidates); default ``pipeline`` when it is a
            string, the default pipeline's when None.
        engine_options: settings of the chosen engine (e.g. ``host=`` for ``kfp``, ``airflow_home=`` for
            ``airflow``, ``parallel=`` for ``kfp-local``); an engine names any it does not know.

    Raises:
        InvalidParameter: an unknown engine (the message lists the registered ones), parameter, value or engine
            option, checked before anything runs.
        EngineUnavailable: the engine needs a module that is not installed (the message names the
            ``pip install 'heteroflow[...]'`` to run).
        DatasetError: a local data set folder that is missing, empty or holds no supported file.
        KeyboardInterrupt: the run was stopped (Ctrl-C, or SIGTERM through the CLI) before it completed; its
            ``record`` attribute is the run's record (status ``interrupted``).
    """
    chosen = get_engine(engine)
    if source is None:
        source = pipeline if isinstance(pipeline, str) else DEFAULT_PIPELINE_SOURCE if pipeline is None else None
    resolved = resolve_pipeline(pipeline)
    given = {"on_progress": on_progress is not None, "echo_engine_output": bool(echo_engine_output)}
    for option in OPTIONAL_OPTIONS:
        if given[option] and option not in chosen.options:
            warnings.warn(f"engine {chosen.name!r} ignores {option}", stacklevel=2)
    return chosen.run(
        resolved,
        params,
        run_dir=run_dir,
        simulate_devices=simulate_devices,
        inject_faults=inject_faults,
        on_progress=on_progress if "on_progress" in chosen.options else None,
        echo_engine_output=bool(echo_engine_output) and "echo_engine_output" in chosen.options,
        source=source,
        **engine_options,
    )
