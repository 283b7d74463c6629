"""The paper's numbers in config/reference/*.csv, checked against the paper itself.

The paper is ../shared/paper/paper.md beside the repository (CI provides it there): a Markdown
conversion of the PDF whose tables are tab-separated lines under their caption ("TABLE III: ...").
Each table is parsed here and compared cell by cell with the CSV that transcribes it; the numbers
the paper prints only in its text (prose.csv, serving_text.csv, fig4.csv) are checked through
their quote, which must be a verbatim passage of the paper that holds the value. So changing any
transcribed number, or dropping or adding a row, makes a test here fail.

``paper_text()`` and ``normalise()`` are meant for other tests that quote the paper
(config/reference/findings.yaml).
"""

from __future__ import annotations

import csv
import functools
import re
from pathlib import Path

import pytest

from llmbench.config import REPO_ROOT
from llmbench.report import reference

PAPER = REPO_ROOT.parent / "shared" / "paper" / "paper.md"
REFERENCE = REPO_ROOT / "config" / "reference"
PLATFORMS = ("a800", "rtx4090", "rtx3090", "rtx3090-nonvlink")  # the column groups of Tables III, IV, IX
MODELS = {"7B": "llama2-7b", "13B": "llama2-13b", "70B": "llama2-70b",
          "Llama2-7B": "llama2-7b", "Llama2-13B": "llama2-13b"}
#: number words the text uses for a value (prose.csv's "half", serving_text.csv's "doubling")
WORDS = {"half": 0.5, "doubling": 2.0, "twice": 2.0, "three": 3.0, "ten": 10.0}
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")


def normalise(text: str) -> str:
    """Whitespace runs as one space: the PDF's line and page breaks fall anywhere in a sentence."""
    return " ".join(text.split())


@functools.cache
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def paper_text() -> str:
    """The paper's text (paper.md as converted); skips the calling test where it is absent."""
    if not PAPER.is_file():
        pytest.skip(f"the paper is not at {PAPER} (../shared/paper/paper.md beside the repository)")
    return _read(PAPER)


@functools.cache
def _normalised_paper() -> str:
    return normalise(paper_text())


def caption(roman: str) -> str:
    """The caption line of Table <roman> ("TABLE <roman>: ...")."""
    hits = [line for line in paper_text().splitlines() if line.startswith(f"TABLE {roman}:")]
    assert len(hits) == 1, f"Table {roman}: {len(hits)} captions in paper.md"
    return hits[0]


def table_rows(roman: str) -> list[list[str]]:
    """Table <roman>'s lines as lists of cells: the tab-separated lines after its caption."""
    lines = paper_text().splitlines()
    start = lines.index(caption(roman)) + 1
    rows: list[list[str]] = []
    for line in lines[start:]:
        if "\t" in line:
            rows.append([c.strip() for c in line.split("\t")])
        elif rows:
            break
    assert rows, f"Table {roman}: no tab-separated lines under its caption"
    return rows


def number(cell: str) -> float:
    """A printed number: '58.' and '.07' as printed, '4.9%' without its sign."""
    return float(cell.strip().rstrip("%"))


def measure(cell: str) -> tuple[float, float]:
    """'7488.3 <sub>.07</sub>': the throughput and the standard deviation printed under it."""
    m = re.fullmatch(r"(\S+) <sub>(\S+)</sub>", cell)
    assert m, f"not a 'value <sub>std</sub>' cell: {cell!r}"
    return number(m[1]), number(m[2])


def rows_of(name: str) -> list[dict[str, str]]:
    """config/reference/<name>.csv as strings (empty: not printed)."""
    with (REFERENCE / f"{name}.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# The expected rows of each table file, from the paper: a dict per row of column -> value
# (a float compares numerically, a str exactly, None must be empty).

def _grid(roman: str, per_platform: int, batch_size: int | None) -> list[dict]:
    """Tables III, IV and IX: per (model, method) row, a (tokens/s <sub>std</sub>, M (GB)[, BS])
    group per platform; '-' is out of memory."""
    rows = table_rows(roman)
    assert [c for c in rows[1] if c] == ["A800", "RTX4090", "RTX3090 w/ NVLink", "RTX3090 w/o NVLink"]
    out, model, pending = [], None, []
    for cells in rows[3:]:
        label, method, rest = cells[0], cells[1], cells[2:]
        if label:
            pending.append([MODELS[label], LABEL_DELAY.get((roman, label), 0)])
        if pending and pending[0][1] == 0:
            model = pending.pop(0)[0]
        for p in pending:
            p[1] -= 1
        assert len(rest) == per_platform * len(PLATFORMS), (roman, cells)
        for i, platform in enumerate(PLATFORMS):
            group = rest[i * per_platform:(i + 1) * per_platform]
            row = {"table": roman, "model": model, "method": method, "platform": platform}
            if group[0] == "-":
                assert set(group) == {"-"}, (roman, cells)
                row.update(status="oom", tokens_per_s=None, tokens_per_s_std=None, mem_gb=None,
                           batch_size=batch_size)
            else:
                tps, std = measure(group[0])
                row.update(status="ok", tokens_per_s=tps, tokens_per_s_std=std, mem_gb=number(group[1]),
                           batch_size=number(group[2]) if per_platform == 3 else batch_size)
            out.append(row)
    return out


#: a row-group label printed this many rows before the group starts. Table IX prints "70B" on
#: the row of 13B's L+F+R+Z3: 13B's methods follow 7B's order, which ends with L+F+R+Z3 and
#: L+F+R+Z3+O, 70B lists both again below, and 10.8 GB (A800, ZeRO-3) cannot hold 70B's bf16
#: weights (17.5 GB a GPU). table9.csv's notes say so.
LABEL_DELAY = {("IX", "70B"): 2}


def expected_table3() -> list[dict]:
    assert "We set the batch size to 1" in caption("III")
    return _grid("III", 2, 1)


def expected_table4() -> list[dict]:
    return _grid("IV", 3, None)


def expected_table9() -> list[dict]:
    assert "We set the batch size to 1" in caption("IX")
    return _grid("IX", 2, 1)


def expected_table1() -> list[dict]:
    rows = {cells[0]: cells[1:] for cells in table_rows("I")}
    assert rows["Platform"] == ["A800", "RTX4090", "RTX3090"]
    assert "Each platform has 8x Nvidia GPUs" in caption("I")
    out = []
    for i, platform in enumerate(("a800", "rtx4090", "rtx3090")):
        gpu = re.fullmatch(r"(\S+)-(\d+)G @ ([\d.]+)GHz", rows["GPU"][i])
        cpu = re.fullmatch(r"(\d)x (.+) @ ([\d.]+)GHz", rows["CPU"][i])
        mem = re.fullmatch(r"(\d+)(GiB|GB)(?: (\S+))?", rows["Memory"][i])
        assert gpu and cpu and mem, (platform, rows)
        out.append({"table": "I", "platform": platform, "gpu": gpu[1], "gpu_memory_gb": number(gpu[2]),
                    "gpu_clock_ghz": number(gpu[3]), "cpu": cpu[2], "cpu_sockets": number(cpu[1]),
                    "cpu_clock_ghz": number(cpu[3]), "host_memory": number(mem[1]), "host_memory_unit": mem[2],
                    "host_memory_type": mem[3], "interconnect": rows["Network"][i], "gpus_per_node": 8.0})
    return out


def expected_table2() -> list[dict]:
    assert "pre-training Llama2-7B on the 8-GPU A800-80GB platform" in caption("II")
    out, framework = [], None
    for cells in table_rows("II")[1:]:
        framework = cells[0].lower() or framework
        out.append({"table": "II", "framework": framework, "platform": "a800", "model": "llama2-7b",
                    "batch_size": number(cells[1]), "tokens_per_s": number(cells[2]), "tokens_per_s_std": None,
                    "mem_gb": number(cells[3]), "status": "ok"})
    return out


def _by_label(roman: str) -> tuple[list[str], dict[str, list[str]]]:
    """A table of labelled rows under a header row: (the header's cells, label -> cells)."""
    rows = table_rows(roman)
    return rows[0][1:], {cells[0]: cells[1:] for cells in rows[1:]}


def expected_profile_phases() -> list[dict]:
    gemm_head, gemm = _by_label("XIII")
    assert gemm_head == ["Forward", "Backward"]
    out = []
    for roman, method, batch, share, gemm_row in (("V", "Naive", 2, "Breakdown in one step(%)", "Naive"),
                                                   ("VII", "R", 32, "Percentage(%)", "Recomputation")):
        assert "Llama2-7B" in caption(roman)
        head, rows = _by_label(roman)
        for i, phase in enumerate(head):
            phase = phase.rstrip("#").lower()
            out.append({"table": roman, "model": "llama2-7b", "method": method, "platform": "a800",
                        "batch_size": batch, "phase": phase, "wall_ms": number(rows["Overall (ms)"][i]),
                        "share_pct": number(rows[share][i]), "kernel_ms": number(rows["Compute kernel (ms)"][i]),
                        "gemm_share_pct": number(gemm[gemm_row][i]) if phase != "optimizer" else None})
    return out


#: Table VI's module names (the CSV's names are the report's module kinds)
MODULES = {"Embedding": "embedding", "QKV": "qkv", "RoPE": "rope", "Bmm0": "attn_scores", "Softmax": "softmax",
           "Bmm1": "attn_values", "Output": "output", "MLP": "mlp", "RMSNorm": "rmsnorm", "Linear": "lm_head",
           "non-overlapping communication": "communication"}


def expected_profile_modules() -> list[dict]:
    rows = table_rows("VI")
    assert rows[0] == ["", "Module", "Time(ms)", "Percentage(%)", "", "Module", "Time(ms)", "Percentage(%)"]
    out = []
    for half, phase in ((slice(0, 4), "forward"), (slice(4, 8), "backward")):
        for cells in rows[1:]:
            _, module, time_ms, pct = cells[half]
            if module == "-":
                continue
            out.append({"table": "VI", "model": "llama2-7b", "method": "Naive", "platform": "a800", "batch_size": 2,
                        "phase": phase, "module": MODULES[module], "time_ms": number(time_ms),
                        "share_pct": number(pct)})
    return out


def expected_profile_attention() -> list[dict]:
    head, rows = _by_label("VIII")
    return [{"table": "VIII", "model": "llama2-7b", "method": "F", "platform": "a800", "batch_size": 2,
             "phase": phase.lower(), "naive_ms": number(rows["Naive(ms)"][i]),
             "flash_ms": number(rows["FlashAttention(ms)"][i]), "improvement_pct": number(rows["Improvement(%)"][i])}
            for i, phase in enumerate(head)]


#: Table X's rows: (section, task) -> group; a section's own line is its subtotal
KERNEL_GROUPS = {("Comp.", ""): "comp", ("Comp.", "Element-Wise"): "element_wise", ("Comp.", "RoPE"): "rope",
                 ("Comp.", "Triton"): "attention", ("Comp.", "GeMM"): "gemm", ("Comp.", "RMSNorm"): "rmsnorm",
                 ("Comp.", "Other"): "comp_other", ("Comm.", ""): "comm", ("Comm.", "AllReduce"): "comm_allreduce",
                 ("Comm.", "AllGather"): "comm_allgather", ("Comm.", "Other"): "comm_other", ("Other", ""): "other"}
TIMELINE_GROUPS = {"Before Transformer": "before", "Transformer": "transformer", "32 x Attention": "attention",
                   "32 x FFN": "ffn", "After Transformer": "after"}


def expected_profile_serve() -> list[dict]:
    assert "Llama2-7B running LightLLM on A800" in caption("X")
    assert "Llama2-7B using LightLLM on A800" in caption("XI")
    out = []

    def add(roman, view, group, parent, time_ms, pct):
        out.append({"table": roman, "view": view, "group": group, "parent": parent, "time_ms": number(time_ms),
                    "pct": number(pct)})

    rows = table_rows("X")
    assert rows[0] == ["", "", "Task", "Time(ms)", "", "Percentage(%)", ""]
    section = None
    for _, sec, task, sub_ms, ms, sub_pct, pct in rows[1:]:
        section = sec or section
        if sub_ms:  # the section's subtotal, printed on its first line
            add("X", "kernels", KERNEL_GROUPS[(section, "")], None, sub_ms, sub_pct)
        if task:
            add("X", "kernels", KERNEL_GROUPS[(section, task)], KERNEL_GROUPS[(section, "")], ms, pct)
    rows = table_rows("XI")
    assert rows[0] == ["Timeline", "", "Time(ms)", "", "Percentage(%)", ""]
    for part, sub, sub_ms, ms, sub_pct, pct in rows[1:]:
        if part:
            add("XI", "timeline", TIMELINE_GROUPS[part], None, sub_ms, sub_pct)
        if sub:
            add("XI", "timeline", TIMELINE_GROUPS[sub], "transformer", ms, pct)
    return out


def expected_profile_comm() -> list[dict]:
    out = []
    for roman, kind in (("XIV", "memcpy"), ("XVI", "comm")):
        assert "batch size of 32" in caption(roman) and "in A800" in caption(roman)
        method = None
        for zero, model, time_s, pct in table_rows(roman)[1:]:
            method = zero or method
            out.append({"table": roman, "kind": kind, "model": MODELS[model], "method": method, "batch_size": 32,
                        "time_s": number(time_s), "pct": number(pct)})
    head, *rows = table_rows("XV")
    assert head[0] == "Llama2-7B"
    out += [{"table": "XV", "kind": "allreduce", "model": "llama2-7b", "method": method, "batch_size": None,
             "time_s": number(time_s), "pct": number(pct)} for method, time_s, pct in rows]
    return out


def expected_table12() -> list[dict]:
    assert "average of 320 measurements" in caption("XII")
    head, rows = _by_label("XII")
    out = []
    for i, method in enumerate(head):
        m, n, k = (number(x) for x in rows["Shape( $M,N,K$ )"][i].split(","))
        out.append({"table": "XII", "model": "llama2-7b", "method": {"Recomputation": "R"}.get(method, method),
                    "platform": "a800", "m": m, "n": n, "k": k, "time_ms": number(rows["Time(ms)"][i]),
                    "peak_pct": number(rows["Peak(%)"][i]), "measurements": 320, "status": "ok"})
    return out


#: file -> (its key columns, the rows the paper prints)
TABLES = {
    "table1": (("platform",), expected_table1),
    "table2": (("framework", "batch_size"), expected_table2),
    "table3": (("model", "method", "platform"), expected_table3),
    "table4": (("model", "method", "platform"), expected_table4),
    "table9": (("model", "method", "platform"), expected_table9),
    "profile_phases": (("table", "phase"), expected_profile_phases),
    "profile_modules": (("phase", "module"), expected_profile_modules),
    "profile_attention": (("phase",), expected_profile_attention),
    "profile_serve": (("view", "group"), expected_profile_serve),
    "profile_comm": (("table", "model", "method"), expected_profile_comm),
    "table12": (("method",), expected_table12),
}
QUOTED = ("prose", "serving_text", "fig4")


def _canon(value):
    """A cell for comparison: a number as a float, a word as itself, not printed as ''."""
    if value is None:
        return ""
    try:
        return float(value)
    except ValueError:
        return value


@pytest.mark.parametrize("name", list(TABLES))
def test_every_table_cell_is_the_papers(name):
    """Each CSV row is a printed row, each printed row is in the CSV, every value as printed."""
    key, expected = TABLES[name]
    want = {tuple(_canon(r[k]) for k in key): r for r in expected()}
    got = {tuple(_canon(r[k]) for k in key): r for r in rows_of(name)}
    assert len(want) == len(expected()), f"{name}: the paper's rows do not have unique keys {key}"
    assert len(got) == len(rows_of(name)), f"{name}: the CSV's rows do not have unique keys {key}"
    assert set(got) == set(want), (f"{name}: rows differ from the paper's: missing {set(want) - set(got)}, "
                                   f"extra {set(got) - set(want)}")
    wrong = [f"{k} {col}: csv {got[k][col]!r}, paper {value!r}" for k, row in want.items()
             for col, value in row.items() if _canon(got[k][col]) != _canon(value)]
    assert not wrong, f"{name}: {len(wrong)} value(s) differ from the paper:\n" + "\n".join(wrong)


def _values_in(quote: str) -> set[float]:
    found = {float(m.replace(",", "")) for m in NUMBER.findall(quote)}
    return found | {v for w, v in WORDS.items() if re.search(rf"\b{w}\b", quote, re.IGNORECASE)}


#: top-level sections by the headings of paper.md ("## IV. RESULTS ...", "#### IV. ...")
SECTION_HEADING = re.compile(r"^#+ (I|II|III|IV|V|VI|VII|VIII|IX)\. ", re.MULTILINE)


def _section_at(offset: int) -> str | None:
    """The top-level section (roman numeral) that holds the character at ``offset`` of paper.md."""
    section = None
    for m in SECTION_HEADING.finditer(paper_text()):
        if m.start() > offset:
            break
        section = m[1]
    return section


@pytest.mark.parametrize("name", QUOTED)
def test_every_quoted_value_is_in_its_quote(name):
    """Each quote is a passage of the paper (whitespace aside), in the section the row names
    (for text outside table and figure captions, which float), and it prints the row's value."""
    text = _normalised_paper()
    raw = paper_text()
    rows = rows_of(name)
    value_col = "efficiency_pct" if name == "fig4" else "value"
    wrong = []
    for i, r in enumerate(rows):
        quote = normalise(r["quote"])
        where = r.get("id") or f"row {i + 2}"
        if not quote or quote not in text:
            wrong.append(f"{where}: quote not in the paper: {r['quote']!r}")
            continue
        value = r[value_col]
        try:
            if value and float(value) not in _values_in(quote):
                wrong.append(f"{where}: {value} is not printed in its quote {quote!r}")
        except ValueError:  # a word (a status): printed as such
            if value.lower() not in quote.lower():
                wrong.append(f"{where}: {value!r} is not in its quote {quote!r}")
        if "section" in r:
            first = re.escape(quote.split(" ")[0])
            hit = re.search(r"\s+".join([first] + [re.escape(w) for w in quote.split(" ")[1:]]), raw)
            line = raw[raw.rfind("\n", 0, hit.start()) + 1:hit.start()]
            in_caption = line.startswith(("TABLE ", "Fig. "))
            if not in_caption and _section_at(hit.start()) != r["section"].split("-")[0]:
                wrong.append(f"{where}: quote is in Section {_section_at(hit.start())}, not {r['section']}")
    assert not wrong, f"{name}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("name", ("prose", "serving_text"))
def test_quoted_rows_have_stable_ids(name):
    ids = [r["id"] for r in rows_of(name)]
    assert len(set(ids)) == len(ids), [i for i in ids if ids.count(i) > 1]
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", i) for i in ids), ids


def test_every_reference_file_is_checked_here():
    """A new reference file needs a loader entry and a check against the paper."""
    files = {p.stem for p in REFERENCE.glob("*.csv")}
    assert files == set(reference.COLUMNS)
    assert files == set(TABLES) | set(QUOTED)


@pytest.mark.parametrize("name", sorted(reference.COLUMNS))
def test_every_row_has_the_columns_its_loader_expects(name):
    """Every row of every reference CSV has exactly the header's fields, the header has the
    loader's columns (reference.COLUMNS), and the loader reads it."""
    with (REFERENCE / f"{name}.csv").open(newline="", encoding="utf-8") as f:
        header, *rows = list(csv.reader(f))
    assert sorted(header) == sorted(reference.COLUMNS[name]), f"{name}.csv: columns {header}"
    short = [i + 2 for i, r in enumerate(rows) if len(r) != len(header)]
    assert not short, f"{name}.csv: line(s) {short} do not have {len(header)} fields"
    df = reference.load(name)
    assert len(df) == len(rows)


def test_flags_are_typos_with_a_reason():
    """``flag`` is empty or 'typo' (with the reason in the note); the paper's 640435 is flagged."""
    flagged = []
    for name in ("table2", "table3", "table4", "table9"):
        for r in rows_of(name):
            assert r["flag"] in ("", "typo"), (name, r)
            if r["flag"]:
                assert r["note"], (name, r)
                flagged.append((name, r["model"], r["method"], r["platform"], r["tokens_per_s"]))
    assert ("table4", "llama2-13b", "R+Z2+O", "a800", "640435") in flagged


@pytest.mark.parametrize("name", ("prose", "serving_text"))
def test_quoted_rows_name_known_platforms_models_engines(name):
    """The cells a row is about use the pipeline's names ('|' joins several)."""
    known = {"platform": set(PLATFORMS), "model": set(MODELS.values()), "engine": {"vllm", "lightllm", "tgi"}}
    wrong = [(r["id"], col, r[col]) for r in rows_of(name) for col, names in known.items()
             if r[col] and not set(r[col].split("|")) <= names]
    assert not wrong


def test_fig4_setup_is_the_texts():
    """fig4.csv's batch size, GPU count and efficiencies are the ones Section IV-A.2 prints (prose.csv)."""
    prose = {r["id"]: r for r in rows_of("prose")}
    for r in rows_of("fig4"):
        assert (r["model"], r["method"]) == (prose["fig4_batch_size"]["model"], prose["fig4_batch_size"]["method"])
        assert float(r["batch_size"]) == float(prose["fig4_batch_size"]["value"])
        assert float(r["gpus"]) == float(prose["fig4_gpus_to"]["value"])
        if r["efficiency_pct"]:
            assert float(r["efficiency_pct"]) == float(prose[f"fig4_efficiency_{r['platform']}"]["value"])
