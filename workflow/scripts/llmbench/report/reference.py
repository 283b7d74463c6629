"""The paper's published numbers (config/reference/*.csv), with canonical technique names."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import techniques
from ..config import REPO_ROOT


def load(table: str, root: Path = REPO_ROOT) -> pd.DataFrame:
    """Load config/reference/<table>.csv; adds ``technique`` (canonical name of ``method``)."""
    df = pd.read_csv(root / "config" / "reference" / f"{table}.csv", dtype={"note": str})
    if "method" in df.columns:
        df["technique"] = [_canonical(m) for m in df["method"]]
    return df


def _canonical(method: str) -> str:
    try:
        return techniques.canonical(method)
    except techniques.TechniqueError:
        return method  # fine-tuning methods (L, QL) come with their own grammar later
