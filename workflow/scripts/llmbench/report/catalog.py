"""Every table and figure of the report, once: its name (the path stem under tables/ or
figures/), its report section, its title and what it reads.

The workflow (workflow/rules/common.smk: targets, wildcard constraints, each rule's inputs
and report section), the builders (llmbench.report.tables, llmbench.report.figures) and the
tests all read this list; adding a table or figure is adding an entry here and its builder
(``tables.<name>`` or ``figures.<name>_chart``, dashes as underscores).

What an entry reads (``reads``) is named in one vocabulary, turned into paths by ``inputs``:
  tidy                             the tidy table of every record (tables/records.csv)
  superseded                       the records other runs of the same cells superseded
                                   (tables/records-superseded.csv; the findings pair from them)
  tidy:<stage>                     the tidy table's rows of one stage (tables/records-<stage>.csv,
                                   rebuilt only when a record of that stage changes)
  requests, micro, profile         the per-row tables of one stage each (tables/<name>.parquet:
                                   serving requests, microbenchmark points, profile rows)
  searches                         the max-batch searches' folders and the records they measured
                                   (known to the grid only: the workflow supplies them)
  findings                         config/reference/findings.yaml
  findings-ours                    config/findings/ours.yaml (our own findings)
  throughput                       the throughput model's fitted constants and interval widths
                                   (config/throughput/{constants,interval}.yaml: a refit rebuilds
                                   what predicts with them)
  reference:<file>                 config/reference/<file>.csv
  table:<name>                     tables/<name>.csv, another table of this catalog, or a CSV
                                   its rule writes beside it (BESIDE) (figures)
A figure reads the tables it plots, never the records: a new record rebuilds a figure only
through the tables it shows.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The report's sections in order; the verdict leads.
VERDICT = "1. The verdict: the paper's findings on this hardware"
PRETRAIN = "Pre-training (Tables II-IV, Fig. 4)"
FINETUNE = "Fine-tuning (Table IX)"
SERVING = "Serving (Figs. 6-10)"
MICRO = "Microbenchmarks (Figs. 11-15, Table XII)"
PROFILES = "Profiles (Tables V-VIII, X, XI, XIII-XVI, Fig. 5)"
MEMORY = "Memory model and advice (beyond the paper)"
STACKS = "Today's training stack: FSDP2 beside DeepSpeed (beyond the paper)"
SECTIONS = (VERDICT, PRETRAIN, FINETUNE, SERVING, MICRO, PROFILES, MEMORY, STACKS)

#: The tidy table and the per-row tables (name -> path under the results folder).
SOURCES = {"tidy": "tables/records.csv", "superseded": "tables/records-superseded.csv", "requests": "tables/requests.parquet",
           "micro": "tables/micro.parquet", "profile": "tables/profile.parquet"}
#: The stages whose rows of the tidy table a table may read alone (tables/records-<stage>.csv),
#: so a record of one stage rebuilds only the tables (and figures) of that stage.
SLICES = ("pretrain", "finetune", "serve", "profile")
#: Per-row table -> the stage whose records it holds.
SAMPLES = {"requests": "serve", "micro": "micro", "profile": "profile"}
#: Everything of config/reference that llmbench.report.paper_frame.frame reads (the paper's
#: numbers as tidy rows, under every paper table and the findings).
PAPER_FRAME = ("table2", "table3", "table4", "table9", "fig4", "table12", "profile_phases", "profile_attention",
               "profile_comm")
KINDS = ("table", "figure")
#: CSVs a table's rule writes beside the table itself (name -> that table), which a figure may
#: read as ``table:<name>``: the findings' checks, one row per check with its value and interval.
BESIDE = {"findings-checks": "findings", "findings-missing": "findings"}
#: The paper's findings, as data (llmbench.report.findings).
FINDINGS_FILE = "config/reference/findings.yaml"
#: Our own findings (today's stack against the paper's), judged by the same engine.
OURS_FILE = "config/findings/ours.yaml"
#: A findings vocabulary item -> its file.
FINDINGS_FILES = {"findings": FINDINGS_FILE, "findings-ours": OURS_FILE}
_REF = tuple(f"reference:{r}" for r in PAPER_FRAME)


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One table or figure of the report."""

    name: str
    """Path stem: tables/<name>.{csv,md,html} or figures/<name>.{html,svg,png}."""
    kind: str
    """'table' or 'figure'."""
    section: str
    """The report section it is shown under (one of SECTIONS)."""
    title: str
    """Its heading (a table's Markdown and HTML title, a figure's chart title)."""
    reads: tuple[str, ...]
    """What it is built from, in the vocabulary of this module's docstring."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.section not in SECTIONS:
            raise ValueError(f"{self.name}: section {self.section!r} is not one of SECTIONS")
        for r in self.reads:
            head, _, tail = r.partition(":")
            if not (r in SOURCES or r in ("searches", "throughput", *FINDINGS_FILES)
                    or (head in ("reference", "table") and tail)
                    or (head == "tidy" and tail in SLICES)):
                raise ValueError(f"{self.name}: reads {r!r}, which is not in the catalog's vocabulary")

    @property
    def function(self) -> str:
        """The builder's name: tables.<function> or figures.<function>."""
        base = self.name.replace("-", "_")
        return base if self.kind == "table" else f"{base}_chart"

    @property
    def tables(self) -> tuple[str, ...]:
        """The catalog tables a figure reads."""
        return tuple(r.split(":", 1)[1] for r in self.reads if r.startswith("table:"))


def _t(name, section, title, *reads) -> Entry:
    return Entry(name=name, kind="table", section=section, title=title, reads=tuple(reads))


def _f(name, section, title, *reads) -> Entry:
    return Entry(name=name, kind="figure", section=section, title=title, reads=tuple(reads))


#: Every table, in report order within its section.
TABLES: tuple[Entry, ...] = (
    _t("findings", VERDICT, "The verdict: the paper's findings on this hardware",
       "tidy", "superseded", "profile", "micro", "findings", *_REF),
    _t("table2", PRETRAIN, "Table II: Megatron-LM vs DeepSpeed pre-training at batch size 1 and the largest batch "
       "(ours beside the paper's)", "tidy:pretrain", *_REF),
    _t("table3", PRETRAIN, "Table III: pre-training at batch size 1 (ours beside the paper's)", "tidy:pretrain", *_REF),
    _t("table4", PRETRAIN, "Table IV: pre-training at the best batch size run, maximised where a max-batch search "
       "ran (ours beside the paper's)", "tidy:pretrain", *_REF),
    _t("scaling", PRETRAIN, "Fig. 4: data-parallel scaling (tokens/s against the linear ideal, per GPU and MFU)",
       "tidy:pretrain", "tidy:finetune", "reference:fig4"),
    _t("search", PRETRAIN, "Max-batch search (Table IV's batch sizes)", "searches"),
    _t("table9", FINETUNE, "Table IX: fine-tuning at batch size 1 (ours beside the paper's)", "tidy:finetune", *_REF),
    _t("serving", SERVING, "Serving: throughput and latency per engine (Figs. 6-10 as numbers)", "tidy:serve"),
    _t("micro-gemm", MICRO, "GEMM throughput (Fig. 11): best point per platform and case", "micro"),
    _t("micro-memcpy", MICRO, "Memory copies (Fig. 12): latency at the smallest size, bandwidth at the largest",
       "micro"),
    _t("micro-collectives", MICRO, "Collectives (Figs. 13-15): latency at the smallest size, bus bandwidth at the "
       "largest", "micro"),
    _t("table12", MICRO, "Table XII: the first MLP GEMM of a llama2-7b step, ours beside the paper's (A800)",
       "micro", "reference:table12"),
    _t("profile-phases", PROFILES, "Tables V, VII, XIII: one training step by phase (ours beside the paper's A800 "
       "values)", "tidy:profile", "reference:profile_phases"),
    _t("profile-modules", PROFILES, "Table VI, Fig. 5: time per module and phase (ours beside the paper's A800 "
       "values)", "tidy:profile", "profile", "reference:profile_modules"),
    _t("profile-attention", PROFILES, "Table VIII: attention time without and with FlashAttention (F)",
       "tidy:profile", "profile", "reference:profile_attention"),
    _t("profile-serve", PROFILES, "Tables X, XI: serving forward passes by part of the model and by kernel class",
       "tidy:profile", "profile", "reference:profile_serve"),
    _t("profile-serve-engine", PROFILES, "Table X on the engine that serves: its kernels by class per engine step "
       "(the engine's own profiler)", "tidy:profile", "profile", "reference:profile_serve"),
    _t("profile-comm", PROFILES, "Tables XIV, XV, XVI: memory copy and communication per iteration of a DeepSpeed "
       "step", "tidy:profile", "reference:profile_comm"),
    _t("memory-model", MEMORY, "Memory model: predicted against measured peak GPU memory of every training record, "
       "DeepSpeed's and accelerate's estimators beside (llmbench.memory)", "tidy", "reference:table3",
       "reference:table4", "reference:table9"),
    _t("memory-model-heldout", MEMORY, "Memory model held out: fitted on one part of the records, scored on the "
       "rest (by time, and one technique family left out at a time), per family; the margin per family it gives "
       "(llmbench.memory.heldout)", "tidy", "searches"),
    _t("coverage", MEMORY, "Coverage: every training row of Tables III, IV and IX on each GPU platform run, "
       "measured (protocol, CV), out of memory, predicted not to fit or still to run (llmbench.report.coverage)",
       "tidy:pretrain", "tidy:finetune", "reference:table3", "reference:table9"),
    _t("advice", MEMORY, "Advice: the methods ranked per platform, model and stage, measured here or by the "
       "paper where measured, predicted with an interval elsewhere (llmbench.report.advice)", "tidy", "throughput"),
    _t("stacks", STACKS, "The paper's stack and today's: every cell PyTorch FSDP2 ran, beside DeepSpeed's cell of the "
       "same method, at each batch and at each side's largest (llmbench.report.stacks)", "tidy", "superseded"),
    _t("findings-ours", STACKS, "Our findings: claims of this project about today's stack, judged by the verdicts' "
       "engine (config/findings/ours.yaml)", "tidy", "superseded", "profile", "micro", "findings-ours"),
)

#: Every figure; each answers one question and reads the table(s) it plots.
FIGURES: tuple[Entry, ...] = (
    _f("verdict", VERDICT, "The verdict: each check of the paper's findings, our value and its 95 % interval "
       "against what the claim allows", "table:findings", "table:findings-checks"),
    _f("pretrain", PRETRAIN, "Pre-training per method: ours against the paper's, across hardware (Tables III, IV)",
       "table:table3", "table:table4"),
    _f("scaling", PRETRAIN, "Data-parallel scaling: tokens/s per GPU against GPUs (Fig. 4)", "table:scaling"),
    _f("finetune", FINETUNE, "Fine-tuning per method: ours against the paper's, across hardware (Table IX)",
       "table:table9"),
    _f("serve-throughput", SERVING, "Serving: output-token throughput per engine (ok cells, and timeout cells up to "
       "the cut; Fig. 6)", "table:serving"),
    _f("serve-latency-cdf", SERVING, "Serving: latency CDF per engine, fraction of all requests (ok and timeout "
       "cells; Figs. 7-10)", "table:serving", "requests"),
    _f("serve-sweep", SERVING, "Serving sweeps: throughput, p50 and p99 latency and goodput against the offered rate "
       "(Poisson arrivals) and against the requests in flight (concurrency), per engine (beyond the paper)",
       "table:serving"),
    _f("micro-gemm", MICRO, "GEMM throughput against M (Fig. 11)", "table:micro-gemm"),
    _f("micro-memcpy", MICRO, "Memory copies: bandwidth against size (Fig. 12; h2h on a CPU platform is a host "
       "copy)", "table:micro-memcpy"),
    _f("micro-collectives", MICRO, "Collectives: bus bandwidth against size (Figs. 13-15)", "table:micro-collectives"),
    _f("profile-modules", PROFILES, "Module-wise time of a training step (Fig. 5, Table VI)", "table:profile-modules"),
    _f("profile-serve", PROFILES, "Serving forward passes: timeline (Table XI) and kernel classes (Table X)",
       "table:profile-serve"),
    _f("profile-comm", PROFILES, "Memory copies and communication per DeepSpeed step (Tables XIV-XVI)",
       "table:profile-comm"),
)

ENTRIES: tuple[Entry, ...] = TABLES + FIGURES


def names(kind: str) -> list[str]:
    """The names of every table or every figure, in catalog order."""
    return [e.name for e in ENTRIES if e.kind == kind]


def get(kind: str, name: str) -> Entry:
    """The entry of one table or figure; a KeyError names what exists."""
    for e in ENTRIES:
        if (e.kind, e.name) == (kind, name):
            return e
    raise KeyError(f"no {kind} {name!r} in the catalog; {kind}s: {', '.join(names(kind))}")


def by_section() -> dict[str, list[Entry]]:
    """Section -> its tables then its figures, sections in report order."""
    return {s: [e for e in TABLES if e.section == s] + [e for e in FIGURES if e.section == s] for s in SECTIONS}


def input_key(source: str) -> str:
    """The name an input has in a rule (and in the adapter's ``snakemake.input``)."""
    head, _, tail = source.partition(":")
    if head == "tidy" and tail:
        return f"tidy_{tail}"
    return tail.replace("-", "_") if head == "table" else source


def inputs(entry: Entry, results_dir: str) -> dict[str, str | list[str]]:
    """The entry's inputs as named paths (under ``results_dir``, or config/ relative to the
    workflow), references together under 'reference'; 'searches' is left to the caller."""
    out: dict[str, str | list[str]] = {}
    refs = [f"config/reference/{r.split(':', 1)[1]}.csv" for r in entry.reads if r.startswith("reference:")]
    for r in entry.reads:
        if r in SOURCES:
            out[r] = f"{results_dir}/{SOURCES[r]}"
        elif r in FINDINGS_FILES:
            out[r] = FINDINGS_FILES[r]
        elif r == "throughput":
            # the files llmbench.throughput reads, named there (imported here only when asked:
            # the catalog itself stays free of the model's dependencies)
            from ..throughput.interval import INTERVAL_FILE
            from ..throughput.model import CONSTANTS_FILE
            out[r] = [str(CONSTANTS_FILE), str(INTERVAL_FILE)]
        elif r.startswith("table:"):
            out[input_key(r)] = f"{results_dir}/tables/{r.split(':', 1)[1]}.csv"
        elif r.startswith("tidy:"):
            out[input_key(r)] = f"{results_dir}/tables/records-{r.split(':', 1)[1]}.csv"
    if refs:
        out["reference"] = refs
    return out


def _check() -> None:
    for kind in KINDS:
        seen = names(kind)
        dup = {n for n in seen if seen.count(n) > 1}
        if dup:
            raise ValueError(f"the catalog names {kind}(s) {sorted(dup)} twice")
    tables = set(names("table")) | set(BESIDE)
    for f in FIGURES:
        if not f.tables or set(f.tables) - tables:
            raise ValueError(f"figure {f.name} must read catalog tables; reads {f.reads}")


_check()
