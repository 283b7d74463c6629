# llmbench: runtime benchmarks of LLM pre-training, fine-tuning and serving, and
# microbenchmarks of their kernels, regenerating the tables and figures of
# "Dissecting the Runtime Performance of the Training, Fine-tuning, and Inference of
# Large Language Models" with the published numbers beside ours.
#
# Path grammar (under config["results_dir"], default results/; the patterns the rules use
# are llmbench/cells.py's, this is their summary):
#   runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-g{gpus}/record.json
#     (backend megatron: {backend} is megatron-tp{T}pp{P}[-distopt], its parallel layout)
#     (stage profile: {backend} is the backend of the block's profile: torch (training),
#      inference, deepspeed (communication); the cell's Chrome traces sit beside its record)
#   runs/search/{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}/   a max-batch search:
#     search.json and its probes, bs{batch_size}/record.json
#   frontier/{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}.json  what searches learnt
#   runs/serve/{platform}/{model}/{engine}/{load}-g{gpus}/record.json   serving cells
#   runs/micro/{platform}/{bench}/{case}-g{gpus}/record.json            microbenchmark cells
#   logs/<same as runs, .log>            benchmarks/<same as runs, .tsv> (harness overhead)
#   logs/serve/<same as runs>.server.log the engine's own output
#   models/{model}/{weights}/            model directory an engine loads (config, weights, tokenizer)
#   tables/records.{csv,parquet}         the tidy table of every Record (and of evidence_dirs' records)
#   tables/records-{stage}.csv           its rows of one stage (pretrain, finetune, serve, profile)
#   tables/requests.parquet, micro.parquet, profile.parquet  per-row tables: requests, microbenchmark
#                                        points, profile rows
#   tables/<table>.{csv,md,html}         every table of workflow/scripts/llmbench/report/catalog.py: its
#                                        long form, its Markdown and its report page. The verdict
#                                        (findings, + findings-missing.csv: the cells that would decide the
#                                        most), the paper's layouts table2-4, table9 (ours beside the published
#                                        values), serving, scaling (Fig. 4), search, micro-gemm, micro-memcpy,
#                                        micro-collectives, table12, profile-phases, -modules, -attention,
#                                        -serve, -comm
#   figures/<figure>.{html,svg,png}      every figure of the catalog, drawn from the tables it plots:
#                                        pretrain, finetune (per method: ours against the paper's), scaling,
#                                        serve-throughput, serve-latency-cdf, micro-*, profile-*
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
    build_tidy_slice,
    build_sample_table,
    build_table,
    build_findings_table,
    findings,
    advice,
    build_advice,
    plot_figure,
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


rule tables:
    input:
        table_targets(),


# `snakemake advice [--config advice='{platforms: [a800], models: [llama2-70b], stage: finetune, gpus: 8}']`
rule advice:
    input:
        expand("{r}/tables/advice.{ext}", r=R, ext=("csv", "md", "html")),


rule figures:
    input:
        figure_targets(),
