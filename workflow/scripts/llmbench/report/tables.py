"""Every report table built from its inputs: ``build(name, inputs)`` calls this module's
function of that catalog name (dashes as underscores), which returns a render.Table (the
long form for the CSV, the display parts for Markdown and HTML).

``Inputs`` holds a table's inputs by the catalog's names (llmbench.report.catalog) and
loads each the first time it is read, so a table reads only what the catalog says it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from . import catalog, findings as verdicts, micro as micro_tables, paper_tables, profile as profile_tables, render
from . import advice as advice_table, memory_model as memory_table, scaling as scaling_table, search as search_table
from . import coverage as coverage_table, serving as serving_table, stacks as stacks_table


class Inputs:
    """A table's inputs: paths by the catalog's names (``tidy``, ``profile``, ``micro``,
    ``requests``, ``searches``, ``measured``, ``findings``, ``reference``), or frames already
    loaded (tests). ``root``: the repository whose config/reference is read (None: this one)."""

    def __init__(self, sources: Mapping[str, Any], root: Path | None = None,
                 findings_models: list[str] | None = None, findings_machines: list[dict] | None = None):
        self._sources = dict(sources)
        self.root = root
        self.findings_models = findings_models
        self.findings_machines = findings_machines

    def _frame(self, key: str, reader) -> pd.DataFrame:
        value = self._sources[key]
        if not isinstance(value, pd.DataFrame):
            value = self._sources[key] = reader(value)
        return value

    @property
    def tidy(self) -> pd.DataFrame:
        """The tidy table: the whole one, or the stage slices the table reads, together."""
        if "tidy" in self._sources:
            return self._frame("tidy", pd.read_csv)
        slices = [k for k in self._sources if k.startswith("tidy_")]
        if not slices:
            raise KeyError("this table reads no tidy table (catalog: tidy or tidy:<stage>)")
        frames = [self._frame(k, pd.read_csv) for k in slices]
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

    @property
    def superseded(self) -> pd.DataFrame | None:
        """The records other runs of the same cells superseded (None where not given)."""
        return self._frame("superseded", pd.read_csv) if "superseded" in self._sources else None

    @property
    def profile(self) -> pd.DataFrame | None:
        """The per-row profile table (None where not given: a table of training cells alone)."""
        return self._frame("profile", pd.read_parquet) if "profile" in self._sources else None

    @property
    def micro(self) -> pd.DataFrame | None:
        """The per-point microbenchmark table (None where not given)."""
        return self._frame("micro", pd.read_parquet) if "micro" in self._sources else None

    def path(self, key: str) -> str | None:
        """A file input (the findings file), or None where the table was given none."""
        value = self._sources.get(key)
        return None if value is None else str(value)

    def paths(self, key: str) -> list[str]:
        """A list input (the searches' folders, the records they measured)."""
        value = self._sources.get(key) or []
        return [value] if isinstance(value, (str, Path)) else list(value)

    @property
    def kw(self) -> dict:
        return {"root": self.root} if self.root else {}


def build(name: str, inputs: Inputs) -> render.Table:
    """The catalog table ``name`` built from ``inputs``."""
    return globals()[catalog.get("table", name).function](inputs)


# The verdict ------------------------------------------------------------------------------

def verdict(table: pd.DataFrame, missing: pd.DataFrame) -> render.Table:
    """The findings table as the report shows it (its display lives with the engine)."""
    return verdicts.report_table(table, missing)


def findings_and_missing(inputs: Inputs) -> tuple[render.Table, pd.DataFrame, pd.DataFrame]:
    """The findings table, what to run next (findings-missing.csv) and the checks as numbers
    (findings-checks.csv)."""
    table, missing = verdicts.build(inputs.tidy, inputs.profile, inputs.micro, path=inputs.path("findings"),
                                    models=inputs.findings_models, superseded=inputs.superseded,
                                    machines=inputs.findings_machines, **inputs.kw)
    return verdict(table, missing), missing, verdicts.checks_table(table)


def findings(inputs: Inputs) -> render.Table:
    return findings_and_missing(inputs)[0]


def findings_ours(inputs: Inputs) -> render.Table:
    """Our own findings (config/findings/ours.yaml), judged as the paper's are."""
    table, missing = verdicts.build(inputs.tidy, inputs.profile, inputs.micro, path=inputs.path("findings-ours"),
                                    superseded=inputs.superseded, models=inputs.findings_models,
                                    machines=inputs.findings_machines, **inputs.kw)
    return verdicts.report_table(table, missing, "findings-ours")


# Pre-training and fine-tuning -------------------------------------------------------------

def table2(inputs: Inputs) -> render.Table:
    return paper_tables.table2(paper_tables.build_table2(inputs.tidy, inputs.root))


def table3(inputs: Inputs) -> render.Table:
    return paper_tables.table(paper_tables.build(inputs.tidy, "table3", inputs.root), "table3")


def table4(inputs: Inputs) -> render.Table:
    return paper_tables.table(paper_tables.build(inputs.tidy, "table4", inputs.root), "table4")


def table9(inputs: Inputs) -> render.Table:
    return paper_tables.table(paper_tables.build(inputs.tidy, "table9", inputs.root), "table9")


def scaling(inputs: Inputs) -> render.Table:
    return scaling_table.table(scaling_table.build(inputs.tidy, inputs.root))


def search(inputs: Inputs) -> render.Table:
    return search_table.table(search_table.build(inputs.paths("searches"), inputs.paths("measured")))


# Serving, microbenchmarks, profiles -------------------------------------------------------

def serving(inputs: Inputs) -> render.Table:
    return serving_table.table(serving_table.build(inputs.tidy))


def micro_gemm(inputs: Inputs) -> render.Table:
    return micro_tables.gemm(inputs.micro)


def micro_memcpy(inputs: Inputs) -> render.Table:
    return micro_tables.memcpy(inputs.micro)


def micro_collectives(inputs: Inputs) -> render.Table:
    return micro_tables.collectives(inputs.micro)


def table12(inputs: Inputs) -> render.Table:
    return micro_tables.table12(inputs.micro, inputs.root)


def profile_phases(inputs: Inputs) -> render.Table:
    return profile_tables.phases(inputs.tidy, root=inputs.root)


def profile_modules(inputs: Inputs) -> render.Table:
    return profile_tables.modules(inputs.tidy, inputs.profile, inputs.root)


def profile_attention(inputs: Inputs) -> render.Table:
    return profile_tables.attention(inputs.tidy, inputs.profile, inputs.root)


def profile_serve(inputs: Inputs) -> render.Table:
    return profile_tables.serve(inputs.tidy, inputs.profile, inputs.root)


def profile_serve_engine(inputs: Inputs) -> render.Table:
    return profile_tables.serve_engine(inputs.tidy, inputs.profile, inputs.root)


def profile_comm(inputs: Inputs) -> render.Table:
    return profile_tables.comm(inputs.tidy, root=inputs.root)


# Memory model and advice -------------------------------------------------------------------

def memory_model(inputs: Inputs) -> render.Table:
    return memory_table.table(*memory_table.build(inputs.tidy, inputs.root, inputs.paths("reference")))


def memory_model_heldout(inputs: Inputs) -> render.Table:
    return memory_table.heldout_table(*memory_table.build_heldout(inputs.tidy, inputs.root, inputs.paths("searches")))


def stacks(inputs: Inputs) -> render.Table:
    return stacks_table.table(stacks_table.build(inputs.tidy, inputs.superseded))


def coverage(inputs: Inputs) -> render.Table:
    return coverage_table.table(coverage_table.build(inputs.tidy, inputs.root))


def advice(inputs: Inputs) -> render.Table:
    """The advisor with its defaults (every platform and model of the records); the workflow
    builds it with the config's request instead (rule build_advice)."""
    return advice_table.table(advice_table.build(inputs.tidy, root=inputs.root))
