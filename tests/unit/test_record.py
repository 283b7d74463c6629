import json

import pytest

from llmbench import record
from llmbench.record import Metrics, Record


def make(status="ok", **kw):
    m = Metrics(tokens_per_s_mean=10.0, tokens_per_s_std=1.0, tokens_per_s_runs=(9.0, 11.0),
                step_time_s_runs=(0.1, 0.2), peak_rss_gib=0.5, mfu=None, mfu_formula="n/a")
    return Record(cell={"stage": "pretrain", "technique": "Z3"}, status=status, metrics=m if status == "ok" else Metrics(),
                  provenance={"git": {"sha": "abc"}}, **kw)


def test_round_trip(tmp_path):
    r = make()
    path = tmp_path / "a" / "record.json"
    record.write(r, path)
    assert record.read(path) == r
    assert Record.from_dict(json.loads(path.read_text())) == r
    assert json.loads(path.read_text())["schema_version"] == record.SCHEMA_VERSION


def test_non_ok_needs_reason():
    with pytest.raises(ValueError, match="needs a reason"):
        make(status="oom")
    assert make(status="oom", reason="CUDA out of memory").status == "oom"


def test_unknown_status_rejected():
    with pytest.raises(ValueError, match="status must be one of"):
        make(status="crashed", reason="x")


def test_other_schema_version_rejected(tmp_path):
    d = make().to_dict()
    d["schema_version"] = 999
    with pytest.raises(ValueError, match="schema_version 999"):
        Record.from_dict(d)


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "record.json"
    record.write(make(), path)
    before = path.read_text()
    with pytest.raises(ValueError):
        record.write_json_atomic(path, {"x": float("nan")})  # not valid JSON
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temp file left


def test_version_1_records_read_as_current(tmp_path):
    d = make().to_dict()
    d["schema_version"] = 1
    for key in ("summary", "samples"):
        d.pop(key)
    r = Record.from_dict(d)
    assert r.schema_version == record.SCHEMA_VERSION and r.summary == {} and r.samples == {}


def test_version_2_frontier_answers_read_as_skipped(tmp_path):
    """Version 2 wrote a max-batch probe the frontier answered (it ran nothing) as ok, with
    the peak the batch once had, or as oom; version 3 reads it as skipped, the answer in
    its provenance (the committed reference probes that are such records:
    tests/calibration/test_reference_records.py)."""
    answered = {**make(reason="known to run: batch 28 fit before").to_dict(), "schema_version": 2,
                "provenance": {"command": record.FRONTIER_COMMAND}}
    (tmp_path / "record.json").write_text(json.dumps(answered))
    r = record.read(tmp_path / "record.json")
    assert r.status == "skipped" and r.reason == answered["reason"] and r.metrics == Metrics()
    assert r.provenance["frontier"] == {"status": "ok", "peak_gib": answered["metrics"]["peak_rss_gib"]}
    assert Record.from_dict(r.to_dict()) == r  # version 3 reads its own skipped record as it is
    ran = {**make().to_dict(), "schema_version": 2}  # a version 2 record that ran is read unchanged
    assert Record.from_dict(ran) == make()
    oom = {**make("oom", reason="x").to_dict(), "schema_version": 2,
           "provenance": {"command": record.FRONTIER_COMMAND}}
    assert Record.from_dict(oom).status == "skipped" and Record.from_dict(oom).provenance["frontier"]["status"] == "oom"


def test_serving_record_round_trip(tmp_path):
    r = Record(cell={"stage": "serve", "engine": "vllm"}, status="ok",
               summary={"output_tokens_per_s": 123.4, "ttft_s_p50": 0.5},
               samples={"ttft_s": [0.1, 0.2], "ok": [True, False]})
    record.write(r, tmp_path / "record.json")
    assert record.read(tmp_path / "record.json") == r


def test_git_state_takes_the_senders_sha_over_a_copy_s_git(monkeypatch):
    """A tree copied to a GPU host may carry an older .git (the lent machines' did, so their
    records named a commit the code was not): LLMBENCH_GIT_SHA, when set, is the sha."""
    import re

    from llmbench import provenance

    monkeypatch.delenv("LLMBENCH_GIT_SHA", raising=False)
    own = provenance.git_state()
    assert re.fullmatch(r"[0-9a-f]{40}", own["sha"] or "") and "source" not in own
    monkeypatch.setenv("LLMBENCH_GIT_SHA", "f" * 40)
    assert provenance.git_state() == {"sha": "f" * 40, "dirty": None, "source": "LLMBENCH_GIT_SHA"}
