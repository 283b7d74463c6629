# llmbench: runtime benchmarks of LLM pre-training, fine-tuning and serving, and
# microbenchmarks of their kernels, regenerating the tables and figures of
# "Dissecting the Runtime Performance of the Training, Fine-tuning, and Inference of
# Large Language Models" with the published numbers beside ours.
#
# Path grammar (under config["results_dir"], default results/):
#   runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-g{gpus}/record.json
#     (backend megatron: {backend} is megatron-tp{T}pp{P}[-distopt], its parallel layout)
#     (stage profile: module-wise profiling; the cell's Chrome traces sit beside its record)
#   runs/serve/{platform}/{model}/{engine}/{load}-g{gpus}/record.json   serving cells
#   runs/micro/{platform}/{bench}/{case}-g{gpus}/record.json            microbenchmark cells
#   logs/<same as runs, .log>            benchmarks/<same as runs, .tsv> (harness overhead)
#   logs/serve/<same as runs>.server.log the engine's own output
#   models/{model}/{weights}/            model directory an engine loads (config, weights, tokenizer)
#   tables/records.{csv,parquet}         the tidy table of every Record (and of evidence_dirs' records)
#   tables/findings.{csv,md,html}        the verdict: every finding of the paper judged on these records;
#   tables/findings-missing.csv          the cells that would decide the most undecided findings
#   tables/requests.parquet              one row per measured request of every serving cell
#   tables/{table2,table3,table4,table9}.{csv,md}  the paper's layouts, ours beside the published values
#   tables/*.html                        every .md table as a page of the report (snakemake --report)
#   tables/serving.{csv,md}              throughput and TTFT/TPOT/ITL/latency percentiles per cell
#   tables/scaling.{csv,md}              Fig. 4: tokens/s and efficiency per GPU count
#   tables/micro.parquet                 one row per measured microbenchmark point
#   tables/{micro-gemm,micro-memcpy,micro-collectives,table12}.{csv,md}  Section VII
#   tables/profile.parquet, tables/{profile-phases,profile-modules,profile-attention}.{csv,md}
#                                        Tables V-VIII, XIII: module-wise profile of a training step
#   figures/{pretrain,finetune}.{html,svg,png}  throughput and memory per technique and platform
#   figures/serve-throughput, serve-latency-cdf  Figs. 6-10: throughput, latency CDFs
#   figures/micro-gemm, micro-memcpy, micro-collectives  Figs. 11-15
#   figures/profile-modules              Fig. 5: module shares per phase
#   figures/scaling                      Fig. 4: tokens/s against GPUs, with the linear ideal
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


# `snakemake --report results/report.html`: every table and figure in one offline page
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/training.smk"
include: "workflow/rules/search.smk"
include: "workflow/rules/serving.smk"
include: "workflow/rules/micro.smk"
include: "workflow/rules/report.smk"


# Light rules run where snakemake runs (a cluster's login node), not as Slurm jobs.
localrules:
    all,
    pretrain,
    tables,
    figures,
    build_tidy_table,
    build_paper_table,
    build_serving_table,
    build_micro_table,
    build_profile_table,
    build_scaling_table,
    build_search_table,
    build_findings_table,
    findings,
    plot_figure,
    render_report_tables,
    finetune,
    serve,
    micro,
    profile,


rule all:
    default_target: True
    input:
        all_targets(),


rule pretrain:
    input:
        records("pretrain"),
        search_folders("pretrain"),
        lambda wildcards: searched_records("pretrain"),


rule finetune:
    input:
        records("finetune"),
        search_folders("finetune"),
        lambda wildcards: searched_records("finetune"),


rule serve:
    input:
        records("serve"),


rule micro:
    input:
        records("micro"),


rule profile:
    input:
        records("profile"),


rule findings:
    input:
        findings_targets(),
        f"{R}/tables/findings.html",


rule tables:
    input:
        table_targets(),


rule figures:
    input:
        figure_targets(),
