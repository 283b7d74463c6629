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
    # weights fill one tensor per thread (llama2-7b: 5.6 min on one core)
    threads: 8
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
