"""The run report's plots: matplotlib figures drawn as inline SVG (text kept as text, ids made unique per plot).

Holds the plots (the attempts' timeline, the per-epoch history, the confusion matrix, per-class precision and
recall), their placement from the texts' sizes (:func:`_fit`, no layout engine), the SVG clean-up, and the memo of
drawn plots by their inputs (:func:`_memo`, :data:`_CHARTS`) that
:func:`heteroflow.pipelines.runs.prerendering.prerender` fills while a run goes on. matplotlib is imported late
(inside the functions), never when this module is imported: :func:`_import_plotting` imports it on purpose.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import sys
import threading
from typing import Any

from heteroflow.pipelines.runs.folders import retries
from heteroflow.pipelines.runs.markup import _e

_CHARTS: dict[str, Any] = {}
"""Rendered plots by their inputs (:func:`_memo`): what :func:`heteroflow.pipelines.runs.prerendering.prerender`
drew while the run went on."""
_CHARTS_LOCK = threading.Lock()


def _import_plotting() -> None:
    with contextlib.suppress(Exception):  # a problem shows when the report is rendered, as a warning
        import matplotlib.backends.backend_svg  # noqa: F401
        import matplotlib.figure  # noqa: F401


def _plotting_imported() -> bool:
    return "matplotlib.figure" in sys.modules and "matplotlib.backends.backend_svg" in sys.modules


_DRAWING: dict[str, threading.Event] = {}
"""Plots being drawn now, by their :data:`_CHARTS` key: set when the drawing ends."""


def _memo(func: Any) -> Any:
    """Keep ``func``'s result by its (JSON) arguments in :data:`_CHARTS`, for
    :func:`heteroflow.pipelines.runs.prerendering.prerender`. A call whose plot another thread is drawing waits for
    that drawing instead of drawing it a second time beside it (kfp.local's check task renders the report while the
    prerendering thread may still draw evaluate's plots); where that drawing failed, it draws the plot itself."""

    @functools.wraps(func)
    def wrapper(*args: Any) -> Any:
        key = func.__name__ + json.dumps(args, sort_keys=True, default=str)
        with _CHARTS_LOCK:
            hit = _CHARTS.get(key)
            drawing = _DRAWING.get(key) if hit is None else None
            if hit is None and drawing is None:
                done = _DRAWING[key] = threading.Event()
        if hit is not None:
            return hit
        if drawing is not None:
            drawing.wait()
            with _CHARTS_LOCK:
                hit = _CHARTS.get(key)
            return hit if hit is not None else func(*args)
        try:
            out = func(*args)
            with _CHARTS_LOCK:
                _CHARTS[key] = out
            return out
        finally:
            with _CHARTS_LOCK:
                _DRAWING.pop(key, None)
            done.set()

    return wrapper


_FONT_SIZE = 9.0
"""Points: tick labels and axis labels; titles are matplotlib's ``large`` (1.2x)."""
_TICK_SPACE = 7.0
"""Points between an axis and its tick labels: matplotlib's default tick length (3.5) plus its pad (3.5)."""
_LABEL_PAD = 4.0
"""Points between tick labels and the axis label (matplotlib's ``axes.labelpad``)."""
_TITLE_PAD = 6.0
"""Points between the axes and the title (matplotlib's ``axes.titlepad``)."""
_EDGE = 5.0
"""Points of white space kept at each edge of a figure."""


@contextlib.contextmanager
def _style(label: str) -> Any:
    """matplotlib's settings for the report's plot ``label``, while it is built and saved (a text's size is fixed
    when the text is made): text kept as text in the SVG, and ids salted with the label, so a report's SVG is the
    same for the same run."""
    import matplotlib

    with matplotlib.rc_context({"font.size": _FONT_SIZE, "svg.fonttype": "none", "svg.hashsalt": label}):
        yield


def _figure(width: float, height: float) -> Any:
    """A figure of ``width`` x ``height`` inches, with no layout engine: :func:`_fit` places its axes."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=96)


def _text_extent(texts: Any, size: float, rotation: float = 0.0) -> tuple[float, float]:
    """The widest and the tallest of ``texts`` at ``size`` points, rotated by ``rotation`` degrees, in points
    (``(0, 0)`` for none), measured with the text metrics matplotlib's SVG backend itself uses
    (:class:`matplotlib.textpath.TextToPath`; ``$...$`` as mathtext, as matplotlib draws it), without drawing."""
    import math

    from matplotlib import cbook
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    prop = FontProperties(size=size)
    cos, sin = abs(math.cos(math.radians(rotation))), abs(math.sin(math.radians(rotation)))
    widest = tallest = 0.0
    for text in texts:
        if not text:
            continue
        text = str(text)
        w, h, _ = text_to_path.get_text_width_height_descent(text, prop, ismath=cbook.is_math_text(text))
        widest, tallest = max(widest, w * cos + h * sin), max(tallest, w * sin + h * cos)
    return widest, tallest


def _tick_labels(axis: Any) -> list[str]:
    """The major tick labels ``axis`` draws at its present size, from its locator and formatter (no ticks are
    made)."""
    lo, hi = sorted(axis.get_view_interval())
    slack = 1e-9 * (hi - lo)
    values = list(axis.get_major_locator()())
    labels = axis.get_major_formatter().format_ticks(values)  # all of them, as matplotlib formats them
    return [str(label) for value, label in zip(values, labels) if lo - slack <= value <= hi + slack]


def _rotated_xticks(ax: Any, labels: list[str]) -> float:
    """Set ``labels`` as ``ax``'s x ticks at 0, 1, ...: turned 45 degrees and ending at their tick (matplotlib's
    ``ha="right", rotation_mode="anchor"``) when one is longer than 2 characters, else level; returns the rotation."""
    rotation = 45.0 if max(map(len, labels), default=0) > 2 else 0.0
    if rotation:
        ax.set_xticks(range(len(labels)), labels=labels, rotation=rotation, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticks(range(len(labels)), labels=labels)
    return rotation


def _fit(fig: Any, ax: Any, *, x_rotation: float = 0.0, colorbar: Any = None) -> None:
    """Place ``ax`` (and its ``colorbar``) in ``fig`` with room for the tick labels, axis labels and title.

    What matplotlib's constrained layout finds by drawing the figure twice (about 60% of a plot's time), computed
    from the texts themselves: their sizes (:func:`_text_extent`) plus matplotlib's default tick length, pads and
    title offset. An axis's tick locator picks its ticks for the axes' size, so the labels are measured again once
    the axes is placed, until they no longer change (at most 3 passes). Long texts (step or class names) make the
    figure larger: the axes keep at least half the planned width and height, and the title's width.

    Args:
        fig: the figure (:func:`_figure`); ``ax``: its only axes, fully drawn on (limits and ticks set).
        x_rotation: the x tick labels' rotation, degrees (:func:`_rotated_xticks`: they end at their tick).
        colorbar: a colorbar beside ``ax`` (``fig.colorbar(..., ax=ax)``: placed by ``ax``'s grid, so it moves
            with it); its tick labels are kept in the figure.
    """
    size = _FONT_SIZE
    _, line = _text_extent(["Ag"], size)
    title_w, title = _text_extent([ax.get_title()], size * 1.2) if ax.get_title() else (0.0, 0.0)
    planned_w, planned_h = (v * 72 for v in fig.get_size_inches())
    seen: Any = None
    for _ in range(3):
        labels = (_tick_labels(ax.yaxis), _tick_labels(ax.xaxis), _tick_labels(colorbar.ax.yaxis) if colorbar else [])
        if labels == seen:
            break
        seen = labels
        ytick_w, _ = _text_extent(labels[0], size)
        xtick_w, xtick_h = _text_extent(labels[1], size, x_rotation)
        scale_w = _text_extent(labels[2], size)[0] + _TICK_SPACE if colorbar else 0.0
        left = _EDGE + ytick_w + _TICK_SPACE + (line + _LABEL_PAD if ax.get_ylabel() else 0.0)
        if x_rotation:  # the first label reaches left of its tick by its whole turned width
            left = max(left, _EDGE + _text_extent(labels[1][:1], size, x_rotation)[0])
        bottom = _EDGE + xtick_h + _TICK_SPACE + (line + _LABEL_PAD if ax.get_xlabel() else 0.0)
        top = _EDGE + (title + _TITLE_PAD if title else 0.0)
        # level x labels are centred on their tick: the last one reaches right of the axes by half its width
        right = _EDGE + max(scale_w, 0.0 if x_rotation else xtick_w / 2)
        # long texts make the figure larger rather than the axes smaller than half the planned size (or than the
        # title, which is centred over the axes): a report has room, and nothing is clipped
        width = max(planned_w, left + right + max(planned_w / 2, title_w))
        height = max(planned_h, bottom + top + planned_h / 2)
        fig.set_size_inches(width / 72, height / 72)
        fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)


def _svg(fig: Any, label: str) -> str:
    """``fig`` as an inline SVG element of the report; called inside ``_style(label)``."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF/Dublin Core boilerplate with URLs
    # ids are unique per document: prefix the ones matplotlib made with the plot's label
    prefix = re.sub(r"[^a-z0-9]", "", label.lower()) + "-"
    text = re.sub(r'id="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", text)
    text = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{prefix}{m.group(1)}"', text)
    return f'<div class="plot" data-plot="{_e(label)}" role="img" aria-label="{_e(label)}">{text}</div>'


def _timeline_plot(run: dict[str, Any]) -> str:
    """The attempts' timeline: one bar per attempt (by status), a hatched bar for each wait before a retry.

    Drawn from the bars alone (:func:`_timeline_svg`, kept by them in the memo): a kfp.local run's check task
    draws it for its HTML artifact, and the report written when the run ends reuses that drawing when the attempts
    are the same."""
    from heteroflow.components.core.telemetry import iteration_key

    recs = [(name, r) for name, rs in (run.get("attempts") or {}).items() for r in rs if isinstance(r.get("started_at"), (int, float))]
    if not recs:
        return ""
    t0 = min(r["started_at"] for _, r in recs)
    order = [s.get("name") for s in run.get("steps") or []]
    names = [n for n in order if any(n == name for name, _ in recs)] + sorted({n for n, _ in recs} - set(order))
    bars = []
    for y, name in enumerate(names):
        for _, r in (x for x in recs if x[0] == name):
            start = r["started_at"] - t0
            end = (r.get("ended_at") or r["started_at"] + (r.get("seconds") or 0.0)) - t0
            bars.append([y, start, max(end - start, 0.01), r.get("status")])
    waited = [r for r in retries(run) if r["wait_seconds"]]
    waits = []
    for r in waited:
        nxt = next((x for n, x in recs if n == r["step"] and x.get("attempt") == r["attempt"] and iteration_key(x) == r.get("iteration")), None)
        if nxt is not None:
            waits.append([names.index(r["step"]), r["wait_seconds"], nxt["started_at"] - t0 - r["wait_seconds"]])
    return _timeline_svg(names, bars, waits, bool(waited))


@_memo
def _timeline_svg(names: list[str], bars: list[list[Any]], waits: list[list[Any]], waited: bool) -> str:
    """The timeline plot of :func:`_timeline_plot`'s bars: ``[row, start, width, status]`` per attempt and
    ``[row, width, start]`` per wait before a retry (seconds since the first attempt started); ``waited``: some
    retry waited."""
    with _style("timeline"):
        fig = _figure(7.5, 0.45 * len(names) + 1.0)
        ax = fig.add_subplot()
        colours = {"succeeded": "#2da44e", "failed": "#cf222e", "running": "#0969da", "interrupted": "#bf8700"}
        for y, start, width, status in bars:
            ax.barh(y, width, left=start, color=colours.get(status, "#8c959f"), edgecolor="black", linewidth=0.4)
        for y, width, start in waits:
            ax.barh(y, width, left=start, color="none", hatch="//", edgecolor="#9a6700", linewidth=0.4)
        ax.set_yticks(range(len(names)), labels=names)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the first attempt started" + (" (hatched: waiting to retry)" if waited else ""))
        ax.set_title("attempts over time (green succeeded, red failed)")
        _fit(fig, ax)
        return _svg(fig, "timeline")


def _resume_at(xs: list[Any], history: list[dict[str, Any]], resumed: Any, steps: Any) -> float | None:
    """Where on the epoch axis a training resumed from optimizer step ``resumed`` (after a fallback or a restart),
    or None for a fresh start: between the epochs whose ``step`` values surround it, else ``resumed / steps`` of
    the epochs shown."""
    if not isinstance(resumed, (int, float)) or isinstance(resumed, bool) or resumed <= 0 or not xs:
        return None
    numeric = [(x, e.get("step")) for x, e in zip(xs, history) if isinstance(x, (int, float))]
    known = [(float(x), float(s)) for x, s in numeric if isinstance(s, (int, float)) and not isinstance(s, bool)]
    before = [(x, s) for x, s in known if s <= resumed]
    after = [(x, s) for x, s in known if s > resumed]
    if after:
        x0, s0 = before[-1] if before else (float(numeric[0][0]) - 1.0, 0.0)
        x1, s1 = after[0]
        return x0 + (x1 - x0) * (resumed - s0) / (s1 - s0) if s1 > s0 else x1
    if isinstance(steps, (int, float)) and steps > 0 and numeric:
        return float(numeric[-1][0]) * float(resumed) / float(steps)
    return None


@_memo
def _history_plots(call: str, history: list[dict[str, Any]], resumed_from_step: Any = 0, steps: Any = 0) -> list[str]:
    """The loss and metric curves of one call's per-epoch history; a training that resumed (``resumed_from_step``
    of ``steps``) has a dashed line where it did, labelled ``resumed from step N``."""
    keys: list[str] = []
    for entry in history:
        for k, v in entry.items():
            if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool) and k not in keys:
                keys.append(k)
    if not keys:
        return []
    xs = [e.get("epoch", i + 1) for i, e in enumerate(history)]
    mark = _resume_at(xs, history, resumed_from_step, steps)
    resumed = (float(mark), int(resumed_from_step)) if mark is not None else None
    losses = [k for k in keys if "loss" in k]
    scores = [k for k in keys if k in ("accuracy", "validation_accuracy", "train_accuracy", "f1", "precision", "recall") or k.endswith("accuracy")]
    groups = [("loss", losses), ("metrics", scores)]
    out = []
    for title, group in groups:
        if not group:
            continue
        with _style(f"{call} {title}"):
            out.append(_history_plot(call, title, group, xs, history, resumed))
    return out


def _history_plot(call: str, title: str, group: list[str], xs: list[Any], history: list[dict[str, Any]],
                  resumed: tuple[float, int] | None = None) -> str:
    fig = _figure(5.0, 3.0)
    ax = fig.add_subplot()
    for k in group:
        pts = [(x, e[k]) for x, e in zip(xs, history) if isinstance(e.get(k), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=k)
    if resumed is not None:
        ax.axvline(resumed[0], color="#6e7781", linestyle="--", linewidth=1.0, label=f"resumed from step {resumed[1]}")
    ax.set_xlabel("epoch")
    ax.set_ylabel(title)
    ax.set_title(f"{call}: {title} per epoch")
    ax.grid(alpha=0.3)
    ax.legend()
    _fit(fig, ax)
    return _svg(fig, f"{call} {title}")


@_memo
def _confusion_plot(call: str, cm: list[list[Any]], classes: list[str]) -> str:
    with _style(f"{call} confusion"):
        fig = _figure(4.2, 3.6)
        ax = fig.add_subplot()
        image = ax.imshow(cm, cmap="Blues")
        rotation = _rotated_xticks(ax, classes)
        ax.set_yticks(range(len(classes)), labels=classes)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title(f"{call}: confusion matrix")
        bar = fig.colorbar(image, ax=ax)  # placed beside ax by its grid: _fit moves both
        _fit(fig, ax, x_rotation=rotation, colorbar=bar)
        return '<div class="plots">' + _svg(fig, f"{call} confusion") + "</div>"


@_memo
def _per_class_plot(call: str, prec: dict[str, Any], rec: dict[str, Any]) -> str:
    classes = list(prec)
    with _style(f"{call} per class"):
        fig = _figure(max(4.0, 0.45 * len(classes) + 1.5), 3.0)
        ax = fig.add_subplot()
        xs = range(len(classes))
        ax.bar([x - 0.2 for x in xs], [prec.get(c) or 0 for c in classes], width=0.4, label="precision")
        ax.bar([x + 0.2 for x in xs], [rec.get(c) or 0 for c in classes], width=0.4, label="recall")
        rotation = _rotated_xticks(ax, classes)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{call}: precision and recall per class")
        ax.legend(loc="lower right")
        _fit(fig, ax, x_rotation=rotation)
        return '<div class="plots">' + _svg(fig, f"{call} per class") + "</div>"
