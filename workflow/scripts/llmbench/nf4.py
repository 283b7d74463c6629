"""What torchao's NF4 base needs of a model's shapes, in one place: QLoRA under FSDP2 (technique
QL, backend fsdp2; llmbench.train.fsdp2_worker) and the grid's check of it before any job
(llmbench.grid). Pure: no torch.

torchao's NF4Tensor (``torchao.quantization.to_nf4``, torchtune's QLoRA base) quantises a
weight in blocks of BLOCK values, each with a scaler, and quantises those scalers again in
blocks of SCALER_BLOCK (double quantisation): a weight's element count must be a multiple of
BLOCK x SCALER_BLOCK. FSDP2 shards it on dim 0 by splitting its quantised data, scalers and
scaler factors alike, unpadded: each rank's rows must hold whole scaler blocks, so the rows
divide by the shard group and the elements by BLOCK x SCALER_BLOCK x the group."""

from __future__ import annotations

from .models import LLAMA_LINEARS, ModelSpec

#: Values per NF4 block (one scaler each): torchao's default, torchtune's.
BLOCK = 64
#: Scalers per double-quantisation block: torchao's default, torchtune's.
SCALER_BLOCK = 256
#: The decoder's linears whose weights the 4-bit base holds in NF4 (bitsandbytes' QLoRA
#: quantises the same: every linear but the LM head).
LINEARS = LLAMA_LINEARS


def linear_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(out, in) of each of a decoder layer's LINEARS."""
    d, f, kv = model.hidden_size, model.intermediate_size, model.num_key_value_heads * model.head_dim
    return {"q_proj": (d, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, d),
            "gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f)}


def unshardable(model: ModelSpec, shards: int) -> str | None:
    """Why FSDP2 cannot hold ``model``'s NF4 base split over ``shards`` ranks (the module
    docstring's rules; one rank: FSDP2's own shortcut, below), or None where it can."""
    if shards == 1:
        # FSDP2's shortcut for a shard group of one copies only the first tensor a parameter's
        # fsdp_pre_all_gather returns; NF4 returns three (pytorch/pytorch#197999, open)
        return ("QLoRA under FSDP2 needs its NF4 base sharded over two or more ranks (Z2 or Z3 on 2+ GPUs): with "
                "one rank in the shard group (one GPU, or no Z flag) FSDP2 skips the all-gather and passes on only "
                "the first of the three tensors an NF4 weight gathers (pytorch/pytorch#197999), and the first "
                "forward fails")
    whole = BLOCK * SCALER_BLOCK
    for name, (rows, cols) in linear_shapes(model).items():
        if rows % shards or (rows * cols) % (whole * shards):
            return (f"QLoRA under FSDP2 holds the decoder's linears as torchao NF4 tensors, split on dim 0 over "
                    f"{shards} rank(s) without padding: model {model.name!r}'s {name} ({rows} x {cols}) needs its "
                    f"rows a multiple of {shards} and its {rows * cols} elements a multiple of {BLOCK} x "
                    f"{SCALER_BLOCK} x {shards} = {whole * shards} (NF4 blocks of {BLOCK} values, their scalers "
                    f"quantised in blocks of {SCALER_BLOCK})")
    return None
