"""Predicted memory of training cells (docs/memory-model.md): the model (llmbench.memory.model), its
constants and their sources (constants), the fit of those constants to the committed
records (fit), the validation table (validate), its held-out companion and the margin per
technique family it gives (heldout), the dry run of a grid (plan) and the replay
of the max-batch searches from a predicted start (replay). ``python -m llmbench.memory``
runs fit, heldout, plan and replay from the command line."""

from .cells import Verdict, check, start_hint, start_slope
from .constants import FAMILY_MARGINS, MARGIN, margin_for
from .model import (ADAM_FP32, FAMILIES, GIB, GRADS, NF4, WEIGHTS_BF16, Prediction, Workload, adapter_params,
                    batch_slope_gib, cannot_fit, family, fits, host_memory_gib, machine_host_gib, model_states_gib, predict, predicted_max_batch)

__all__ = ["Verdict", "check", "start_hint", "start_slope", "ADAM_FP32", "FAMILIES", "FAMILY_MARGINS", "GIB", "GRADS",
           "MARGIN", "family", "margin_for", "NF4", "WEIGHTS_BF16", "Prediction", "Workload", "adapter_params",
           "batch_slope_gib", "cannot_fit", "fits", "host_memory_gib", "machine_host_gib", "model_states_gib", "predict", "predicted_max_batch"]
