# Microbenchmarks (paper Section VII: Fig. 11 and Table XII GEMM, Fig. 12 memcpy,
# Figs. 13-15 collectives): one job per MicroCell, its worker in its own process group
# (llmbench.micro.bench). A wrong result is an error record, not a number.


rule run_micro_cell:
    output:
        record=MICRO_RECORD,
    log:
        f"{R}/logs/micro/{MICRO_CELL_DIR}.log",
    benchmark:
        f"{R}/benchmarks/micro/{MICRO_CELL_DIR}.tsv"
    params:
        spec=cell_spec,
    threads: exclusive_threads
    conda:
        "../../envs/pretrain.yaml"
    resources:
        slurm_partition=slurm_resource("partition"),
        gres=slurm_resource("gres"),
        cpus_per_task=exclusive_threads,
        mem_mb=slurm_resource("mem_mb", 4000),
        runtime=micro_runtime_min,
        gpu_slots=lambda wildcards: int(wildcards.gpus),
    script:
        "../scripts/run_micro_cell.py"
