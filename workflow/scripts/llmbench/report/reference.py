"""The paper's published numbers (config/reference/*.csv), with canonical technique names.

One file a table (table2.csv: Table II, ...; profile_*.csv: Tables V to XVI; fig4.csv), and two
files of numbers the paper prints only in its text, each row with the verbatim quote it comes
from: prose.csv (Sections I, III, IV, V, VII) and serving_text.csv (Sections III and VI). A value
is kept as printed; a printed value that cannot be right is marked in the ``flag`` column
(``typo``) with the reason in ``note``, and stays out of every ratio and finding. In prose.csv
and serving_text.csv a ``platform``, ``method`` or ``model`` of several values joins them with
"|". tests/unit/test_transcription.py checks every number against the paper itself.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import techniques
from ..config import REPO_ROOT

_RESULT = ("status", "tokens_per_s", "tokens_per_s_std", "mem_gb", "flag", "note")
_TEXT = ("id", "section", "figure", "platform", "model", "engine", "method", "quantity", "value", "unit", "quote",
         "note")
#: the columns each reference file has and its readers rely on (config/reference/<name>.csv)
COLUMNS: dict[str, tuple[str, ...]] = {
    "table1": ("table", "platform", "gpu", "gpu_memory_gb", "gpu_clock_ghz", "cpu", "cpu_sockets", "cpu_clock_ghz",
               "host_memory", "host_memory_unit", "host_memory_type", "interconnect", "gpus_per_node", "note"),
    "table2": ("table", "framework", "platform", "model", "batch_size") + _RESULT,
    "table3": ("table", "model", "method", "platform", "batch_size") + _RESULT,
    "table4": ("table", "model", "method", "platform", "batch_size") + _RESULT,
    "table9": ("table", "model", "method", "platform", "batch_size") + _RESULT,
    "fig4": ("figure", "model", "method", "platform", "batch_size", "gpus", "efficiency_pct", "note", "quote"),
    "profile_phases": ("table", "model", "method", "platform", "batch_size", "phase", "wall_ms", "share_pct",
                       "kernel_ms", "gemm_share_pct", "note"),
    "profile_modules": ("table", "model", "method", "platform", "batch_size", "phase", "module", "time_ms",
                        "share_pct", "note"),
    "profile_attention": ("table", "model", "method", "platform", "batch_size", "phase", "naive_ms", "flash_ms",
                          "improvement_pct", "note"),
    "profile_serve": ("table", "view", "group", "parent", "time_ms", "pct", "note"),
    "profile_comm": ("table", "kind", "model", "method", "batch_size", "time_s", "pct", "note"),
    "table12": ("table", "model", "method", "platform", "m", "n", "k", "time_ms", "peak_pct", "measurements",
                "status", "note"),
    "prose": _TEXT,
    "serving_text": _TEXT,
}


def load(table: str, root: Path = REPO_ROOT) -> pd.DataFrame:
    """Load config/reference/<table>.csv; adds ``technique`` (canonical name of ``method``)."""
    path = root / "config" / "reference" / f"{table}.csv"
    df = pd.read_csv(path, dtype={c: str for c in ("note", "flag", "quote", "platform", "method", "value")})
    missing = [c for c in COLUMNS.get(table, ()) if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    if "method" in df.columns:
        df["technique"] = [_canonical(m) for m in df["method"]]
    return df


def _canonical(method) -> str:
    if not isinstance(method, str):
        return method  # a prose number that no one method is about
    try:
        return techniques.canonical(method)
    except techniques.TechniqueError:
        return method  # fine-tuning methods (L, QL) come with their own grammar later
