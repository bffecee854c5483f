"""A grouped bar chart drawn with Pillow, so the benchmark needs no plotting library."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = ((70, 110, 180), (230, 140, 50), (90, 170, 90))
WIDTH, HEIGHT, MARGIN = 900, 480, 60


def bar_chart(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float]],
    unit: str,
) -> None:
    """One group of bars per label in `groups`, one bar per series in each group."""
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    draw.text((MARGIN, 15), title, fill="black")
    top = max((v for values in series.values() for v in values), default=1.0) or 1.0
    plot_height = HEIGHT - 2 * MARGIN
    group_width = (WIDTH - 2 * MARGIN) / max(len(groups), 1)
    bar_width = group_width * 0.8 / max(len(series), 1)
    baseline = HEIGHT - MARGIN
    draw.line((MARGIN, baseline, WIDTH - MARGIN, baseline), fill="black")
    for g, label in enumerate(groups):
        left = MARGIN + g * group_width + group_width * 0.1
        for s, values in enumerate(series.values()):
            value = values[g]
            height = plot_height * value / top
            x0 = left + s * bar_width
            box = (x0, baseline - height, x0 + bar_width - 2, baseline)
            draw.rectangle(box, fill=COLOURS[s % len(COLOURS)])
            draw.text((x0, baseline - height - 12), f"{value:.0f}", fill="black")
        draw.text((left, baseline + 8), label, fill="black")
    for s, name in enumerate(series):
        x = WIDTH - MARGIN - 220
        y = 15 + 16 * s
        draw.rectangle((x, y, x + 10, y + 10), fill=COLOURS[s % len(COLOURS)])
        draw.text((x + 16, y - 1), f"{name} ({unit})", fill="black")
    image.save(path)
