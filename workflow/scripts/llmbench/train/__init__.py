"""Training backends: each turns a resolved cell spec into a timed training loop.

scenario: what every training repeat does, written once (seeding, synthetic ids, warm-up and
timed window, peak memory, the typed RepeatResult); the backends provide build and step.

deepspeed_worker: DeepSpeed (ZeRO 0/2/3, offload, recomputation, FlashAttention, 4-bit).
megatron_worker: Megatron-LM's megatron-core (tensor/pipeline/data parallel; CPU stubs in
megatron_cpu_compat). contract: what every worker owes llmbench.launch (arguments, the
OOM marker and exit code). jit_ops: DeepSpeed's JIT-op loads under a kernel flock, safe
beside other cells and after a killed one. A new backend is a module here with a
scenario.Backend (build, step, synchronize) whose run calls scenario.run, and whose main()
is contract.main(run, ...), registered in llmbench.backends.
"""
