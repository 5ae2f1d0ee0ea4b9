"""The sections of the run report (:mod:`heteroflow.pipelines.runs.report`), each an HTML fragment of a run record
(empty when the record holds nothing for it): the header, the step graph, the attempts table, retries, fallbacks,
placement, the plots, the evaluation (confusion matrix, per-class precision and recall), lineage and parameters."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

from heteroflow.pipelines.runs.charts import _confusion_plot, _history_plots, _per_class_plot, _timeline_plot
from heteroflow.pipelines.runs.folders import (
    attempts,
    device_of,
    headline_metric,
    history_of,
    iteration_name,
    iterations_note,
    iterations_of,
    model_overrides,
    ran_on,
    retries,
    step_label,
    wait_seconds,
    waiting_text,
)
from heteroflow.pipelines.runs.markup import _STATUS_COLOURS, _badge, _e, _kv_table, _num, _seconds, _short_error


def _header(run: dict[str, Any]) -> str:
    started = run.get("started_at")
    when = (
        _dt.datetime.fromtimestamp(started, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        if isinstance(started, (int, float)) and started > 0
        else "-"
    )
    rows = [
        ("pipeline", _e(run.get("pipeline"))),
        ("started", _e(when)),
        ("wall time", f"{_seconds(run.get('wall_seconds'))} s"),
        ("run folder", f"<code>{_e(run.get('run_dir'))}</code>"),
    ]
    metric = headline_metric(run)
    if metric:
        rows.append((f"test {metric[0]}", f"{metric[1]:.4f}"))
    waited = [r for r in retries(run) if r["wait_seconds"] is not None]
    if waited:
        summed, under_way = wait_seconds(waited)
        text = f"{summed:.1f} s over {len(waited)} retr{'y' if len(waited) == 1 else 'ies'}"
        if under_way < summed - 0.05:  # loop iterations waited side by side: the sum is no span of the run's time
            text = f"{len(waited)} retries: {waiting_text(waited, run.get('wall_seconds'))}"
        rows.append(("waiting for retries", _e(text)))
    if run.get("testing"):
        rows.append(("testing settings", _e(", ".join(f"{k}={v}" for k, v in run["testing"].items()))))
    out = [f"<h1>Run {_e(run.get('run_id'))} {_badge(run.get('status'))}</h1>", _kv_table(rows)]
    if run.get("error"):
        out.append(f'<p class="error" id="run-error"><b>Stopped by:</b> {_e(_short_error(run["error"]))}</p>')
    failed = [s for s in run.get("steps") or [] if s.get("status") in ("failed", "killed") and s.get("error")]
    for s in failed:
        failure = f" ({_e(s['failure'])} failure)" if s.get("failure") else ""
        out.append(
            f'<p class="error step-error"><b>step {_e(s.get("name"))} {_e(s.get("status"))}{failure}:</b> '
            f'{_e(_short_error(s.get("error")))}</p>'
        )
    return "\n".join(out)


def _graph(run: dict[str, Any]) -> str:
    steps = [s for s in run.get("steps") or [] if isinstance(s, dict)]
    if not steps:
        return "<h2>Steps</h2><p class=\"muted\">The record holds no steps.</p>"
    nodes = []
    for s in steps:
        colour = _STATUS_COLOURS.get(str(s.get("status")), "#6e7781")
        cand = s.get("candidate")
        lines = [
            f"<b>{_e(step_label(s))}</b>",
            _e(s.get("status")),
            f"device: {_e(device_of(s))}",
            f"candidate: {_e(cand) if cand is not None else '-'}",
            f"attempts: {_e(s.get('attempts') or '-')}",  # a step that never ran: `-`, as every table says
            f"seconds: {_seconds(s.get('seconds'))}",
        ]
        if iterations_of(s):  # a loop step: its attempts are the most one iteration took
            lines.insert(2, f'<span class="iterations">{_e(iterations_note(s))}</span>')
        nodes.append(f'<div class="node" data-step="{_e(s.get("name"))}" style="border-color:{colour}">' + "<br>".join(lines) + "</div>")
    graph = '<div class="graph">' + '<span class="arrow">&rarr;</span>'.join(nodes) + "</div>"
    return "<h2>Steps</h2>" + graph


def _attempts_table(run: dict[str, Any]) -> str:
    """One row per attempt; a loop step's attempts name their iteration (``[1] 0.1``: index and item), and each
    iteration's attempts are numbered, and waited for, apart."""
    from heteroflow.components.core.telemetry import iteration_key

    looped = any(iteration_key(r) is not None for recs in (run.get("attempts") or {}).values() for r in recs)
    rows = []
    for s in run.get("steps") or []:
        recs = attempts(run, s.get("name"))
        if not recs:
            rows.append(
                f"<tr><td>{_e(s.get('name'))}</td>" + ("<td></td>" if looped else "") + f"<td class=num>-</td><td>{_badge(s.get('status'))}</td>"
                f"<td>{_e(device_of(s))}</td><td class=num>-</td><td class=num>{_seconds(s.get('seconds'))}</td><td></td><td class=error>{_e(_short_error(s.get('error')))}</td></tr>"
            )
            continue
        prev = None
        for r in recs:
            if prev is not None and iteration_key(prev) != iteration_key(r):
                prev = None  # the next iteration: not a retry of the one before
            iteration = ""
            if looped:
                key = iteration_key(r)
                iteration = "<td class=iteration>" + (_e(iteration_name({"iteration": key[-1], "outer_iterations": list(key[:-1]), "item": r.get("item")})) if key else "") + "</td>"
            if r.get("status") == "running" and run.get("status") not in (None, "running"):
                # the run ended while this attempt ran: it was stopped with the run, not still going
                r = {**r, "status": "interrupted" if run.get("status") == "interrupted" else "killed"}
            wait = ""
            if prev is not None and isinstance(prev.get("ended_at"), (int, float)) and isinstance(r.get("started_at"), (int, float)):
                wait = f"{max(r['started_at'] - prev['ended_at'], 0.0):.1f}"
            rows.append(
                f"<tr><td>{_e(r.get('step', s.get('name')))}</td>{iteration}<td class=num>{_e(r.get('attempt'))}</td><td>{_badge(r.get('status'))}</td>"
                f"<td>{_e(device_of(r))}</td><td class=num>{_e(r.get('candidate')) if r.get('candidate') is not None else '-'}</td>"
                f"<td class=num>{_seconds(r.get('seconds'))}</td><td class=num>{wait}</td>"
                f"<td class=error>{_e(r.get('failure') + ': ' if r.get('failure') else '')}{_e(_short_error(r.get('error')))}</td></tr>"
            )
            prev = r
    head = "<tr><th>step</th>" + ("<th>iteration</th>" if looped else "") + "<th>attempt</th><th>status</th><th>device</th><th>candidate</th><th>seconds</th><th>waited s</th><th>failure</th></tr>"
    return "<h2>Attempts</h2><table>" + head + "".join(rows) + "</table>"


def _retries(run: dict[str, Any]) -> str:
    from heteroflow.components.core.telemetry import iteration_label

    items = retries(run)
    if not items:
        return ""
    rows = "".join(
        f"<tr><td>{_e(str(r['step']) + iteration_label(r.get('iteration')))}</td><td class=num>{_e(r['attempt'])}</td><td>{_e(r['kind'])}{'' if r.get('candidate') is None else ' (candidate ' + _e(r['candidate']) + ')'}</td>"
        f"<td>{_e(r['after'])}</td><td class=num>{_wait(r['wait_seconds'])}</td>"
        f"<td class=error>{_e(_short_error(r['error']))}</td></tr>"
        for r in items
    )
    return (
        f"<h2>Retries</h2><p>{len(items)} retr{'y' if len(items) == 1 else 'ies'}, {_e(waiting_text(items))} (backoff).</p>"
        "<table><tr><th>step</th><th>attempt</th><th>on</th><th>after a failure of class</th><th>waited s</th><th>the failure</th></tr>"
        + rows
        + "</table>"
    )


def _wait(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def _fallbacks(run: dict[str, Any]) -> str:
    items = run.get("fallbacks") or []
    if not items:
        return ""
    lis = []
    for f in items:
        acc = f" ({f['accelerator']})" if f.get("accelerator") else ""
        where = f"[{f['iteration']}]" if f.get("iteration") is not None else ""  # a loop iteration's fallback
        lis.append(
            f'<li class="fallback"><b>{_e(f.get("step"))}{_e(where)}</b> left candidate {_e(f.get("candidate"))} '
            f"({_e(f.get('kind'))}{_e(acc)}) after a {_e(f.get('failure'))} failure: <span class=error>{_e(_short_error(f.get('reason')))}</span></li>"
        )
    for call in dict.fromkeys(str(f.get("step")) for f in items):
        ran = ran_on(run, call)
        if ran:
            lis.append(f'<li class="fallback-end"><b>{_e(call)}</b> ran on {_e(ran).replace("-&gt;", "&rarr;")}</li>')
    return "<h2>Fallbacks</h2><ul>" + "".join(lis) + "</ul>"


def _placement(run: dict[str, Any]) -> str:
    placement = run.get("placement") or {}
    if not placement:
        return ""
    lis = []
    for call, p in placement.items():
        if not isinstance(p, dict):
            continue
        res = p.get("resources") or {}
        ran = ran_on(run, call)  # where it ran in the end, worded as every view words it (#28 item 17)
        if ran:
            lis.append(f"<li><b>{_e(call)}</b>: {_e(ran).replace('-&gt;', '&rarr;')}")
        else:
            lis.append(f"<li><b>{_e(call)}</b>: candidate {_e(p.get('index'))} &rarr; {_e(p.get('device_kind') or res.get('kind'))}"
                       f"{' (' + _e(res.get('accelerator')) + ')' if res.get('accelerator') else ''}")
        passed = p.get("passed_over") or []
        if passed:
            lis.append("<ul>" + "".join(f"<li>passed over: {_e(_passed(x))}</li>" for x in passed) + "</ul>")
        lis.append(_scores(p))
        lis.append("</li>")
    return "<h2>Placement</h2><ul>" + "".join(lis) + "</ul>"


def _scores(p: dict[str, Any]) -> str:
    """The plan's score of each candidate and why the winner won (node inventories), as a small table."""
    scores = [x for x in p.get("scores") or [] if isinstance(x, dict)]
    if not scores:
        return ""
    rows = []
    for x in scores:
        score = x.get("score")
        mark = " &#10003;" if x.get("candidate") == p.get("index") else ""
        rows.append(f"<tr><td>{_e(x.get('candidate'))}{mark}</td><td>{'-' if score is None else _e(f'{score:.4g}')}</td>"
                    f"<td>{'yes' if x.get('feasible') else 'no'}</td><td>{_e(x.get('reason', ''))}</td></tr>")
    basis = next((x["basis"] for x in scores if x.get("basis")), "est. steps/s")  # a packing policy's own score (#30)
    packing = p.get("packing") or {}
    source = f'<p class="plan-why">{_e(packing["policy"])} workload distribution: {_e(packing["distribution"])}</p>' if (
        isinstance(packing, dict) and packing.get("distribution")) else ""
    return (f'<p class="plan-why">won: {_e(p.get("why", ""))}</p>{source}<table class="plan-scores"><tr><th>candidate</th>'
            f"<th>score ({_e(basis)})</th><th>feasible</th><th>why</th></tr>{''.join(rows)}</table>")


def _passed(item: Any) -> str:
    if isinstance(item, dict):
        return f"candidate {item.get('index', '?')}: {item.get('reason', json.dumps(item, default=str))}"
    return str(item)


def _plots(run: dict[str, Any]) -> str:
    out = []
    timeline = _timeline_plot(run)
    if timeline:
        out.append(timeline)
    results = run.get("results") or {}
    for call, history in history_of(run).items():
        facts = results.get(call) if isinstance(results.get(call), dict) else {}
        out.extend(_history_plots(call, history, facts.get("resumed_from_step") or 0, facts.get("steps") or 0))
    if not out:
        return ""
    note = "" if history_of(run) else '<p class="muted">The record holds no per-epoch history.</p>'
    return "<h2>Plots</h2>" + note + '<div class="plots">' + "".join(out) + "</div>"


# --- classification --------------------------------------------------------------------------------------


def _classification(run: dict[str, Any]) -> str:
    out = []
    for call, facts in (run.get("results") or {}).items():
        if not isinstance(facts, dict):
            continue
        # Any step's results are read here, a user's step too: a key named like evaluate's ("classes": 10, a
        # "confusion_matrix" of another shape) is drawn only when it has evaluate's shape.
        cm = facts.get("confusion_matrix")
        prec, rec = facts.get("precision"), facts.get("recall")
        named = facts.get("classes")
        classes = [str(c) for c in named] if isinstance(named, list) else []
        if _is_square_matrix(cm):
            if len(classes) != len(cm):
                classes = [str(i) for i in range(len(cm))]
            out.append(f"<h3>{_e(call)}: confusion matrix</h3>" + _confusion_table(cm, classes) + _confusion_plot(call, cm, classes))
        if _is_per_class(prec) and _is_per_class(rec) and prec:
            out.append(f"<h3>{_e(call)}: per-class precision and recall</h3>" + _per_class_table(prec, rec, facts) + _per_class_plot(call, prec, rec))
    if not out:
        return ""
    return "<h2>Evaluation</h2>" + "".join(out)


def _is_square_matrix(cm: Any) -> bool:
    """True for a non-empty n x n list of lists of numbers (evaluate's ``confusion_matrix``)."""
    return (
        isinstance(cm, list)
        and bool(cm)
        and all(isinstance(row, list) and len(row) == len(cm) for row in cm)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for row in cm for v in row)
    )


def _is_per_class(values: Any) -> bool:
    """True for evaluate's per-class ``precision``/``recall``: a dict of class name -> number (or None)."""
    return isinstance(values, dict) and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values.values())


def _confusion_table(cm: list[list[Any]], classes: list[str]) -> str:
    peak = max((v for row in cm for v in row if isinstance(v, (int, float))), default=1) or 1
    head = "<tr><th>true \\ predicted</th>" + "".join(f"<th>{_e(c)}</th>" for c in classes) + "</tr>"
    rows = []
    for name, row in zip(classes, cm):
        cells = []
        for v in row:
            share = (v / peak) if isinstance(v, (int, float)) else 0
            cells.append(f'<td class=num style="background:rgba(9,105,218,{0.08 + 0.6 * share:.2f})">{_e(v)}</td>')
        rows.append(f"<tr><th>{_e(name)}</th>{''.join(cells)}</tr>")
    return '<table class="confusion">' + head + "".join(rows) + "</table>"


def _per_class_table(prec: dict[str, Any], rec: dict[str, Any], facts: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{_e(c)}</td><td class=num>{_num(prec.get(c))}</td><td class=num>{_num(rec.get(c))}</td></tr>" for c in prec
    )
    extra = f"<p>accuracy {_num(facts.get('accuracy'))} on {_e(facts.get('samples', '?'))} samples</p>" if "accuracy" in facts else ""
    return extra + "<table><tr><th>class</th><th>precision</th><th>recall</th></tr>" + rows + "</table>"


# --- lineage and parameters ----------------------------------------------------------------------------------


def _lineage(run: dict[str, Any]) -> str:
    results = run.get("results") or {}
    data = next((f for f in results.values() if isinstance(f, dict) and "dataset_sha256" in f), None)
    model = next((f for f in results.values() if isinstance(f, dict) and "version" in f and "name" in f and "path" in f), None)
    steps = {s.get("name"): s for s in run.get("steps") or []}
    chain = []
    factory = (run.get("params") or {}).get("dataset_factory")
    if factory:  # train read the factory's samples; the data set below was only prewarmed and preprocessed
        chain.append(f"train's data: <b>dataset_factory <code>{_e(factory)}</code></b> (the model trained on its samples, "
                     "not on the data set prewarmed and preprocessed below)")
    if data:
        chain.append(
            f"data set <code>{_e(data.get('source_uri'))}</code> version <code>{_e(data.get('version'))}</code> "
            f"(sha256 <code>{_e(str(data.get('dataset_sha256'))[:12])}</code>, {_e(data.get('files'))} files)"
        )
    for name, facts in results.items():
        counts = facts.get("counts") if isinstance(facts, dict) else None
        if isinstance(counts, dict) and "num_classes" in facts and all(isinstance(v, (int, float)) for v in counts.values()):
            chain.append(f"{_e(name)}: {_e(sum(counts.values()))} rows, {_e(facts.get('num_features'))} features, {_e(facts.get('num_classes'))} classes")
        if isinstance(facts, dict) and "final_loss" in facts:
            chain.append(f"{_e(name)} on {_e(device_of(steps.get(name, {})))}: final loss {_num(facts.get('final_loss'))}")
    if model:
        chain.append(f"model <b>{_e(model.get('name'))}:v{_e(model.get('version'))}</b> <code>{_e(model.get('path'))}</code>")
    if not chain:
        return ""
    return "<h2>Lineage</h2><ol class=\"lineage\">" + "".join(f"<li>{c}</li>" for c in chain) + "</ol>"


def _params(run: dict[str, Any]) -> str:
    params = run.get("params") or {}
    if not params:
        return ""
    overridden = model_overrides(run)

    def shown(key: str, value: Any) -> str:
        text = _e(json.dumps(value) if not isinstance(value, str) else value)
        if key in overridden:  # the parameter's default, which model_args replaced: say what the model used
            text += f" <span class=\"muted\">(not used: model_args set {_e(key.split('.')[-1])}={_e(json.dumps(overridden[key]))})</span>"
        return text

    return "<h2>Parameters</h2>" + _kv_table([(k, shown(k, v)) for k, v in params.items()])
