"""The HTML building blocks of the run report (:mod:`heteroflow.pipelines.runs.report`): its style sheet, the
status colours, escaping, status badges, number and duration formats, short error texts and key-value tables."""

from __future__ import annotations

import html
from typing import Any

_STATUS_COLOURS = {
    "succeeded": "#1a7f37",
    "failed": "#cf222e",
    "killed": "#cf222e",
    "interrupted": "#9a6700",
    "running": "#0969da",
    "not run": "#6e7781",
}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1f2328;max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0} th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600}
.graph{display:flex;flex-wrap:wrap;align-items:stretch;gap:0;margin:8px 0}
.node{border:2px solid;border-radius:8px;padding:6px 10px;min-width:120px;font-size:12px;background:#fff}
.node b{font-size:14px} .arrow{align-self:center;font-size:20px;color:#6e7781;padding:0 6px}
.muted{color:#6e7781} .error{color:#cf222e;white-space:pre-wrap;word-break:break-word}
.plots{display:flex;flex-wrap:wrap;gap:16px} .plot{border:1px solid #d0d7de;border-radius:6px;padding:4px}
.plot svg{display:block;max-width:100%;height:auto} code{font-size:12px}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _badge(status: Any) -> str:
    colour = _STATUS_COLOURS.get(str(status), "#6e7781")
    return f'<span class="badge" style="background:{colour}">{_e(status)}</span>'


def _seconds(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def _num(value: Any) -> str:
    """Numbers with 4 significant digits (losses keep theirs), others as text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _e(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}"


def _short_error(error: Any) -> str:
    text = str(error or "")
    kind, sep, message = text.partition(": ")
    return message if sep and kind.startswith("heteroflow.") else text


def _kv_table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"
