"""The human-readable form of a bench document: one table, the ratios and the verdict."""

from __future__ import annotations

from typing import Any

_COLUMNS = (
    ("events/s", "events_per_s", "{:,.0f}"),
    ("p50 ms", "p50_ms", "{:.2f}"),
    ("p99 ms", "p99_ms", "{:.2f}"),
    ("max ms", "max_ms", "{:.2f}"),
    ("CPU s/1000", "cpu_s_per_1000", "{:.3f}"),
    ("server CPU s/1000", "server_cpu_s_per_1000", "{:.3f}"),
    ("cmds/event", "commands_per_event", "{:.2f}"),
    ("peak RSS MB", "peak_rss_mb", "{:.1f}"),
)

#: Document key of each side and the name its row goes by.
_ROWS = (
    ("ceiling", "ceiling (same entries)"),
    ("ceiling_minimal", "ceiling (minimal, 1 field)"),
    ("printery", "printery"),
    ("printery_without", "printery reporting costs"),
    ("printery_with", "printery with"),
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
    if "prefetch" in result:
        prefetch = result["prefetch"]
        how = "library default" if result.get("prefetch_default") else "--prefetch"
        parts.append(f"printery prefetch {'adaptive' if prefetch is None else prefetch} ({how})")
    if result.get("rounds", 1) > 1:
        parts.append(f"{result['rounds']} rounds (medians)")
    return "printery bench: " + ", ".join(parts)


def _cell(values: dict[str, Any], key: str, fmt: str) -> str:
    return fmt.format(values[key]) if key in values else "-"


def format_table(result: dict[str, Any]) -> str:
    """Every side in aligned columns, then printery's ratio to each ceiling and whether
    every event arrived exactly once (a bench that loses events has measured nothing)."""
    rows = [["", *(title for title, _, _ in _COLUMNS)]]
    for side, name in _ROWS:
        values = result.get(side) or {}
        if values:
            if side == "printery_with":
                name = f"printery with {' + '.join(result.get('with', []))}"
            rows.append([name, *(_cell(values, key, fmt) for _, key, fmt in _COLUMNS)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [_headline(result), ""]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    for key, against in (("", "same-entry ceiling"), ("_minimal", "minimal relay")):
        if not result.get("ceiling" + key):
            continue
        summary = f"ratio (printery / {against} events/s): {result.get('ratio' + key, 0):.2f}"
        if result.get("p99_ratio" + key):
            summary += f"; p99 ratio: {result['p99_ratio' + key]:.2f}"
        lines.append(summary)
    if result.get("printery_with"):
        lines.append(f"overhead of {' + '.join(result.get('with', []))} on every stage "
                     f"(1 - with / without events/s): {result.get('with_overhead', 0):.1%}")
        if "with_overhead_plain" in result:
            lines.append("  without = the same handlers reporting costs; against printery "
                         f"without cost reports: {result['with_overhead_plain']:.1%}")
    rounds = result.get("per_round") or []
    for key, name, fmt in (("ratio", "ratio", "{:.2f}"), ("ratio_minimal", "ratio (minimal)", "{:.2f}"),
                           ("with_overhead", "overhead", "{:.1%}")):
        values = [r[key] for r in rounds if r.get(key)]
        if values:
            lines.append(f"  {name} by round: {', '.join(fmt.format(v) for v in values)}")
    verdict = "yes" if result.get("verified") else "NO"
    lines.append(f"every event arrived exactly once: {verdict}")
    return "\n".join(lines)
