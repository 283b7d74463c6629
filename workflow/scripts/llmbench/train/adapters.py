"""Fine-tuning methods on top of a built model, through PEFT (paper Section V).

L (LoRA), QL (LoRA on a 4-bit NF4 base, with k-bit training preparation as QLoRA),
LFA (LoRA-FA: A frozen, only B trains), DORA (weight-decomposed LoRA), PT (prompt tuning).
Settings (rank, alpha, dropout, target modules; virtual tokens) come from the cell.
"""

from __future__ import annotations

import torch

from ..techniques import Technique


def apply(model: torch.nn.Module, tech: Technique, settings: dict,
          prepare_kbit: bool = True) -> tuple[torch.nn.Module, str]:
    """Wrap ``model`` for the cell's fine-tuning method; returns (model, what trains).
    ``prepare_kbit``: QLoRA's preparation of a bitsandbytes 4-bit base (PEFT's
    prepare_model_for_kbit_training: every other weight cast to fp32); False for a base whose
    4-bit weights are torchao NF4 tensors (FSDP2), which that cast would dequantise: its other
    weights stay in the compute dtype, as torchtune's QLoRA keeps them."""
    from peft import LoraConfig, PromptTuningConfig, get_peft_model, prepare_model_for_kbit_training

    from ..platforms import dtype_name

    base_dtype = dtype_name(model.get_input_embeddings().weight.dtype)  # the platform's compute dtype
    if tech.quant4 and prepare_kbit:
        # QLoRA's recipe: freeze the base, fp32 norms/embeddings, input grads for checkpointing
        model.is_loaded_in_4bit = True
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=tech.recompute,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    kind = settings["kind"]
    if kind == "prompt_tuning":
        cfg = PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=settings["num_virtual_tokens"])
        model = get_peft_model(model, cfg)
        return model, f"PT: {settings['num_virtual_tokens']} virtual-token embeddings; the model is frozen"
    cfg = LoraConfig(
        r=settings["rank"], lora_alpha=settings["alpha"], lora_dropout=settings["dropout"],
        target_modules=list(settings["target_modules"]), bias="none", task_type="CAUSAL_LM",
        use_dora=kind == "dora",
    )
    model = get_peft_model(model, cfg)
    what = f"rank {settings['rank']} on {', '.join(settings['target_modules'])}"
    if kind == "lora_fa":
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.requires_grad_(False)
        return model, f"LoRA-FA: B matrices only (A frozen at init), {what}; base frozen"
    base = "4-bit NF4 base (frozen)" if tech.quant4 else f"{base_dtype} base (frozen)"
    label = {"lora": "QLoRA" if tech.quant4 else "LoRA", "dora": "DoRA"}[kind]
    return model, f"{label}: adapters A and B, {what}; {base}"


def frozen_checksum(model: torch.nn.Module) -> float:
    """Sum of every frozen parameter's local storage (ZeRO-3 shards included), float64.

    Taken before and after training: equal values mean the base weights did not move.
    """
    total = 0.0
    for p in model.parameters():
        if p.requires_grad:
            continue
        data = getattr(p, "ds_tensor", None)
        data = p.data if data is None else data
        # summed where it lies, in float64, with no host copy (a 70B 4-bit base is 35 GB)
        total += float(data.detach().sum(dtype=torch.float64))
    return total
