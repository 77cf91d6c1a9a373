// Fitting a run to the memory of a card (-b auto): the micro-batch B and the recompute level whose
// memory plan (gpt2_memory_plan, the sizes gpt2_build allocates) fits a byte budget. Pure functions
// of the sizes, so the CPU tests check the choice for any card.
#pragma once
#include <stddef.h>

#include "model/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

// Memory a plan leaves unplanned: what the plan does not count and cannot know. With --memory-limit
// the CUDA context of the smaller card (300-600 MiB), and in every case the cuBLAS and cuBLASLt
// workspaces (32 MiB and more), NCCL's buffers on several GPUs (tens to hundreds of MiB), the
// kernels' scratch buffers (column-sum partials; the encoder's buckets, about 6 B T ints, and sequence
// sums, at most B T C bytes: 50 MB at d12 B 64 T 1024; the weight gradients' products, with
// --batch-invariant up to 64 MiB) and cudaMalloc's 2 MiB granularity.
// Checked on the GPU by tests/gpu/test_recipe_gpu.sh, which holds each run's peak to its --memory-limit.
#define FIT_MARGIN_BYTES ((size_t)1 << 30)

// GPT2BuildSpec.offload for gpt2_fit and gpt2_fit_offload: GPT2_OFFLOAD_NEEDED offloads only when
// nothing fits without it; GPT2_OFFLOAD_AUTO too, and with gpt2_fit also when offloading lets B grow
// FIT_OFFLOAD_B_GAIN times and a step holds at least FIT_OFFLOAD_MIN_TOKENS tokens per GPU (train.c
// takes GPT2_OFFLOAD_NEEDED where the host cannot hold the state). An offloaded step moves 12 bytes a
// parameter up and 12 down (at once), against 6 FLOPs a parameter and token of compute: at 64K tokens
// a step that is under a quarter of the step on an H200 (50 GB/s each way, 40% of 989 TFLOP/s), less
// on slower GPUs; while a micro-batch of 1 instead of 4 more than doubles the step (d24 at --memory-limit 8, -d
// 1048576: B 1 -r 1 13.2 s, offloaded B 4 -r 0 5.75 s; docs/options.md).
#define GPT2_OFFLOAD_AUTO (-1)
#define GPT2_OFFLOAD_NEEDED (-2)
#define FIT_OFFLOAD_B_GAIN 4
#define FIT_OFFLOAD_MIN_TOKENS 65536

typedef struct {
    GPT2BuildSpec spec; // the run with its B and recompute level chosen
    MemoryPlan plan;    // gpt2_memory_plan(&spec)
} Fit;

// The largest B that divides seqs_per_gpu (the per-GPU share of the total batch, in sequences of
// T) and is a multiple of run->group_sequences (--batch-invariant's group, when set) and, for that
// B, the lowest recompute level in recompute_lo..recompute_hi whose plan fits in `memory` bytes
// less FIT_MARGIN_BYTES, in that order of cost, with the head's slices at GPT2_HEAD_SLICE_TOKENS;
// where none does, the widest narrower slices (down to gpt2_fit_narrowest_head_slice_tokens) at
// recompute_hi, before a smaller B; with run->offload GPT2_OFFLOAD_AUTO or GPT2_OFFLOAD_NEEDED,
// offloading where they say. run gives the model, T, zero_stage, world, group_sequences and offload;
// fit->spec is run with B, recompute, offload and the head's slices chosen. Returns 1 and fills
// *fit, or 0 when nothing fits (not even B = 1 at recompute_hi with the narrowest slices, offloaded
// where allowed).
int gpt2_fit(const GPT2BuildSpec* run, int seqs_per_gpu, int recompute_lo, int recompute_hi, size_t memory,
             Fit* fit);

// The narrowest head slices a run may take: GPT2_HEAD_NARROWEST_SLICE_TOKENS, or with a
// --batch-invariant group GPT2_HEAD_SLICE_TOKENS, whose splits of a group its bits rest on
// (model/config.h).
int gpt2_fit_narrowest_head_slice_tokens(const GPT2BuildSpec* run);

// For a run of a given B and recompute level: spec->offload, or with GPT2_OFFLOAD_AUTO or
// GPT2_OFFLOAD_NEEDED 1 when its plan without offload does not fit in `memory` less FIT_MARGIN_BYTES
// even with the narrowest head slices, else 0.
int gpt2_fit_offload(const GPT2BuildSpec* spec, size_t memory);

// The head's slice tokens for a build of spec (its head_slice_tokens aside): the widest of
// GPT2_HEAD_WIDEST_SLICE_TOKENS, its half, ... down to gpt2_fit_narrowest_head_slice_tokens whose
// plan fits in `memory` bytes less FIT_MARGIN_BYTES (fewer slices move fewer bytes: model/config.h),
// else the narrowest. Slices wider than GPT2_HEAD_SLICE_TOKENS, which gpt2_fit plans B and the
// recompute level with, only take memory that nothing else would.
int gpt2_fit_head_slice_tokens(const GPT2BuildSpec* spec, size_t memory);

// For a run that does not fit even at B = 1: what would, at B = 1 and recompute level recompute_hi,
// written into buf as a list for a message (the longest T that divides run->T, the largest smaller
// GPT-2 size at this T, -r 2 when recompute_hi is lower, ZeRO stage 1 on several GPUs, --offload
// auto when run->offload is 0), or "nothing
// shorter or smaller fits either". run gives the model, T, zero_stage and world.
void gpt2_fit_advice(char* buf, size_t n, const GPT2BuildSpec* run, int recompute_hi, size_t memory);

#ifdef __cplusplus
}
#endif
