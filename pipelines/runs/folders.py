"""Read run folders of any engine, for ``heteroflow runs``, ``heteroflow report`` and the run metrics.

kfp.local (``heteroflow run``), the in-process engine (``--engine inprocess``) and the Airflow DAGs all leave a
run folder with ``run.json`` (the run record) and ``steps/<call>/attempt-<n>.json`` (one file per attempt;
``steps/<call>/iteration-<i>/attempt-<n>.json`` for a loop iteration's). This
module reads them as plain JSON (dicts), so it depends on the record's documented fields, not on the classes that
write it, and it tolerates fields a record of another version lacks.

Where run folders are found (:func:`default_roots`): ``./heteroflow-runs`` (``heteroflow run``'s default) and
``$HETEROFLOW_HOME/airflow-runs`` (the Airflow DAGs' default ``run_root``, whose folders are
``<run_root>/<dag id>/<run id>``); a root is searched three levels deep.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from heteroflow.components.errors import InvalidParameter

__all__ = [
    "RUN_FILE",
    "attempts",
    "default_roots",
    "device_of",
    "ran_on",
    "fallback_step",
    "find_runs",
    "headline_metric",
    "history_of",
    "iteration_name",
    "iteration_results",
    "iterations_note",
    "iterations_of",
    "load_run",
    "model_overrides",
    "prune_archive",
    "prune_cache",
    "resolve_run",
    "retries",
    "scalar_results",
    "step_label",
]

RUN_FILE = "run.json"
_DEPTH = 3


def default_roots() -> list[Path]:
    """``./heteroflow-runs`` and ``<heteroflow home>/airflow-runs`` (whichever exist are searched)."""
    from heteroflow.cache.locations import home_dir

    return [Path.cwd() / "heteroflow-runs", home_dir() / "airflow-runs"]


def load_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run record of ``run_dir`` (``run.json``) as a dict, plus ``attempts``: per call, its attempt records
    (dicts, in attempt order) read from ``steps/``.

    ``run_dir`` may also be the path of a ``run.json``.

    Raises:
        InvalidParameter: no ``run.json`` there, or one that is not a JSON object.
    """
    path = Path(run_dir).expanduser()
    if path.name == RUN_FILE and path.is_file():
        path = path.parent
    file = path / RUN_FILE
    if not file.exists() and (path / _DRIVER_FILE).is_file():
        going = _in_progress(path)  # still going: what it has done so far; killed: its record is written now
        if going is not None:
            going["attempts"] = _read_attempts(path)
            return going
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        hint = " (its driver.json cannot be read: the run is still starting, or its folder is damaged)" if (path / _DRIVER_FILE).exists() else ""
        raise InvalidParameter(f"run folder {path} has no {RUN_FILE}{hint}; give a folder a run wrote, e.g. heteroflow-runs/<run id>") from None
    except ValueError as exc:
        raise InvalidParameter(f"{file} is not valid JSON ({exc}); it is not a run record") from None
    if not isinstance(data, dict):
        raise InvalidParameter(f"{file} holds a {type(data).__name__}, not a run record (a JSON object)")
    # the fields every reader walks, of the shape a run writes them (one record with "steps": [1] made `heteroflow
    # runs` fail for every run with an AttributeError; a started_at of text, with a TypeError of the sort)
    for key, shape in (("steps", list), ("fallbacks", list)):
        value = data.get(key)
        if value is not None and not (isinstance(value, shape) and all(isinstance(v, dict) for v in value)):
            raise InvalidParameter(f"{file}: {key} is not a list of objects ({str(value)[:60]}); it is not a run record heteroflow wrote")
    for key in ("results", "placement", "params", "metrics"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise InvalidParameter(f"{file}: {key} is not an object; it is not a run record heteroflow wrote")
    for key in ("started_at", "wall_seconds"):
        if data.get(key) is not None and (isinstance(data[key], bool) or not isinstance(data[key], (int, float))):
            raise InvalidParameter(f"{file}: {key}={data[key]!r} is not a number of seconds; it is not a run record heteroflow wrote")
    data.setdefault("run_dir", str(path))
    data["attempts"] = _read_attempts(path)
    return data


_DRIVER_FILE = "driver.json"  # heteroflow.pipelines.runs.records.DRIVER_FILE: a local run's driver process


def _in_progress(folder: Path) -> dict[str, Any] | None:
    """A run folder without ``run.json`` whose ``driver.json`` names its driver process: while that process lives,
    the run so far (status ``running``); once it is gone, the run was killed and gets its record now (as the next
    run beside it would write it: :func:`heteroflow.pipelines.runs.records.recover_killed_runs`), so that
    ``heteroflow runs`` lists it at once. None when neither applies."""
    from heteroflow.pipelines.runs.records import recover_killed_runs, running_record

    going = running_record(folder)
    if going is not None:
        return going
    recover_killed_runs(folder.parent, only=folder)
    return None


def _read_attempts(folder: Path) -> dict[str, list[dict[str, Any]]]:
    from heteroflow.components.core.telemetry import attempt_files, record_order

    out: dict[str, list[dict[str, Any]]] = {}
    root = folder / "steps"
    if not root.is_dir():
        return out
    for step_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        records = []
        for f in attempt_files(step_dir):
            try:
                rec = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict):
                records.append(rec)
        out[step_dir.name] = sorted(records, key=record_order)
    return out


def find_runs(roots: Sequence[str | os.PathLike[str]] | None = None, *,
              unreadable: list[tuple[Path, str]] | None = None) -> list[dict[str, Any]]:
    """Every run record under ``roots`` (default :func:`default_roots`), newest first (by ``started_at``).

    A root may itself be a run folder. Records that cannot be read are skipped; with ``unreadable``, each is
    appended there as ``(folder, why)``. A local run still going (its
    ``driver.json`` names a live process) is listed as ``running``, with what it has done so far; one whose
    process is gone without a record was killed, and gets its record now (status ``killed``).
    """
    seen: set[Path] = set()
    runs = []
    for root in [Path(r).expanduser() for r in (roots if roots is not None else default_roots())]:
        for file in _run_files(root, _DRIVER_FILE):  # runs still going (listed so far), or killed (recorded now)
            folder = file.parent.resolve()
            if (folder / RUN_FILE).exists() or folder in seen:
                continue
            going = _in_progress(folder)
            if going is not None:
                seen.add(folder)
                going["attempts"] = _read_attempts(folder)
                runs.append(going)
        for file in _run_files(root):
            folder = file.parent.resolve()
            if folder in seen:
                continue
            seen.add(folder)
            try:
                runs.append(load_run(folder))
            except InvalidParameter as exc:
                if unreadable is not None:
                    unreadable.append((folder, str(exc)))
                continue
    return sorted(runs, key=lambda r: r.get("started_at") or 0.0, reverse=True)


def _run_files(root: Path, name: str = RUN_FILE) -> Iterable[Path]:
    if not root.is_dir():
        return []
    found = []
    for depth in range(_DEPTH + 1):
        found.extend(p for p in root.glob("/".join(["*"] * depth + [name])) if p.is_file())
    return found


def resolve_run(ref: str, roots: Sequence[str | os.PathLike[str]] | None = None) -> dict[str, Any]:
    """The run named ``ref``: a run folder (or its ``run.json``), a run id (a unique prefix is enough) or a run
    folder's name found under ``roots``.

    Raises:
        InvalidParameter: no run matches, or a prefix matches several (their ids are listed).
    """
    path = Path(ref).expanduser()
    if path.is_dir() or path.is_file():
        return load_run(path)
    if "/" in ref or ref.startswith(("~", ".")):
        raise InvalidParameter(f"run folder {path} does not exist; give a run folder (holding run.json) or a run id")
    unreadable: list[tuple[Path, str]] = []
    runs = find_runs(roots, unreadable=unreadable)
    # or its folder's name: an Airflow run's id is Airflow's (manual__...), its folder the one `heteroflow run` printed
    exact = [r for r in runs if r.get("run_id") == ref] or [r for r in runs if r.get("run_dir") and Path(str(r["run_dir"])).name == ref]
    matches = exact or [r for r in runs if str(r.get("run_id", "")).startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    where = ", ".join(str(r) for r in (roots if roots is not None else default_roots()))
    if not matches:
        damaged = [why for folder, why in unreadable if folder.name.startswith(ref)]
        if damaged:  # a folder of that name whose run.json cannot be read: say so (it said "no run" of it)
            raise InvalidParameter(damaged[0])
        known = ", ".join(str(r.get("run_id")) for r in runs[:5])
        raise InvalidParameter(f"no run {ref!r} in {where}" + (f"; newest runs: {known}" if known else "; there are no runs there") + " (or give the run's folder)")
    shown = ", ".join(str(r.get("run_id")) for r in matches[:8]) + (f", and {len(matches) - 8} more" if len(matches) > 8 else "")
    raise InvalidParameter(f"run id {ref!r} matches {len(matches)} runs ({shown}); give more of the id")


# --- facts derived from a record ---------------------------------------------------------------------------


def attempts(run: dict[str, Any], step: str) -> list[dict[str, Any]]:
    """The attempt records of ``step`` (dicts, in order: by loop iteration, then attempt); empty when the run folder
    has none."""
    return list((run.get("attempts") or {}).get(step, []))


def retries(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Every retry of the run: ``step``, ``attempt`` (the retry's number), ``after`` (the failure class of the
    attempt before it), ``candidate``, ``kind``, ``wait_seconds`` (from the end of the attempt before to the
    start of this one, in seconds; None when either time is unknown) and ``iteration`` (the loop iteration it
    retried, as :func:`~heteroflow.components.core.telemetry.iteration_key` gives it: ``(1,)``, nested ``(0, 1)``;
    None outside a loop: a retry is always within one iteration, the next iteration is never a retry). A move to another
    candidate after a device failure is a fallback, not a retry, and is not listed."""
    from heteroflow.components.core.telemetry import iteration_key

    out = []
    for step, recs in (run.get("attempts") or {}).items():
        for prev, cur in zip(recs, recs[1:]):
            if iteration_key(prev) != iteration_key(cur):
                continue
            if prev.get("status") != "failed" or prev.get("candidate") != cur.get("candidate"):
                continue
            end, start = prev.get("ended_at"), cur.get("started_at")
            wait = max(start - end, 0.0) if isinstance(end, (int, float)) and isinstance(start, (int, float)) else None
            out.append(
                {
                    "step": step,
                    "attempt": cur.get("attempt"),
                    "after": prev.get("failure"),
                    "error": prev.get("error"),
                    "candidate": cur.get("candidate"),
                    "kind": cur.get("kind"),
                    "wait_seconds": wait,
                    "waited_from": end if wait is not None else None,
                    "waited_until": start if wait is not None else None,
                    "iteration": iteration_key(cur),
                }
            )
    return out


def wait_seconds(items: list[dict[str, Any]]) -> tuple[float, float]:
    """``(summed, under way)`` of the retries ``items`` (:func:`retries`), seconds: the sum of their waits, and the
    time at least one of them was under way (the union of the intervals ``waited_from``-``waited_until``; a wait
    whose times are unknown counts in neither). The two differ only where loop iterations waited side by side."""
    summed = sum(r.get("wait_seconds") or 0.0 for r in items)
    spans = sorted((r["waited_from"], r["waited_until"]) for r in items
                   if isinstance(r.get("waited_from"), (int, float)) and isinstance(r.get("waited_until"), (int, float)))
    union, reach = 0.0, None
    for start, end in spans:
        if reach is None or start > reach:
            union += end - start
            reach = end
        elif end > reach:
            union += end - reach
            reach = end
    return summed, union


def waiting_text(items: list[dict[str, Any]], wall_seconds: Any = None) -> str:
    """How long the retries ``items`` (:func:`retries`) waited, worded so that it holds when loop iterations waited
    side by side: ``15.0 s spent waiting of the run's 40.0 s`` when no two waits overlapped; else the waits' sum
    named as such and the time at least one of them was under way (the union of the waits' intervals, from the
    attempt records' times), which the run's wall time bounds: ``20.8 s spent waiting, summed over the retries
    (loop iterations waited side by side); 10.4 s of the run's 17.0 s with at least one waiting``.

    Args:
        items: the retries, with ``wait_seconds``, ``waited_from`` and ``waited_until`` (Unix seconds; None when
            unknown).
        wall_seconds: the run's wall time, seconds; None leaves it out.
    """
    summed, union = wait_seconds(items)
    of_run = f" of the run's {wall_seconds:.1f} s" if isinstance(wall_seconds, (int, float)) else ""
    if union >= summed - 0.05:  # no two waits overlapped: the sum is the time spent waiting
        return f"{summed:.1f} s spent waiting{of_run}"
    return (f"{summed:.1f} s spent waiting, summed over the retries (loop iterations waited side by side); "
            f"{union:.1f} s{of_run} with at least one waiting")


def iterations_of(step: Any) -> list[dict[str, Any]]:
    """A step's loop iterations (dicts, in order) from its summary (a ``run.json`` step or a
    :class:`~heteroflow.pipelines.runs.records.StepSummary`); empty outside a loop and in records written before
    iterations were recorded."""
    import dataclasses

    found = step.get("iterations") if isinstance(step, dict) else getattr(step, "iterations", None)
    out = []
    for it in found or []:
        it = dataclasses.asdict(it) if dataclasses.is_dataclass(it) and not isinstance(it, type) else it
        if isinstance(it, dict) and isinstance(it.get("iteration"), int):
            out.append(it)
    return out


def step_label(step: Any) -> str:
    """A step's name as the tables show it: ``train ×3`` for a step that ran 3 loop iterations, else its name."""
    name = step.get("name") if isinstance(step, dict) else getattr(step, "name", "")
    its = iterations_of(step)
    return f"{name} ×{len(its)}" if its else str(name)


def iteration_name(it: dict[str, Any], *, item_chars: int = 24) -> str:
    """One iteration as a table row names it: ``[1] 0.1`` (its index, as Airflow's ``map_index``, and its loop item
    as JSON, cut to ``item_chars`` characters); nested: ``[0][1] ...``."""
    from heteroflow.components.core.telemetry import iteration_label

    label = iteration_label((*(it.get("outer_iterations") or []), it["iteration"]))
    item = it.get("item")
    if item is None:
        return label
    text = item if isinstance(item, str) else json.dumps(item, default=str, sort_keys=True)
    return f"{label} {text if len(text) <= item_chars else text[: item_chars - 1] + '…'}"


def iterations_note(step: Any) -> str:
    """How a loop step's iterations ended, in a few words (``3 iterations: 2 succeeded, 1 failed; [1] 2
    attempts``); empty outside a loop."""
    from heteroflow.components.core.telemetry import iteration_label

    its = iterations_of(step)
    if not its:
        return ""
    counts: dict[str, int] = {}
    for it in its:
        counts[str(it.get("status"))] = counts.get(str(it.get("status")), 0) + 1
    text = f"{len(its)} iteration{'s' if len(its) != 1 else ''}: " + ", ".join(f"{n} {status}" for status, n in counts.items())
    retried = [f"{iteration_label((*(it.get('outer_iterations') or []), it['iteration']))} {it.get('attempts')} attempts"
               for it in its if (it.get("attempts") or 0) > 1]
    return text + ("; " + ", ".join(retried) if retried else "")


def iteration_results(step: Any, *, limit: int = 6) -> list[str]:
    """A loop step's results, one line per iteration (``[0] 0.1: result 0.93``; ``[1] 0.5: failed``), from each
    iteration's facts (its scalar ones, numbers to 4 significant digits, at most ``limit``, in the order the step
    returned them); empty outside a loop, or when no iteration has a scalar fact."""
    lines, any_facts = [], False
    for it in iterations_of(step):
        shown = scalar_results(it.get("details"), limit=limit)
        any_facts = any_facts or bool(shown)
        text = shown or str(it.get("status"))
        lines.append(f"{iteration_name(it)}: {text}")
    return lines if any_facts else []


def fallback_step(fallback: dict[str, Any]) -> str:
    """The step a fallback entry of ``run.json`` left a candidate of, with its loop iteration where it has one
    (``train[1]``; ``train[0][2]`` in a nested loop), as the other views name an iteration."""
    from heteroflow.components.core.telemetry import iteration_label

    it = fallback.get("iteration")
    key = (*(fallback.get("outer_iterations") or []), it) if it is not None else None
    return f"{fallback.get('step')}{iteration_label(key)}"


def scalar_results(facts: Any, *, limit: int = 6) -> str:
    """A step's (or an iteration's) scalar results as one text: ``best_learning_rate 0.001, best_accuracy 0.99``
    (numbers to 4 significant digits, booleans, strings up to 60 characters; at most ``limit``, then ``…``, in the
    order the step returned them); empty when there are none."""
    if not isinstance(facts, dict):
        return ""
    shown = [
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in facts.items()
        if isinstance(v, (int, float, str, bool)) and not (isinstance(v, str) and (len(v) > 60 or not v))
    ]
    return ", ".join(shown[:limit]) + (", …" if len(shown) > limit else "")


def device_of(step: dict[str, Any]) -> str:
    """Where a step ran, worded as every view words it (:func:`~heteroflow.components.core.telemetry.where_ran`:
    ``gpu (nvidia-gpu, simulated, on cpu)``); ``-`` for a step that did not run."""
    from heteroflow.components.core.telemetry import where_ran

    if not (step.get("kind") or step.get("device")) or step.get("status") == "not run":
        return "-"
    return where_ran(step.get("kind") or step.get("device"), step.get("device"), accelerator=step.get("accelerator"),
                     simulated=bool(step.get("simulated")), details=step.get("details"))


def ran_on(run: dict[str, Any], call: str) -> str:
    """Where ``call`` ran in the end, as one line every view shares (#28 item 17): the candidate its last attempt
    ran on and :func:`device_of` it, the candidate it was placed on first when a fallback moved it, and the step
    it resumed from (a training's ``resumed_from_step``); empty for a call the record has no step of."""
    step = next((s for s in run.get("steps") or [] if isinstance(s, dict) and s.get("name") == call), None)
    placed = (run.get("placement") or {}).get(call)
    placed = placed if isinstance(placed, dict) else {}
    if step is None or device_of(step) == "-":
        return ""
    index = step.get("candidate") if step.get("candidate") is not None else placed.get("index", 0)
    res = placed.get("resources") if isinstance(placed.get("resources"), dict) else {}
    shape = _mixed_shape(res)
    facts = (run.get("results") or {}).get(call)
    mixed = facts.get("mixed") if isinstance(facts, dict) and isinstance(facts.get("mixed"), dict) else {}
    dropped = [d for d in mixed.get("dropped") or [] if isinstance(d, dict)]
    first = placed.get("index")
    if shape and dropped and index == first:
        # a mixed candidate went on without a kind: say what the candidate was and what it continued on (#new-user
        # trial: "candidate 0 -> gpu" after the npu dropped out, with no word that candidate 0 was gpu+npu)
        from heteroflow.components.training.mixed_step import drop_point

        gone = " and ".join(f"{d.get('kind')} dropped out{drop_point(d.get('step'))}" for d in dropped)
        text = f"candidate {index} ({shape}) -> {device_of(step)} once {gone}"
    else:
        text = f"candidate {index} -> {device_of(step)}"
    if first is not None and step.get("candidate") is not None and step.get("candidate") != first:
        text += f" (placed on candidate {first}, {shape or placed.get('device_kind') or res.get('kind')}, then fell back)"
    resumed = facts.get("resumed_from_step") if isinstance(facts, dict) else None
    if isinstance(facts, dict) and facts.get("reused_model"):  # not trained here: an earlier run's finished model
        text += f"; took the model an earlier run finished ({resumed} steps)" if isinstance(resumed, int) and resumed else \
            "; took the model an earlier run finished"
    elif isinstance(resumed, int) and not isinstance(resumed, bool) and resumed > 0:
        text += f"; resumed from step {resumed}"
    return text


def _mixed_shape(resources: dict[str, Any]) -> str:
    """A mixed candidate's replicas as the placement line names them (``gpu x1 + npu x1``); ``""`` for a candidate of
    one kind."""
    groups = [g for g in resources.get("replicas") or [] if isinstance(g, dict)]
    if len(groups) < 2:
        return ""
    return " + ".join(f"{g.get('kind')} x{g.get('count', 1)}" for g in groups)


def headline_metric(run: dict[str, Any]) -> tuple[str, float] | None:
    """The run's test accuracy (``accuracy`` of the first call whose metrics have it), else None."""
    for call, values in (run.get("metrics") or {}).items():
        if isinstance(values, dict) and isinstance(values.get("accuracy"), (int, float)):
            return ("accuracy", float(values["accuracy"]))
    return None


def history_of(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per call, the per-epoch history its record holds: a list of dicts (one per epoch, numeric values such as
    ``loss``, ``validation_accuracy``), found under the call's ``results``, ``metrics`` or step ``details`` as
    ``history`` (or ``epochs``): a list of dicts, or a dict of equal-length lists (columns); for a step stopped
    before it finished (interrupted, killed), the history its last live progress report held. Calls without one
    are left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    sources: list[tuple[str, Any]] = []
    for key in ("results", "metrics"):
        sources += list((run.get(key) or {}).items())
    sources += [(s.get("name"), s.get("details")) for s in run.get("steps") or [] if isinstance(s, dict)]
    sources += [(s.get("name"), (s.get("details") or {}).get("progress")) for s in run.get("steps") or []
                if isinstance(s, dict) and isinstance(s.get("details"), dict)]
    for call, facts in sources:
        if call in out or not isinstance(facts, dict):
            continue
        for name in ("history", "epochs"):
            value = facts.get(name)
            if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
                # columns ({"loss": [...], "accuracy": [...]}) -> one dict per epoch
                n = max(len(v) for v in value.values())
                value = [{k: v[i] for k, v in value.items() if i < len(v)} for i in range(n)]
            if isinstance(value, list) and value and all(isinstance(e, dict) for e in value):
                out[call] = value
                break
    return out


# --- pruning: keep the newest N, never what a kept run names --------------------------------------------------


def model_overrides(run: dict[str, Any]) -> dict[str, Any]:
    """Run parameters whose value the model did not use, mapped to the value it used: a train call's
    ``model_args`` sets a parameter train also offers (the model's width, say) and wins over the parameter's
    default (:func:`heteroflow.components.training.factories._check_overrides` refuses two set values that
    disagree). Read from each call's ``results`` (``model_args``: the arguments the model factory was called
    with); the parameter is matched by name or as ``<call>.<name>``. Empty when nothing was overridden."""
    params = run.get("params") or {}
    out: dict[str, Any] = {}
    for call, facts in (run.get("results") or {}).items():
        used = facts.get("model_args") if isinstance(facts, dict) else None
        if not isinstance(used, dict):
            continue
        for name, value in used.items():
            key = next((k for k in (f"{call}.{name}", name) if k in params), None)
            if key is not None and key not in out and params[key] != value:
                out[key] = value
    return out


def _named_by_runs(roots: Sequence[str | os.PathLike[str]] | None) -> tuple[dict[tuple[str, int], list[tuple[str, str, bool]]], dict[str, str]]:
    """What the runs under ``roots`` name in their lineage: ``{(model, version): [(run id, archived path, reused)]}``
    (the versions they archived, or found archived already: ``reused``) and ``{data set version: run id}`` (the
    cache versions they read)."""
    models: dict[tuple[str, int], list[tuple[str, str, bool]]] = {}
    datasets: dict[str, str] = {}
    for run in find_runs(roots):
        rid = str(run.get("run_id"))
        for facts in (run.get("results") or {}).values():
            if not isinstance(facts, dict):
                continue
            if isinstance(facts.get("name"), str) and isinstance(facts.get("version"), int) and "path" in facts:
                models.setdefault((facts["name"], facts["version"]), []).append((rid, str(facts["path"]), bool(facts.get("existing"))))
            if isinstance(facts.get("version"), str) and "dataset_sha256" in facts:
                datasets.setdefault(facts["version"], rid)
    return models, datasets


def _remove_tree(folder: Path) -> None:
    """Hide ``folder`` by a rename first (so it is never seen half removed), then delete it (archived files are
    read-only)."""
    import shutil
    import stat

    hidden = folder.with_name(f".pruning-{folder.name}-{os.getpid()}")
    folder.rename(hidden)
    for p in hidden.rglob("*"):
        try:
            p.chmod(stat.S_IRWXU if p.is_dir() else stat.S_IRUSR | stat.S_IWUSR)
        except OSError:
            pass
    hidden.chmod(stat.S_IRWXU)
    shutil.rmtree(hidden)


def _check_keep(keep: int) -> None:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InvalidParameter(f"keep={keep!r} is not valid; valid: a whole number >= 1 (the newest versions kept)")


def prune_archive(
    keep: int,
    *,
    model: str | None = None,
    archive_root: str | os.PathLike[str] | None = None,
    roots: Sequence[str | os.PathLike[str]] | None = None,
    force: bool = False,
    dry_run: bool = False,
) -> list[dict[str, Any]]:
    """Remove archived model versions beyond the newest ``keep`` of each model (or of ``model``).

    A version that a run under ``roots`` (default :func:`default_roots`) archived is kept unless ``force``: its
    lineage names it. The newest version always stays, so version numbers are never reused.

    Returns:
        One entry per version looked at beyond the newest ``keep``: ``model``, ``version``, ``path``, ``action``
        (``removed``, ``would remove`` with ``dry_run``, or ``kept``) and, when kept, ``reason``.

    Raises:
        InvalidParameter: ``keep`` < 1, or an unknown ``model`` (the archived ones are listed).
    """
    from heteroflow.components.models.archive import archive_root_dir, list_models, list_versions, read_version

    _check_keep(keep)
    root = archive_root_dir(archive_root)
    if model:
        read_version(root, model)  # an unknown model: the error lists the archived ones
    named, _ = _named_by_runs(roots)
    out = []
    for name in [model] if model else list_models(root):
        for version in list_versions(root, name)[:-keep]:
            entry: dict[str, Any] = {"model": name, "version": version, "path": str(root / name / f"v{version}")}
            # every run naming name:vN keeps it (a cluster run records the path it saw, maybe another mount of this
            # archive); the reason names the run that archived it here first, else says what the run did (it named
            # the newest run, which had found the model archived already, and runs of another --root alike)
            here = Path(entry["path"]).resolve()
            by = sorted(named.get((name, version), []), key=lambda r: (Path(r[1]).resolve() != here, r[2]))
            if by and not force:
                rid, path, reused = by[0]
                did = ("uses it (it found the same model archived)" if reused else "archived it") if Path(path).resolve() == here \
                    else f"names {name}:v{version} of the archive at {Path(path).parent.parent}"
                entry.update(action="kept", reason=f"run {rid} {did} (its lineage names {name}:v{version}); --force removes it")
            elif dry_run:
                entry["action"] = "would remove"
            else:
                _remove_tree(root / name / f"v{version}")
                entry["action"] = "removed"
            out.append(entry)
    return out


def prune_cache(
    keep: int,
    *,
    dataset: str = "",
    cache_root: str = "",
    roots: Sequence[str | os.PathLike[str]] | None = None,
    archive_root: str | os.PathLike[str] | None = None,
    force: bool = False,
    dry_run: bool = False,
    lock_timeout_s: float = 60.0,
) -> list[dict[str, Any]]:
    """Remove cached data set versions beyond the newest ``keep`` of each data set (or of ``dataset``: its
    source URI or cache key prefix), never the current version.

    A version that a run under ``roots`` read, or that an archived model's lineage names, is kept unless
    ``force``. Each data set's prewarm lock is held while its versions are removed, so a prewarm never sees
    one half gone.

    Returns:
        One entry per version looked at beyond the newest ``keep``: ``dataset`` (cache key), ``version``,
        ``path``, ``action`` (``removed``, ``would remove``, ``kept``) and, when kept, ``reason``.

    Raises:
        InvalidParameter: ``keep`` < 1. CacheLockTimeout: a prewarm held a data set's lock over ``lock_timeout_s``.
    """
    import json as _json

    import filelock

    from heteroflow.cache.errors import CacheLockTimeout
    from heteroflow.cache.layout import LOCK_NAME, VERSIONS_DIR
    from heteroflow.cache.status import cache_status
    from heteroflow.components.models.archive import archive_root_dir, list_models, list_versions

    _check_keep(keep)
    _, named = _named_by_runs(roots)
    archived: dict[str, str] = {}
    aroot = archive_root_dir(archive_root)
    for name in list_models(aroot):
        for version in list_versions(aroot, name):
            try:
                lineage = _json.loads((aroot / name / f"v{version}" / "lineage.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            dv = (lineage.get("dataset") or {}).get("version")
            if isinstance(dv, str):
                archived.setdefault(dv, f"{name}:v{version}")
    out = []
    for status in cache_status(cache_root, dataset):
        old = [v for v in status.versions if not v.current]  # newest first
        beyond = old[max(keep - (len(status.versions) - len(old)), 0):]
        if not beyond:
            continue
        lock = filelock.FileLock(str(status.folder / LOCK_NAME), timeout=lock_timeout_s, preserve_lock_file=True)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise CacheLockTimeout(f"a prewarm of {status.key} holds {status.folder / LOCK_NAME} for more than {lock_timeout_s:.0f} s; try again when it ends") from None
        try:
            for v in beyond:
                path = status.folder / VERSIONS_DIR / v.version
                entry: dict[str, Any] = {"dataset": status.key, "version": v.version, "path": str(path)}
                if v.version in named and not force:
                    entry.update(action="kept", reason=f"run {named[v.version]} read it (its lineage names version {v.version}); --force removes it")
                elif v.version in archived and not force:
                    entry.update(action="kept", reason=f"archived model {archived[v.version]} was trained on it; --force removes it")
                elif dry_run:
                    entry["action"] = "would remove"
                else:
                    _remove_tree(path)
                    entry["action"] = "removed"
                out.append(entry)
        finally:
            lock.release()
    return out
