// The GPT-2 model: parameters, gradients, optimizer state and activations, each one allocation in
// backend ("device") memory, and the forward, backward and update written once against the kernel
// interface of kernels/kernels.h.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    floatX* t[NUM_PARAMETER_TENSORS]; // pointers into one allocation, in model-file order
} ParameterTensors;

// What the forward keeps for the backward. With recompute >= 1 the GELU output is one (B,T,4C)
// buffer rebuilt from fch during the backward; with recompute >= 2 the layernorm outputs ln1 and ln2
// are one (B,T,C) buffer each, rebuilt from the residual stream. The top layer's are not rebuilt:
// the forward's last layer left them there.
typedef struct {
    floatX* encoded;     // (B, T, C) token + position embedding
    floatX* ln1;         // (L, B, T, C), or (B, T, C) with recompute >= 2
    float* ln1_mean;     // (L, B, T)
    float* ln1_rstd;     // (L, B, T)
    floatX* qkv;         // (L, B, T, 3C)
    floatX* atty;        // (L, B, T, C) attention output before the projection
    char* att_saved;     // L x attention_saved_bytes(B, T, NH)
    floatX* residual2;   // (L, B, T, C) after the attention block
    floatX* ln2;         // like ln1, rows linear_bias_ld(C) apart (fc's input with its bias columns)
    float* ln2_mean;     // (L, B, T)
    float* ln2_rstd;     // (L, B, T)
    floatX* fch;         // (L, B, T, 4C) before GELU
    floatX* fch_gelu;    // (L, B, T, 4C), or (B, T, 4C) with recompute >= 1
    floatX* residual3;   // (L, B, T, C) block outputs
    floatX* lnf;         // (B, T, C)
    float* lnf_mean;     // (B, T)
    float* lnf_rstd;     // (B, T)
    floatX* logits;      // head_classifier's scratch for the head's slice of S sequences
                         // (gpt2_head_slice_sequences), whose first (S, T, Vp) floatX can hold the
                         // slice's logits; gpt2_logits_row's row of logits
    float* losses;       // (B, T)
    // backward working buffers, reused by every layer
    floatX* dresidual;   // (B, T, C) gradient of the residual stream
    floatX* dbuf_c;      // (B, T, C); from a forward with dloss to its backward: dL/dlnf
    floatX* dbuf_3c;     // (B, T, 3C)
    floatX* dbuf_4c;     // (B, T, 4C)
    char* att_scratch;   // attention_scratch_bytes(B, T, C, NH)
    int* inputs;         // (B, T) token ids on the device
    int* targets;        // (B, T)
    float* row;          // (Vp) one row of logits as fp32, for sampling
} Activations;

// Weights pass between the host and the device in pieces of at most this many floats (64 MiB), and
// offloaded optimizer state through the device in pieces of a quarter as many (16 MiB: copies of
// that size still run at PCIe's full speed), one in each of the DEV_SLOTS (kernels.h) the update
// streams them through: the staging and the offload buffers stay small.
#define GPT2_PIECE_FLOATS ((size_t)1 << 24)
#define GPT2_OFFLOAD_PIECE_FLOATS (GPT2_PIECE_FLOATS / 4)

// The device memory of one rank, in bytes, exactly as gpt2_build allocates it, and the host memory
// that offloading takes. The peak is the total: the staging piece exists only while weights are
// loaded (init, model file, resume) or gathered (a ZeRO checkpoint), but then everything else is
// allocated too.
typedef struct {
    size_t parameters, gradients;
    size_t gradient_scratch; // of gradients: the fp32 scratch of bf16 gradients (GRADS=BF16), else 0
    // AdamW m and v, and the master weights when floatX is not float; offloaded: the device's
    // buffers for one piece of each, the state itself in host memory (host_optimizer)
    size_t optimizer;
    size_t activations;      // one block: what the forward keeps, backward buffers, attention scratch
    size_t attention_state;  // of which the attention's saved state
    size_t staging;          // one piece of fp32 weights while they are loaded or gathered
    size_t total;
    size_t host_optimizer;   // pinned host memory of the offloaded optimizer state (0 without offload)
} MemoryPlan;

// What a model is built for: everything its memory depends on, and how its gradients are summed.
typedef struct {
    GPT2Config config;
    int B, T;              // the largest batch the activations hold
    int recompute;         // -r: 0, 1 (GELU rebuilt in the backward) or 2 (the layernorms too)
    int zero_stage;        // -z: 0, or 1 (the optimizer state sharded over the ranks)
    int world;             // the ranks (comm_world() when it is built)
    int head_slice_tokens; // GPT2_HEAD_SLICE_TOKENS, wider where the memory allows, narrower where
                           // B fits only so (model/fit.h)
    // --batch-invariant: the backward sums parameter gradients over groups of group_sequences
    // sequences (group_rows = group_sequences T, kernels.h), so every micro-batch B that is a
    // multiple of it trains the same bits; 0: one sum per micro-batch.
    int group_sequences;
    // --offload: 1 keeps AdamW m, v and the master weights in pinned host memory, and gpt2_update
    // streams them through the device piece by piece (the same kernel on the same values: the same
    // bits); 0 keeps them on the device. Not with zero_stage 1.
    int offload;
} GPT2BuildSpec;

// The plan of gpt2_build(spec) on one of spec->world ranks: the sizes come from the same code that
// carves the allocations, for this build's floatX and attention.
MemoryPlan gpt2_memory_plan(const GPT2BuildSpec* spec);

// Where a GRADS=BF16 build's kernels write a micro-step's fp32 gradients, which gpt2_backward then
// folds into the bf16 gradients (model/gpt2.c, "where the kernels write the gradients"): two slots
// of one layer's 12 tensors each, layer l's in slot l % 2, since layer l's last layernorm backward
// sums layer l - 1's fcproj bias gradient before layer l's own are complete (its weight-gradient
// stream still runs); and wte's, wpe's, lnfw's and lnfb's (the head writes wte's in the forward).
typedef struct {
    float* slots;    // 2 x slot_floats, one allocation with nonlayer
    float* nonlayer; // nonlayer_floats
    size_t offset[NUM_PARAMETER_TENSORS]; // tensor i's (a layer tensor's: one layer's) in its scratch
    size_t slot_floats, nonlayer_floats;
    size_t slot_zeroed, nonlayer_zeroed; // the first floats of each: the gradients kernels add into
} GradScratch;

typedef struct {
    GPT2Config config;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    ParameterTensors params;
    gradX* grads; // the parameters' gradients, each at its parameter's offset: fp32, or bf16 (GRADS=BF16)
    GradScratch scratch; // GRADS=BF16's fp32 scratch (else all NULL and 0)
    // With group_sequences (else NULL): the encoder's share of wte's gradient (the head's goes into
    // grads during the forward), added to grads before their sum over the ranks.
    float* wte_encoder_grad;
    // gpt2_zero_grad leaves the products' weight gradients (wte's and each layer's four matrices,
    // all but 0.1% of GPT-2 124M's gradients) as they are: a step's first product into each writes
    // it (GRAD_WRITE, kernels.h). Until then they hold the last step's values, which these say: wte's
    // until the first head backward (in gpt2_forward with dloss), the layers' until the end of the
    // first gpt2_backward. With bf16 gradients (GRADS=BF16) the first backward's folds write all of
    // grads (layer_grads_stale), and wte_grad_stale is about wte's scratch: stale again after each
    // backward, which folds it.
    int wte_grad_stale, layer_grads_stale;
    // Data parallelism over comm_world() ranks: parameters and gradients are padded to world * shard
    // elements, and rank r owns the shard [r * shard, (r + 1) * shard). This rank keeps master
    // weights and AdamW moments for parameters [opt_offset, opt_offset + opt_count): all of them
    // with ZeRO stage 0, its own shard with stage 1.
    int zero_stage, rank, world;
    size_t shard, opt_offset, opt_count;
    CommPiece* sum_pieces; // GPT2_MAX_SUM_PIECES(world), for gpt2_sum_pieces
    int sums_started;      // the last gpt2_backward queued the gradients' sums over the ranks
    int nan_gradient_pending; // gpt2_inject_nan_gradient's, until the gradients are complete
    // In device memory, or with offload in pinned host memory (dev_malloc_host).
    float* master;       // fp32 master weights when floatX is not float, else NULL (params are fp32)
    float* adam_m;
    float* adam_v;
    int offload;         // GPT2BuildSpec's
    // With offload: each slot's piece of master (when there is one), m and v, of
    // GPT2_OFFLOAD_PIECE_FLOATS each.
    float *piece_master[DEV_SLOTS], *piece_m[DEV_SLOTS], *piece_v[DEV_SLOTS];
    int B, T, recompute; // the largest batch the activations were allocated for
    int head_slice_tokens; // the head's slices (gpt2_head_slice_sequences)
    int fwd_B, fwd_T;    // shape of the last forward, which the backward differentiates
    int group_sequences; // GPT2BuildSpec's: the gradients' sums in groups of sequences, 0: none
    Activations acts;
    int training;        // 0: built by gpt2_build_forward_only (no gradients, no optimizer state)
    MemoryPlan plan;
    // Host staging (pinned on the GPU), so that a forward neither waits for the GPU nor leaves it
    // idle: each forward's tokens pass through a slot of staged_tokens (appended; when full, one
    // dev_synchronize and the slots start over), and with targets its B*T losses come back into
    // host_losses behind it, appended until gpt2_losses waits for them.
    int* staged_tokens;
    size_t staged_used, staged_capacity;
    float* host_losses;
    size_t losses_pending, losses_capacity;
} GPT2;

// Prints the memory plan (on rank 0), then allocates everything for batches up to B x T, for this
// rank of spec->world, which must be comm_world() (call comm_init first when there are several).
// The weights are not initialised: call gpt2_init_random or gpt2_set_weights.
void gpt2_build(GPT2* model, const GPT2BuildSpec* spec);
// The same model for the forward only (generation, evaluation): parameters and activations, without
// gradients and optimizer state (2 bytes per parameter in the BF16 build instead of 18, 4 in FP32
// instead of 16, besides the fp32 staging while the weights load), so a card that cannot train a
// model can still run it. One process, no recompute; backward and update must not be called.
void gpt2_build_forward_only(GPT2* model, const GPT2Config* cfg, int B, int T);
void gpt2_free(GPT2* model);
// Prints where the memory of a build of spec goes (plan: gpt2_memory_plan(spec), less gradients and
// optimizer when not training): parameters, gradients, optimizer, activations, staging.
void gpt2_print_memory_plan(const GPT2BuildSpec* spec, const MemoryPlan* plan, int training);

// GPT-2 init from the seed: gpt2_initial_weights (init.h), then loaded as gpt2_set_weights loads.
void gpt2_init_random(GPT2* model, unsigned long long seed);
// Weights from / to a host fp32 array of num_parameters values (model-file order). With ZeRO stage
// 1 in the BF16 build, gpt2_get_weights gathers the master weights: every rank must call it.
void gpt2_set_weights(GPT2* model, const float* host);
void gpt2_get_weights(const GPT2* model, float* host);
// What this rank's optimizer keeps, from / to host fp32 arrays of opt_count values each: the fp32
// weights (master or parameters), AdamW's m and v of parameters [opt_offset, opt_offset +
// opt_count). Setting it rebuilds the parameters as the update of step t (with gpt2_update's seed)
// left them, bit for bit also in the BF16 build (t = 0: as at init), and is collective with ZeRO
// stage 1 (the ranks exchange their shards).
void gpt2_set_optimizer_state(GPT2* model, const float* weights, const float* m, const float* v,
                              int t, unsigned long long seed);
void gpt2_get_optimizer_state(const GPT2* model, float* weights, float* m, float* v);

// Forward pass over B x T tokens (host arrays, copied before it returns; B, T at most what was
// built). It queues the work and returns without waiting for the GPU. With targets, the B x T
// losses follow it to the host: gpt2_losses returns them. dloss > 0 means a backward follows: the
// forward also runs the head's backward (dloss * dL/dlogits, dloss = 1 / (tokens of the whole step)
// averaging over micro-batches), adding the head's share of wte's gradient (writing it, the first
// after gpt2_zero_grad), so that the logits are only ever stored one slice of the batch at a time.
// Without targets it stops before the head.
void gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss);
// Waits for the losses of the forwards with targets since the last call and returns them, forward
// after forward (B x T each, row-major), in host memory valid until the next forward; *count says
// how many. It waits for their downloads only, not for a backward queued after them: a training
// step calls it once, after all its micro-batches are queued, and reads the losses while the GPU
// runs the last backward.
const float* gpt2_losses(GPT2* model, size_t* count);
// The sum of n losses in double, in order. A loss reported as this sum over all its positions
// divided by their number does not depend on how the positions were batched: with
// --batch-invariant, B 8 and B 64 log the same bits (a mean of per-batch means rounded to float
// differed in the last bit).
double gpt2_loss_sum(const float* losses, size_t n);
// Backward of the last forward (called with dloss > 0): adds into the gradients (the first after
// gpt2_zero_grad writes the layers' weight matrices' instead: layer_grads_stale). sum_over_ranks
// (the step's last backward only): with several ranks, each layer's gradients start their sum over
// the ranks once complete, on NCCL's stream beside the layers below (gpt2_sum_pieces' buckets, the
// other tensors' last), and gpt2_reduce_gradients waits for them; 0 leaves the sum to
// gpt2_reduce_gradients, in one collective after the backward. On 2 ranks both give the same bits.
void gpt2_backward(GPT2* model, int sum_over_ranks);
// The gradients from here on are the next forwards' and backwards' alone: zeroed, or, for the big
// weight gradients, written by their first product (wte_grad_stale).
void gpt2_zero_grad(GPT2* model);
// A training step ends in two calls, so that the caller can decide between them, from values that
// are the same on every rank, whether to apply the update (train.c skips non-finite and outlier steps):
// gpt2_reduce_gradients completes wte's gradient (wte_encoder_grad), sums the gradients over the
// ranks (all-reduce, or reduce-scatter with ZeRO stage 1), or waits for the sums the step's last
// backward started (the same elements, summed into the same ranks), and returns the global
// gradient norm. *loss is this rank's mean loss of the step on entry
// and the mean over the ranks on return: it travels in the all-reduce of the norm, which the step
// waits for anyway. Collective: every rank calls it.
float gpt2_reduce_gradients(GPT2* model, double* loss);
// One AdamW step (t counts the updates applied, from 1) with the reduced gradients scaled by
// grad_clip / norm when the norm is above grad_clip (> 0), on the parameters this rank keeps
// optimizer state for (then all-gathered with ZeRO stage 1). seed: the stochastic rounding of the
// BF16 build (gpt2_set_optimizer_state needs the same t and seed). Collective with ZeRO stage 1.
// With loss scaling the gradients hold the loss scale times the true gradients: norm is the TRUE
// norm (the reduced one divided by the scale) and inv_loss_scale is 1 / the scale (1 without
// scaling); a power of two, so the gradient AdamW sees has the bits of an unscaled run's.
void gpt2_update(GPT2* model, float norm, float lr, float beta1, float beta2, float eps,
                 float weight_decay, float grad_clip, float inv_loss_scale, int t, unsigned long long seed);
// For the tests of the divergence guard only (train_gpt's --inject-nan-grad): makes one gradient
// value of this step NaN, as an overflow in the backward would, before the gradients are summed
// over the ranks. Call before the step's last gpt2_backward.
void gpt2_inject_nan_gradient(GPT2* model);

// The gradients' sums over the ranks in buckets: bucket l < L holds layer l's 12 tensors, bucket L
// the others (wte, wpe, lnfw, lnfb) and, with ZeRO stage 1, the padding up to world * shard. Fills
// out (GPT2_MAX_SUM_PIECES(world) at most) with the bucket's pieces, in model-file order, and
// returns how many: with stage 0 one per tensor (a layer's slice of it), summed on every rank; with
// stage 1 that cut at the shards' bounds, each summed into its shard's rank. Over all buckets they
// cover the gradients once each, as the one all-reduce (stage 0, num_parameters) or reduce-scatter
// (stage 1, world * shard) that gpt2_reduce_gradients makes otherwise.
#define GPT2_MAX_SUM_PIECES(world) (NUM_PARAMETER_TENSORS + 1 + (world))
int gpt2_sum_pieces(const size_t sizes[NUM_PARAMETER_TENSORS], int L, int bucket, int zero_stage, int world,
                    CommPiece* out);
// The gradients (num_parameters values, model-file order) into host fp32, bf16 ones widened exactly.
void gpt2_get_gradients(const GPT2* model, float* host);
// fp32 logits of position t of batch row b of the last forward (T tokens per row), V values, made
// from its lnf by a product of that one row.
void gpt2_logits_row(GPT2* model, int b, int t, int T, float* host_out);

#ifdef __cplusplus
}
#endif
