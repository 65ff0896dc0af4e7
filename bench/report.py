"""`python -m bench.report [RESULT.json]`: a bench result (default: bench/results/latest.json) as Markdown,
for the README's `## Benchmarks` section."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3f}"
    return str(value)


def markdown(data: dict[str, Any]) -> str:
    machine = data.get("machine", {})
    lines = [
        f"Measured {data['date']} with `{data['command']}` ({data['seconds']:.0f} s) on this machine: "
        f"{machine.get('cpus')} CPUs shared with other work (load average at the end "
        f"{', '.join(f'{x:.1f}' for x in machine.get('load_average', []))}), PostgreSQL {machine.get('postgres')}, "
        f"Python {machine.get('python')}, {data.get('worker_processes')} Celery worker processes; code at "
        f"{data.get('git', {}).get('commit', '?')}"
        f"{' with uncommitted changes' if data.get('git', {}).get('uncommitted_app_files') else ''}. "
        "Median [min – max] of the repetitions; ratios are per repetition, A and B side by side.",
        "",
        "| workload | figure | median | min – max | unit |",
        "|---|---|---:|---:|---|",
    ]
    for name, section in data["workloads"].items():
        if section.get("skipped"):
            lines.append(f"| {name} | skipped: {section['skipped']} | | | |")
            continue
        for figure, stat in section["figures"].items():
            lines.append(
                f"| {name} | {figure} | {_fmt(stat['median'])} | {_fmt(stat['min'])} – {_fmt(stat['max'])} | {stat['unit']} |"
            )
    goals = [(name, g) for name, s in data["workloads"].items() for g in s.get("goals", [])]
    if goals:
        lines += ["", "| goal | target | measured | verdict |", "|---|---|---:|---|"]
        for name, goal in goals:
            verdict = {True: "met", False: "**missed**", None: "n/a"}[goal["met"]]
            lines.append(f"| {name}: {goal['name']} | {goal['target']} | {_fmt(goal['value'])} | {verdict} |")
    notes = [(name, n) for name, s in data["workloads"].items() for n in s.get("notes", [])]
    if notes:
        lines.append("")
        lines += [f"- {name}: {note}" for name, note in notes]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else RESULTS_DIR / "latest.json"
    print(markdown(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
