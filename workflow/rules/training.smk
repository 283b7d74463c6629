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


# A cell over several nodes (a block's nodes: N >= 2): one Slurm job of N nodes, one task
# per node. The slurm executor plugin's `mpi` resource makes it run the job's command in
# the batch script on the first node, instead of inside `srun -n1` (which would hold the
# allocation's only task); the launcher then starts its own srun over the N nodes
# (llmbench.nodes). `tasks` is N (sbatch --ntasks; the plugin wants > 1 for mpi jobs), and
# tasks_per_gpu 0 keeps the plugin from turning `tasks` into --ntasks-per-gpu on GPU jobs.
# cpus_per_task, mem_mb and gres are per node. Without Slurm the job fails (no record).
# Everything else is run_training_cell's; `with: resources` replaces the whole set (not merged),
# so the per-node Slurm resources are listed again.
use rule run_training_cell as run_multinode_training_cell with:
    output:
        record=NODES_RECORD,
    log:
        f"{R}/logs/{NODES_CELL_DIR}.log",
    benchmark:
        f"{R}/benchmarks/{NODES_CELL_DIR}.tsv"
    resources:
        slurm_partition=slurm_resource("partition"),
        gres=slurm_resource("gres"),
        cpus_per_task=cell_threads,
        mem_mb=slurm_resource("mem_mb", 4000),
        runtime=cell_runtime_min,
        nodes=lambda wildcards: int(wildcards.nodes),
        tasks=lambda wildcards: int(wildcards.nodes),
        tasks_per_gpu=0,
        mpi="srun",
        gpu_slots=lambda wildcards: int(wildcards.gpus) // int(wildcards.nodes),


# A paired set (a training block's `paired` key; llmbench.grid.paired): the cells of one
# comparison measured together, in one job on one machine, their repeats interleaved round
# by round (llmbench.launch.run_set). One rule per set, its outputs the set's records (each
# cell's own path, as run_training_cell would write it), which it takes over from
# run_training_cell (ruleorder): asking for any record of a set runs the whole set. Its log
# and benchmark are named by the set's id: logs/paired/<id>.log, benchmarks/paired/<id>.tsv.
# It holds the GPUs of its largest cell and the time of all its cells one after the other.
# A set with some records present and some missing stops the workflow at parse time
# (common.smk): Snakemake would delete the present ones to run it.
for pset in (s for s in GRID.sets if not s.serving):

    rule:
        name:
            pset.rule_name
        output:
            pset.record_paths(R),
        log:
            f"{R}/logs/paired/{pset.id}.log",
        benchmark:
            f"{R}/benchmarks/paired/{pset.id}.tsv"
        params:
            specs=set_specs(pset),
            plan=pset.plan(),
            threads=set_threads(pset),
        threads: max(set_threads(pset))
        conda:
            "../../envs/pretrain.yaml"
        resources:
            slurm_partition=set_slurm(pset, "partition"),
            gres=set_slurm(pset, "gres"),
            cpus_per_task=max(set_threads(pset)),
            mem_mb=set_slurm(pset, "mem_mb", 4000),
            runtime=set_runtime_min(pset),
            gpu_slots=pset.gpus,
        script:
            "../scripts/run_paired_set.py"

    workflow.ruleorder(pset.rule_name, "run_training_cell")
