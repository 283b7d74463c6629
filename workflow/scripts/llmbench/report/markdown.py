"""Markdown pieces shared by the report tables."""

from __future__ import annotations


def fmt(value, spec: str) -> str:
    """A number formatted with ``spec``; empty for None or NaN."""
    return "" if value is None or (isinstance(value, float) and value != value) else format(value, spec)


def table(title: str, head: list[str], rows: list[list[str]], note: str) -> str:
    """A titled Markdown table followed by a note on what its numbers mean."""
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows] + ["", note, ""])
