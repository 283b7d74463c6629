# Serving cells (paper Section VI, Figs. 6-10): one job per ServeCell starts its engine
# on 127.0.0.1, fires the load, and always stops the engine (llmbench.serve.bench).
# A model directory (config, random weights, a tokenizer whose ids match the synthetic
# prompts) is built once per model and weights kind, and shared by the engines.


rule build_model_dir:
    output:
        directory(f"{R}/models/{{model}}/{{weights}}"),
    log:
        f"{R}/logs/models/{{model}}-{{weights}}.log",
    benchmark:
        f"{R}/benchmarks/models/{{model}}-{{weights}}.tsv"
    params:
        model=model_spec,
    # weights fill one tensor per thread (llama2-7b: 5.6 min on one core); a model under a
    # billion parameters (the tests' tiny one) is written in seconds on one
    threads: model_dir_threads
    wildcard_constraints:
        weights="random|dummy",
    conda:
        "../../envs/pretrain.yaml"
    script:
        "../scripts/build_model_dir.py"


rule run_serving_cell:
    input:
        model_dir=serve_model_dir,
    output:
        record=SERVE_RECORD,
    log:
        cell=f"{R}/logs/serve/{SERVE_CELL_DIR}.log",
        server=f"{R}/logs/serve/{SERVE_CELL_DIR}.server.log",
    benchmark:
        f"{R}/benchmarks/serve/{SERVE_CELL_DIR}.tsv"
    params:
        spec=cell_spec,
    threads: exclusive_threads
    conda:
        serve_env_file
    resources:
        slurm_partition=slurm_resource("partition"),
        gres=slurm_resource("gres"),
        cpus_per_task=exclusive_threads,
        mem_mb=slurm_resource("mem_mb", 4000),
        runtime=serve_runtime_min,
        gpu_slots=lambda wildcards: int(wildcards.gpus),
    script:
        "../scripts/run_serving_cell.py"


# A paired set of serving cells (a serve block's `paired` key; llmbench.grid.paired): its
# cells measured in one job on one machine, each with a fresh engine, the runs of each point
# (loads <point>-1, <point>-2, ...) interleaved round by round (llmbench.serve.paired). One
# rule per set, its outputs the set's records (each cell's own path), which it takes over
# from run_serving_cell (ruleorder): asking for any record of a set runs the whole set. Its
# log is named by the set's id (logs/paired/<id>.log), each engine's log by its cell, as
# run_serving_cell names it. It holds the GPUs of its largest cell and the time of all its
# cells one after the other. A set with some records present and some missing stops the
# workflow at parse time (common.smk).
for pset in serving_sets():

    rule:
        name:
            pset.rule_name
        input:
            set_model_dirs(pset),
        output:
            pset.record_paths(R),
        log:
            set=f"{R}/logs/paired/{pset.id}.log",
            servers=set_server_logs(pset),
        benchmark:
            f"{R}/benchmarks/paired/{pset.id}.tsv"
        params:
            specs=set_specs(pset),
            plan=pset.plan(),
            model_dirs=[serve_model_dir_of(c) for c in pset.cells],
        threads: serve_set_threads(pset)
        conda:
            serve_set_env_file(pset)
        resources:
            slurm_partition=set_slurm(pset, "partition"),
            gres=set_slurm(pset, "gres"),
            cpus_per_task=serve_set_threads(pset),
            mem_mb=set_slurm(pset, "mem_mb", 4000),
            runtime=serve_set_runtime_min(pset),
            gpu_slots=pset.gpus,
        script:
            "../scripts/run_serving_set.py"

    workflow.ruleorder(pset.rule_name, "run_serving_cell")
