"""A distributional check drawn as inline SVG (no dependency, nothing
fetched): per bin, the expected count (a tick), the acceptance band (a
shaded bar: the counts a correct implementation shows there with
probability at least ``1 - false_alarm / bins``, ``harness.frequencies``)
and the observed count (a dot, red when outside the band). The input is
one record of ``harness.frequencies.observe``.
"""

from __future__ import annotations

from html import escape
from typing import Any

__all__ = ["frequency_plot"]

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 28, 40


def _ticks(top: float) -> list[float]:
    """About four round values from 0 to ``top``."""
    if top <= 0:
        return [0.0]
    raw = top / 4
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(top // step) + 1)]


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 or abs(x) >= 100 else f"{x:.1f}"


def frequency_plot(freq: dict[str, Any]) -> str:
    """The ``<svg>`` element of one observation (module doc)."""
    obs, exp = list(freq.get("observed", [])), list(freq.get("expected", []))
    low, high = list(freq.get("low", exp)), list(freq.get("high", exp))
    labels = list(freq.get("labels", [str(i) for i in range(len(obs))]))
    bins = len(obs)
    if bins == 0:
        return ""
    top = max([*obs, *high, *exp, 1.0]) * 1.08
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / bins

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    status = "passed" if freq.get("passed") else "FAILED"
    pv = freq.get("p_value")
    said = (f"{freq.get('kind', '')}: p-value {pv:.3g} vs false-alarm rate {freq.get('false_alarm', 0):g} "
            f"({status}); n={freq.get('n', 0)}" if pv is not None else f"{freq.get('kind', '')}: {status}")
    title = f"{freq.get('what', '')}: {said}"  # the tooltip; the caption line says the test's numbers
    parts = [f'<svg class="freq-plot" role="img" width="{WIDTH}" '
             f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" data-passed="{str(bool(freq.get("passed"))).lower()}">',
             f"<title>{escape(title)}</title>",
             f'<text x="{LEFT}" y="16" font-size="12" fill="#222">{escape(_clip(said, 100))}</text>']
    for tick in _ticks(top):
        ty = y(tick)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#e4e4e4"/>'
                     f'<text x="{LEFT - 6}" y="{ty + 4:.1f}" font-size="10" text-anchor="end" fill="#555">'
                     f'{_num(tick)}</text>')
    every = max(1, -(-bins // 12))  # at most about 12 bin labels
    for i in range(bins):
        cx = LEFT + step * (i + 0.5)
        bar = max(step * 0.6, 1.0)
        outside = not (low[i] - 1e-9 <= obs[i] <= high[i] + 1e-9)
        parts.append(f'<rect class="band" x="{cx - bar / 2:.1f}" y="{y(high[i]):.1f}" width="{bar:.1f}" '
                     f'height="{max(y(low[i]) - y(high[i]), 1.0):.1f}" fill="#cfe3f7">'
                     f'<title>bin {escape(labels[i])}: band {_num(low[i])}..{_num(high[i])}</title></rect>')
        parts.append(f'<line class="expected" x1="{cx - bar / 2:.1f}" x2="{cx + bar / 2:.1f}" y1="{y(exp[i]):.1f}" '
                     f'y2="{y(exp[i]):.1f}" stroke="#1f5fa8" stroke-width="2"/>')
        parts.append(f'<circle class="observed{" outside" if outside else ""}" cx="{cx:.1f}" cy="{y(obs[i]):.1f}" '
                     f'r="{min(4.0, max(step / 3, 1.5)):.1f}" fill="{"#c62828" if outside else "#222"}">'
                     f'<title>bin {escape(labels[i])}: observed {_num(obs[i])}, expected {_num(exp[i])}'
                     f'{" (outside the band)" if outside else ""}</title></circle>')
        if i % every == 0:
            parts.append(f'<text x="{cx:.1f}" y="{HEIGHT - BOTTOM + 14}" font-size="10" text-anchor="middle" '
                         f'fill="#555">{escape(_clip(labels[i], 9))}</text>')
    axis = f"{'cell' if freq.get('cells', bins) == bins else 'cells (neighbours summed)'}"
    parts += [f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#888"/>',
              f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" stroke="#888"/>',
              f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 8}" font-size="11" text-anchor="middle" fill="#333">'
              f'{axis}; dot: observed (red: outside the band), tick: expected, bar: acceptance band</text>',
              f'<text x="12" y="{TOP + plot_h / 2:.0f}" font-size="11" fill="#333" '
              f'transform="rotate(-90 12 {TOP + plot_h / 2:.0f})" text-anchor="middle">count</text>',
              "</svg>"]
    return "".join(parts)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"
