# llmbench: runtime benchmarks of LLM pre-training (and, in later stages, fine-tuning,
# serving and microbenchmarks), regenerating the tables and figures of
# "Dissecting the Runtime Performance of the Training, Fine-tuning, and Inference of
# Large Language Models" with the published numbers beside ours.
#
# Path grammar (under config["results_dir"], default results/):
#   runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-g{gpus}/record.json
#   logs/<same as runs, .log>            benchmarks/<same as runs, .tsv> (harness overhead)
#   tables/records.{csv,parquet}         the tidy table of every Record
#   tables/{table3,table4,table9}.{csv,md}  the paper's layouts, ours beside the published values
#   figures/{pretrain,finetune}.{html,svg,png}  throughput and memory per technique and platform
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/training.smk"
include: "workflow/rules/report.smk"


# Light rules run where snakemake runs (a cluster's login node), not as Slurm jobs.
localrules:
    all,
    pretrain,
    tables,
    figures,
    build_tidy_table,
    build_paper_table,
    plot_figure,
    finetune,


rule all:
    default_target: True
    input:
        all_targets(),


rule pretrain:
    input:
        records("pretrain"),


rule finetune:
    input:
        records("finetune"),


rule tables:
    input:
        table_targets(),


rule figures:
    input:
        figure_targets(),
