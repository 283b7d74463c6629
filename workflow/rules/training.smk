# Training cells, pre-training (paper Section IV, Tables III and IV) and fine-tuning
# (Section V, Table IX): one job per Cell, each repeat in its own process group
# (llmbench.launch). An OOM is a record, not a failure of the workflow.


rule run_training_cell:
    output:
        record=RECORD,
    log:
        f"{R}/logs/{CELL_DIR}.log",
    benchmark:
        f"{R}/benchmarks/{CELL_DIR}.tsv"
    params:
        spec=cell_spec,
    threads: cell_threads
    conda:
        "../../envs/pretrain.yaml"
    resources:
        slurm_partition=slurm_resource("partition"),
        gres=slurm_resource("gres"),
        cpus_per_task=cell_threads,
        mem_mb=slurm_resource("mem_mb", 4000),
        runtime=cell_runtime_min,
        gpu_slots=lambda wildcards: int(wildcards.gpus),
    script:
        "../scripts/run_cell.py"
