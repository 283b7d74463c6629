"""Microbenchmarks of the paper's Section VII: GEMM, host<->device memcpy, collectives."""
