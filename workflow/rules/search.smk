# The max-batch search (Table IV, llmbench.search): a checkpoint per searched cell probes
# batch sizes (each probe a recorded short run) and writes search.json; the cell at the
# largest batch that fits is then an ordinary training cell (training.smk), asked for by
# the report rules once the search has run. The OOM frontier file lives outside the
# checkpoint's folder, so a rerun search reads what earlier ones learnt. Its params (the
# rerun trigger) are the spec less the measured cell's batch and protocol
# (llmbench.search.rerun_spec): what the frontier's fingerprint hashes plus the search's
# own settings.


checkpoint search_max_batch:
    output:
        dir=directory(SEARCH_FOLDER),
    log:
        f"{R}/logs/search/{SEARCH_DIR}.log",
    benchmark:
        f"{R}/benchmarks/search/{SEARCH_DIR}.tsv"
    params:
        spec=lambda wildcards: lbsearch.rerun_spec(search_spec(wildcards)),
        frontier=search_frontier,
    threads: cell_threads
    conda:
        "../../envs/pretrain.yaml"
    resources:
        slurm_partition=slurm_resource("partition"),
        gres=slurm_resource("gres"),
        cpus_per_task=cell_threads,
        mem_mb=slurm_resource("mem_mb", 4000),
        runtime=search_runtime_min,
        gpu_slots=lambda wildcards: int(wildcards.gpus),
    script:
        "../scripts/run_search.py"
