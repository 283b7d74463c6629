"""Markdown pieces shared by the report tables."""

from __future__ import annotations

import html
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


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 13px/1.4 system-ui, sans-serif; margin: 1em; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }}
th {{ background: #f3f3f3; position: sticky; top: 0; }}
td:nth-child(-n+2), th:nth-child(-n+2) {{ text-align: left; }}
p {{ max-width: 60em; color: #444; }}
</style></head><body>
{body}
</body></html>
"""


def _inline(text: str) -> str:
    """HTML-escaped text with `code` spans (the only inline markup the tables use)."""
    parts = html.escape(text.strip(), quote=False).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().removeprefix("|").removesuffix("|").split("|")]


def to_html(md_text: str) -> str:
    """A report table's Markdown (what ``table`` writes: a ``###`` title, one pipe table, a
    note) as a standalone HTML page, for the Snakemake report. Only that subset is read:
    headings, pipe tables (the second row is the separator), paragraphs, `code`."""
    body, rows, title = [], [], None

    def flush_table() -> None:
        if rows:
            head, data = rows[0], rows[2:]
            body.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head)
                        + "</tr></thead><tbody>")
            body.extend("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in data)
            body.append("</tbody></table>")
            rows.clear()

    for line in md_text.splitlines():
        if line.startswith("|"):
            rows.append(_cells(line))
            continue
        flush_table()
        if line.startswith("#"):
            text = line.lstrip("#")
            level = min(len(line) - len(text), 6)
            title = title or text.strip()
            body.append(f"<h{level}>{_inline(text)}</h{level}>")
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
    flush_table()
    return _PAGE.format(title=html.escape(title or "llmbench table"), body="\n".join(body))
