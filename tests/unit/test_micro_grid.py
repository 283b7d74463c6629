"""Microbenchmark cells in the grid and their tables: expansion, paths, bad input, Table XII."""

import copy

import pandas as pd
import pytest

from llmbench import grid
from llmbench.config import ConfigError
from llmbench.cells import MicroCell, cell_from_dict
from llmbench.micro.bench import columns, summarize
from llmbench.report import micro

BASE = {"protocol": {}, "micro": [{
    "platforms": ["a800"],
    "gemm": {"curves": {"n4096-k4096": {"n": 4096, "k": 4096, "m_start": 4096, "m_stop": 16384, "m_step": 512},
                        "unaligned": {"n": 11008, "k": 4096, "m_start": 4096, "m_stop": 16384, "m_step": 512, "m_offset": 13}},
             "shapes": {"table12-mlp": [[666, 11008, 4096], [10624, 11008, 4096]]}},
    "memcpy": {},
    "collectives": {"p2p": [True, False]},
}]}


def cfg(**block):
    c = copy.deepcopy(BASE)
    c["micro"][0].update(block)
    return c


def test_micro_cells_one_per_curve_shape_set_sweep_and_p2p_setting():
    g = grid.expand(cfg())
    assert all(isinstance(c, MicroCell) for c in g.cells)
    by = {(c.bench, c.case): c for c in g.cells}
    assert set(by) == {("gemm", "n4096-k4096"), ("gemm", "unaligned"), ("gemm", "table12-mlp"),
                       ("memcpy", "sweep"), ("collectives", "p2p"), ("collectives", "nop2p")}
    unaligned = by[("gemm", "unaligned")].params["shapes"]
    assert len(unaligned) == 25 and unaligned[0] == [4109, 11008, 4096] and unaligned[-1] == [16397, 11008, 4096]
    assert by[("memcpy", "sweep")].params["sizes_bytes"][:2] == [1024, 2048]
    assert by[("memcpy", "sweep")].params["sizes_bytes"][-1] == 2**28
    coll = by[("collectives", "nop2p")]
    assert coll.gpus == 8 and coll.params["p2p"] is False and len(coll.params["ops"]) == 5
    assert coll.record_path() == "results/runs/micro/a800/collectives/nop2p-g8/record.json"
    assert cell_from_dict(coll.to_dict()) == coll
    assert "model" not in g.spec(coll) and g.spec(coll)["platform"]["peak_bf16_tflops"] == 312


@pytest.mark.parametrize("edit,needle", [
    (dict(platforms=["cpu"]), "micro[0].collectives.ranks: platform 'cpu' has 1 GPU(s) per node"),
    (dict(platforms=["cpu"], collectives={"ranks": 2, "p2p": [False]}), "micro[0].collectives.p2p: false disables NCCL"),
    (dict(collectives={"ops": ["all_to_all"]}), "micro[0].collectives.ops[0]: 'all_to_all' is not allowed"),
    (dict(memcpy={"min_bytes": 4096, "max_bytes": 1024}), "micro[0].memcpy.min_bytes: 4096 > max_bytes 1024"),
    (dict(gemm={"curves": {"c": {"n": 1, "k": 1, "m_start": 9, "m_stop": 1, "m_step": 1}}}), "micro[0].gemm.curves.c: m_start 9 > m_stop 1"),
    (dict(gemm={"dtype": "int8"}), "micro[0].gemm.dtype: 'int8' is not allowed"),
    (dict(gemm={"shapes": {"s": [[1, 2]]}}), "micro[0].gemm.shapes.s[0]: [1, 2] is too short"),
])
def test_bad_micro_config_names_the_key(edit, needle):
    with pytest.raises(ConfigError) as exc:
        grid.expand(cfg(**edit))
    assert needle in str(exc.value)


def test_a_block_without_a_benchmark_is_rejected():
    with pytest.raises(ConfigError, match=r"micro\[0\]: names no benchmark"):
        grid.expand({"protocol": {}, "micro": [{"platforms": ["cpu"]}]})


def gemm_rows():
    return [{"m": 666, "n": 11008, "k": 4096, "dtype": "bfloat16", "aligned": False, "time_s": 0.3e-3,
             "tflops": 200.0, "pct_of_peak": 64.1, "correct": True},
            {"m": 10624, "n": 11008, "k": 4096, "dtype": "bfloat16", "aligned": True, "time_s": 3.5e-3,
             "tflops": 280.0, "pct_of_peak": 89.7, "correct": True}]


def test_summaries_and_table12_beside_the_paper():
    rows = gemm_rows()
    s = summarize("gemm", rows)
    assert s["best_tflops"] == 280.0 and s["best_shape"] == [10624, 11008, 4096] and s["all_correct"]
    assert summarize("collectives", [{"op": "all_reduce", "busbw_gb_per_s": 3.0, "correct": False}])["all_correct"] is False
    df = pd.DataFrame(columns(rows)).assign(platform="a800", bench="gemm", case="table12-mlp", gpus=1)
    built = micro.table12(df)
    table = built.long
    naive = table[table["method"] == "Naive"].iloc[0]
    assert naive.time_ms == pytest.approx(0.289) and naive.ours_time_ms == pytest.approx(0.3)
    shown = [list(r) for r in built.parts[0].frame.itertuples(index=False)]  # what the .md and .html show
    assert ["Naive", "666,11008,4096", "0.289", "66.6", "a800", "0.300", "64.1", "200.00"] in shown
    gemm = [list(r)[:6] for r in micro.gemm(df).parts[0].frame.itertuples(index=False)]
    assert ["a800", "table12-mlp", "2", "10624x11008x4096", "280.00", "89.7"] in gemm
