"""Small SVG charts for the run report (:mod:`heteroflow.pipelines.report`): axes with "nice" ticks, bars, lines
with markers, a heat map with its colour bar, and a legend, written as SVG text directly.

Why not matplotlib: the report is written at the end of every run, and importing matplotlib and laying out its
figures took about 1 s of each ``heteroflow run`` (0.5 s warm) for four small plots; these take milliseconds. Text
stays text (a browser's find works), nothing is fetched, and every id is prefixed with the plot's own prefix.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["Axes", "BLUES", "COLOURS", "blues", "nice_ticks", "tick_labels"]

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""Series colours (matplotlib's default cycle, as the report's plots had)."""

BLUES = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")
"""The ColorBrewer Blues ramp (matplotlib's ``Blues``), light to dark."""

FONT = 12.0  # px: 9 pt at 96 dpi
_FAMILY = "DejaVu Sans, Verdana, Arial, sans-serif"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _n(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def text_width(text: str, size: float = FONT) -> float:
    """An estimate of ``text``'s width in px (for margins; a browser measures the real one)."""
    return 0.6 * size * len(text)


def blues(share: float) -> str:
    """The Blues colour at ``share`` (0 light .. 1 dark), interpolated between the ramp's colours."""
    share = min(max(share, 0.0), 1.0) * (len(BLUES) - 1)
    i = min(int(share), len(BLUES) - 2)
    f = share - i
    a, b = BLUES[i], BLUES[i + 1]
    rgb = (round(int(a[k : k + 2], 16) * (1 - f) + int(b[k : k + 2], 16) * f) for k in (1, 3, 5))
    return "#" + "".join(f"{v:02x}" for v in rgb)


def nice_ticks(lo: float, hi: float, count: int = 5, *, cover: bool = True) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2, 2.5 or 5 times a power of ten): from at or below ``lo``
    to at or above ``hi`` with ``cover`` (an axis's limits), else only those within [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        lo, hi = lo - 0.5, lo + 0.5
    raw = (hi - lo) / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw * 0.75)
    eps = step * 1e-9
    first = (math.floor if cover else math.ceil)(lo / step + (eps if cover else -eps)) * step
    last = (math.ceil(hi / step - eps) if cover else math.floor(hi / step + eps)) * step
    n = int(round((last - first) / step))
    return [0.0 if abs(first + k * step) < eps else first + k * step for k in range(n + 1)]


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Tick values as text with as many decimals as their spacing needs (``0.25``, ``1``, ``2.5``)."""
    if len(ticks) < 2:
        return [f"{t:g}" for t in ticks]
    step = abs(ticks[1] - ticks[0]) or 1.0
    decimals = 0
    while decimals < 6 and abs(round(step, decimals) - step) > step * 1e-6:
        decimals += 1
    return [f"{t:.{decimals}f}" for t in ticks]


class Axes:
    """One plot: a frame mapping data coordinates [x0, x1] x [y0, y1] into a ``width`` x ``height`` px SVG."""

    def __init__(
        self,
        width: float,
        height: float,
        *,
        xlim: tuple[float, float],
        ylim: tuple[float, float],
        left: float = 56.0,
        right: float = 14.0,
        top: float = 30.0,
        bottom: float = 42.0,
        invert_y: bool = False,
    ) -> None:
        self.width, self.height = width, height
        self.left, self.right, self.top, self.bottom = left, right, top, bottom
        self.xlim, self.ylim = xlim, ylim
        self.invert_y = invert_y
        self.body: list[str] = []  # drawn inside the frame
        self.over: list[str] = []  # frame, ticks, labels, legend
        self.defs: list[str] = []
        self.points: list[tuple[float, float]] = []  # px positions of the data drawn, for the legend's place

    # coordinates
    @property
    def plot_width(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> float:
        return self.height - self.top - self.bottom

    def sx(self, x: float) -> float:
        x0, x1 = self.xlim
        return self.left + (x - x0) / ((x1 - x0) or 1.0) * self.plot_width

    def sy(self, y: float) -> float:
        y0, y1 = self.ylim
        share = (y - y0) / ((y1 - y0) or 1.0)
        return self.top + (share if self.invert_y else 1.0 - share) * self.plot_height

    # drawing
    def rect(self, x0: float, x1: float, y0: float, y1: float, *, fill: str, stroke: str = "none", width: float = 0.0) -> None:
        """A rectangle between data coordinates (bars, cells)."""
        ax0, ax1 = sorted((self.sx(x0), self.sx(x1)))
        ay0, ay1 = sorted((self.sy(y0), self.sy(y1)))
        line = f' stroke="{stroke}" stroke-width="{_n(width)}"' if stroke != "none" else ""
        self.body.append(
            f'<rect x="{_n(ax0)}" y="{_n(ay0)}" width="{_n(max(ax1 - ax0, 0.5))}" height="{_n(max(ay1 - ay0, 0.5))}" fill="{fill}"{line}/>'
        )

    def line(self, xs: Sequence[float], ys: Sequence[float], *, colour: str, markers: bool = True) -> None:
        """A polyline through the points, with a dot on each."""
        pts = " ".join(f"{_n(self.sx(x))},{_n(self.sy(y))}" for x, y in zip(xs, ys))
        self.points.extend((self.sx(x), self.sy(y)) for x, y in zip(xs, ys))
        self.body.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5" stroke-linejoin="round"/>')
        if markers:
            self.body.extend(f'<circle cx="{_n(self.sx(x))}" cy="{_n(self.sy(y))}" r="2.6" fill="{colour}"/>' for x, y in zip(xs, ys))

    def hatch(self, prefix: str, colour: str) -> str:
        """A diagonal hatch fill (``url(#...)``), defined once per plot."""
        pid = f"{prefix}hatch"
        if not any(pid in d for d in self.defs):
            self.defs.append(
                f'<pattern id="{pid}" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)">'
                f'<line x1="0" y1="0" x2="0" y2="6" stroke="{colour}" stroke-width="1"/></pattern>'
            )
        return f"url(#{pid})"

    def text(self, x: float, y: float, text: str, *, anchor: str = "middle", size: float = FONT, rotate: float = 0.0, bold: bool = False) -> None:
        """Text at px coordinates (``y`` is its baseline)."""
        turn = f' transform="rotate({_n(rotate)} {_n(x)} {_n(y)})"' if rotate else ""
        weight = ' font-weight="bold"' if bold else ""
        self.over.append(f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="{anchor}" font-size="{_n(size)}"{weight}{turn}>{_e(text)}</text>')

    def xticks(self, values: Sequence[float], labels: Sequence[str] | None = None, *, rotate: bool = False, grid: bool = False) -> None:
        labels = list(labels) if labels is not None else tick_labels(values)
        base = self.top + self.plot_height
        for v, label in zip(values, labels):
            x = self.sx(v)
            if grid:
                self.body.append(f'<line x1="{_n(x)}" y1="{_n(self.top)}" x2="{_n(x)}" y2="{_n(base)}" stroke="#b0b0b0" stroke-opacity="0.3"/>')
            self.over.append(f'<line x1="{_n(x)}" y1="{_n(base)}" x2="{_n(x)}" y2="{_n(base + 4)}" stroke="#000"/>')
            if rotate:
                self.text(x + 3, base + 15, label, anchor="end", rotate=-45)
            else:
                self.text(x, base + 16, label)

    def yticks(self, values: Sequence[float], labels: Sequence[str] | None = None, *, grid: bool = False) -> None:
        labels = list(labels) if labels is not None else tick_labels(values)
        for v, label in zip(values, labels):
            y = self.sy(v)
            if grid:
                self.body.append(f'<line x1="{_n(self.left)}" y1="{_n(y)}" x2="{_n(self.left + self.plot_width)}" y2="{_n(y)}" stroke="#b0b0b0" stroke-opacity="0.3"/>')
            self.over.append(f'<line x1="{_n(self.left - 4)}" y1="{_n(y)}" x2="{_n(self.left)}" y2="{_n(y)}" stroke="#000"/>')
            self.text(self.left - 7, y + 4, label, anchor="end")

    def labels(self, *, title: str = "", xlabel: str = "", ylabel: str = "", xlabel_offset: float = 32.0) -> None:
        if title:
            self.text(self.left + self.plot_width / 2, self.top - 10, title, size=FONT * 1.2)
        if xlabel:
            self.text(self.left + self.plot_width / 2, self.top + self.plot_height + xlabel_offset, xlabel)
        if ylabel:
            x, y = 14.0, self.top + self.plot_height / 2
            self.text(x, y, ylabel, rotate=-90)

    def legend(self, items: Sequence[tuple[str, str]], *, loc: str = "best", kind: str = "line") -> None:
        """A boxed legend of (label, colour) in a corner of the frame: ``upper right``, ``lower right``, or
        ``best`` (of the four corners, the first that covers the fewest of the points drawn, as matplotlib's)."""
        if not items:
            return
        w = max(text_width(label) for label, _ in items) + 40
        h = 18 * len(items) + 6
        corners = {
            "upper right": (self.left + self.plot_width - w - 6, self.top + 6),
            "lower right": (self.left + self.plot_width - w - 6, self.top + self.plot_height - h - 6),
            "upper left": (self.left + 6, self.top + 6),
            "lower left": (self.left + 6, self.top + self.plot_height - h - 6),
        }
        if loc == "best":
            def covered(corner: tuple[float, float]) -> int:
                cx, cy = corner
                return sum(cx - 4 <= px <= cx + w + 4 and cy - 4 <= py <= cy + h + 4 for px, py in self.points)

            loc = min(corners, key=lambda name: covered(corners[name]))  # ties: the first, upper right
        x, y = corners[loc]
        self.over.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" fill="#fff" fill-opacity="0.8" stroke="#ccc" rx="3"/>')
        for i, (label, colour) in enumerate(items):
            cy = y + 12 + 18 * i
            if kind == "line":
                self.over.append(f'<line x1="{_n(x + 6)}" y1="{_n(cy)}" x2="{_n(x + 26)}" y2="{_n(cy)}" stroke="{colour}" stroke-width="1.5"/>')
                self.over.append(f'<circle cx="{_n(x + 16)}" cy="{_n(cy)}" r="2.6" fill="{colour}"/>')
            else:
                self.over.append(f'<rect x="{_n(x + 6)}" y="{_n(cy - 5)}" width="20" height="10" fill="{colour}"/>')
            self.over.append(f'<text x="{_n(x + 32)}" y="{_n(cy + 4)}" font-size="{_n(FONT)}">{_e(label)}</text>')

    def svg(self, extra: Sequence[str] = ()) -> str:
        """The whole plot as one ``<svg>`` element (``extra``: more elements drawn on top, in px coordinates)."""
        frame = f'<rect x="{_n(self.left)}" y="{_n(self.top)}" width="{_n(self.plot_width)}" height="{_n(self.plot_height)}" fill="none" stroke="#000" stroke-width="0.8"/>'
        defs = f"<defs>{''.join(self.defs)}</defs>" if self.defs else ""
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(self.width)}" height="{_n(self.height)}" '
            f'viewBox="0 0 {_n(self.width)} {_n(self.height)}" font-family="{_FAMILY}">'
            f'{defs}<rect width="100%" height="100%" fill="#fff"/>'
            + "".join(self.body)
            + frame
            + "".join(self.over)
            + "".join(extra)
            + "</svg>"
        )
