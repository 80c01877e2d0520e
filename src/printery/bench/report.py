"""The human-readable form of a bench document: one table, the ratio and the verdict."""

from __future__ import annotations

from typing import Any

_COLUMNS = (
    ("events/s", "events_per_s", "{:,.0f}"),
    ("p50 ms", "p50_ms", "{:.2f}"),
    ("p99 ms", "p99_ms", "{:.2f}"),
    ("max ms", "max_ms", "{:.2f}"),
    ("CPU s/1000", "cpu_s_per_1000", "{:.3f}"),
    ("peak RSS MB", "peak_rss_mb", "{:.1f}"),
)


def _headline(result: dict[str, Any]) -> str:
    processes = result.get("processes", 1)
    parts = [
        f"{result.get('events', 0):,} events",
        f"{result.get('stages', 0)} stages",
        f"{processes} process{'es' if processes != 1 else ''}",
        f"{result.get('payload_bytes', 0):,} B payload",
    ]
    if result.get("mode") == "rate":
        parts.append(f"offered {result.get('rate', 0):,.0f}/s for {result.get('duration', 0):g} s")
    else:
        parts.append("backlog")
    return "printery bench: " + ", ".join(parts)


def format_table(result: dict[str, Any]) -> str:
    """Both sides in aligned columns, then printery's ratio to the ceiling and whether
    every event arrived exactly once (a bench that loses events has measured nothing)."""
    rows = [["", *(title for title, _, _ in _COLUMNS)]]
    for side in ("ceiling", "printery"):
        values = result.get(side) or {}
        if not values:
            continue
        rows.append([side, *(fmt.format(values.get(key, 0)) for _, key, fmt in _COLUMNS)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [_headline(result), ""]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    summary = f"ratio (printery / ceiling events/s): {result.get('ratio', 0):.2f}"
    if "p99_ratio" in result:
        summary += f"; p99 ratio: {result['p99_ratio']:.2f}"
    lines.append(summary)
    verdict = "yes" if result.get("verified") else "NO"
    lines.append(f"every event arrived exactly once: {verdict}")
    return "\n".join(lines)
