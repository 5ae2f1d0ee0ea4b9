"""The train step on a mixed candidate (issue #29): :func:`train_mixed` turns the step's parameters into a
:class:`~heteroflow.components.training.mixed.MixedJob`, runs it with one elastic agent per kind
(:func:`~heteroflow.components.training.mixed.run_mixed`), and writes the model as :func:`train
<heteroflow.components.training.step.train>` does. Its ``mixed`` facts (kinds, shares, throughputs, busy
fractions, the kinds that dropped out) go into the run record, the report and the metrics.

What differs from one kind: the built-in classifier loop only (``train_function`` is refused), float32, the
global batch is ``batch_size`` (``batch_sizes`` is refused: shares are measured), a last partial global batch of
an epoch is dropped. A kind that is neither present nor simulated (``HETEROFLOW_SIMULATE_DEVICES``) is left out
before the start and recorded as dropped with step 0 (before its first step); when no kind is left the step fails with
``DeviceUnavailable`` (a device failure: the next candidate runs).

On a cluster (:mod:`heteroflow.components.training.mixed_launch`): the train task of a KFP or Airflow rendering,
in a pod with the cluster profile, launches the mixed job's Volcano Job, hosts its c10d store and returns the facts
of the pod that held rank 0, its model copied into the step's output; in each pod of that job the step is in worker
mode: one elastic agent for the pod's kind joins the rendezvous, and only the pod holding rank 0 writes the model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from heteroflow.components.errors import DeviceUnavailable, InvalidParameter

__all__ = ["drop_point", "exchange_text", "mixed_facts_lines", "mixed_metrics", "profile_throughput", "replica_rows", "step_dataset", "step_model", "train_mixed"]


def step_dataset(dataset_dir: str, values: Mapping[str, Any]) -> Any:
    """The train split of ``dataset_dir`` as the train step opens it (a worker's data factory)."""
    from heteroflow.components.training.step import _plan

    return _plan(dataset_dir, values)[0].train


def step_model(dataset_dir: str, values: Mapping[str, Any]) -> Any:
    """The train step's model (a worker's model factory)."""
    from heteroflow.components.training.step import _plan

    return _plan(dataset_dir, values)[1].build()


def _groups(resources: Any, say: Callable[[str], None]) -> tuple[list[Any], list[dict[str, Any]]]:
    """The replica groups that can run here, and the kinds left out (neither present nor simulated)."""
    from heteroflow.components.core.failures import simulated_devices
    from heteroflow.components.training.device import resolve_device
    from heteroflow.components.training.mixed import ReplicaGroup
    from heteroflow.components.training.shares import simulated_speeds

    simulated = simulated_devices()
    speeds = simulated_speeds()
    groups, left_out = [], []
    for g in resources.replicas:
        kind = g.kind
        if not kind.has_devices:
            groups.append(ReplicaGroup(kind.value, g.count, kind.torch_device_type, 1.0))
        elif kind.value in simulated:
            groups.append(ReplicaGroup(kind.value, g.count, kind.simulated_device_type, speeds.get(kind.value, 1.0)))
        else:
            try:
                resolve_device(g.resources.torch_device_type)
            except DeviceUnavailable as exc:
                left_out.append({"kind": kind.value, "step": 0, "reason": f"DeviceUnavailable: {exc}", "resumed_from_step": 0})
                say(f"train: kind {kind.value} of the mixed candidate is not here ({exc}); the others train without it")
                continue
            groups.append(ReplicaGroup(kind.value, g.count, g.resources.torch_device_type, 1.0))
    return groups, left_out


def profile_throughput(resources: Any, training_profile: str) -> dict[str, float]:
    """``{kind: relative throughput}`` of a mixed candidate's kinds from a training profile (the plan step's
    ``training_profile``, :func:`heteroflow.components.training.profiling.read_profile`): per kind, 1 / the step
    time :func:`heteroflow.components.placement.scoring.step_seconds_per_model` gives the first of the kind's
    accelerator models it knows (``cpu`` for the CPU). Empty when there is no profile or it times some kind on no
    model: the first steps measure the shares then.

    Raises:
        InvalidParameter: ``training_profile`` names no readable heteroflow profile.
    """
    if not training_profile:
        return {}
    from heteroflow.components.placement.scoring import step_seconds_per_model
    from heteroflow.components.training.profiling import read_profile

    seconds = step_seconds_per_model(read_profile(training_profile, field="training_profile"), None)
    out: dict[str, float] = {}
    for g in resources.replicas:
        models = [m.name for m in g.resources.accelerator_models] if g.kind.has_devices else [g.kind.value]
        timed = next((seconds[m][0] for m in models if m in seconds), None)
        if timed is None:
            return {}
        out[g.kind.value] = 1.0 / timed
    return out


def train_mixed(resources: Any, *, dataset_dir: str | os.PathLike[str], model_dir: str | os.PathLike[str],
                values: dict[str, Any], splits: Any, spec: Any, params: dict[str, Any], ckpt_dir: Path,
                started: float, progress: Callable[..., None] | None = None) -> Any:
    """Train on a mixed candidate and return the step's ``TrainResult`` (its ``mixed`` facts filled in). Its lines go
    to stderr and, with ``progress`` (the step's live progress), to the live table, where every report carries
    ``device_kind`` (``gpu+npu``: the kinds that train), as does rank 0's epoch, loss and samples/s while it trains.

    Raises:
        InvalidParameter: ``train_function`` or ``batch_sizes`` given (not supported on a mixed candidate).
        DeviceUnavailable: no kind of the candidate is here.
        BaseException: as :func:`~heteroflow.components.training.mixed.run_mixed` (every kind dropped: the first
            kind's device failure).
    """
    from heteroflow.components.training.step import _sayer

    live_kinds = [g.kind.value for g in resources.replicas]  # the candidate's, then those that train here

    def live(**facts: Any) -> None:  # the live table words the step by the kinds that train (telemetry.mixed_kinds)
        if progress is not None:
            progress(device_kind="+".join(live_kinds), **facts)

    say = _sayer(live if progress is not None else None)
    live()

    if values.get("train_function"):
        raise InvalidParameter("train_function with a mixed candidate: its replicas run the built-in classifier loop; valid: leave train_function empty, or use a single-kind candidate")
    if values.get("batch_sizes"):
        raise InvalidParameter("batch_sizes with a mixed candidate: the shares of the global batch (batch_size) are measured; valid: leave batch_sizes empty")
    from heteroflow.components.training.mixed_launch import in_launcher_pod, pod_rendezvous

    pod = pod_rendezvous()  # a pod of the mixed job's Volcano Job: one agent for its kind (worker mode)
    if pod is None and in_launcher_pod():  # the cluster rendering's task: launch the job, host its store, wait
        return _launched(resources, dataset_dir=dataset_dir, model_dir=model_dir, values=values, key=ckpt_dir.name,
                         started=started, say=say)
    if pod is not None:  # the pods of a cluster job share the folder (and resume from it): no lock, nothing kept
        return _train_here(resources, pod=pod, dataset_dir=dataset_dir, model_dir=model_dir, values=values, splits=splits,
                           spec=spec, params=params, ckpt_dir=ckpt_dir, started=started, say=say, live=live,
                           live_kinds=live_kinds, progress=progress)
    import dataclasses

    from heteroflow.components.core.telemetry import RUN_DIR_ENV
    from heteroflow.components.training.checkpoint_lock import (
        _exclusive, _take_finished_model, _take_kept_model, code_fingerprint, keep_finished)
    from heteroflow.components.training.step import _reused_result

    code = code_fingerprint([params["model"].get("factory"), params.get("dataset_factory"), params.get("train_function")])
    # as a single-kind training: two identical trainings never share the folder, and a run stopped or failed after
    # train (Ctrl-C during evaluate) takes the model this one finished instead of training again (step.train)
    with _exclusive(ckpt_dir, say=say) as held:
        waited = {"waited_for": held.waited_for or "", "waited_seconds": held.waited_seconds}
        reused = _take_finished_model(held, model_dir, say=say) or _take_kept_model(ckpt_dir, model_dir, say=say, code=code)
        if reused is not None:
            return _reused_result(reused, ckpt_dir, waited=waited, started=started)
        result = _train_here(resources, pod=None, dataset_dir=dataset_dir, model_dir=model_dir, values=values,
                             splits=splits, spec=spec, params=params, ckpt_dir=ckpt_dir, started=started, say=say,
                             live=live, live_kinds=live_kinds, progress=progress)
        result = dataclasses.replace(result, **waited)
        if os.environ.get(RUN_DIR_ENV):  # a run that records itself: kept until it (or a rerun) succeeds
            try:
                keep_finished(ckpt_dir, result.model_dir, {**dataclasses.asdict(result), "kept_checkpoint": str(ckpt_dir), "code": code})
                result = dataclasses.replace(result, kept_checkpoint=str(ckpt_dir))
            except OSError as exc:
                say(f"train: could not keep the finished model in {ckpt_dir} ({exc.strerror or exc}); a rerun "
                    "after a stop past train trains again")
        held.finish({**dataclasses.asdict(result), "model_dir": str(result.model_dir)})
        if not result.kept_checkpoint:
            import shutil

            shutil.rmtree(ckpt_dir, ignore_errors=True)
    return result


def _train_here(resources: Any, *, pod: dict[str, Any] | None, dataset_dir: str | os.PathLike[str],
                model_dir: str | os.PathLike[str], values: dict[str, Any], splits: Any, spec: Any, params: dict[str, Any],
                ckpt_dir: Path, started: float, say: Callable[[str], None], live: Callable[..., None],
                live_kinds: list[str], progress: Callable[..., None] | None) -> Any:
    """Train the mixed candidate's kinds found here (``pod`` None), or this pod's kind in a cluster job (``pod``:
    its rendezvous), and return the ``TrainResult``; in a pod, the pod holding rank 0 writes the model and removes
    the checkpoint folder (``train_mixed`` does it, under the folder's lock, for a local job)."""
    import torch

    from heteroflow.components.training.mixed import MixedJob, run_mixed
    from heteroflow.components.training.mixed_launch import pod_group
    from heteroflow.components.training.model_files import _write_model
    from heteroflow.components.training.step import TrainResult

    groups, left_out = ([pod_group(resources, pod, say)], []) if pod is not None else _groups(resources, say)
    if not groups:
        raise DeviceUnavailable(f"no kind of the mixed candidate {resources.describe()} is here: " + "; ".join(d["reason"] for d in left_out))
    live_kinds[:] = [g.kind for g in groups]
    from_profile = profile_throughput(resources, str(values.get("training_profile") or ""))
    if from_profile:
        say("train: the first shares come from the training profile: " + ", ".join(f"{k} {v:.3g}/s" for k, v in from_profile.items()))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    global_batch = int(values["batch_size"])
    samples = len(splits.train) if splits.train is not None else global_batch
    if samples < global_batch:  # as a single-kind training's DataLoader does: one step a epoch, of every sample
        say(f"train: batch_size={global_batch} is more than the {samples} training samples: one global batch of "
            f"{samples} a epoch")
        global_batch = samples
    plain = {k: v for k, v in values.items() if k not in ("progress", "training_profile")}
    job = MixedJob(
        model="heteroflow.components.training.mixed_step:step_model", data="heteroflow.components.training.mixed_step:step_dataset",
        model_kwargs={"dataset_dir": str(dataset_dir), "values": plain}, data_kwargs={"dataset_dir": str(dataset_dir), "values": plain},
        global_batch=global_batch, learning_rate=float(values["learning_rate"]), epochs=int(values["epochs"]),
        optimizer=values.get("optimizer") or "", loss=values.get("loss") or "", seed=int(values["seed"]),
        rebalance_every_steps=resources.rebalance_every_steps, rebalance_every_minutes=resources.rebalance_every_minutes,
        topk_ratio=resources.topk_ratio, powersgd_rank=resources.powersgd_rank,
        compression=resources.compression, checkpoint_dir=str(ckpt_dir), profile_throughput=from_profile,
        checkpoint_every_steps=int(values["checkpoint_every_steps"]))
    joined = {"rendezvous": pod, "last_call_timeout": pod["last_call_timeout"]} if pod is not None else {}
    result = run_mixed(job, groups, say=say, progress=live if progress is not None else None, **joined)
    result.dropped[:0] = left_out
    writer = result.rank0  # in a pod of a cluster job, the pod holding rank 0 writes the model
    model = spec.build()
    model.load_state_dict(result.state_dict)
    val_acc = None
    if splits.validation is not None and writer:
        from heteroflow.components.training.mixed import _collate

        import numpy as np

        model.eval()
        correct = 0
        with torch.no_grad():
            for start in range(0, len(splits.validation), 512):
                x, y = _collate(splits.validation, np.arange(start, min(start + 512, len(splits.validation))))
                correct += int((model(x).argmax(1) == y).sum())
        val_acc = correct / max(1, len(splits.validation))
    kinds = "+".join(dict.fromkeys(result.kinds))
    out = Path(model_dir)
    if writer:
        out = _write_model(model_dir, model, dataset_dir=dataset_dir, splits=splits, spec=spec, params=params,
                           steps=result.steps, precision="float32", device="cpu", device_kind=kinds)
    last = result.history[-1] if result.history else {}
    facts = result.facts()
    facts["replicas"] = [{"kind": g.kind, "count": g.count, "device": g.device_type, "speed": g.speed} for g in groups]
    if pod is not None:
        facts.update(pod=pod["pod"], writer=writer)
        say(f"train: pod {pod['pod']} ({pod['kind']}) trained its share; " + ("it held rank 0 and wrote the model" if writer else "the pod holding rank 0 writes the model"))
        from heteroflow.components.training.mixed_job import OUTPUT_ENV

        output = os.environ.get(OUTPUT_ENV)
        if output and not writer:  # a launched job completes at its first succeeded pod: that must be after the writer's outcome
            from heteroflow.components.training.mixed_launch import WRITER_WAIT_ENV, wait_for_writer

            wait_for_writer(Path(output), timeout=float(os.environ.get(WRITER_WAIT_ENV) or 600), say=say)
    if writer and pod is not None:
        import shutil

        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return TrainResult(
        model_dir=out, device="cpu", steps=result.steps, resumed_from_step=result.resumed_from_step,
        checkpoints_written=0, samples_per_second=result.samples / result.loop_seconds if result.loop_seconds > 0 else 0.0,
        final_loss=float(last.get("loss", float("nan"))), validation_accuracy=val_acc, seconds=time.perf_counter() - started,
        history=tuple(result.history), precision="float32", model=spec.to_dict(), device_kind=kinds, num_workers=0,
        processes=len(result.kinds), batch_size=job.global_batch, mixed=facts, loop_seconds=result.loop_seconds)


def _launched(resources: Any, *, dataset_dir: Any, model_dir: Any, values: Mapping[str, Any], key: str, started: float,
              say: Callable[[str], None]) -> Any:
    """The launcher's ``TrainResult``: the facts of the job's pod that held rank 0
    (:func:`~heteroflow.components.training.mixed_launch.launch_mixed_job`), its model copied into ``model_dir``."""
    from heteroflow.components.training.mixed_launch import launch_mixed_job
    from heteroflow.components.training.step import TrainResult

    facts = launch_mixed_job(resources, dataset_dir=dataset_dir, model_dir=model_dir, values=values, key=key, say=say)
    return TrainResult(
        model_dir=Path(model_dir), device=str(facts.get("device", "cpu")), steps=int(facts.get("steps", 0)),
        resumed_from_step=int(facts.get("resumed_from_step", 0)), checkpoints_written=int(facts.get("checkpoints_written", 0)),
        samples_per_second=float(facts.get("samples_per_second", 0.0)), final_loss=float(facts.get("final_loss", float("nan"))),
        validation_accuracy=facts.get("validation_accuracy"), seconds=time.perf_counter() - started,
        history=tuple(facts.get("history") or ()), precision=str(facts.get("precision", "float32")),
        model={"factory": facts.get("model"), "args": facts.get("model_args")}, device_kind=str(facts.get("device_kind", "")),
        num_workers=0, processes=int(facts.get("processes", 0)), batch_size=int(facts.get("batch_size", 0)),
        mixed=dict(facts.get("mixed") or {}))


def replica_rows(mixed: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per replica of a mixed run's facts, by rank: ``rank``, ``kind``, ``share`` (samples of the global
    batch), ``samples_per_second`` (per busy second) and ``busy_fraction`` (0-1), each None where the facts have no
    value for that rank. The summary lines, the metrics and the report's section are made from them."""
    columns = {name: mixed.get(key) or [] for name, key in (("share", "shares"), ("samples_per_second", "throughput"),
                                                             ("busy_fraction", "busy_fraction"))}
    return [{"rank": r, "kind": kind, **{name: values[r] if r < len(values) else None for name, values in columns.items()}}
            for r, kind in enumerate(mixed.get("kinds") or [])]


def mixed_facts_lines(mixed: Mapping[str, Any]) -> list[str]:
    """The summary lines of a mixed run's facts: each replica's kind, share, throughput and busy fraction; the
    kinds that dropped out."""
    parts = []
    rows = replica_rows(mixed)
    for row in rows:
        s = row["share"] if row["share"] is not None else "?"
        t = f", {row['samples_per_second']:.0f} samples/s" if row["samples_per_second"] else ""
        b = f", busy {row['busy_fraction'] * 100:.0f}%" if row["busy_fraction"] is not None else ""
        parts.append(f"{row['kind']}[{row['rank']}] share {s}{t}{b}")
    lines = ["train: mixed replicas: " + "; ".join(parts)] if parts else []
    exchange = exchange_text(mixed)
    if exchange:
        lines.append(f"train: cross-kind exchange: {exchange}")
    lines += _starved_lines(rows)
    for d in mixed.get("dropped") or []:
        where = ""
        if d.get("task"):  # a cluster job: the kind's Volcano task failed
            where = f", its Volcano task {d['task']} failed" + (f" (pod {d['pod']})" if d.get("pod") else "")
        lines.append(f"train: kind {d.get('kind')} dropped out{drop_point(d.get('step'))}{where} ({d.get('reason')}); "
                     f"the others resumed from step {d.get('resumed_from_step')}")
    return lines


def drop_point(step: Any) -> str:
    """When a kind of a mixed job dropped out, worded the one way the live line, the summary, the placement line and
    the report say it: ``" after step 12"`` (a drop record's ``step`` counts the optimizer steps the kind had
    done), ``" before its first step"`` (0: left out at the start), ``""`` when unknown (a cluster job's task)."""
    if not isinstance(step, int) or isinstance(step, bool):
        return ""
    return " before its first step" if step == 0 else f" after step {step}"


def exchange_text(mixed: Mapping[str, Any]) -> str:
    """What a leader sent across kinds per step, and the compression that did it, in words (``""`` when nothing
    was sent: one kind): ``top-k 1% with momentum correction (SGD's momentum 0.9 taken into the exchange, DGC):
    2,096 bytes per step per leader, 0.02x of 104,488 uncompressed``."""
    sent, full = mixed.get("bytes_per_step"), mixed.get("uncompressed_bytes_per_step")
    if not sent:
        return ""
    c = mixed.get("compression") or {}
    how = "uncompressed"
    if c.get("method") == "topk":
        how = f"top-k {float(c.get('topk_ratio', 0)) * 100:g}%"
        m = float(c.get("momentum_correction") or 0)
        how += (f" with momentum correction (SGD's momentum {m:g} taken into the exchange, DGC)" if m
                else " with error feedback (no momentum correction: the optimizer is not plain SGD with momentum)")
    elif c.get("method") == "powersgd":
        how = f"PowerSGD rank {c.get('powersgd_rank')}"
    ratio = f", {float(sent) / float(full):.2f}x of {float(full):,.0f} uncompressed" if full and c else ""
    return f"{how}: {float(sent):,.0f} bytes per step per leader{ratio}"


STARVED_FRACTION = 1 / 32
"""A replica left with at most this fraction of the global batch (and at least one sample) is named in the summary:
the rebalancer gives a replica so little only when its time per step is mostly fixed."""


def _starved_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A line per replica the rebalancer left with almost none of the global batch (:data:`STARVED_FRACTION`): its
    time per step is mostly fixed (a model this small: launching work and exchanging gradients cost more than its
    samples), so whatever its share the others wait for it each step, and a candidate without its kind may train
    faster."""
    shares = [r["share"] for r in rows if isinstance(r["share"], int)]
    total = sum(shares)
    if len(shares) < 2 or total <= 0:
        return []
    out = []
    for r in rows:
        if isinstance(r["share"], int) and r["share"] <= max(1, int(total * STARVED_FRACTION)):
            out.append(f"train: {r['kind']}[{r['rank']}] kept only {r['share']} of {total} samples per step: its step "
                       f"time hardly shrinks with its share (fixed costs dominate at this model's size), so the others "
                       f"wait for it each step; a candidate without {r['kind']} may train faster")
    return out


def mixed_metrics(mixed: Mapping[str, Any]) -> dict[str, float]:
    """Scalar metrics of a mixed run, per replica ``<kind>_<rank>``: ``share_...`` (samples of the global
    batch), ``samples_per_second_...`` (per busy second), ``busy_fraction_...`` (0-1); ``dropped_kinds`` (how many
    kinds dropped out). They reach the Metrics output and Prometheus (``heteroflow_step_metric``)."""
    out: dict[str, float] = {}
    for name in ("share", "samples_per_second", "busy_fraction"):
        for row in replica_rows(mixed):
            if isinstance(row[name], (int, float)):
                out[f"{name}_{row['kind']}_{row['rank']}"] = float(row[name])
    out["dropped_kinds"] = float(len(mixed.get("dropped") or []))
    return out
