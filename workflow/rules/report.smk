# Records -> tidy table -> the paper's tables and the figures. Nothing here runs a cell.


rule build_tidy_table:
    input:
        records=records(),
        evidence=evidence_records(),
        searches=search_folders(),
        measured=lambda wildcards: searched_records(),
    output:
        csv=f"{R}/tables/records.csv",
        parquet=f"{R}/tables/records.parquet",
        # records another run's record of the same cell superseded (llmbench.report.runs)
        superseded=f"{R}/tables/records-superseded.csv",
    log:
        f"{R}/logs/report/build_tidy_table.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_tidy_table.py"


# One stage's rows of the tidy table: the tables of that stage read it, so a record of
# another stage does not rebuild them (nor the figures that plot them).
rule build_tidy_slice:
    input:
        records=slice_records,
        searches=lambda wildcards: search_folders(wildcards.slice),
        measured=lambda wildcards: searched_records(wildcards.slice),
    output:
        csv=f"{R}/tables/records-{{slice}}.csv",
    log:
        f"{R}/logs/report/build_tidy_slice-{{slice}}.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_tidy_table.py"


# Per-row tables (serving requests, microbenchmark points, profile rows), each from its
# stage's records only.
rule build_sample_table:
    input:
        records=sample_records,
    output:
        f"{R}/tables/{{sample}}.parquet",
    log:
        f"{R}/logs/report/build_sample_table-{{sample}}.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_sample_table.py"


rule build_findings_table:
    input:
        **lbcatalog.inputs(lbcatalog.get("table", "findings"), R),
    output:
        csv=f"{R}/tables/findings.csv",
        md=f"{R}/tables/findings.md",
        html=report(f"{R}/tables/findings.html", category=lbcatalog.get("table", "findings").section,
                    subcategory="Tables", labels={"table": "findings"}),
        missing=f"{R}/tables/findings-missing.csv",
        checks=f"{R}/tables/findings-checks.csv",
    params:
        models=config.get("findings_models"),
        machines=config.get("findings_machines"),
    log:
        f"{R}/logs/report/build_findings_table.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_findings_table.py"


# Every other table of the catalog: its own inputs (llmbench/report/catalog.py), its CSV,
# Markdown and report page.
rule build_table:
    input:
        unpack(table_inputs),
        measured=measured_inputs,
    output:
        csv=f"{R}/tables/{{table}}.csv",
        md=f"{R}/tables/{{table}}.md",
        html=report(f"{R}/tables/{{table}}.html", category=table_section, subcategory="Tables",
                    labels={"table": "{table}"}),
    params:
        # our own findings (findings-ours) judge their own models (findings_ours_models; unset:
        # the paper's findings' models) and plan for the machines the paper's findings do
        models=lambda wildcards: (config.get("findings_ours_models") or config.get("findings_models")
                                  if wildcards.table == "findings-ours" else config.get("findings_models")),
        machines=config.get("findings_machines"),
    log:
        f"{R}/logs/report/build_table-{{table}}.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_table.py"


# The vega-embed bundle that every figure's HTML page inlines (figures.vega_bundle): made once
# a run rather than once a figure; figure_inputs takes it as ancient(), so remaking it redraws
# no figure.
rule vega_bundle:
    output:
        f"{R}/figures/vega-embed.js",
    log:
        f"{R}/logs/report/vega_bundle.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_vega_bundle.py"


# A figure reads the tables it plots (catalog), so a new record rebuilds it only through them.
rule plot_figure:
    input:
        unpack(figure_inputs),
    output:
        html=f"{R}/figures/{{figure}}.html",
        svg=report(f"{R}/figures/{{figure}}.svg", caption="../report/figure.rst", category=figure_section,
                   subcategory="Figures", labels={"figure": "{figure}"}),
        png=f"{R}/figures/{{figure}}.png",
    log:
        f"{R}/logs/report/plot_figure-{{figure}}.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/plot_figure.py"


# The advisor (llmbench.report.advice): the methods ranked for the platforms and models of
# the config's `advice` request (default: every platform and model of the grid and of the
# records): measured where measured, the paper's numbers for its platforms, else predicted (the
# memory model for fit, the throughput model for tokens/s with an interval).
ruleorder: build_advice > build_table


rule build_advice:
    input:
        # the tidy table and the throughput model's files (a refit rebuilds the advice)
        **lbcatalog.inputs(lbcatalog.get("table", "advice"), R),
    output:
        csv=f"{R}/tables/advice.csv",
        md=f"{R}/tables/advice.md",
        html=report(f"{R}/tables/advice.html", category=lbcatalog.get("table", "advice").section,
                    subcategory="Tables", labels={"table": "advice"}),
    params:
        advice=config.get("advice"),
        cells=sorted({(c.platform, c.model) for c in GRID.cells if getattr(c, "stage", "") in ("pretrain", "finetune")}),
    log:
        f"{R}/logs/report/build_advice.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_advice.py"
