"""Training backends: each turns a resolved cell spec into a timed training loop.

deepspeed_worker: DeepSpeed (ZeRO 0/2/3, offload, recomputation, FlashAttention, 4-bit).
A new backend (megatron, ...) is a module here with the same worker contract
(llmbench.launch runs it under torchrun and reads the JSON it writes).
"""
