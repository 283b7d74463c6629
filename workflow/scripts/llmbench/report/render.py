"""One writer for every report table: its long form as CSV, its display form as Markdown
(pandas' ``to_markdown``) and as a standalone HTML page (pandas' ``Styler.to_html``), each
with the table's title and notes.

A table is built as a :class:`Table`: the long DataFrame (what a program reads: the CSV)
and one or more :class:`Part` (what a reader sees: an optional heading, a lead paragraph,
a display DataFrame of strings, a note). Integer columns are written as integers
(pandas' nullable Int64), never as "2.0".
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

#: Columns that hold counts wherever they appear (tidy table, long CSVs): batch sizes, GPUs,
#: steps, requests, lengths, parameters, points. Written as Int64 (empty where missing).
INTEGER_COLUMNS = frozenset({
    "batch_size", "gpus", "paper_batch_size", "searched_max_batch", "seq_len", "warmup_steps", "measured_steps",
    "repeats", "total_params", "trainable_params", "num_requests", "input_len", "output_len", "completed", "failed",
    "output_tokens_total", "output_shortfall_requests", "one_read_requests", "max_concurrency", "points",
    "decode_steps", "largest_ok", "smallest_oom", "max_batch", "n_probes", "n_run", "bound", "world_size", "m", "n",
    "k", "bytes", "measurements", "index", "output_tokens",
})


def integers(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its integer columns (INTEGER_COLUMNS) as Int64 where every value is a whole
    number; a column that is not (a mistake upstream) is left as it is rather than rounded."""
    out = df.copy()
    for col in INTEGER_COLUMNS.intersection(out.columns):
        s = out[col]
        if pd.api.types.is_integer_dtype(s):
            out[col] = s.astype("Int64")
            continue
        num = pd.to_numeric(s, errors="coerce")
        if num.notna().sum() != s.notna().sum() or not (num.dropna() % 1 == 0).all():
            continue  # not numbers, or not whole: keep
        out[col] = num.round().astype("Int64")
    return out


def read_csv(path: Path | str) -> pd.DataFrame:
    """A table's CSV with its integer columns as Int64 (pd.read_csv makes a column with an
    empty cell float: batch 1 would print as 1.0). An empty table (no columns) reads empty."""
    try:
        return integers(pd.read_csv(path))
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """One displayed table of a page, with its text."""

    frame: pd.DataFrame
    """The display form (cells already formatted as text; NA shows empty)."""
    heading: str = ""
    """A sub-heading above it (none for a page's first part)."""
    lead: str = ""
    """A paragraph before the table."""
    note: str = ""
    """What the columns mean; paragraphs separated by blank lines."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    """A built report table: the CSV's long form and the parts a reader sees."""

    title: str
    """The page's title (a ``###`` heading in Markdown, ``<h3>`` in HTML)."""
    long: pd.DataFrame
    """Everything a program reads (written as CSV, integers as Int64)."""
    parts: tuple[Part, ...] = field(default_factory=tuple)
    """The displayed tables, in order."""


def _display(df: pd.DataFrame) -> pd.DataFrame:
    """Text cells: integers without '.0', NA empty, everything else as str."""
    out = integers(df)
    for col in out.columns:
        s = out[col]
        out[col] = ["" if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v) for v in s.tolist()]
    return out.reset_index(drop=True)


def markdown(table: Table) -> str:
    """Title, then per part: heading, lead, the table (pandas' Markdown), note."""
    lines = [f"### {table.title}", ""]
    for p in table.parts:
        if p.heading:
            lines += [f"#### {p.heading}", ""]
        if p.lead:
            lines += [p.lead, ""]
        frame = _display(p.frame)
        lines += [frame.to_markdown(index=False, disable_numparse=True) if len(frame.columns) and len(frame)
                  else "(no rows)", ""]
        if p.note:
            lines += [p.note, ""]
    return "\n".join(lines)


_STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 1em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; vertical-align: top; }
th { background: #f3f3f3; position: sticky; top: 0; white-space: nowrap; }
td { white-space: nowrap; }
td.long { white-space: normal; min-width: 20em; max-width: 40em; text-align: left; }
td:nth-child(-n+2), th:nth-child(-n+2) { text-align: left; }
p { max-width: 60em; color: #444; }
"""


#: a cell longer than this wraps (claims, reasons, the cells a finding misses): numbers stay on one line
LONG_CELL = 40


def _styled(frame: pd.DataFrame, uuid: str) -> str:
    """The display frame as an HTML table (pandas' Styler): text escaped, no index, columns
    with long text allowed to wrap. ``uuid`` names its ids (Styler's default is random, so
    a rebuilt page differed from the last one in every id)."""
    long = [c for c in frame.columns if frame[c].str.len().max() > LONG_CELL]
    styler = frame.style.hide(axis="index").format(escape="html").set_uuid(uuid)
    if long:
        styler = styler.set_td_classes(pd.DataFrame(
            [["long" if c in long else "" for c in frame.columns]] * len(frame), index=frame.index,
            columns=frame.columns))
    return styler.to_html()


def _paragraphs(text: str) -> str:
    return "\n".join(f"<p>{html.escape(p.strip(), quote=False)}</p>" for p in text.split("\n\n") if p.strip())


def page(table: Table) -> str:
    """The table as a standalone HTML page (inline style, no script): title, then per part
    its heading, lead, the table (pandas' Styler) and note; all text HTML-escaped."""
    body = [f"<h3>{html.escape(table.title, quote=False)}</h3>"]
    for i, p in enumerate(table.parts):
        if p.heading:
            body.append(f"<h4>{html.escape(p.heading, quote=False)}</h4>")
        if p.lead:
            body.append(_paragraphs(p.lead))
        frame = _display(p.frame)
        if len(frame.columns) and len(frame):
            body.append(_styled(frame, f"part{i}"))
        else:
            body.append("<p>(no rows)</p>")
        if p.note:
            body.append(_paragraphs(p.note))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(table.title, quote=False)}</title>\n<style>{_STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write(table: Table, csv: Path | str, md: Path | str, html_path: Path | str | None = None) -> None:
    """Write ``table`` as CSV (long form), Markdown and, where a path is given, HTML."""
    Path(csv).parent.mkdir(parents=True, exist_ok=True)
    integers(table.long).to_csv(csv, index=False)
    Path(md).write_text(markdown(table))
    if html_path is not None:
        Path(html_path).write_text(page(table))


def fmt(value, spec: str) -> str:
    """A number formatted with ``spec``; empty for None or NA."""
    return "" if value is None or pd.isna(value) else format(value, spec)


def brief(text, limit: int = 240) -> str:
    """A record's reason for a table cell: white space folded, at most ``limit`` characters
    (empty for None or NA)."""
    return "" if text is None or pd.isna(text) else " ".join(str(text).split())[:limit]


def simple(name: str, long: pd.DataFrame, head: list[str], rows: list[list[str]], note: str) -> Table:
    """A catalog table of one displayed part: ``rows`` of text under ``head``, and a note."""
    from . import catalog

    return Table(title=catalog.get("table", name).title, long=long,
                 parts=(Part(frame=pd.DataFrame(rows, columns=head), note=note),))
