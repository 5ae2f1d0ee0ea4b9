"""The DAG factory: :func:`build_dag` renders a :class:`~heteroflow.pipelines.graph.Pipeline` as an Airflow 3 DAG.

Nothing here knows a step's name or parameters: tasks, parameters, resources, retries and fallback all come
from the Pipeline and its Steps (DESIGN.md, "One definition, rendered per engine"). The DAG's shape is
described in :mod:`heteroflow.dags.layout`, the tasks in :mod:`heteroflow.dags.operators` (local mode) and
:mod:`heteroflow.dags.pods` (kubernetes mode).

Example (a DAG file in your DAGS_FOLDER)::

    from heteroflow.dags.factory import build_dag
    from heteroflow.pipelines.default import default_pipeline

    dag = build_dag(default_pipeline(), "heteroflow-nightly", schedule="0 3 * * *")
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterable, Mapping
from typing import Any

from heteroflow.components.devices.cluster import ClusterProfile
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.resources import DeviceKind
from heteroflow.dags.layout import PREPARE_TASK, RECORD_TASK, Layout, airflow_params, check_calls, pool_for
from heteroflow.pipelines.graph import Call, Pipeline, load_pipeline

__all__ = ["MODES", "build_dag"]

MODES = ("local", "kubernetes")
"""``local``: each task runs its step in the Airflow worker (the embedded default; artifacts in a local run
folder). ``kubernetes``: each task is a KubernetesPodOperator running ``heteroflow step`` in a pod."""

_START = _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)


def _doc(call: Call, index: int | None) -> str:
    res = call.candidates[index or 0]
    lines = [f"**{call.name}**: {call.step.description or call.step.name}", ""]
    if call.device_bound:
        lines.append(f"Candidate {index or 0} of {len(call.candidates)} (0 = preferred): `{res.describe()}`.")
    else:
        lines.append(f"Runs on: `{res.describe()}`.")
    r = call.retry
    what = "transient failures only" if r.retry_on == "transient" else "retry_on='any': permanent failures too"
    lines.append(
        f"Retries ({what}): {r.retries}, wait min({r.backoff_seconds:g} s x {r.factor:g}^n, "
        f"{r.max_delay_seconds:g} s), within {r.window_seconds:g} s of the first attempt."
    )
    return "\n".join(lines)


def build_dag(
    pipeline: Pipeline | str,
    dag_id: str | None = None,
    *,
    mode: str = "local",
    schedule: Any = None,
    start_date: _dt.datetime | None = None,
    catchup: bool = False,
    params: Mapping[str, Any] | None = None,
    run_root: str | os.PathLike[str] | None = None,
    pools: bool = True,
    outlets: Mapping[str, Iterable[Any]] | None = None,
    profile: ClusterProfile | str | os.PathLike[str] | None = None,
    image: str | None = None,
    pod_kwargs: Mapping[str, Any] | None = None,
    tags: Iterable[str] = ("heteroflow",),
    description: str | None = None,
    **dag_kwargs: Any,
) -> Any:
    """Render ``pipeline`` as an Airflow DAG.

    Args:
        pipeline: the pipeline, or ``module:attribute`` of one (or of a function returning one).
        dag_id: the DAG's id; default the pipeline's name.
        mode: ``local`` (steps run in the worker, through the code path of ``heteroflow step``) or
            ``kubernetes`` (each task a KubernetesPodOperator running ``heteroflow step`` in the image for its
            device kind, with the candidate's resources, node selector, tolerations, scheduler and queue).
        schedule: Airflow's ``schedule``: None (manual), a cron string, a timedelta, or Assets (run when they
            are updated).
        start_date: default 2024-01-01 UTC; with ``catchup`` False no past run is created.
        params: new defaults for pipeline parameters (the DAG's params; each run may override them).
        run_root: the folder that holds run folders (``<run_root>/<dag id>/<run id>``): default
            ``<heteroflow home>/airflow-runs`` in local mode; required in kubernetes mode (a path on storage
            every pod mounts, see ``pod_kwargs``).
        pools: put each accelerator task in its device kind's / model's pool with ``pool_slots`` = the devices
            it uses (create the pools with ``heteroflow airflow pools``); False: Airflow's default pool.
        outlets: per call name, Airflow Assets the call updates when it succeeds (the asset event's ``extra``
            carries the run folder, the output paths and the step's scalar facts).
        profile: kubernetes mode: the cluster profile (a :class:`ClusterProfile` or a YAML path): device-plugin
            names, node labels, queues, scheduler, image per device kind.
        image: kubernetes mode: the image for device kinds the profile names none for (heteroflow[all]
            installed).
        pod_kwargs: kubernetes mode: more KubernetesPodOperator arguments for every pod (``namespace``,
            ``volumes``, ``volume_mounts``, ``service_account_name``, ``in_cluster``, ``config_file``...).
        tags / description / dag_kwargs: passed to ``DAG``.

    Returns:
        An ``airflow.sdk.DAG``.

    Raises:
        InvalidParameter: ``pipeline`` is not a Pipeline or a reference to one; an unknown mode, parameter, call
            name; kubernetes mode without ``run_root``; a step a pod cannot import.
        InvalidResources: a candidate the cluster profile cannot ask for.
    """
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, Param, TaskGroup, TriggerRule

    from heteroflow.dags.operators import (
        FallbackGateOperator,
        PrepareRunOperator,
        RecordRunOperator,
        StepOperator,
        retry_arguments,
    )

    if mode not in MODES:
        raise InvalidParameter(f"mode={mode!r} is unknown; valid: {', '.join(MODES)}")
    if isinstance(pipeline, str):
        pipeline = load_pipeline(pipeline)
    if not isinstance(pipeline, Pipeline):  # None said "'NoneType' object has no attribute 'calls'"
        raise InvalidParameter(
            f"pipeline={pipeline!r} is not a heteroflow Pipeline; valid: a Pipeline or 'module:attribute' of one (the "
            "default pipeline: default_pipeline(), or 'heteroflow.pipelines.default:default_pipeline')")
    from heteroflow.pipelines.control import has_control
    from heteroflow.pipelines.subpipelines import check_runnable

    check_runnable(pipeline)
    controlled = has_control(pipeline)  # output parameters, conditions, loops, sub-pipelines: dags.control
    if controlled:
        from heteroflow.dags import control as dag_control

        dag_control.check_renderable(pipeline)
    outlets = {k: list(v) for k, v in (outlets or {}).items()}
    check_calls(pipeline, outlets, what="outlets")
    kube = mode == "kubernetes"
    if kube and run_root is None:
        raise InvalidParameter(
            "kubernetes mode needs run_root: a folder on storage every pod mounts (pass the volume in pod_kwargs)"
        )
    if kube:
        from heteroflow.dags.pods import pod_task_factory

        make_pod = pod_task_factory(pipeline, profile=profile, image=image, pod_kwargs=pod_kwargs or {})
    layout = Layout(pipeline)
    if controlled:
        dag_control.check_loop_ids(pipeline, layout)
    dag_id = dag_id or pipeline.name
    doc = [pipeline.description or pipeline.name, "", f"Rendered by heteroflow ({mode} mode) from pipeline `{pipeline.name}`."]
    dag = DAG(
        dag_id,
        schedule=schedule,
        start_date=start_date or _START,
        catchup=catchup,
        params={name: Param(**spec) for name, spec in airflow_params(pipeline, params).items()},
        tags=list(tags),
        description=description or pipeline.description or None,
        doc_md="\n".join(doc),
        **({"dag_display_name": pipeline.display_name} if getattr(pipeline, "display_name", None) and "dag_display_name" not in dag_kwargs else {}),
        **dag_kwargs,
    )
    tasks: dict[str, Any] = {}

    def step_task(call: Call, index: int | None, task_id: str, **extra: Any) -> Any:
        res = call.candidates[index or 0]
        kwargs: dict[str, Any] = dict(task_id=task_id, doc_md=_doc(call, index), **retry_arguments(call.retry), **extra)
        if call.display_name:
            shown = call.display_name if index is None or not layout[call.name].grouped else f"{call.display_name} ({task_id})"
            kwargs["task_display_name"] = shown
        if pools:
            pool, slots = pool_for(res)
            if pool is not None:
                kwargs.update(pool=pool, pool_slots=slots)
        if call.name in outlets:
            kwargs["outlets"] = outlets[call.name]
        if controlled:
            kwargs.update(dag_control.operator_options(pipeline, layout, call, kube=kube, tasks=tasks))
        if kube:
            return make_pod(call, index, dag_id=dag_id, layout=layout, **kwargs)
        cls = kwargs.pop("operator_class", StepOperator)  # a call inside a ParallelFor: a task of its mapped task group
        return cls(pipeline=pipeline, layout=layout, call_name=call.name, candidate_index=index, **kwargs)

    with dag:
        claims: dict[str, Any] = {}
        if kube:  # CreatePVC: created before the first call that mounts it, deleted after the last (dags/volumes.py)
            from heteroflow.dags.volumes import pvc_operators

            claims = pvc_operators(pipeline, namespace=(pod_kwargs or {}).get("namespace"), conn_id=(pod_kwargs or {}).get("kubernetes_conn_id"))
        prepare = PrepareRunOperator(
            task_id=PREPARE_TASK,
            pipeline=pipeline,
            local=not kube,
            run_root=None if run_root is None else os.fspath(run_root),
            retries=0,
            doc_md="Checks the run's arguments and fixes its run folder (setup).",
        )
        tasks[PREPARE_TASK] = prepare
        subs: list[Any] = []  # the sub-pipelines' TaskGroups open now (dags.control)
        for create, delete, _ in claims.values():
            prepare >> create
            tasks[create.task_id] = create
        for call in pipeline.calls:
            if controlled:
                dag_control.enter_groups(call, subs, pipeline=pipeline, layout=layout, tasks=tasks)
            names = layout[call.name]
            upstream = [tasks[t] for t in layout.upstream(call)]
            if controlled:  # the producers of the output parameters it, its conditions or its loop read
                upstream += [tasks[t] for t in dag_control.control_upstream(pipeline, layout, call) if tasks[t] not in upstream]
            upstream += [create for create, _, users in claims.values() if call.name in users]
            if not names.grouped:
                op = step_task(call, 0 if call.device_bound else None, call.name)
                upstream >> op
                tasks[call.name] = op
                continue
            with TaskGroup(group_id=call.name, tooltip=f"{call.name}: {len(call.candidates)} candidates, first preferred"):
                previous = None
                candidates = []
                for k, res in enumerate(call.candidates):
                    rule = TriggerRule.ALL_SUCCESS if k == 0 else TriggerRule.NONE_FAILED
                    op = step_task(call, k, f"{DeviceKind(res.kind).value}-{k}", trigger_rule=rule)
                    if previous is None:
                        upstream >> op
                    else:
                        gate = FallbackGateOperator(
                            task_id=f"fallback-to-{k}",
                            pipeline=pipeline,
                            layout=layout,
                            call_name=call.name,
                            candidate_index=k,
                            trigger_rule=TriggerRule.ALL_FAILED,
                            retries=0,
                            doc_md=f"Opens candidate {k} only after candidate {k - 1} reported a device failure.",
                        )
                        previous >> gate
                        # not prepare-run itself: a setup's direct downstream must be all_success (it precedes
                        # this candidate through candidate 0 anyway)
                        [gate, *(t for t in upstream if t is not prepare)] >> op
                        tasks[gate.task_id] = gate
                    tasks[op.task_id] = op
                    candidates.append(op)
                    previous = op
                join = EmptyOperator(task_id="done", trigger_rule=TriggerRule.ONE_SUCCESS, doc_md="One candidate succeeded.")
                candidates >> join
                tasks[join.task_id] = join
        if controlled:
            dag_control.enter_groups(None, subs)
        for create, delete, users in claims.values():
            if delete is not None:
                [tasks[layout[user].join] for user in users] >> delete
                tasks[delete.task_id] = delete
        record = RecordRunOperator(task_id=RECORD_TASK, pipeline=pipeline, retries=0, doc_md="Writes run.json (teardown).")
        record.as_teardown(setups=prepare)
        [t for name, t in tasks.items() if name != PREPARE_TASK] >> record
    return dag

