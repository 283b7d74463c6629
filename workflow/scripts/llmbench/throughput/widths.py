"""The interval file's widths from held-out errors (``python -m llmbench.throughput interval
[--write]``): the rule is in llmbench.throughput.interval, the numbers come from here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from ..config import REPO_ROOT
from . import calibrate, score
from .interval import ASSUMED, DIMENSIONS, INTERVAL_FILE, QUANTILE, covered_by, link_kind, load, width_of
from .model import CONSTANTS_FILE, calibrated_constants, load_constants


def leave_one_run_out(records: pd.DataFrame, root: Path = REPO_ROOT) -> pd.DataFrame:
    """Each record predicted from a fit on the records of every other run."""
    out = []
    for run in sorted(records["run"].unique()):
        consts = calibrate.fit(records[records["run"] != run], root)
        out.append(score.predict_rows(records[records["run"] == run], consts, root))
    return pd.concat(out, ignore_index=True)


def compute(root: Path = REPO_ROOT, quantile: float = QUANTILE) -> dict:
    """The interval file's content from the committed records and the paper's tables."""
    records = calibrate.load_records(root)
    runs = (load_constants(root).get("calibrated") or {}).get("fitted_on", {}).get("runs")
    if runs:  # the records the calibrated constants were fitted on
        records = records[records["run"].isin(runs)].reset_index(drop=True)
    cv = leave_one_run_out(records, root)
    multi = score.predict_rows(records[records["gpus"] > 1],
                               calibrate.fit(records[records["gpus"] == 1], root), root)
    paper = score.predict_rows(score.paper_rows(root), calibrated_constants(root), root,
                               measured="tokens_per_s_compared")
    hw = load_constants(root)["hardware"]
    link = paper["platform"].map(lambda p: link_kind(p, root) if p in hw else "pcie")

    def entry(pred: pd.DataFrame, source: str, measured: str = "tokens_per_s_measured") -> dict:
        return {"value": round(width_of(pred["tokens_per_s_predicted"], pred[measured], quantile), 4),
                "n": len(pred), "source": source}

    q = f"{quantile:.0%} quantile of |ln(predicted / measured)|"
    widths = {
        "in_range": entry(cv, f"{q}, leave-one-run-out over the {len(records)} calibration records "
                              f"({records['run'].nunique()} runs)"),
        "gpus": entry(multi, f"{q}, the multi-GPU calibration records predicted from a fit on the 1-GPU ones"),
        "platform_nvlink": entry(paper[link == "nvlink"], f"{q}, the paper's NVLink cells (Tables II, III, IV, "
                                 "IX; A800) under the calibrated constants; the width only, never the fit"),
        "platform_pcie": entry(paper[link == "pcie"], f"{q}, the paper's PCIe-only cells (Tables II, III, IV, "
                               "IX; RTX 4090, RTX 3090) under the calibrated constants; the width only, never the fit"),
    }
    assumed = max(widths["in_range"]["value"], widths["gpus"]["value"])
    for d in ASSUMED:
        widths[d] = {"value": assumed, "n": 0,
                     "source": f"assumption: no held-out set holds a {DIMENSIONS[d]} outside what the fit saw, so "
                               "no error measures it; the largest width our own records measured (gpus)"}
    covered = covered_by(records, root)
    return {"quantile": quantile,
            "covered": {"source": f"the {len(records)} records of {calibrate.RECORDS_CSV} the calibrated "
                                  f"constants of {CONSTANTS_FILE} were fitted on", **covered},
            "widths": widths}


HEADER = """\
# The interval of a throughput prediction (llmbench.throughput.interval; docs/throughput-model.md).
# Written by `python -m llmbench.throughput interval --write`; do not edit by hand.
# covered: what the calibration records span (ranges are [low, high]); a cell outside one of
# them gets that dimension's width and a note. widths: half-widths w of [value / e^w, value x e^w].
"""


def write(data: dict, root: Path = REPO_ROOT) -> Path:
    """Write the interval file (HEADER + data); return its path."""
    path = root / INTERVAL_FILE
    path.write_text(HEADER + yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
    load.cache_clear()
    return path
