"""The report's section on mixed training jobs (issue #29): per replica its kind, share of the global batch,
measured throughput and busy fraction; the shares as they were rebalanced; the kinds that dropped out, at which
step, and from which step the others resumed. Empty for a run without a mixed job."""

from __future__ import annotations

from typing import Any

from heteroflow.components.training.mixed_step import drop_point, exchange_text, replica_rows
from heteroflow.pipelines.runs.markup import _e

__all__ = ["mixed_section"]


def mixed_section(run: dict[str, Any]) -> str:
    """The HTML fragment (``<h2>Mixed device kinds</h2>...``), or ``""``."""
    out = []
    for call, facts in (run.get("results") or {}).items():
        mixed = facts.get("mixed") if isinstance(facts, dict) else None
        if not isinstance(mixed, dict):
            continue
        rows = []
        for row in replica_rows(mixed):
            share = row["share"] if row["share"] is not None else ""
            t = f"{row['samples_per_second']:.0f}" if row["samples_per_second"] else "-"
            b = f"{row['busy_fraction'] * 100:.0f}%" if row["busy_fraction"] is not None else "-"
            rows.append(f"<tr><td>{row['rank']}</td><td>{_e(row['kind'])}</td><td>{_e(share)}</td><td>{_e(t)}</td><td>{_e(b)}</td></tr>")
        table = ("<table class=mixed><tr><th>replica</th><th>kind</th><th>share (samples of the global batch)</th>"
                 "<th>samples/s (per busy second)</th><th>busy</th></tr>" + "".join(rows) + "</table>")
        history = mixed.get("shares_history") or []
        changes = "".join(f"<li>step {_e(h.get('step'))}: shares {_e(h.get('shares'))} ({_e(h.get('why'))})</li>" for h in history)
        dropped = "".join(
            f"<li class=dropped>kind <b>{_e(d.get('kind'))}</b> dropped out"
            + _e(drop_point(d.get("step")))
            + (f", its Volcano task <b>{_e(d['task'])}</b> failed" + (f" (pod {_e(d['pod'])})" if d.get("pod") else "") if d.get("task") else "")
            + " "
            f"({_e(d.get('reason'))}); the others resumed from step {_e(d.get('resumed_from_step'))}</li>"
            for d in mixed.get("dropped") or []
        )
        exchange = exchange_text(mixed)
        extra = f"<p>cross-kind exchange: {_e(exchange)}</p>" if exchange else ""
        out.append(f"<h3>{_e(call)}</h3>{table}{extra}" + (f"<ul>{changes}</ul>" if changes else "")
                   + (f"<ul>{dropped}</ul>" if dropped else ""))
    return "<h2>Mixed device kinds</h2>" + "".join(out) if out else ""
