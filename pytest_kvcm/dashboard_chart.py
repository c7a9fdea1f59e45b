"""The dashboard's history chart: an inline SVG of score per run, drawn server-side (no script, no network).

Every coordinate is finite for any finite score: the scale is computed from halves of the extremes, so scores
of -1e308 and 1e308 (whose difference overflows to inf and once drew ``nan`` coordinates) still place every
point inside the frame. Rows whose numbers are not finite never reach it (``dashboard_rows``).
"""

from __future__ import annotations

import html
import sys
import time
from collections import defaultdict
from typing import Any

from kvcm.versions import NAMES as _VERSIONS

PALETTE = ("#2563eb", "#ea580c", "#16a34a", "#9333ea")   # one colour a version, in the registry's order
COLORS = {**dict(zip(_VERSIONS, PALETTE)), None: "#6b7280"}


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


class _Scale:
    """Scores to a fraction of the chart's height: the range [lo, hi] padded by 15% each side, at least +-1."""

    def __init__(self, lo: float, hi: float):
        self.mid = lo / 2 + hi / 2
        half = hi / 2 - lo / 2  # half the range; never overflows
        self.half = min(max(half * 1.3, half + 1.0), sys.float_info.max)

    def fraction(self, v: float) -> float:
        return 0.5 + (v / 2 - self.mid / 2) / self.half

    def value(self, fraction: float) -> float:
        v = self.mid + self.half * (2 * fraction - 1)
        return max(-sys.float_info.max, min(sys.float_info.max, v))


def _axis(v: float) -> str:
    return f"{v:.1f}" if abs(v) < 1e6 else f"{v:.3g}"


def number_text(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{v:.0f}"
    return str(v)


def when_text(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) + " UTC" if t else "–"


def history_svg(points: list[dict], *, width: int = 560, height: int = 170) -> str:
    """Score per run for each manager version, with the threshold as a dashed step line."""
    pts = [p for p in points if p["value"] is not None]
    if not pts:
        return '<p class="muted">no values</p>'
    left, right, top, bottom = 44, 12, 10, 26
    values = [p["value"] for p in pts] + [p["threshold"] for p in pts if p["threshold"] is not None]
    scale = _Scale(min(values), max(values))
    times = [p["time"] for p in pts]
    t0, t1 = min(times), max(times)
    span = (t1 - t0) or 1.0

    def x(t: float) -> float:
        return left + (width - left - right) * ((t - t0) / span if t1 > t0 else 0.5)

    def y(v: float) -> float:
        return top + (height - top - bottom) * (1 - scale.fraction(v))

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'role="img" aria-label="score history">']
    for frac in (0.0, 0.5, 1.0):
        at = top + (height - top - bottom) * (1 - frac)
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{at:.1f}" y2="{at:.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{at + 4:.1f}" class="axis" text-anchor="end">'
                   f'{_axis(scale.value(frac))}</text>')
    thr = sorted((p["time"], p["threshold"]) for p in pts if p["threshold"] is not None)
    if thr:
        path = [f"M{x(thr[0][0]):.1f},{y(thr[0][1]):.1f}"]
        for (ta, va), (tb, vb) in zip(thr, thr[1:]):
            path += [f"L{x(tb):.1f},{y(va):.1f}", f"L{x(tb):.1f},{y(vb):.1f}"]
        if len(thr) == 1:
            path = [f"M{left},{y(thr[0][1]):.1f}", f"L{width - right},{y(thr[0][1]):.1f}"]
        out.append(f'<path d="{" ".join(path)}" class="threshold"><title>threshold</title></path>')
    series: dict[Any, list[dict]] = defaultdict(list)
    for p in pts:
        series[p["kvcm_version"]].append(p)
    for kvcm_version, ps in sorted(series.items(), key=lambda kv: str(kv[0])):
        color = COLORS.get(kvcm_version, COLORS[None])
        if len(ps) > 1:
            coords = " ".join(f"{x(p['time']):.1f},{y(p['value']):.1f}" for p in ps)
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        for p in ps:
            tip = (f"{kvcm_version or '?'} {p['value']:.3f} (threshold {number_text(p['threshold'])}, n={number_text(p['n'])}) "
                   f"{when_text(p['time'])} {p['git_commit'] or ''}")
            cls = "pt fail" if p["passed"] is False else "pt"
            out.append(f'<circle cx="{x(p["time"]):.1f}" cy="{y(p["value"]):.1f}" r="4" fill="{color}" '
                       f'class="{cls}"><title>{esc(tip)}</title></circle>')
    out.append(f'<text x="{left}" y="{height - 8}" class="axis">{esc(when_text(t0))}</text>')
    if t1 > t0:
        out.append(f'<text x="{width - right}" y="{height - 8}" class="axis" text-anchor="end">'
                   f'{esc(when_text(t1))}</text>')
    out.append("</svg>")
    return "".join(out)


