"""SVG geometry for the numbers of a date range (insights.numbers): one bar per bucket with its
value written on it, one meaning per chart, so one colour per meaning on a page (the template
styles a chart by its meaning's class: `m-runs`, `m-failed`, `m-tokens`, `m-cost`, `m-duration`).
"""

from __future__ import annotations

from typing import Any

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 200, 8, 8, 28, 30
MEANINGS = ("runs", "failed", "tokens", "cost", "duration")


def short_number(value: float | int | None) -> str:
    """1234 → 1.2k, 2500000 → 2.5M; what fits on a bar."""
    if value is None:
        return "—"
    value = float(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:.2f}".rstrip("0").rstrip(".") if value % 1 else str(int(value))


def seconds_label(value: float | None) -> str:
    """850ms, 12.3s, 3m04s, 2h05m."""
    if value is None:
        return "—"
    if value < 1:
        return f"{round(value * 1000)}ms"
    if value < 60:
        return f"{value:.1f}s".replace(".0s", "s")
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"


def _label(start: str, end: str, bucket: str) -> str:
    return start[5:] if bucket == "day" or start == end else f"{start[5:]}–{end[5:]}"


def bars(
    trend: list[dict[str, Any]], key: str, meaning: str, bucket: str, *, overlay: str | None = None, fmt: Any = short_number
) -> dict[str, Any]:
    """A bar per bucket as tall as its `key` (against the largest); `overlay` draws a second,
    nested value of another meaning in front (failed runs within runs). Every bar carries its value
    as text, above the bar; a bucket without a value shows an empty slot, never a made-up zero height."""
    values = [row.get(key) for row in trend]
    numeric = [float(v) for v in values if v is not None]
    top = max(numeric, default=0.0) or 1.0
    n = max(1, len(trend))
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    slot = plot_w / n
    base = PAD_T + plot_h
    show_every = max(1, n // 12)  # at most a dozen date labels
    out = []
    for index, row in enumerate(trend):
        value = values[index]
        height = round(plot_h * float(value) / top, 1) if value is not None else 0.0
        x = round(PAD_L + index * slot + slot * 0.12, 1)
        width = round(slot * 0.76, 1)
        bar: dict[str, Any] = {
            "x": x,
            "y": round(base - height, 1),
            "width": width,
            "height": height,
            "cx": round(x + width / 2, 1),
            "value": fmt(value) if value else "",  # a zero or an empty bucket has nothing written on it
            "value_y": round(base - height - 3, 1),
            "title": f"{row['start']}{'' if row['start'] == row['end'] else ' – ' + row['end']}: {fmt(value)}"
            + (" (part of a week)" if row.get("partial") else ""),
            "date": _label(row["start"], row["end"], bucket) if index % show_every == 0 else "",
        }
        if overlay is not None:
            inner = row.get(overlay) or 0
            inner_h = round(plot_h * float(inner) / top, 1)
            bar |= {"inner_y": round(base - inner_h, 1), "inner_height": inner_h, "inner_value": fmt(inner) if inner else ""}
            bar["title"] += f", {fmt(inner)} {overlay}"
        out.append(bar)
    # Values on narrow bars would overlap: with more than 31 buckets they stay in the tooltips.
    return {
        "bars": out,
        "meaning": meaning,
        "overlay": overlay,
        "width": W,
        "height": H,
        "base": base,
        "date_y": H - 6,
        "values_shown": n <= 31,
        "dense": n > 14,  # smaller value labels
    }


def range_charts(numbers: dict[str, Any]) -> dict[str, Any]:
    trend, bucket = numbers["trend"], numbers["range"]["bucket"]
    for row in trend:
        row["cost"] = float(row["cost_usd"]) if row.get("cost_usd") else None
        row["failure_rate"] = round(row["rate"] * 100, 1) if row.get("rate") is not None else None
    return {
        "volume": bars(trend, "runs", "runs", bucket, overlay="failed"),
        "rate": bars(trend, "failure_rate", "failed", bucket, fmt=lambda v: f"{short_number(v)}%"),
        "tokens": bars(trend, "tokens", "tokens", bucket),
        "cost": bars(trend, "cost", "cost", bucket, fmt=lambda v: f"${short_number(v)}"),
        "p50": bars(trend, "p50", "duration", bucket, fmt=seconds_label),
        "p95": bars(trend, "p95", "duration", bucket, fmt=seconds_label),
    }
