"""The Airflow operators a heteroflow DAG is made of (see :mod:`heteroflow.dags.layout` for the shape).

- :class:`PrepareRunOperator` (setup ``prepare-run``): checks the run's arguments once and fixes the run folder.
- :class:`StepOperator` (local mode): one attempt of one call on one candidate, in the worker, through
  :func:`heteroflow.components.core.runtime.run_step` (the code path of ``heteroflow step``). The pod operator of
  kubernetes mode (:mod:`heteroflow.dags.pods`) shares its ending (:class:`StepEnding`).
- :class:`FallbackGateOperator` (``<call>.fallback-to-<k>``): after candidate k-1 failed, reads the failure
  class it reported and opens the fallback only for a device failure.
- :class:`RecordRunOperator` (teardown ``record-run``): ``run.json`` from the attempt records.
- :class:`StepRetryPolicy`: the step's :class:`~heteroflow.components.core.retry.RetryPolicy` as Airflow 3.3's
  ``retry_policy``: the exact n-th wait ``min(backoff * factor**n, max_delay)`` (Airflow's own exponential
  backoff adds up to 100 % hash jitter), no retry once the next one would start after the policy's total
  window, and no retry for anything that is not a transient failure.

How a step task ends, per failure class (DESIGN.md):

==============  =====================================================================================
outcome         task
==============  =====================================================================================
succeeded       returns the outcome (XCom ``return_value``: status, candidate, output paths, scalar
                facts); skips the later candidates of its call; a planner skips what it passed over
device          pushes the outcome (XCom ``heteroflow_failure``) and raises ``AirflowFailException``: no
                retry is spent on a failed device; the next gate decides the fallback
permanent       pushes the outcome and raises ``AirflowFailException``: no retry, no fallback
transient       pushes the outcome and raises ``TransientStepFailure``: retried with the step's backoff
==============  =====================================================================================
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator, SkipMixin
from airflow.sdk.definitions.retry_policy import RetryDecision
from airflow.sdk.definitions.retry_policy import RetryPolicy as AirflowRetryPolicy
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from heteroflow.components.errors import HeteroflowError, InvalidParameter, did_you_mean
from heteroflow.components.resources import DeviceKind, RetryPolicy
from heteroflow.components.core.runtime import TransientStepFailure
from heteroflow.dags.layout import DECISION_KEY, FAILURE_KEY, PREPARE_TASK, Layout, safe_run_id
from heteroflow.pipelines.graph import Pipeline
from heteroflow.pipelines.environment import environ

__all__ = [
    "FallbackGateOperator",
    "PrepareRunOperator",
    "RecordRunOperator",
    "StepEnding",
    "StepOperator",
    "StepRetryPolicy",
    "artifact_path",
    "retry_arguments",
]

_OUTCOME_FIELDS = ("call", "step", "status", "failure", "reason", "candidate", "kind", "accelerator", "device", "simulated", "attempt")


def artifact_path(run_dir: str | os.PathLike[str], call: str, output: str) -> Path:
    """Where output ``output`` of call ``call`` lives in a run folder: ``<run_dir>/artifacts/<call>/<output>``
    (every candidate of a call writes the same path, as in the in-process runner; one of them succeeds)."""
    return Path(run_dir, "artifacts", call, output)


def small_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts worth an XCom: scalars and flat mappings of scalars (a planner's ``indices`` and
    ``inventory``); lists and nested values (histories, decisions) stay in the attempt records."""
    scalar = (str, int, float, bool, type(None))
    out: dict[str, Any] = {}
    for key, value in facts.items():
        if isinstance(value, scalar):
            out[key] = value
        elif isinstance(value, Mapping) and all(isinstance(v, scalar) for v in value.values()):
            out[key] = dict(value)
    return out


def outcome_record(outcome: Mapping[str, Any], outputs: Mapping[str, str], returns: Any = ()) -> dict[str, Any]:
    """The small, JSON-ready dict a step task leaves in XCom: the outcome's fields, the output paths, and
    :func:`small_facts`; with ``returns`` (the step's output parameters), ``values``: their values, which later
    tasks pull (:mod:`heteroflow.dags.control`)."""
    out = {k: outcome.get(k) for k in _OUTCOME_FIELDS}
    out["route"] = "succeeded" if outcome.get("status") == "succeeded" else outcome.get("failure")
    out["outputs"] = dict(outputs) if out["route"] == "succeeded" else {}
    out["facts"] = small_facts(outcome.get("facts") or {})
    facts = outcome.get("facts") or {}
    if returns:
        out["values"] = {p.name: facts[p.name] for p in returns if p.name in facts}
    return out


def _prepared(context: Mapping[str, Any]) -> dict[str, Any]:
    prep = context["ti"].xcom_pull(task_ids=PREPARE_TASK)
    if not isinstance(prep, Mapping) or "run_dir" not in prep:
        raise AirflowFailException(f"the {PREPARE_TASK} task left no run folder in XCom; did it run?")
    return dict(prep)


# --- retries -------------------------------------------------------------------------------------------------


class StepRetryPolicy(AirflowRetryPolicy):
    """A step's :class:`~heteroflow.components.core.retry.RetryPolicy` as an Airflow 3.3 ``retry_policy``.

    Evaluated in the worker after a try failed (Airflow's ``task_runner``): a
    :class:`~heteroflow.components.core.runtime.TransientStepFailure` is retried after exactly
    ``policy.delay_seconds(try_number - 1)`` seconds, unless that retry would start after
    ``policy.window_seconds`` from the first attempt on this candidate (then the task fails; checked where that
    start is known: local mode reads it from the attempt records, kubernetes mode only when the worker can read
    the run folder, else the window is not enforced and ``retries`` alone limits the retries); anything else
    falls through to Airflow's default (its ``retries``/``retry_delay``), except that ``AirflowFailException``
    (device and permanent failures) never reaches a policy. Airflow still caps the number of retries at the
    task's ``retries``.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context: Any = None) -> RetryDecision:
        if not isinstance(exception, TransientStepFailure):
            return RetryDecision.default()
        from heteroflow.components.core.fallback import retry_decision

        first = getattr(exception, "first_started_at", None)
        elapsed = time.time() - first if isinstance(first, (int, float)) else 0.0
        delay = retry_decision(self.policy, "transient", max(try_number - 1, 0), elapsed)  # the rule every engine uses
        if delay is None:
            spent = try_number - 1 >= self.policy.retries
            return RetryDecision.fail(
                reason=f"transient failure, and its {self.policy.retries} retries are spent"
                if spent
                else f"transient failure, but the next retry would start after the retry window of "
                f"{self.policy.window_seconds:g} s from the first attempt"
            )
        return RetryDecision.retry(
            delay=timedelta(seconds=delay),
            reason=f"transient failure: retry {try_number} of {self.policy.retries} in {delay:g} s",
        )

    def serialize(self) -> dict[str, Any]:
        return {"__type": "heteroflow.StepRetryPolicy", **dataclasses.asdict(self.policy)}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> StepRetryPolicy:
        return cls(RetryPolicy(**{k: v for k, v in data.items() if k != "__type"}))

    def __repr__(self) -> str:
        return f"StepRetryPolicy({self.policy!r})"


def retry_arguments(policy: RetryPolicy) -> dict[str, Any]:
    """BaseOperator keyword arguments for ``policy``: ``retries``, ``retry_delay``, ``retry_exponential_backoff``
    (a float multiplier in Airflow 3.3; 0 turns it off, which is what a factor of 1 means), ``max_retry_delay``
    (Airflow caps each wait with it, as ``max_delay_seconds`` does) and the exact ``retry_policy``."""
    return {
        "retries": policy.retries,
        "retry_delay": timedelta(seconds=policy.backoff_seconds),
        "retry_exponential_backoff": float(policy.factor) if policy.factor != 1 else 0.0,
        "max_retry_delay": timedelta(seconds=policy.max_delay_seconds),
        "retry_policy": StepRetryPolicy(policy),
    }


# --- the step tasks ------------------------------------------------------------------------------------------


class StepEnding(BaseOperator, SkipMixin):
    """What a step task is (one call of a pipeline on one candidate) and how it ends (the module docstring's
    table): the base of the local step operator, and below KubernetesPodOperator in the pod operator's bases
    (``KubernetesPodOperator.__init__`` passes the call's arguments on to this one). An operator class of its own
    because Airflow's ``BaseOperatorMeta`` wraps only an ``__init__`` that an operator class defines (defaults,
    and the XCom dependencies set once); a plain mixin's ``__init__`` would bypass that.

    Args:
        pipeline: the pipeline.
        layout: its task layout.
        call_name: the call.
        candidate_index: the candidate (device-bound calls with several candidates), else None.
        kwargs: the Airflow operator's (task_id, pool, retries, ...).
    """

    shallow_copy_attrs = ("pipeline", "layout")

    def __init__(self, *, pipeline: Pipeline, layout: Layout, call_name: str, candidate_index: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.layout = layout
        self.call_name = call_name
        self.candidate_index = candidate_index

    def finish(self, context: Mapping[str, Any], result: dict[str, Any], *, first_started_at: float | None = None) -> dict[str, Any]:
        """End the task for ``result`` (:func:`outcome_record`): return it, or raise what the failure class asks.

        Raises:
            DownstreamTasksSkipped: (success) to skip the later candidates / passed-over candidates.
            TransientStepFailure: a transient failure (retried by :class:`StepRetryPolicy`).
            AirflowFailException: a device or permanent failure (no retry).
        """
        ti = context["ti"]
        tasks = self.layout[self.call_name]
        route = result.get("route")
        if route == "succeeded":
            skips: list[str] = []
            if self.layout.planner == self.call_name:
                skips += self.layout.planner_skips(result.get("facts", {}).get("indices") or {})
            if tasks.grouped and self.candidate_index is not None:
                skips += tasks.after_success(self.candidate_index)
            outlet_events = context.get("outlet_events")
            for asset in getattr(self, "outlets", None) or []:
                if outlet_events is not None:
                    outlet_events[asset].extra = {"run_dir": result.get("run_dir"), "outputs": result["outputs"], "facts": result["facts"]}
            if skips:
                ti.xcom_push(key="return_value", value=result)
                self.skip(ti, [self.dag.get_task(t) for t in dict.fromkeys(skips)])  # raises DownstreamTasksSkipped
            return result
        ti.xcom_push(key=FAILURE_KEY, value=result)
        kind = result.get("kind") or DeviceKind.host().value
        where = f" on candidate {result.get('candidate')} ({kind})" if tasks.grouped else ""
        message = f"step {self.call_name!r} failed{where} with a {route} failure: {result.get('reason')}"
        if route == "permanent" and self.pipeline[self.call_name].retry.retry_on == "any":
            route = "transient"  # retry_on="any" (KFP's behaviour): StepRetryPolicy retries it like a transient one
            message += " (retry_on='any')"
        if route == "transient":
            exc = TransientStepFailure(message + " (retried on the same candidate with the step's backoff)")
            exc.first_started_at = first_started_at  # type: ignore[attr-defined]
            raise exc
        if route == "device":
            last = self.candidate_index is None or self.candidate_index + 1 >= len(tasks.candidates)
            message += "; no retry is spent on a failed device" + (
                "; no candidate left" if last else f"; {tasks.gates[(self.candidate_index or 0) + 1]} decides the fallback"
            )
        else:
            message += "; not retried, no fallback"
        raise AirflowFailException(message)


class StepOperator(StepEnding):
    """Run one call of a pipeline on one candidate, in this worker (local mode).

    Args:
        pipeline, layout, call_name, candidate_index: as :class:`StepEnding`.
        kwargs: BaseOperator's (task_id, pool, retries, ...).
    """

    ui_color = "#e8f0fe"
    channel_params: dict[str, Any] = {}  # noqa: RUF012 - values of output parameters, loop items (dags.control)
    map_index: int | None = None  # a mapped instance's index (dags.control: one artifact folder per instance)

    def artifact(self, run_dir: Path, call: str, output: str) -> Path:
        """Where output ``output`` of ``call`` is for this task: :func:`artifact_path`, in this mapped instance's
        folder for a call of the same loop (:mod:`heteroflow.dags.control`)."""
        path = artifact_path(run_dir, call, output)
        if self.map_index is not None and call in self.pipeline and self._same_loop(call):
            return path.parent / str(self.map_index) / output
        return path

    def _same_loop(self, call: str) -> bool:
        mine = next((g for g in self.pipeline[self.call_name].groups if g.kind == "loop"), None)
        return mine is not None and mine in self.pipeline[call].groups

    def execute(self, context: Any) -> Any:
        from heteroflow.pipelines.cli.script import passive_openmp_waits

        # as the heteroflow command does for its own processes, before this task process imports torch: an Airflow
        # task runs the step here, and OpenMP's spinning waits made train 2-5x slower beside other work (a new
        # user's `airflow dags test` beside a busy core: 7,817-9,750 samples/s spinning, 18,421-52,995 passive)
        passive_openmp_waits()
        from heteroflow.components.core.runtime import LocalArtifact, Outcome, run_step
        from heteroflow.components.core.telemetry import Iteration, read_step_records
        from heteroflow.pipelines.environment import step_environment

        prep = _prepared(context)
        folder = Path(prep["run_dir"])
        call = self.pipeline[self.call_name]
        k = self.candidate_index or 0
        index = k if call.device_bound else None
        resources = call.candidates[k]
        inputs = {name: str(self.artifact(folder, ref.call, ref.output)) for name, ref in call.input_refs().items()}
        outputs = {s.name: str(self.artifact(folder, call.name, s.name)) for s in call.step.outputs}
        from heteroflow.pipelines.volumes import step_env

        # a mapped instance is its loop's iteration map_index: its attempts are its own (Airflow's try numbers)
        iteration = Iteration(index=self.map_index, item=getattr(self, "loop_item", None)) if self.map_index is not None else None
        with environ({**step_environment(folder, str(prep["run_id"])), **step_env(call, engine="airflow-local")}):
            try:
                outcome = run_step(
                    call.step,
                    call=call.name,
                    params={**self.pipeline.call_params(call, prep["args"]), **self.channel_params},
                    inputs=inputs,
                    outputs={name: LocalArtifact(path) for name, path in outputs.items()},
                    candidate=resources,
                    candidate_index=index,
                    placements=self.pipeline.placements() if call.step.planner else None,
                    run_dir=folder,
                    iteration=iteration,
                ).to_dict()
            except HeteroflowError as exc:  # a usage error (a malformed task): nothing ran, never worth a retry
                outcome = Outcome(
                    call=call.name, step=call.step.name, status="failed", failure="permanent", reason=str(exc),
                    candidate=index, kind=DeviceKind(resources.kind).value,
                ).to_dict()
            except KeyboardInterrupt:
                # Ctrl-C (airflow dags test runs the tasks in its own process): the attempt is recorded interrupted;
                # stop here, never retried (Airflow retried it in the same process: the run went on, or failed on a
                # torch import the stop had left half done)
                raise AirflowFailException(
                    f"{call.name}: interrupted (Ctrl-C); the run stops here. Trigger the DAG again to resume: train "
                    "continues from its last checkpoint") from None
        result = outcome_record(outcome, outputs, call.step.returns)
        result["run_dir"] = str(folder)
        first = None
        if result["route"] == "transient":
            records = [r for r in read_step_records(folder).get(call.name, []) if r.candidate == index and r.iteration == self.map_index]
            first = min((r.started_at for r in records), default=None)
        return self.finish(context, result, first_started_at=first)


class FallbackGateOperator(BaseOperator, SkipMixin):
    """Decide, after candidate ``index - 1`` of a call failed, whether candidate ``index`` runs (see
    :mod:`heteroflow.dags.layout`). Leaves its decision and why in XCom (``heteroflow_decision``).

    A device failure opens the next candidate the planner's inventory can serve (its ``inventory`` fact: device
    count per kind), skipping those it cannot (a pool of 0 slots would hold them forever); any other failure
    class, or no outcome at all (an upstream failure), skips every later candidate.
    """

    ui_color = "#fdf3e1"
    shallow_copy_attrs = ("pipeline", "layout")

    def __init__(self, *, pipeline: Pipeline, layout: Layout, call_name: str, candidate_index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.layout = layout
        self.call_name = call_name
        self.candidate_index = candidate_index

    def decide(self, failure: Mapping[str, Any] | None, inventory: Mapping[str, int] | None) -> dict[str, Any]:
        """The decision for the previous candidate's ``failure`` (its XCom outcome, or None) and the planner's
        ``inventory`` (or None): ``{"decision": "fallback" | "stop", "target": k | None, "why": ...,
        "passed_over": [...]}``. Pure; no Airflow calls."""
        from heteroflow.components.core.fallback import next_candidate

        route = (failure or {}).get("failure") if failure is not None else None
        decided = next_candidate(
            self.pipeline[self.call_name],
            self.candidate_index - 1,
            route if route in ("device", "transient", "permanent") else (None if failure is None else "permanent"),
            inventory,
            reason=(failure or {}).get("reason"),
        )
        decision = "fallback" if decided.action == "fallback" else "stop"
        return {"decision": decision, "target": decided.target, "why": decided.why, "passed_over": list(decided.passed_over), "left": failure}

    def execute(self, context: Any) -> Any:
        ti = context["ti"]
        tasks = self.layout[self.call_name]
        failure = ti.xcom_pull(task_ids=tasks.candidates[self.candidate_index - 1], key=FAILURE_KEY)
        inventory = None
        if self.layout.planner is not None and self.call_name in self.pipeline.placements():
            planned = ti.xcom_pull(task_ids=self.layout[self.layout.planner].join)
            found = (planned or {}).get("facts", {}).get("inventory") if isinstance(planned, Mapping) else None
            inventory = dict(found) if isinstance(found, Mapping) else None
        decision = self.decide(failure if isinstance(failure, Mapping) else None, inventory)
        self.log.info("%s", decision["why"])
        for line in decision["passed_over"]:
            self.log.info("passed over: %s", line)
        ti.xcom_push(key=DECISION_KEY, value=decision)
        skips = tasks.route(self.candidate_index, decision["target"])
        if skips:
            self.skip(ti, [self.dag.get_task(t) for t in skips])  # raises DownstreamTasksSkipped; the gate succeeds
        return None


# --- setup and teardown --------------------------------------------------------------------------------------


class PrepareRunOperator(BaseOperator):
    """Setup task: the run's arguments, checked once (DAG params over the pipeline's defaults; in local mode an
    empty ``dataset_uri`` takes the digits sample, see :func:`heteroflow.pipelines.runs.records.prepare_arguments`),
    and its run folder ``<run_root>/<dag id>/<run id>``. Returns (XCom) ``run_dir``, ``run_id``, ``args``,
    ``started_at`` (Unix time, seconds).

    Args:
        local: local mode (create the folder, check local data set paths); on kubernetes the folder is the
            pods' (shared storage) and only the values are checked.
        run_root: the folder that holds the run folders; default ``<heteroflow home>/airflow-runs``.
    """

    ui_color = "#eeeeee"
    shallow_copy_attrs = ("pipeline",)

    def __init__(self, *, pipeline: Pipeline, local: bool, run_root: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.local = local
        self.run_root = run_root

    def run_folder(self, run_id: str) -> Path:
        from heteroflow.cache.locations import home_dir

        root = Path(self.run_root) if self.run_root else home_dir() / "airflow-runs"
        folder = root / self.dag_id / safe_run_id(run_id)
        return folder.absolute() if self.local else folder

    def record_id(self, run_id: str) -> str:
        """The heteroflow run id of Airflow's run ``run_id``: ``<safe run id>-<dag id>``. Airflow's ids are unique
        only within a DAG (two DAGs scheduled at 03:00 both run ``scheduled__...T03:00:00+00:00``), and run records
        and Prometheus files are keyed by the id (#28.12)."""
        return f"{safe_run_id(run_id)}-{self.dag_id}"

    def execute(self, context: Any) -> Any:
        from heteroflow.dags.pools import check_pools
        from heteroflow.pipelines.runs.records import prepare_arguments

        check_pools(self.dag.tasks, dag_id=self.dag_id)  # a missing pool would leave its tasks scheduled for ever
        folder = self.run_folder(str(context["run_id"]))
        params = context.get("params") or {}
        given = {k: v for k, v in dict(params).items() if k in self.pipeline.params and v is not None}
        started = time.time()
        dag_run = context.get("dag_run")
        conf = dict(getattr(dag_run, "conf", None) or {})
        aliases = self.pipeline.aliases  # -c '{"seed": 1}' sets preprocess.seed and train.seed, as --param seed=1
        for short in sorted(set(conf) & set(aliases)):
            for name in aliases[short]:
                if name not in conf:  # a qualified name given beside the short one wins
                    given[name] = conf[short]
        spellings = self.pipeline.kfp_spellings  # -c '{"preprocess_seed": 1}': KFP's spelling of preprocess.seed (#28.20)
        for kfp_name in sorted(set(conf) & set(spellings)):
            given.setdefault(spellings[kfp_name], conf[kfp_name])
        unknown = sorted(set(conf) - set(self.pipeline.params) - set(aliases) - set(spellings))
        if self.local:
            folder.mkdir(parents=True, exist_ok=True)  # so a run refused here still gets its run.json
        try:
            if unknown:  # a typo in -c '{"epoch": 10}' would otherwise run with the default, silently
                valid = sorted([*self.pipeline.params, *aliases])
                raise InvalidParameter(f"unknown parameter(s) {', '.join(unknown)} in the run's conf{did_you_mean(unknown, valid)}; valid: {', '.join(valid)}")
            if self.local:
                from heteroflow.pipelines.volumes import make_local_volumes, warn_local_packages

                warn_local_packages(self.pipeline.calls, engine="airflow-local")

                args = prepare_arguments(self.pipeline, given)
                make_local_volumes(self.pipeline.calls, folder, engine="airflow-local")  # record-run deletes them
            else:
                args = self.pipeline.arguments(given)
                self.pipeline.check(args)
        except (HeteroflowError, OSError) as exc:
            if self.local and folder.is_dir():
                _write_record(self.pipeline, folder, self.record_id(str(context["run_id"])), started, given, error=f"{type(exc).__name__}: {exc}")
            raise AirflowFailException(f"the run's arguments are not valid: {exc}") from None
        return {"run_dir": str(folder), "run_id": self.record_id(str(context["run_id"])), "args": args, "started_at": started}


def _testing_settings() -> dict[str, str]:
    from heteroflow.components.core.failures import FAULT_ENV, SIMULATE_ENV

    return {k: os.environ[k] for k in (SIMULATE_ENV, FAULT_ENV) if os.environ.get(k)}


def _write_record(pipeline: Pipeline, folder: Path, run_id: str, started: float, args: Mapping[str, Any], *, error: str | None = None) -> Any:
    from heteroflow.pipelines.runs.records import build_record, release_kept_trainings

    record = build_record(
        pipeline,
        run_id=run_id,
        folder=folder,
        started=started,
        wall_seconds=max(time.time() - started, 0.0),
        args=args,
        interrupted=False,
        error=error,
        testing=_testing_settings(),
    )
    record.write()
    release_kept_trainings(record)  # a finished training kept for a rerun: this run succeeded, so it goes
    return record


class RecordRunOperator(BaseOperator):
    """Teardown task: write ``<run_dir>/run.json`` (:class:`heteroflow.pipelines.runs.records.RunRecord`, from the
    attempt records) and return its status and ``fallbacks`` (XCom). It runs whatever ended the run (as an
    Airflow teardown it does not decide the DAG run's state). Skipped, with the reason, when the run folder is
    not reachable from this worker (kubernetes mode without the shared storage mounted on the workers)."""

    ui_color = "#eeeeee"
    shallow_copy_attrs = ("pipeline",)
    print_summary = True
    """Print the run's summary (what ``heteroflow run`` prints) in the task's log; the airflow engine's DAG turns it
    off (:func:`heteroflow.dags.engine.engine_dag`: the CLI prints it once, after Airflow)."""

    def __init__(self, *, pipeline: Pipeline, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def execute(self, context: Any) -> Any:
        prep = _prepared(context)
        folder = Path(prep["run_dir"])
        if not folder.is_dir():
            raise AirflowSkipException(
                f"run folder {folder} is not reachable from this worker; mount the run storage on the workers to get run.json"
            )
        from heteroflow.pipelines.volumes import remove_local_volumes

        remove_local_volumes(folder)  # local mode's CreatePVC folders live for the run (KFP's DeletePVC)
        record = _write_record(self.pipeline, folder, prep["run_id"], float(prep["started_at"]), prep["args"])
        self.log.info("run %s: %s; record %s", record.run_id, record.status, Path(record.run_dir, "run.json"))
        if self.print_summary:
            from heteroflow.pipelines.cli.runs import summary_text  # the summary `heteroflow run` prints (#17)
            from heteroflow.pipelines.runs.folders import load_run

            print(summary_text(load_run(folder), self.pipeline), flush=True)
        for f in record.fallbacks:
            self.log.info("fallback: %s left candidate %s (%s) after a %s failure: %s", f["step"], f["candidate"], f["kind"], f["failure"], f["reason"])
        return json.loads(json.dumps({"status": record.status, "run_json": str(Path(record.run_dir, "run.json")), "fallbacks": record.fallbacks}, default=str))
