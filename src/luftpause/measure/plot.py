"""Plain SVG plots, written as text: panels of marks (x, y, optional 95 % whiskers) in
named kinds, each kind a colour and a marker, some kinds joined by a line, a legend below.
The benchmarks' frontier plots (tools/bench) and the simulator's sweeps (``luftpause sim
--plot``) draw through it. Pure: the same panels give the same bytes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Style:
    """How a kind of mark looks: its colour, its marker (circle, square, triangle,
    diamond), filled or hollow."""

    colour: str
    marker: str = "circle"
    filled: bool = True


UNSTYLED = Style("#000000", "circle", False)


@dataclass(frozen=True, slots=True)
class Mark:
    """One point: ``xh``/``yh`` the half-widths of its whiskers (None: none); ``label``
    written beside it (empty: none, the legend names its kind)."""

    x: float
    y: float
    kind: str
    xh: float | None = None
    yh: float | None = None
    label: str = ""


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    marks: Sequence[Mark]
    x_label: str
    y_label: str


def esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice_axis(values: list[float], ticks: int = 5) -> tuple[float, float, list[float]]:
    """An axis that holds ``values``: its ends and about ``ticks`` round tick values
    (steps of 1, 2, 2.5 or 5 × a power of ten)."""
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - max(1.0, abs(lo) * 0.1), hi + max(1.0, abs(hi) * 0.1)
    raw = (hi - lo) / ticks
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-9))
    start, end = math.floor(lo / step) * step, math.ceil(hi / step) * step
    count = round((end - start) / step)
    return start, end, [round(start + i * step, 10) for i in range(count + 1)]


def marker(style: Style, x: float, y: float, r: float = 5.0) -> str:
    paint = (
        f'fill="{style.colour if style.filled else "white"}" stroke="{style.colour}" '
        'stroke-width="1.5"'
    )
    corners = {
        "square": ((-1, -1), (1, -1), (1, 1), (-1, 1)),
        "triangle": ((0, -1.2), (1, 0.8), (-1, 0.8)),
        "diamond": ((0, -1.2), (1, 0), (0, 1.2), (-1, 0)),
    }.get(style.marker)
    if corners is None:
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {paint}/>'
    pts = " ".join(f"{x + dx * r:.1f},{y + dy * r:.1f}" for dx, dy in corners)
    return f'<polygon points="{pts}" {paint}/>'


def svg(
    panels: Sequence[Panel],
    title: str,
    styles: Mapping[str, Style],
    legend: Mapping[str, str],
    subtitle: str = "",
    joined: Sequence[str] = (),
    legend_slots: int | None = None,
) -> str:
    """One or two columns of panels. Axes hold every mark and whisker, and stop at 0
    (what is plotted is never negative); the marks of each kind in ``joined`` are joined
    by a line in the order given; ``legend`` (kind -> text) in two columns below, room
    kept for ``legend_slots`` entries (default: the legend's)."""
    pw, ph, ml, mr, mt, mb = 640, 420, 64, 24, 44, 52
    cols = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / cols)
    slots = len(legend) if legend_slots is None else legend_slots
    legend_h = 22 * math.ceil(slots / 2) + 16
    top = 60 if subtitle else 40
    width, height = pw * cols, top + ph * rows + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2:.0f}" y="24" text-anchor="middle" font-size="15">{esc(title)}</text>',
    ]
    if subtitle:
        out.append(
            f'<text x="{width / 2:.0f}" y="44" text-anchor="middle" fill="#555">'
            f"{esc(subtitle)}</text>"
        )
    for i, panel in enumerate(panels):
        ox, oy = pw * (i % cols), top + ph * (i // cols)
        x0, x1, y0, y1 = ox + ml, ox + pw - mr, oy + mt, oy + ph - mb
        out.append(
            f'<text x="{(x0 + x1) / 2:.0f}" y="{oy + 24}" text-anchor="middle" '
            f'font-size="13">{esc(panel.title)}</text>'
        )
        marks = panel.marks
        if not marks:
            continue
        xs = [max(0.0, v) for p in marks for v in (p.x - (p.xh or 0), p.x + (p.xh or 0))]
        ys = [max(0.0, v) for p in marks for v in (p.y - (p.yh or 0), p.y + (p.yh or 0))]
        xlo, xhi, xticks = nice_axis(xs)
        ylo, yhi, yticks = nice_axis(ys)

        def sx(
            v: float, xlo: float = xlo, xhi: float = xhi, x0: float = x0, x1: float = x1
        ) -> float:
            return x0 + (v - xlo) / (xhi - xlo) * (x1 - x0)

        def sy(
            v: float, ylo: float = ylo, yhi: float = yhi, y0: float = y0, y1: float = y1
        ) -> float:
            return y1 - (v - ylo) / (yhi - ylo) * (y1 - y0)

        out.append(
            f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" '
            'fill="none" stroke="#999"/>'
        )
        for t in xticks:
            out.append(
                f'<line x1="{sx(t):.1f}" y1="{y0}" x2="{sx(t):.1f}" y2="{y1}" stroke="#eee"/>'
            )
            out.append(f'<text x="{sx(t):.1f}" y="{y1 + 16}" text-anchor="middle">{t:g}</text>')
        for t in yticks:
            out.append(
                f'<line x1="{x0}" y1="{sy(t):.1f}" x2="{x1}" y2="{sy(t):.1f}" stroke="#eee"/>'
            )
            out.append(f'<text x="{x0 - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
        out.append(
            f'<text x="{(x0 + x1) / 2:.0f}" y="{y1 + 36}" text-anchor="middle">'
            f"{esc(panel.x_label)}</text>"
        )
        out.append(
            f'<text x="{ox + 16}" y="{(y0 + y1) / 2:.0f}" text-anchor="middle" '
            f'transform="rotate(-90 {ox + 16} {(y0 + y1) / 2:.0f})">{esc(panel.y_label)}</text>'
        )
        for kind in joined:
            line = [p for p in marks if p.kind == kind]
            if len(line) > 1:
                colour = styles.get(kind, UNSTYLED).colour
                pts = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in line)
                out.append(
                    f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
                )
        for p in marks:
            style = styles.get(p.kind, UNSTYLED)
            colour = style.colour
            cx, cy = sx(p.x), sy(p.y)
            if p.xh:
                out.append(
                    f'<line x1="{sx(max(0.0, p.x - p.xh)):.1f}" y1="{cy:.1f}" '
                    f'x2="{sx(p.x + p.xh):.1f}" y2="{cy:.1f}" stroke="{colour}"/>'
                )
            if p.yh:
                out.append(
                    f'<line x1="{cx:.1f}" y1="{sy(max(0.0, p.y - p.yh)):.1f}" x2="{cx:.1f}" '
                    f'y2="{sy(p.y + p.yh):.1f}" stroke="{colour}"/>'
                )
            out.append(marker(style, cx, cy))
            if p.label:
                out.append(
                    f'<text x="{cx + 8:.1f}" y="{cy - 7:.1f}" fill="{colour}" font-size="11">'
                    f"{esc(p.label)}</text>"
                )
    ly = top + ph * rows + 8
    for i, (kind, text) in enumerate(legend.items()):
        lx, yy = 24 + (i % 2) * (width / 2), ly + 22 * (i // 2) + 8
        out.append(marker(styles.get(kind, UNSTYLED), lx, yy))
        out.append(f'<text x="{lx + 14:.1f}" y="{yy + 4:.1f}">{esc(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
