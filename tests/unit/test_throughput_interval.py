"""The throughput model's interval (llmbench.throughput.interval): widths from held-out errors,
their combination, the notes of a cell outside what the calibration records cover, the
interval file, and a prediction scaled from a measurement."""

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from llmbench import techniques
from llmbench.config import ConfigError
from llmbench.models import ModelSpec
from llmbench.throughput import Prediction, TrainCell, interval, model, predict

REPO = Path(__file__).resolve().parents[2]


def cell(platform="h200", model_name="llama2-7b", technique="F+Z3", batch_size=8, gpus=1, seq_len=350,
         stage="pretrain", backend="deepspeed"):
    return TrainCell(stage=stage, platform=platform, model=ModelSpec.load(model_name, REPO),
                     technique=techniques.parse(technique), batch_size=batch_size, gpus=gpus, seq_len=seq_len,
                     backend=backend)


def test_width_is_the_quantile_of_log_errors():
    measured = [100.0] * 10
    predicted = [100.0 * math.exp(e) for e in (0.0, 0.1, -0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8, 0.9)]
    assert interval.width_of(predicted, measured, 0.5) == pytest.approx(0.45)
    assert interval.width_of(predicted, measured, 1.0) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="no held-out"):
        interval.width_of([], [])


def test_widths_combine_in_quadrature_of_their_excess():
    w = {"in_range": 0.3, "gpus": 0.5, "platform_nvlink": 1.2, "seq_len": 0.5}
    assert interval.combine(w, []) == 0.3
    assert interval.combine(w, ["gpus"]) == pytest.approx(0.5)  # out of one dimension: its own width
    both = interval.combine(w, ["gpus", "platform_nvlink"])
    assert both > 1.2 and both == pytest.approx(math.sqrt(0.5**2 + 1.2**2 - 0.3**2))
    assert interval.combine({**w, "gpus": 0.1}, ["gpus"]) == 0.3  # never narrower than in range


def test_a_cell_in_range_has_the_in_range_width_and_no_note():
    widths = {k: v["value"] for k, v in interval.load(REPO)["widths"].items()}
    p = predict(cell(), root=REPO)
    assert isinstance(p, Prediction) and p.outside == () and p.notes == ()
    assert p.width == pytest.approx(widths["in_range"])
    assert p.low < p.value < p.high and p.high / p.value == pytest.approx(p.value / p.low)
    # the existing functions answer the same value
    c = cell()
    assert p.value == pytest.approx(model.tokens_per_s(c, model.calibrated_constants(REPO), REPO))
    assert p.step_time_low_s < p.step_time_s < p.step_time_high_s


@pytest.mark.parametrize("change, dimension, words", [
    ({"seq_len": 4096}, "seq_len", "sequence length 4096"),
    ({"gpus": 8, "platform": "h200x8"}, "gpus", "8 GPUs is outside"),
    ({"technique": "F+Z2+C", "gpus": 2}, "flags", "technique C"),
])
def test_a_cell_outside_one_dimension_says_so_and_is_wider(change, dimension, words):
    base = predict(cell(), root=REPO)
    p = predict(cell(**change), root=REPO)
    assert p.outside == (dimension,) and len(p.notes) == 1 and words in p.notes[0]
    assert p.width > base.width


def test_a_platform_never_calibrated_takes_its_link_kinds_width():
    widths = {k: v["value"] for k, v in interval.load(REPO)["widths"].items()}
    a800 = predict(cell(platform="a800", gpus=8), root=REPO)
    assert set(a800.outside) == {"platform", "gpus"} and "platform a800 is not calibrated" in a800.notes[0]
    assert a800.width == pytest.approx(interval.combine(widths, ["platform_nvlink", "gpus"]))
    rtx = predict(cell(platform="rtx4090", technique="Q", batch_size=1, gpus=2), root=REPO)
    assert rtx.outside == ("platform",) and rtx.width == pytest.approx(widths["platform_pcie"])
    # a platform file that shares a calibrated platform's hardware (same_as) is not outside
    assert "platform" not in predict(cell(platform="h200x8", gpus=4), root=REPO).outside


def test_outside_reads_what_the_records_cover():
    covered = {"platforms": ["h100"], "gpus": [1, 2], "seq_len": [512, 2048], "vocab_size": [32000, 32000],
               "architecture": ["llama"], "params": [6.0, 14.0], "flags": ["F", "Z3"], "adapters": []}
    out = interval.outside(cell(platform="h100", technique="F+R+Z3", seq_len=350, gpus=1), covered, REPO)
    assert set(out) == {"seq_len", "flags"} and "R" in out["flags"]
    out = interval.outside(cell(platform="h100", model_name="llama2-70b", technique="L", stage="finetune",
                                seq_len=1024), covered, REPO)
    assert set(out) == {"params", "flags"} and "lora" in out["flags"]


def test_a_backend_on_more_gpus_than_its_own_records_gets_the_gpu_width():
    """FSDP2 records from one GPU only: an FSDP2 cell on 2 GPUs is outside (its collectives
    are untested), a DeepSpeed one on 2 GPUs is not."""
    records = pd.DataFrame({"platform": ["h200"] * 3, "model": ["llama2-7b"] * 3, "technique": ["Z3"] * 3,
                            "gpus": [1, 4, 1], "seq_len": [350] * 3, "backend": ["deepspeed", "deepspeed", "fsdp2"]})
    covered = interval.covered_by(records, REPO)
    assert covered["gpus_by_backend"] == {"deepspeed": [1, 4], "fsdp2": [1, 1]}
    assert "gpus" not in interval.outside(cell(platform="h200", technique="Z3", gpus=2), covered, REPO)
    out = interval.outside(cell(platform="h200", technique="Z3", gpus=2, backend="fsdp2"), covered, REPO)
    assert set(out) == {"gpus"} and "more than the 1 of the fsdp2 calibration records" in out["gpus"]
    assert interval.outside(cell(platform="h200", technique="Z3", gpus=1, backend="fsdp2"), covered, REPO) == {}


def test_covered_by_fixture_records():
    records = pd.DataFrame({"platform": ["h100", "h200", "h200"], "model": ["llama2-7b", "llama2-13b", "llama2-7b"],
                            "technique": ["F+Z3", "QL+F", "Z2+O"], "gpus": [1, 2, 1], "seq_len": [350, 350, 512]})
    c = interval.covered_by(records, REPO)
    assert c["platforms"] == ["h100", "h200"] and c["gpus"] == [1, 2] and c["seq_len"] == [350, 512]
    assert c["flags"] == ["F", "O", "Q", "Z2", "Z3"] and c["adapters"] == ["lora"] and c["architecture"] == ["llama"]
    assert c["params"][0] < 7 < 12 < c["params"][1] < 14


def test_the_interval_file_has_a_value_and_a_source_for_every_width(tmp_path):
    data = interval.load(REPO)
    assert 0 < data["quantile"] < 1
    for name, entry in data["widths"].items():
        assert entry["value"] > 0 and entry["source"], name
    assert data["widths"]["platform_pcie"]["value"] >= data["widths"]["in_range"]["value"]
    broken = yaml.safe_load((REPO / interval.INTERVAL_FILE).read_text())
    del broken["widths"]["gpus"]["source"]
    (tmp_path / interval.INTERVAL_FILE).parent.mkdir(parents=True)
    (tmp_path / interval.INTERVAL_FILE).write_text(yaml.safe_dump(broken))
    with pytest.raises(ConfigError, match="widths.gpus"):
        interval.load(tmp_path)


def test_a_prediction_scaled_from_a_measurement():
    at, measured_at = cell(batch_size=16), cell(batch_size=4)
    p = interval.anchored(at, measured_at, 5000.0, root=REPO)
    consts = model.calibrated_constants(REPO)
    ratio = model.tokens_per_s(at, consts, REPO) / model.tokens_per_s(measured_at, consts, REPO)
    assert p.value == pytest.approx(5000.0 * ratio) and "scaled from 5,000 tokens/s" in p.notes[0]
    assert interval.anchored(measured_at, measured_at, 5000.0, root=REPO).value == pytest.approx(5000.0)
    # a platform outside the calibration: the ratio cancels its level, so the in-range width
    far = interval.anchored(cell(platform="a800", gpus=8, batch_size=16), cell(platform="a800", gpus=8, batch_size=4),
                            5000.0, root=REPO)
    assert far.outside == () and far.width == pytest.approx(predict(cell(), root=REPO).width)
    # never above the compute bound, however fast the measurement
    fast = interval.anchored(at, measured_at, 1e9, root=REPO)
    parts = model.terms(at, consts, REPO)
    assert fast.value == pytest.approx(at.tokens_per_step / (parts["gemm"] + parts["recompute"]))
    assert "compute bound" in fast.notes[0]
