"""Markdown pieces shared by the report tables."""

from __future__ import annotations

from pathlib import Path


def fmt(value, spec: str) -> str:
    """A number formatted with ``spec``; empty for None or NaN."""
    return "" if value is None or (isinstance(value, float) and value != value) else format(value, spec)


def table(title: str, head: list[str], rows: list[list[str]], note: str) -> str:
    """A titled Markdown table followed by a note on what its numbers mean."""
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows] + ["", note, ""])


def write(df, md_text: str, csv: Path | str, md: Path | str) -> None:
    """Write a table as CSV (``df``, long form) and its Markdown (``md_text``)."""
    Path(csv).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv, index=False)
    Path(md).write_text(md_text)
