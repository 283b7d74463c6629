# Grid -> targets: thin wrappers over llmbench.grid; path templates and wildcard
# constraints come from llmbench.cells (the path grammar's one copy). The config is validated here, at
# parse time, before any job: a bad key or value stops the workflow with one message.
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))

from llmbench import cells as lbcells  # noqa: E402
from llmbench import estimate as lbestimate  # noqa: E402
from llmbench import grid as lbgrid  # noqa: E402
from llmbench.grid import paired as lbpaired  # noqa: E402
from llmbench import search as lbsearch  # noqa: E402
from llmbench.serve import engines as lbengines  # noqa: E402
from llmbench.config import ConfigError  # noqa: E402
from llmbench.report import catalog as lbcatalog  # noqa: E402
from llmbench.report import findings as lbfindings  # noqa: E402
from llmbench.report import runs as lbruns  # noqa: E402

try:
    GRID = lbgrid.expand(config, Path(workflow.basedir), source="config")
    # the findings are data: a bad entry stops the workflow here, naming it
    for _findings_file in lbcatalog.FINDINGS_FILES.values():
        lbfindings.load(Path(workflow.basedir) / _findings_file)
    # the serving engines' interpreters exist (what the grid can say without running)
    lbgrid.check_engine_python(GRID)
except ConfigError as exc:
    raise WorkflowError(f"invalid configuration (nothing was run):\n{exc}") from None

R = GRID.results_dir
# A paired set is one job whose outputs are its records (training.smk, serving.smk), and
# Snakemake deletes a job's present outputs before it runs it: a set with some records and
# not others would lose what was measured. Stop here instead, saying how to measure it
# again. Checked where the workflow is planned, not again inside each job (a set writes its
# records one by one).
if workflow.is_main_process and (incomplete := lbpaired.incomplete(GRID.sets, R)):
    raise WorkflowError("\n\n".join(i.message(R) for i in incomplete))
# Outputs: a cell's record (or a search's folder) at its pattern under R; its log and
# benchmark files named by the pattern's fields (CELL_DIR ...: "{platform}/{bench}/{case}-g{gpus}")
RECORD = f"{R}/{lbcells.RECORD_PATTERN}"
NODES_RECORD = f"{R}/{lbcells.NODES_RECORD_PATTERN}"
SERVE_RECORD = f"{R}/{lbcells.SERVE_RECORD_PATTERN}"
MICRO_RECORD = f"{R}/{lbcells.MICRO_RECORD_PATTERN}"
SEARCH_FOLDER = f"{R}/{lbcells.SEARCH_PATTERN}"
CELL_DIR = lbcells.cell_dir(lbcells.RECORD_PATTERN)
NODES_CELL_DIR = lbcells.cell_dir(lbcells.NODES_RECORD_PATTERN)
SERVE_CELL_DIR = lbcells.cell_dir(lbcells.SERVE_RECORD_PATTERN)
MICRO_CELL_DIR = lbcells.cell_dir(lbcells.MICRO_RECORD_PATTERN)
SEARCH_DIR = lbcells.cell_dir(lbcells.SEARCH_PATTERN)
# Every table and figure, its report section and its inputs: llmbench/report/catalog.py.
# The findings table has a rule of its own (it also writes the ranked missing cells); every
# other table is one job of build_table.
TABLES = lbcatalog.names("table")
FIGURES = lbcatalog.names("figure")
BUILT_TABLES = [t for t in TABLES if t != "findings"]


wildcard_constraints:
    **lbcells.WILDCARD_CONSTRAINTS,
    table="|".join(BUILT_TABLES),
    figure="|".join(FIGURES),
    slice="|".join(lbcatalog.SLICES),
    sample="|".join(lbcatalog.SAMPLES),


def evidence_dirs():
    """The other results folders this config reads (evidence_dirs: the combined view). A
    pattern that matches no folder with records is an error, before any job."""
    out = []
    for pattern in config.get("evidence_dirs") or []:
        dirs = sorted(p for p in Path().glob(pattern) if p.is_dir() and (p / "runs").is_dir()
                      and p.resolve() != Path(R).resolve())
        if not dirs:
            raise WorkflowError(f"evidence_dirs: {pattern!r} matches no results folder with a runs/ folder")
        out += dirs
    return out


def evidence_records(stage=None):
    """Records of the other results folders this config reads (evidence_dirs), or those of
    one stage (its cells and its max-batch searches' probes)."""
    out = []
    for d in evidence_dirs():
        folders = [d / f for f in lbcells.record_dirs(stage)]
        out += sorted(str(p) for f in folders if f.is_dir() for p in f.rglob("record.json"))
    return out


def evidence_searches():
    """The max-batch searches the other results folders hold (their folders with a summary),
    one folder per search where several hold it (llmbench.report.runs.choose_searches)."""
    folders = [str(p.parent) for d in evidence_dirs()
               for p in sorted(d.glob(lbcells.glob(lbcells.SEARCH_SUMMARY_PATTERN)))]
    return lbruns.choose_searches(folders)


def evidence_measured():
    """The training cells of the other results folders (not the searches' probes): the
    cells their searches measured are among them, for the search table."""
    return [p for s in lbcells.SEARCH_STAGES for p in evidence_records(s)
            if not lbcells.parse(p, (lbcells.PROBE_RECORD_PATTERN,))]


def slice_records(wildcards):
    """Every record of one stage of the tidy table (tables/records-<stage>.csv): the grid's
    and the other results folders'; a training stage adds the microbenchmark records (MFU
    against the GEMM ceiling measured on the same platform)."""
    stages = [wildcards.slice] + (["micro"] if wildcards.slice in lbcells.SEARCH_STAGES else [])
    return [p for s in stages for p in records(s) + evidence_records(s)]


def sample_records(wildcards):
    """The records whose samples a per-row table holds (requests: serving, micro, profile)."""
    stage = lbcatalog.SAMPLES[wildcards.sample]
    return records(stage) + evidence_records(stage)


def records(stage=None):
    """Every cell's record, or one stage's (rule all lists each, so a deleted one reruns)."""
    return [c.record_path(R) for c in GRID.cells if stage in (None, c.stage)]


def searched_records(stage=None):
    """The cells the max-batch searches measure, at the batch each found (known once the
    search has run: Snakemake re-evaluates this after the checkpoint), and those measured
    at a larger batch that ran out of memory (lbsearch.measured_batch: the next run asks
    for the batch below, once that record exists)."""
    out = []
    for s in GRID.searches:
        if stage in (None, s.cell.stage):
            folder = checkpoints.search_max_batch.get(**s.key).output.dir
            batches = lbsearch.measured_out_of_memory(folder) + [lbsearch.measured_batch(folder)]
            out += [s.measured(b).record_path(R) for b in batches if b]
    return out


def search_folders(stage=None):
    """The searches' folders. Rules that read searched_records() list these as plain inputs
    too: an input function stops at the first unfinished checkpoint, so without them
    Snakemake would learn of (and run) one search at a time."""
    return [s.record_path(R) for s in GRID.searches if stage in (None, s.cell.stage)]


def table_targets():
    """The tidy table (whole and by stage), the per-row tables, every catalog table (CSV,
    Markdown, HTML), what to run next and the findings' checks as numbers."""
    return (
        [f"{R}/tables/records.csv", f"{R}/tables/records.parquet", f"{R}/tables/records-superseded.csv"]
        + [f"{R}/tables/records-{s}.csv" for s in lbcatalog.SLICES]
        + [f"{R}/tables/{s}.parquet" for s in lbcatalog.SAMPLES]
        + [f"{R}/tables/{t}.{ext}" for t in TABLES for ext in ("csv", "md", "html")]
        + [f"{R}/tables/findings-missing.csv", f"{R}/tables/findings-checks.csv"]
    )


def findings_targets():
    return [f"{R}/tables/findings.{ext}" for ext in ("csv", "md", "html")] + [
        f"{R}/tables/findings-missing.csv", f"{R}/tables/findings-checks.csv"]


def figure_targets():
    return [f"{R}/figures/{f}.{ext}" for f in FIGURES for ext in ("html", "svg", "png")]


def table_inputs(wildcards):
    """A table's inputs as the catalog names them; the search table's searches as plain
    inputs (the records they measured come from measured_inputs, after the checkpoints)."""
    entry = lbcatalog.get("table", wildcards.table)
    out = lbcatalog.inputs(entry, R)
    if "searches" in entry.reads:
        out["searches"] = search_folders() + evidence_searches()
    return out


def measured_inputs(wildcards):
    """The records the max-batch searches measured, for the tables that read the searches
    (the other results folders' training cells among them: evidence_measured)."""
    if "searches" not in lbcatalog.get("table", wildcards.table).reads:
        return []
    return searched_records() + evidence_measured()


def figure_inputs(wildcards):
    """The tables a figure plots (catalog): a record reaches a figure only through them; and
    the JavaScript bundle its HTML page inlines (rule vega_bundle)."""
    return {**lbcatalog.inputs(lbcatalog.get("figure", wildcards.figure), R),
            "bundle": ancient(f"{R}/figures/vega-embed.js")}


def table_section(wildcards):
    """The report section of a table (catalog)."""
    return lbcatalog.get("table", wildcards.table).section


def figure_section(wildcards):
    """The report section of a figure (catalog)."""
    return lbcatalog.get("figure", wildcards.figure).section


def all_targets():
    return records() + table_targets() + figure_targets()


def cell_of(wildcards):
    return GRID.find(**dict(wildcards.items()))


def cell_spec(wildcards):
    """The resolved cell config the runner gets (also the params rerun trigger)."""
    return GRID.spec(cell_of(wildcards))


def platform_of(wildcards):
    return GRID.platforms[wildcards.platform]


def threads_of(platform, gpus=1, nodes=1):
    """CPUs a training cell holds on each of its nodes. A GPU platform's cpus_per_task is
    the job's share of the node, split among its ranks; on a CPU platform each rank *is* a
    process that computes, so a cell of n ranks on a node holds n x cpus_per_task there
    (else two cells share cores and a 2-rank cell measures contention, not scaling).
    Snakemake caps it at --cores."""
    platform = GRID.platforms[platform]
    per_task = platform.slurm.get("cpus_per_task", 1)
    if platform.accelerator == "cpu":
        return per_task * int(gpus) // int(nodes)
    return per_task


def cell_threads(wildcards):
    """CPUs a training cell holds on each of its nodes (threads_of)."""
    return threads_of(wildcards.platform, getattr(wildcards, "gpus", 1), getattr(wildcards, "nodes", 1))


def runtime_min(cell):
    """Slurm time limit of a training cell: twice its predicted repeats plus slack, within a
    floor and the bound where every repeat uses its whole timeout, which is also the limit
    where the throughput model cannot predict the cell (llmbench.estimate.runtime_min)."""
    return lbestimate.runtime_min(cell, GRID.models.get(cell.model))


def cell_runtime_min(wildcards):
    """Slurm time limit of a training cell's job (runtime_min)."""
    return runtime_min(cell_of(wildcards))


def set_specs(pset):
    """The resolved configs of a paired set's cells, in the set's order (also its job's
    params rerun trigger)."""
    return [GRID.spec(c) for c in pset.cells]


def set_threads(pset):
    """The CPUs each cell of a paired set holds, as it would alone (threads_of); its job
    holds the largest."""
    return [threads_of(c.platform, c.gpus) for c in pset.cells]


def set_runtime_min(pset):
    """Slurm time limit of a paired set's job: its cells' (runtime_min) one after the other."""
    return sum(runtime_min(c) for c in pset.cells)


def set_slurm(pset, key, default=None):
    """A Slurm resource of a paired set's platform (profiles may override it)."""
    return GRID.platforms[pset.platform].slurm.get(key) or default


def model_spec(wildcards):
    """The model's dimensions (also the model directory's params rerun trigger)."""
    return GRID.models[wildcards.model].to_dict()


def model_dir_threads(wildcards):
    """A model directory's threads (build_model_dir): 8 to fill a billion-parameter
    model's random weights, one tensor a thread; one for a smaller model, which then builds
    beside the running cells rather than holding the machine."""
    return 8 if GRID.models[wildcards.model].param_counts()["total"] >= 10**9 else 1


def serve_model_dir(wildcards):
    """The model directory a serving cell's engine loads."""
    return serve_model_dir_of(cell_of(wildcards))


def serve_model_dir_of(cell):
    """The model directory (built by build_model_dir) that a serving cell's engine loads."""
    return f"{R}/models/{cell.model}/{cell.weights}"


def serve_env_file(wildcards):
    """The engine's environment file (used with --software-deployment-method conda)."""
    return f"../../{lbengines.ENGINES[wildcards.engine].env_file}"


def exclusive_threads(wildcards):
    """A serving or microbenchmark cell on a CPU platform takes the whole machine: beside
    another cell it would measure their contention. On GPUs: the platform's CPUs per job."""
    if platform_of(wildcards).accelerator == "cpu":
        return min(workflow.cores, os.cpu_count() or 1)
    return cell_threads(wildcards)


def search_of(wildcards):
    return GRID.find_search(**dict(wildcards.items()))


def search_spec(wildcards):
    """The search's resolved config (its measured cell's spec, bounds and probe protocol)."""
    return GRID.spec(search_of(wildcards))


def search_frontier(wildcards):
    """The search's OOM frontier file (not an output: a rerun search must not delete it)."""
    return search_of(wildcards).frontier_path(R)


def search_runtime_min(wildcards):
    """Slurm time limit: every probe may use its full timeout, plus start-up slack."""
    s = search_of(wildcards)
    return lbsearch.bound(s.max) * (s.probe_protocol.timeout_s // 60 + 1) + 10


def micro_runtime_min(wildcards):
    """Slurm time limit: the cell's timeout and slack."""
    return cell_of(wildcards).timeout_s // 60 + 10


def serve_runtime_min(wildcards):
    """Slurm time limit of a serving cell's job: start-up, the load's timeout, and slack
    (llmbench.estimate.serve_runtime_min)."""
    return lbestimate.serve_runtime_min(cell_of(wildcards))


def serving_sets():
    """The paired sets of serving cells (serving.smk: one rule each); the others are
    training sets (training.smk)."""
    return [s for s in GRID.sets if s.serving]


def set_model_dirs(pset):
    """The model directories a serving set's engines load, each once."""
    return sorted({serve_model_dir_of(c) for c in pset.cells})


def set_server_logs(pset):
    """Each engine's log of a serving set, at its cell's name as run_serving_cell has it."""
    return [f"{R}/logs/serve/{lbcells.cell_dir(c.pattern).format(**c.key)}.server.log" for c in pset.cells]


def serve_set_threads(pset):
    """A serving set's CPUs: the whole machine on a CPU platform (exclusive_threads), else
    the platform's CPUs per job."""
    if GRID.platforms[pset.platform].accelerator == "cpu":
        return min(workflow.cores, os.cpu_count() or 1)
    return threads_of(pset.platform)


def serve_set_runtime_min(pset):
    """Slurm time limit of a serving set's job: its runs one after the other, an engine start
    where the set makes one (llmbench.estimate.serve_set_runtime_min)."""
    return lbestimate.serve_set_runtime_min(pset.cells, pset.plan()["rounds"], pset.share_engine)


def serve_set_env_file(pset):
    """The environment file of a serving set's job (--software-deployment-method conda):
    its first cell's engine's. An engine of the set with another environment runs from
    its engine_python."""
    return f"../../{lbengines.ENGINES[pset.cells[0].engine].env_file}"


def slurm_resource(key, default=None):
    """A resource taken from the cell's platform file (profiles may override it)."""
    return lambda wildcards: platform_of(wildcards).slurm.get(key) or default
