"""One way to run a pipeline, whatever the engine: :func:`run` (``heteroflow.run``; ``heteroflow run`` calls it).

=============  ===================================================================================  ===============
engine         what runs each step attempt                                                          module
=============  ===================================================================================  ===============
``kfp-local``  kfp.local's SubprocessRunner: one process per task, the KFP rendering of the          pipelines.local
               pipeline (the same graph a cluster runs)
``inprocess``  this process, one call after another (quick iteration, tests)                        pipelines.inprocess
=============  ===================================================================================  ===============

Both write the same run folder and ``run.json`` (:mod:`heteroflow.pipelines.records`) and start every step
attempt through :func:`heteroflow.components.runtime.run_step`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from heteroflow.components.errors import InvalidParameter
from heteroflow.pipelines.graph import Pipeline, load_pipeline
from heteroflow.pipelines.records import RunRecord, StepSummary

__all__ = ["ENGINES", "resolve_pipeline", "run"]

ENGINES = ("kfp-local", "inprocess")


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
    engine: str = "kfp-local",
    run_dir: str | os.PathLike[str] | None = None,
    simulate_devices: Sequence[str] | str | None = None,
    inject_faults: Sequence[str] | str | None = None,
    on_progress: Callable[[list[StepSummary]], None] | None = None,
    echo_engine_output: bool = False,
) -> RunRecord:
    """Run ``pipeline`` on this machine and return (and write) its :class:`~heteroflow.pipelines.records.RunRecord`.

    Args:
        pipeline: a Pipeline, ``module:attribute`` of one (or of a function returning one), or None for the
            default pipeline.
        params: pipeline arguments by name (see ``heteroflow params``); unset ones take their defaults.
        engine: ``kfp-local`` or ``inprocess`` (module docstring).
        run_dir: the run folder; default ``./heteroflow-runs/<run id>``.
        simulate_devices / inject_faults: testing settings (:mod:`heteroflow.components.failures`).
        on_progress: kfp-local only: called about twice a second with the step summaries so far.
        echo_engine_output: kfp-local only: print kfp.local's output instead of writing ``kfp.log``.

    Raises:
        InvalidParameter: an unknown engine, parameter or value, checked before anything runs.
        DatasetError: a local data set folder that is missing, empty or holds no supported file.
        KeyboardInterrupt: the run was stopped (Ctrl-C, or SIGTERM through the CLI) before it completed; its
            ``record`` attribute is the run's record (status ``interrupted``).
    """
    if engine not in ENGINES:
        raise InvalidParameter(f"engine={engine!r} is unknown; valid: {', '.join(ENGINES)}")
    resolved = resolve_pipeline(pipeline)
    if engine == "inprocess":
        from heteroflow.pipelines.inprocess import run_inprocess

        return run_inprocess(resolved, params, run_dir=run_dir, simulate_devices=simulate_devices, inject_faults=inject_faults)
    from heteroflow.pipelines.local import run_local

    return run_local(
        params,
        pipeline=resolved,
        run_dir=run_dir,
        simulate_devices=simulate_devices,
        inject_faults=inject_faults,
        on_progress=on_progress,
        echo_engine_output=echo_engine_output,
    )
