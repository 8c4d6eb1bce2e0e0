"""Small static SVG charts for the HTML report: axes, lines with bands, points, bars, heatmaps.

Each chart is a standalone ``<svg>`` document with ``width``/``height`` set, so an ``<img>``
holding it as a data URI has a natural size. Axis ranges are taken from the finite data drawn
(plus any reference lines), padded by 5%, so no finite value ever falls outside its axis;
callers count non-finite values and say so in the caption. Drawn by hand rather than with
matplotlib: a matplotlib figure costs ~90 ms and ~20 kB of PNG, which for hundreds of runs
exceeds the report's time and page-size budget; these cost well under a millisecond and a few kB.
"""
from __future__ import annotations

import base64
import math
from html import escape

import numpy as np

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
NAN_FILL = "#d9d9d9"
L, R, T, B = 70, 16, 14, 46                                   # plot margins (px)


def fmt(v: float) -> str:
    """Compact number: 3 significant digits, ``nan`` for non-finite."""
    v = float(v)
    return f"{v:.3g}" if math.isfinite(v) else "nan"


def data_uri(svg: str) -> str:
    """``data:image/svg+xml;base64,...`` for an ``<img src>``."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values inside [lo, hi] (steps 1, 2, 2.5, 5 × 10^k), at least the two ends' span."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = start
    while t <= hi + 1e-9 * step:
        ticks.append(0.0 if abs(t) < 1e-12 * step else t)
        t += step
    return ticks


def span(*arrays, include=(), pad: float = 0.05) -> tuple[float, float]:
    """(lo, hi) covering every finite value of ``arrays`` and ``include``, padded; (0, 1) if none."""
    vals = [np.asarray(a, float).ravel() for a in arrays] + [np.asarray(include, float).ravel()]
    v = np.concatenate(vals) if vals else np.array([])
    v = v[np.isfinite(v)]
    if not v.size:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    if hi == lo:
        d = abs(lo) * 0.1 or 0.5
        return lo - d, hi + d
    d = (hi - lo) * pad
    return lo - d, hi + d


class Chart:
    """One x–y chart: add marks with data coordinates, then ``render()`` to an SVG string."""

    def __init__(self, xlim, ylim, xlabel: str, ylabel: str, *, width: int = 560, height: int = 300,
                 xticks=None, yticks=None, right: int = R, left: int = L):
        self.right, self.left = right, left
        self.x0, self.x1 = map(float, xlim)
        self.y0, self.y1 = map(float, ylim)
        self.w, self.h = width, height
        self.xlabel, self.ylabel = xlabel, ylabel
        self.xticks = xticks if xticks is not None else [(t, fmt(t)) for t in nice_ticks(self.x0, self.x1)]
        self.yticks = yticks if yticks is not None else [(t, fmt(t)) for t in nice_ticks(self.y0, self.y1)]
        self.parts: list[str] = []
        self.keys: list[tuple[str, str]] = []

    def px(self, x) -> float:
        return self.left + (float(x) - self.x0) / ((self.x1 - self.x0) or 1.0) * (self.w - self.left - self.right)

    def py(self, y) -> float:
        return self.h - B - (float(y) - self.y0) / ((self.y1 - self.y0) or 1.0) * (self.h - T - B)

    def _path(self, xs, ys) -> list[str]:
        """Polyline segments through finite points (a NaN breaks the line, as in matplotlib)."""
        segs, cur = [], []
        for x, y in zip(xs, ys):
            if math.isfinite(float(x)) and math.isfinite(float(y)):
                cur.append(f"{self.px(x):.1f},{self.py(y):.1f}")
            elif cur:
                segs.append(cur)
                cur = []
        if cur:
            segs.append(cur)
        return [" ".join(s) for s in segs]

    def line(self, xs, ys, color: str, *, label: str | None = None, dash: str | None = None,
             width: float = 1.6, marker: bool = True) -> None:
        d = f' stroke-dasharray="{dash}"' if dash else ""
        for pts in self._path(xs, ys):
            self.parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="{width}"{d}/>')
        if marker:
            self.points(xs, ys, color, r=2.2)
        if label:
            self.keys.append((label, color))

    def band(self, xs, lo, hi, color: str, opacity: float = 0.18) -> None:
        xs, lo, hi = (np.asarray(a, float) for a in (xs, lo, hi))
        ok = np.isfinite(xs) & np.isfinite(lo) & np.isfinite(hi)
        xs, lo, hi = xs[ok], lo[ok], hi[ok]
        if xs.size < 2:
            return
        pts = [f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in zip(np.r_[xs, xs[::-1]], np.r_[hi, lo[::-1]])]
        self.parts.append(f'<polygon points="{" ".join(pts)}" fill="{color}" fill-opacity="{opacity}" stroke="none"/>')

    def points(self, xs, ys, color: str, *, r: float = 3.0, label: str | None = None, opacity: float = 1.0) -> None:
        for x, y in zip(xs, ys):
            if math.isfinite(float(x)) and math.isfinite(float(y)):
                self.parts.append(f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="{r}" fill="{color}" '
                                  f'fill-opacity="{opacity}"/>')
        if label:
            self.keys.append((label, color))

    def errorbars(self, xs, lo, hi, color: str, *, horizontal: bool = False) -> None:
        for x, a, b in zip(xs, lo, hi):
            if not all(math.isfinite(float(v)) for v in (x, a, b)):
                continue
            if horizontal:
                y = self.py(x)
                self.parts.append(f'<line x1="{self.px(a):.1f}" x2="{self.px(b):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                                  f'stroke="{color}" stroke-width="1.4"/>')
            else:
                X = self.px(x)
                self.parts.append(f'<line x1="{X:.1f}" x2="{X:.1f}" y1="{self.py(a):.1f}" y2="{self.py(b):.1f}" '
                                  f'stroke="{color}" stroke-width="1.4"/>')

    def hline(self, y: float, color: str = "#444", *, dash: str | None = "4 3", label: str | None = None) -> None:
        if math.isfinite(float(y)):
            self.line([self.x0, self.x1], [y, y], color, dash=dash, width=1.0, marker=False, label=label)

    def vline(self, x: float, color: str = "#444", *, dash: str | None = "4 3", label: str | None = None) -> None:
        if math.isfinite(float(x)):
            self.line([x, x], [self.y0, self.y1], color, dash=dash, width=1.0, marker=False, label=label)

    def rect(self, x0, x1, y0, y1, color: str, *, title: str | None = None, stroke: str = "none") -> None:
        X0, X1, Y0, Y1 = self.px(x0), self.px(x1), self.py(y0), self.py(y1)
        t = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f'<rect x="{min(X0, X1):.1f}" y="{min(Y0, Y1):.1f}" width="{abs(X1 - X0):.1f}" '
                          f'height="{abs(Y1 - Y0):.1f}" fill="{color}" stroke="{stroke}" stroke-width="0.5">{t}</rect>')

    def text(self, x, y, s: str, *, size: int = 10, anchor: str = "middle", color: str = "#222") -> None:
        self.parts.append(f'<text x="{self.px(x):.1f}" y="{self.py(y):.1f}" font-size="{size}" '
                          f'text-anchor="{anchor}" fill="{color}">{escape(s)}</text>')

    def render(self, extra: str = "") -> str:
        w, h = self.w, self.h
        axes = [f'<rect x="{self.left}" y="{T}" width="{w - self.left - self.right}" height="{h - T - B}" '
                f'fill="none" stroke="#888"/>']
        for t, lab in self.xticks:
            X = self.px(t)
            axes.append(f'<line x1="{X:.1f}" x2="{X:.1f}" y1="{h - B}" y2="{h - B + 4}" stroke="#888"/>'
                        f'<text x="{X:.1f}" y="{h - B + 15}" font-size="10" text-anchor="middle">{escape(lab)}</text>')
        for t, lab in self.yticks:
            Y = self.py(t)
            axes.append(f'<line x1="{self.left - 4}" x2="{self.left}" y1="{Y:.1f}" y2="{Y:.1f}" stroke="#888"/>'
                        f'<text x="{self.left - 6}" y="{Y + 3:.1f}" font-size="10" text-anchor="end">'
                        f'{escape(lab)}</text>')
        axes.append(f'<text x="{(self.left + w - self.right) / 2:.0f}" y="{h - 8}" font-size="11" '
                    f'text-anchor="middle">{escape(self.xlabel)}</text>')
        axes.append(f'<text transform="translate(13,{(T + h - B) / 2:.0f}) rotate(-90)" font-size="11" '
                    f'text-anchor="middle">{escape(self.ylabel)}</text>')
        keys, rows = [], (len(self.keys) + 2) // 3          # legend below the axes, three keys a row
        for i, (lab, col) in enumerate(self.keys):
            x, y = self.left + 190 * (i % 3), h + 4 + 14 * (i // 3)
            keys.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{col}"/>'
                        f'<text x="{x + 14}" y="{y + 9}" font-size="10">{escape(lab[:32])}</text>')
        h = h + 14 * rows + (4 if rows else 0)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
                f'font-family="sans-serif"><rect width="{w}" height="{h}" fill="#fff"/>'
                + "".join(self.parts) + "".join(axes) + "".join(keys) + extra + "</svg>")


def diverging(v: float, lim: float) -> str:
    """Blue (negative) – white (0) – red (positive) colour for ``v`` on a ±``lim`` scale; grey for NaN."""
    if not math.isfinite(v):
        return NAN_FILL
    t = max(-1.0, min(1.0, v / lim)) if lim > 0 else 0.0
    end = (178, 24, 43) if t > 0 else (33, 102, 172)
    a = abs(t)
    r, g, b = (round(255 + (c - 255) * a) for c in end)
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(m: np.ndarray, rows: list[str], cols: list[str], *, xlabel: str, ylabel: str) -> str:
    """Rows × cols cells on a diverging scale centred at 0 (limit = max |finite value|); grey = NaN.

    Each cell carries its value as a tooltip; a colour bar gives the scale.
    """
    m = np.asarray(m, float)
    fin = m[np.isfinite(m)]
    lim = float(np.abs(fin).max()) if fin.size else 0.0
    nr, nc = m.shape
    height = min(900, max(200, 16 * nr + T + B + 10))
    step = max(1, nr // 16)
    c = Chart((0, nc), (0, nr), xlabel, ylabel, width=min(620, 180 + 70 * nc), height=height, right=60,
              xticks=[(j + 0.5, cols[j]) for j in range(nc)],
              yticks=[(i + 0.5, rows[i]) for i in range(0, nr, step)])
    for i in range(nr):
        for j in range(nc):
            c.rect(j, j + 1, i, i + 1, diverging(m[i, j], lim), title=f"{rows[i]} {cols[j]}: {fmt(m[i, j])}",
                   stroke="#fff")
    x = c.w - c.right + 10
    bar = [f'<rect x="{x}" y="{T + k * 8}" width="10" height="8" fill="{diverging(lim * (1 - k / 10), lim)}"/>'
           for k in range(21)]
    bar.append(f'<text x="{x + 13}" y="{T + 8}" font-size="9">{fmt(lim)}</text>'
               f'<text x="{x + 13}" y="{T + 88}" font-size="9">0</text>'
               f'<text x="{x + 13}" y="{T + 168}" font-size="9">{fmt(-lim)}</text>')
    return c.render("".join(bar))
