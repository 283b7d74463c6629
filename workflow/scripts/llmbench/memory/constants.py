"""The memory model's constants, each with where it comes from (llmbench.memory.model).

Two kinds: accounting taken from the frameworks' code and papers (state bytes per
parameter, bucket sizes), and constants fitted to the committed reference records by
``llmbench.memory.fit`` (``python -m llmbench.memory fit``: least squares over the ok GPU
records whose peak is in the forward/backward phase). The fit is reproducible: refitted from
scratch on the combined view's records it reaches these values (tests/calibration); the
held-out validation (llmbench.memory.heldout) scores them on records left out of the fit and
sets the margin per technique family (FAMILY_MARGINS).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter of one rank: ``full`` held whole on every rank plus ``sharded``
    split over the data-parallel ranks."""

    full: float
    sharded: float

    def per_rank(self, params: float, ranks: int) -> float:
        """Bytes one of ``ranks`` holds for ``params`` parameters."""
        return params * (self.full + self.sharded / ranks)


@dataclass(frozen=True, slots=True)
class StateRow:
    """Model-state bytes of one technique: through forward/backward, at the optimizer
    step, and on the host (offload)."""

    fb: StateBytes
    step: StateBytes
    host: StateBytes = StateBytes(0.0, 0.0)
    frozen_host: float = 0.0
    """Host bytes per frozen bf16 parameter (an adapter's base), sharded over the ranks, for
    a row that moves parameters to the host; such a row keeps no frozen base on the GPU.
    0: the frozen base stays on the GPU (llmbench.memory.model.state_bytes)."""


#: DeepSpeed bf16 mode, per trainable parameter, by (ZeRO stage, offload).
DEEPSPEED: dict[tuple[int, bool], StateRow] = {
    # ZeRO-0 (bf16 optimizer): at the forward pass's end, where activations peak, bf16
    # weights 2 + fp32 master 4 + Adam 8 = 14: the gradients of the last step are gone and
    # this step's not made yet (fitted: one H100's llama2-7b L at batch 1-18, 7B/13B L and
    # QL, 7B Q at batch 1-28 held 14-15 bytes a trained parameter, where 20 over-predicted
    # each by 5-6). The backward pass adds bf16 gradients 2 + fp32 gradient accumulation 4
    # = 20, and the step a flat fp32 copy of the gradients (4): the H200 OOMs of llama2-7b
    # Naive/F/R "tried to allocate 25.10 GiB" (4 bytes x 6.74e9) with 125.58 GiB (20 bytes
    # each) allocated.
    (0, False): StateRow(fb=StateBytes(14, 0), step=StateBytes(24, 0)),
    # ZeRO-2: bf16 weights 2 and bf16 gradients 2 whole, fp32 master 4 + Adam 8 sharded
    # through forward/backward: DeepSpeed <= 0.14's estimate_zero2_model_states_mem_needs
    # (4N + 16N/g); the H200 pair measured 75.40 GiB at batch 1 (12 bytes x 6.74e9 at g = 2)
    # where 0.19's estimator says 2N + 18N/g. At the step the whole bf16 gradients are gone
    # and the partition holds 20: its bf16 gradients, master, Adam, the step's fp32 copy of
    # the gradient partition (4) and 2 more. One H200's llama2-7b Z2, R+Z2, F+Z2 and F+R+Z2
    # at g = 1 had 113.03 GiB allocated (18 bytes x 6.74e9) when the fp32 copy "tried to
    # allocate 25.10 GiB" and ran out: 22 at g = 1; 2 + 20/g also gives the pair's 12 at g = 2.
    (2, False): StateRow(fb=StateBytes(4, 12), step=StateBytes(2, 20)),
    # ZeRO-2 + O: bf16 weights whole on the GPU and a part of the bf16 gradient partition
    # (0.80 per sharded parameter, fitted to llama2-7b's 18.25 GiB at batch 1 on the H200 pair
    # and the same 18.25 GiB on four H200s, where the accounting's 2 would say 23 and 19): the
    # part does not shrink with the ranks (1.66 GiB a GPU at 2 and at 4), so this per-parameter
    # mean is 0.8 GiB over the pair's peak and 0.4 under the four's; a per-rank buffer would fit
    # both. The host holds fp32 master, Adam and fp32 gradients (16) plus pinned bf16 copies:
    # 21, fitted to the pair's 67.3 GiB RSS per rank.
    (2, True): StateRow(fb=StateBytes(2, 0.80), step=StateBytes(2, 0.80), host=StateBytes(0, 21)),
    # ZeRO-3: everything sharded, 16 through forward/backward (bf16 weights 2 and gradients
    # 2, fp32 master 4 and Adam 8) and at the step, plus the step's copy of one optimizer
    # sub-group's gradients (ZERO3_STEP_GRAD_COPY_BYTES, added in model.state_bytes).
    # DeepSpeed's estimate_zero3_model_states_mem_needs says 18N/g: 6.9 GiB over one H200's
    # llama2-7b Z3, R+Z3, F+Z3 and F+R+Z3 at g = 1 (107.06 GiB each).
    (3, False): StateRow(fb=StateBytes(0, 16), step=StateBytes(0, 16)),
    # ZeRO-3 + O: part of the bf16 gradient partition stays on the GPU (0.83, fitted to the
    # H200 pair's 7.32 GiB at batch 1 and 19.66 GiB (F+Z3+O) at batch 8 over two ranks,
    # F+Z3+O's 36.36 GiB at batch 16 on one GPU and four H200s' 6.83 GiB at batch 1;
    # activations taking ZERO3_ACT_SCALE): more a buffer of a few GB than bytes per parameter
    # (3.6 GiB a GPU at batch 1 on two ranks, 3.1 on four). The host holds the rest (24, fitted to
    # the pair's 77.9 GiB RSS per rank and the one-GPU cell's 153.8 GiB).
    # offload_param partitions every parameter, a frozen adapter base included, and keeps
    # the partitions in pinned host memory: 3.17 bytes per frozen parameter (fitted to the
    # four LoRA Z3+O rows of llama2-7b and -13b on one H100, 2.86 and 3.47 apiece: bf16's 2
    # plus pinned-buffer rounding and staging copies), none of the base on the GPU.
    (3, True): StateRow(fb=StateBytes(0, 0.83), step=StateBytes(0, 0.83), host=StateBytes(0, 24), frozen_host=3.17),
}

#: Megatron-LM (megatron-core) bf16 with fp32 main gradients, per local parameter (the
#: model over tensor x pipeline ranks): bf16 weights 2 + fp32 main gradient 4 whole; fp32
#: master weights 4, their gradient 4 and Adam 8 (16) sharded over the data-parallel ranks
#: by the distributed optimizer, whole without it. Fitted to the H200 pair's two layouts at
#: batch 1 (tp1pp1-distopt 87.93 GiB = 14 bytes x 6.74e9; tp2pp1 69.13 GiB = 22 bytes x
#: 3.37e9): 6 + 16/dp solves both. The step's extra is the master-gradient copy (4/dp).
MEGATRON_DISTOPT = StateRow(fb=StateBytes(6, 12), step=StateBytes(6, 16))
MEGATRON = StateRow(fb=StateBytes(18, 0), step=StateBytes(22, 0))

#: DeepSpeed's communication buffers by ZeRO stage, bytes: ZeRO-2 with overlap_comm keeps
#: two reduce buckets of reduce_bucket_size (default 5e8 elements) in bf16; ZeRO-3 one
#: (DeepSpeed's config defaults). The tiny model's cells on the H100 measured 1.74 GiB
#: (R+Z2) and 0.94 GiB (Z3) over Naive, against 1.86 and 0.93 here.
BUCKETS: dict[int, float] = {2: 2 * 5e8 * 2, 3: 5e8 * 2}

#: ZeRO-3's optimizer step (DeepSpeed's stage3 ``_prepare_fp32_grad_for_sub_group``, without
#: offload) runs one sub-group of at most ``sub_group_size`` elements of the rank's partition
#: at a time (DeepSpeed's default 1e9: ZERO3_SUB_GROUP_SIZE) and makes its gradients a flat
#: bf16 copy and then fp32: 6 bytes an element of the sub-group while both live. With it the
#: model gives one H200's llama2-7b Z3 rows at g = 1 106.99 GiB for 107.06 measured and the
#: H200 pair's Z3 at g = 2 56.78 for 56.81 (16 bytes a parameter, the sub-group's 5.59 GiB,
#: the bucket's 0.93); 18N/g, fitted to neither, gave 113.95 and 57.47.
ZERO3_SUB_GROUP_SIZE = 1e9
ZERO3_STEP_GRAD_COPY_BYTES = 6.0


@dataclass(frozen=True, slots=True)
class BackendConstants:
    """The fitted constants of one backend."""

    act_scale: float
    """Saved activations over Korthikanti et al.'s eq. 1/2 (fitted)."""
    logits_bytes: float
    """Bytes per vocabulary entry and token of the logits and the loss (fitted)."""
    overhead_gib: float
    """Fixed GPU memory beyond the terms: workspaces, RoPE tables, small buffers (fitted)."""
    host_base_gib: float
    """Host RSS of one rank without offload (median of the ok GPU records)."""


#: Fitted by llmbench.memory.fit on the committed reference records (results/reference/
#: combined/tables/records.csv): logits_bytes from 124 DeepSpeed rows with recomputation
#: (least squares; not those whose recomputed layer sets the peak); deepspeed's act_scale
#: from 127 rows (least squares through the origin, LoRA's dropout copies taken out first:
#: model.adapter_dropout_bytes; the rows include the one-GPU searches' probes up to each
#: row's largest batch, 8-26 for 7B and 13B on one H100, 20-47 on one H200) and its
#: overhead from the 2 tiny-model rows; megatron's act_scale from 11 rows (no tiny rows:
#: overhead 0, logits as DeepSpeed's). Korthikanti's formula needs no scale for DeepSpeed's
#: HF Llama (0.97); Megatron-LM's unfused attention and fp32 softmax keep 43% more.
#: One fit for both backends (Megatron-LM has no rows with recomputation to fit its own).
LOGITS_BYTES = 12.89
BACKENDS: dict[str, BackendConstants] = {
    "deepspeed": BackendConstants(act_scale=0.97, logits_bytes=LOGITS_BYTES, overhead_gib=0.06, host_base_gib=2.0),
    "megatron": BackendConstants(act_scale=1.43, logits_bytes=LOGITS_BYTES, overhead_gib=0.0, host_base_gib=1.83),
}
#: PyTorch FSDP2 (llmbench.train.fsdp2_worker) runs the same transformers Llama as DeepSpeed:
#: its saved activations and logits take DeepSpeed's fitted scale (its LoRA cells grow by the
#: same 3.2 GiB a sample of llama2-7b as DeepSpeed's, 9.69 GiB from batch 1 to 4 on one H200);
#: its model states are FSDP2's (FSDP2_* below). No tiny-model records: overhead 0. Host RSS:
#: the median of one H200's FSDP2 records (1.6-2.1 GiB).
BACKENDS["fsdp2"] = BackendConstants(act_scale=BACKENDS["deepspeed"].act_scale, logits_bytes=LOGITS_BYTES,
                                     overhead_gib=0.0, host_base_gib=1.6)
#: Backends whose activation scale is another's, not fitted on their own rows (llmbench.memory.fit)
ACTIVATIONS_OF: dict[str, str] = {"fsdp2": "deepspeed"}
#: Saved activations of a full-parameter FSDP2 cell (no adapter) over DeepSpeed's for the same
#: model and tokens (fitted: llmbench.memory.fit, the mean over the eager FSDP2 rows without an
#: adapter, recomputation or compile whose forward/backward pass sets the peak: one H200's
#: llama2-7b Z3 and F+Z3 searches at batch 9-18, 1.32-1.39, the H200 pair's llama2-7b and
#: llama3.1-8b Z2, Z3 and F+Z3 at batch 8, 1.34-1.47, and its llama2-7b Z2 at batch 1, 1.94, where
#: the activations are a small part of the peak). Without it the model fell up to 9 % short of
#: those rows' allocated peaks. The LoRA rows of FSDP2 need none (1.02-1.09 at batch 1 and 4);
#: what holds the extra copies in the full-parameter step is not traced (as DeepSpeed's ZeRO-3
#: copies, ZERO3_ACT_SCALE, which are of the same size). A compiled cell (C) takes
#: FSDP2_COMPILED_ACT_SCALE in its place.
FSDP2_FULL_ACT_SCALE = 1.41
#: Saved activations of a full-parameter FSDP2 cell with compiled layers (C) over DeepSpeed's
#: eager ones for the same model and tokens, in place of FSDP2_FULL_ACT_SCALE and
#: COMPILED_ACT_SCALE (fitted: llmbench.memory.fit, the mean over the compiled bf16 FSDP2 rows
#: without an adapter or recomputation whose forward/backward pass sets the peak: the H200
#: pair's llama2-7b F+Z3+C at batch 48 and 49, 0.97, and llama3.1-8b's at batch 30 to 33, 1.01;
#: the larger vocabulary's rows want a little more, not traced). Inductor saves 0.70 of the eager FSDP2
#: cell's, not DeepSpeed's compiled 0.58: taking 0.58 in its place, the model fell 17-24 % short of
#: those rows' allocated peaks (84.6 against 111.2 GiB at batch 48), 7.5-9.4 % with 0.58 times
#: FSDP2_FULL_ACT_SCALE. Every earlier compiled FSDP2
#: record peaked at the optimizer step, where activations are gone.
FSDP2_COMPILED_ACT_SCALE = 0.99
#: Saved activations of an FP8 cell (torchao's float8 training of the compiled layers, FSDP2)
#: over the same cell in bf16 (fitted: llmbench.memory.fit, the mean over the FP8 rows whose
#: forward/backward pass sets the peak: the H200 pair's llama2-7b F+Z3+C+FP8 at batch 48, 64
#: and 72, 0.74-0.76, and llama3.1-8b's at batch 32 and 40, 0.77-0.80). Which tensors the
#: compiled FP8 layers keep smaller is not traced. Their
#: freed blocks shrink alike: the reserved step peak takes the FP8 activations' eager size. The
#: rowwise recipe (FP8R) takes it too: none of its records peaks in forward/backward.
FP8_ACT_SCALE = 0.76

#: FSDP2's model states, per trained parameter (MixedPrecisionPolicy: bf16 compute, fp32
#: reduction; the sharded parameters are fp32 and are the master weights; fused AdamW):
#: through forward/backward the fp32 parameters (4) and AdamW's two moments (8), 12; at the
#: step the fp32 gradients too (4), 16, plus 0.17 that the step holds beyond (fitted: one
#: H200's llama2-7b Z3, F+Z3, Z2 and R+Z3 at batch 1 and F+Z3+C (with FP8, FP8R) at batch 8
#: all peaked at the step with 101.45 GiB allocated, 16 bytes x 6.74e9 being 100.4 GiB; what
#: holds the 1.05 GiB is not traced). Sharded over the ranks (Z3, Z2); with no Z flag FSDP2
#: replicates (llmbench.train.fsdp2_worker.plan): whole on every rank. Offload
#: (CPUOffloadPolicy) is not modelled: one record, on the H200 pair.
FSDP2_SHARDED = StateRow(fb=StateBytes(0, 12), step=StateBytes(0, 16.17))
FSDP2_REPLICATED = StateRow(fb=StateBytes(12, 0), step=StateBytes(16.17, 0))
#: Each layer's all-gathered bf16 parameters (the unsharded copy FSDP2 makes beside the
#: shards, 2 bytes a parameter): kept from forward to backward where layers do not reshard
#: after forward (Z2, and no Z flag), so the whole model's; with resharding (Z3) the root's
#: (embeddings, final norm, lm_head: never resharded) and FSDP2_LIVE_LAYERS layers' (one in
#: use, one prefetched). A LoRA cell's frozen bf16 base is so held twice through
#: forward/backward: one H200's llama2-7b L at batch 1 and 4 and llama3.1-8b L at batch 4
#: held 12.6 and 15.0 GiB more than DeepSpeed's (2 bytes x 6.74e9 and 8.03e9 parameters).
#: On an NF4 base (QL) the decoder's linears are gathered in NF4 as they are stored (model.NF4
#: a weight; llmbench.memory.model.fsdp2_gathered_bytes), the rest in bf16.
FSDP2_GATHERED_BYTES = 2.0
FSDP2_LIVE_LAYERS = 2
#: The backward's reduce-scatter per layer: the layer's unsharded bf16 gradients (2) and
#: their fp32 copy to reduce (4), for FSDP2_LIVE_LAYERS layers at a time; with what the
#: forward/backward peak held beyond the states (activations, logits, gathered copies), the
#: caching allocator keeps them reserved through the step. A compiled layer (C) saves fewer
#: activations (COMPILED_ACT_SCALE) but its graphs allocate and free the eager-sized ones, so
#: its blocks count at eager size: F+Z3+C's reserved-over-allocated grew from 14.4 GiB at batch
#: 8 to 30.8 at batch 16, 2.05 GiB a sample where its saved activations are 0.76. Against one
#: H200's nine full-parameter FSDP2 cells at batch 1, 8 and 16 (104.29-132.41 GiB reserved): within
#: -2.7 % (F+Z3+C+FP8 at batch 8) and +1.7 % (F+Z3+C+FP8R at batch 8).
FSDP2_REDUCE_BYTES = 6.0
#: The root unit's (embeddings, final norm, lm_head) gradients in fp32, unsharded, as its
#: reduce-scatter takes them (MixedPrecisionPolicy's reduce_dtype): the root reduces last in
#: backward, and the step's peak holds them too where the states are sharded over several
#: ranks (4 bytes a root parameter; on one rank the reduction is the gradient itself). Without
#: it the model fell short of the H200 pair's full-parameter FSDP2 step peaks by 4.2-4.4 bytes
#: a root parameter, in both models: llama3.1-8b's seven Z3-family cells that peaked at the
#: step (64.79 GiB allocated against 60.47 predicted; 1.05e9 root parameters) and llama2-7b's
#: at batch 1 (51.68-51.76 against 50.74; 0.26e9), while one H200's llama2-7b cells were
#: exact. That the buffer outlives the backward is read from the records, not traced.
FSDP2_ROOT_REDUCE_BYTES = 4.0

#: Saved activations under torch.compile (C) over eager (fitted: the H200 pair's F+Z2+C
#: against F+Z2 at batch 16; inductor fuses the norms, RoPE and SwiGLU and saves less).
COMPILED_ACT_SCALE = 0.58

#: Saved activations of a cell under ZeRO-3 without recomputation over the same cell without
#: it, an adapter's or a full-parameter one (fitted: llmbench.memory.fit, the mean over the
#: DeepSpeed ZeRO-3 rows without recomputation whose forward/backward pass sets the peak: the
#: llama2-7b and -13b L+Z3 and L+Z3+O rows on one H100 and one H200 at batch 1 and up to each
#: row's largest batch, 1.38-1.54 (1.40-1.43 from batch 6), LoRA's dropout copies included,
#: with or without offload; one H200's llama2-7b Z3 and F+Z3 searches at batch 9-17, 1.34 and
#: 1.38 at every batch; the H200 pair's llama2-7b and -13b ZeRO-3 cells at batch 1, and
#: llama2-7b F+Z3+O at batch 16 on one GPU; four H200s' llama2-7b F+Z3 and Z3+O at batch 1).
#: Full-parameter cells take it too: without it the model falls 4.8-6.7 % (6-9 GiB) short of
#: those Z3 and F+Z3 rows. DeepSpeed's ZeRO-3 linear wrapper is the likely holder of the extra
#: copies (not traced). LoRA's dropout copies are counted on their own (adapter_dropout_bytes);
#: left in this scale, the adapter rows would give 2.16.
ZERO3_ACT_SCALE = 1.45

#: Saved activations of a 4-bit full-parameter cell (Q: frozen NF4 decoder linears, the
#: embeddings, norms and output layer trained) over the backend's (fitted: llmbench.memory.fit,
#: the mean over the Q rows without recomputation whose forward/backward pass sets the peak:
#: the llama2-7b Q search on one H100 at batch 4-28, 1.09 at every batch, and the batch-2 cells
#: of one H200 and of the H200 pair, 1.11). Q's step grew by 2.30 GiB a sample where the
#: backend's scale gave 2.11, so the model was 5 GiB (7 %) short at batch 28 and hinted 30 for
#: 26. bitsandbytes' 4-bit matmul saves no input for its frozen weight, so the extra is not the
#: linears' inputs (what holds it is not traced). Not applied with recomputation: R+Q's
#: recomputed layer stays below its logits at 7B, so no record tells.
QUANT4_ACT_SCALE = 1.10

#: The same for an adapter's recomputed layer under ZeRO-3 (with recomputation only one
#: layer's activations are alive, and its backward sets the peak): fitted by
#: llmbench.memory.fit, the median over the rows whose peak the recomputed layer sets, the
#: llama2-7b L+F+R+Z3 and L+F+R+Z3+O searches on one H100 at batch 194-236, 1.55 and 1.53
#: apiece and the same at every batch. With 1.40 the model was 3 GiB (5 %) short there and
#: hinted 194 for 201 and 236 for 227. The 13B L+F+R+Z3 search, which ran after it was set,
#: needed 1.57-1.58 at batch 114-127 (the median over all three: 1.55). All with FlashAttention:
#: untested without F.
ZERO3_RECOMPUTED_ADAPTER_SCALE = 1.54

#: A recomputed layer's backward peak over the activations the layer saves (fitted:
#: llmbench.memory.fit, the median over the DeepSpeed rows with recomputation whose peak
#: the recomputed layer sets, i.e. what they hold beyond states, layer inputs and overhead
#: exceeds the logits): while a layer's backward runs, the gradients flowing through it
#: sit beside its recomputed activations. The median of 38 rows: llama2-13b L+R and QL+R on
#: one H100 at batch 138-180 and one H200 at 245-332, and llama2-70b QL+R and QL+F+R on one
#: H100 at 29-42 and one H200 at 102-112;
#: counting the layer alone, the model was 5-6 GiB (5 %) short at 13B's large batches and
#: hinted 304 for 261. Where the logits are larger (7B, and 13B with FlashAttention, whose
#: layer saves no attention scores) it changes nothing.
RECOMPUTED_LAYER_PEAK = 1.28

#: What the caching allocator keeps reserved through a ZeRO-1/2 optimizer step (no offload)
#: beyond the step's allocated peak, bytes per trained parameter: the whole bf16 gradients (2),
#: freed as the step begins, stay cached while the step allocates its fp32 buffers of other
#: sizes (accounting, not fitted). The reserved peak of full-parameter ZeRO-2 cells is the
#: step's even where forward/backward allocates more: the H200 pair's llama2-7b Z2, F+Z2 and
#: F+R+Z2 at batch 1 (and Z2 at batch 8) reserved 88.78 GiB over 75.40 allocated (2.13 bytes
#: a parameter), four H200s' llama2-7b and -13b Z2 at batch 1 14.3 and 25.2 GiB beyond
#: (2.28 and 2.08): held out, the model was 15-18 % short of those reserved peaks without it.
ZERO2_STEP_CACHED_GRAD_BYTES = 2.0

#: What the caching allocator keeps reserved through the forward/backward pass of a ZeRO-1/2
#: cell with offload beyond its allocated peak, bytes per trained parameter: the backward pass
#: makes each bf16 gradient whole (2), hands it to the host bucket by bucket and frees it, and
#: the freed blocks, of other sizes than what follows, stay cached (accounting, not fitted).
#: llama2-7b Z2+O at batch 1 reserved 14.99 GiB over its 18.25 allocated on the H200 pair and
#: 12.80 over the same 18.25 on four H200s (2.39 and 2.04 bytes a parameter), where the model
#: without it was 42 % short on each. An adapter cell's trained parameters are few: it adds
#: little there, as those records show.
OFFLOAD_CACHED_GRAD_BYTES = 2.0

#: DeepSpeed's stage3_max_live_parameters default: ZeRO-3 keeps at most this many gathered
#: parameters on a GPU. Under ZeRO-3 + O a frozen adapter base lives on the host, and this
#: many of its bf16 parameters (1.86 GiB) are on the GPU while they are in use (the LoRA
#: Z3+O rows with recomputation, whose activations are small, measured 1.9 GiB over the rest).
ZERO3_MAX_LIVE_PARAMETERS = 1e9

#: What the caching allocator keeps reserved for ZeRO-3's communication streams over several
#: ranks, in both phases (accounting from DeepSpeed's defaults, not fitted): the all-gather
#: stream's gathered bf16 parameters (at most ZERO3_MAX_LIVE_PARAMETERS, 1.86 GiB) and, where
#: full gradients are reduced (no adapter), the reduce stream's flattened bf16 buckets, up to
#: ZERO3_REDUCE_BUCKETS_IN_FLIGHT of reduce_bucket_size elements (stage3's two
#: max_param_reduce_events in flight and the one being reduced: 2.79 GiB). Blocks a side stream
#: freed are reused only by that stream. Held against the 28 DeepSpeed ZeRO-3 rows on two and
#: four H200s, the reserved peaks the model gave without them were 1.4-61 % short (13.9 % for
#: llama2-7b Z3 at batch 1 on the pair); with them -43 % (llama2-70b L+F+R+Z3+O on four H200s) to
#: +6.1 %, 24 within -12 %. One GPU is left out: its rows' fitted cached terms (CACHED_*) already
#: hold what a pool keeps there, and adding the pools put 107 of its 111 rows (the tiny model
#: aside) over, by a median 4.4 % and up to 21 %.
ZERO3_REDUCE_BUCKETS_IN_FLIGHT = 3
ZERO3_REDUCE_BUCKET_ELEMENTS = 5e8

#: What the caching allocator holds reserved beyond the allocated peak: bytes per
#: vocabulary entry and token, and a share of the saved activations. The loss's large
#: blocks (bf16 logits, their fp32 upcast and gradient, gigabytes each at a large batch) are
#: carved out while the freed blocks of other sizes stay cached, so reserved memory runs
#: ahead of allocated by a multiple of the logits; and the activations, many blocks freed
#: and made again each step, leave a few per cent of their size cached. Fitted together
#: (llmbench.memory.fit: least squares over the ok DeepSpeed GPU rows whose
#: forward/backward peak is at least 60 % of the GPU, full-parameter 4-bit rows left out:
#: they keep their load-time reservation too). One H100's llama2-7b L+F+R at batch 182-203
#: and QL+F+R at 209-233 held 15-19 GiB beyond the allocated peak, where 5 % of it would
#: allow 3: the margin alone let the model suggest batch 280 and 320, which ran out of
#: memory, for 200 and 232. Without recomputation, near the limit (7B and 13B LoRA and
#: QLoRA at their largest batch on one H100 and one H200), 2.2-7.5 GiB, where the logits'
#: term alone gave 0.5-3 (a median error of 3.0 GiB, 1.1 with the activations' share).
#: ZeRO-3's rows are left out too (the fit is over the other 259 rows): they follow neither
#: term. Its adapters' recomputation rows (L+F+R+Z3, no offload) hold 5.5-11 GiB less than
#: these constants give, its full-parameter rows 3.0-4.4 GiB more. The likely cause, not
#: traced: ZeRO-3 allocates and frees each layer's gathered parameters through forward and
#: backward, from the cache the logits' blocks sit in. With them in, the fit gives 7.5 and
#: 0.041 and moves the other rows' hints up; the search backs off either way.
CACHED_LOGITS_BYTES = 7.7
CACHED_ACTIVATION_FRACTION = 0.040

#: Safety margin: a cell fits when its predicted reserved peak (the allocated peak plus
#: the allocator's cached share) x (1 + MARGIN) is at most the platform's gpu_memory_gib.
#: Chosen on the reference records (llmbench.memory.validate reports the figures): any
#: margin under 8.4% predicts no ok cell of a sweep not to fit (the closest: Megatron-LM
#: tp1pp1-distopt at batch 18 on the H200 pair); catching the one OOM it misses (Megatron-LM
#: TP2 at batch 39, under-predicted by 3.5%) would need 10.4%. 5% leaves room for the
#: model's spread (90th percentile |error| about 5%). The rest of the allocator's slack is
#: not a term: on the ok records it ranged from 0.1 to 28 GiB (median 15% of allocated; the
#: 4-bit cells keep their load-time reservation), too irregular for a constant; the margin
#: and the platform's gpu_memory_gib (above what CUDA reports usable: 139.8 GiB of an
#: H200's 141) absorb it where it matters, near the limit.
#: On the committed GPU records, with each family's margin (margin_for: this one where the
#: held-out errors ask for no more), the ok rows it predicts not to fit are all at a
#: max-batch search's boundary (89-98 % of the GPU reserved, median 95 %: 148 search probes
#: and 42 cells measured at a searched batch, where the search's own 5 % headroom draws the
#: line), and it catches 64 of the 68 OOM records; the other four are predicted at 93-99.5 %
#: of the limit with their margin (13B L+Z2 at batch 9 and 70B QL+R at 33 on the H100, 13B
#: L+R at 262 on an H200, Megatron-LM at batch 39 on two H200s): tables/memory-model.
MARGIN = 0.05

#: Safety margin per technique family (llmbench.memory.model.FAMILIES): the 95th percentile
#: of how far the reserved peak of records the constants were not fitted to went beyond its
#: prediction (as a share of the prediction), over the records that held at least 85 % of
#: their GPU reserved, where a fit is decided; from the later 30 % of the records (by start
#: time) predicted by a fit on the earlier 70 % (llmbench.memory.heldout: ``python -m
#: llmbench.memory heldout``, the table tables/memory-model-heldout). Never under MARGIN: only
#: ok records are scored, so they can show that a family needs more, not that it can do with
#: less (ZeRO-3's 3.2 % would have hinted one H200's Z3 and F+Z3 searches batches that ran
#: out of memory). FSDP2's 8.4 % comes from its searched probes near the limit (its
#: activations at a large batch reserve more than the model predicts). Where the time split
#: holds fewer than 10 of a family's records near the limit, the leave-the-family-out split
#: decides: 4-bit's 16.7 % is that error (fitted without any 4-bit record, the model misses
#: Q's own activations). A family with fewer than 10 such records in either split
#: (Megatron-LM, offload, recomputation, ZeRO-2 and ZeRO-0 full-parameter cells: few records
#: near the limit) keeps MARGIN, and so does one whose quantile is under it (LoRA's). QLoRA's
#: 5.5 % comes from the time split's later records near the limit, llama3.1-70b's searched
#: probes on one H200 among them. The time split cuts all records at one start
#: time, so any family's new records can move another family's margin: they are refitted with
#: the records, and the calibration tier holds them to the held-out validation.
FAMILY_MARGINS: dict[str, float] = {"fsdp2": 0.084, "4-bit": 0.167, "qlora": 0.055}


def margin_for(family: str) -> float:
    """The safety margin of a technique family: FAMILY_MARGINS, else MARGIN."""
    return FAMILY_MARGINS.get(family, MARGIN)
