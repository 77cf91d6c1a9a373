#include "model/gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/init.h"

// ---- allocation --------------------------------------------------------------------------

// Carves named regions out of one allocation: a first pass with base == NULL only adds up the
// sizes, the second hands out pointers. Regions are 256-byte aligned for vector loads.
typedef struct {
    char* base;
    size_t used;
} Carver;

static void* carve(Carver* c, size_t bytes) {
    void* p = c->base ? c->base + c->used : NULL;
    c->used += (bytes + 255) / 256 * 256;
    return p;
}

// Elements between rows of ln2: fc's input carries its bias columns (kernels.h), from which fc's
// backward has its bias gradient.
static int ln2_ld(int C) { return linear_bias_ld(C); }

// The activations of batches up to B x T: carve(c, ...) for each buffer, the only place that says
// how big they are (the memory plan is a sizing pass of this function).
static void carve_activations(Activations* a, const GPT2BuildSpec* spec, Carver* c) {
    const GPT2Config* cfg = &spec->config;
    size_t B = (size_t)spec->B, T = (size_t)spec->T;
    int recompute = spec->recompute;
    size_t C = cfg->channels, L = cfg->num_layers;
    size_t Vp = cfg->padded_vocab_size, BT = B * T, X = sizeof(floatX);
    size_t L_ln = recompute >= 2 ? 1 : L;      // layers that keep their own ln1/ln2
    size_t L_gelu = recompute >= 1 ? 1 : L;    // layers that keep their own GELU output
    a->encoded = carve(c, BT * C * X);
    a->ln1 = carve(c, L_ln * BT * C * X);
    a->ln1_mean = carve(c, L * BT * sizeof(float));
    a->ln1_rstd = carve(c, L * BT * sizeof(float));
    a->qkv = carve(c, L * BT * 3 * C * X);
    a->atty = carve(c, L * BT * C * X);
    a->att_saved = carve(c, L * attention_saved_bytes(B, T, cfg->num_heads));
    a->residual2 = carve(c, L * BT * C * X);
    a->ln2 = carve(c, L_ln * BT * ln2_ld(cfg->channels) * X);
    a->ln2_mean = carve(c, L * BT * sizeof(float));
    a->ln2_rstd = carve(c, L * BT * sizeof(float));
    a->fch = carve(c, L * BT * 4 * C * X);
    a->fch_gelu = carve(c, L_gelu * BT * 4 * C * X);
    a->residual3 = carve(c, L * BT * C * X);
    a->lnf = carve(c, BT * C * X);
    a->lnf_mean = carve(c, BT * sizeof(float));
    a->lnf_rstd = carve(c, BT * sizeof(float));
    // the largest slice's (head_classifier's scratch, whose first floatX can hold its logits)
    const int head_rows = gpt2_head_slice_sequences((int)B, (int)T, 0, spec->head_slice_tokens) * (int)T;
    a->logits = carve(c, head_scratch_bytes(head_rows, (int)C, (int)Vp));
    a->losses = carve(c, BT * sizeof(float));
    a->dresidual = carve(c, BT * C * X);
    a->dbuf_c = carve(c, BT * C * X);
    a->dbuf_3c = carve(c, BT * 3 * C * X);
    a->dbuf_4c = carve(c, BT * 4 * C * X);
    a->att_scratch = carve(c, attention_scratch_bytes(B, T, C, cfg->num_heads));
    a->inputs = carve(c, BT * sizeof(int));
    a->targets = carve(c, BT * sizeof(int));
    a->row = carve(c, Vp * sizeof(float));
}

// Each rank's share of n parameters: a multiple of 64 elements keeps every shard's start 256-byte
// aligned.
static size_t shard_size(size_t n, int world) {
    size_t shard = (n + (size_t)world - 1) / (size_t)world;
    return (shard + 63) / 64 * 64;
}

// The floats of a piece for arrays of n: GPT2_PIECE_FLOATS, or n when that is smaller.
static size_t piece_floats(size_t n) { return n < GPT2_PIECE_FLOATS ? n : GPT2_PIECE_FLOATS; }
static size_t offload_piece_floats(size_t n) { return n < GPT2_OFFLOAD_PIECE_FLOATS ? n : GPT2_OFFLOAD_PIECE_FLOATS; }
// With ZeRO, the master weights are gathered from the ranks' shards a piece of each at a time: a
// staging piece's worth in all.
static size_t gathered_piece_floats(size_t shard, int world) { return piece_floats(shard * (size_t)world) / (size_t)world; }

// ---- where the kernels write the gradients -----------------------------------------------------
// The kernels write fp32 parameter gradients (kernels.h). Where the model's gradients are fp32
// (GRADS=FP32, and the CPU), they write them in place, into model->grads. Where they are bf16
// (GRADS=BF16), they write them into the fp32 GradScratch (gpt2.h), and each micro-step folds the
// scratch into model->grads, one rounding per value (gradX_fold): a layer's slot once the layer's
// last write has finished (the wait for its weight-gradient stream), the non-layer tensors' after
// the encoder's backward. The first micro-step of a step writes the bf16 values, so they need no
// zeroing; later ones add. A slot is fresh in every micro-step, so every micro-step's first product
// writes its weight gradient (GRAD_WRITE), and the slot's other gradients are zeroed before its
// first write.

static int is_layer_tensor(int i) { return i >= P_LN1W && i <= P_FCPROJB; }

#if defined(GRADS_BF16)
static const int grads_in_scratch = 1;

// Lays out the scratch of cfg's gradients at base (NULL: the sizes only) and returns its floats: two
// slots, then the non-layer tensors. In each, the gradients that kernels add into come first (one
// memset zeroes them), then the products' (gpt2_gradient_written); each starts 256-byte aligned.
static size_t lay_out_grad_scratch(GradScratch* s, const GPT2Config* cfg, float* base) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(cfg, sizes);
    size_t used[2] = {0, 0}; // [0]: the non-layer tensors', [1]: a slot's
    for (int written = 0; written <= 1; written++) {
        if (written) s->nonlayer_zeroed = used[0], s->slot_zeroed = used[1];
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            if (gpt2_gradient_written(i) != written) continue;
            const int layer = is_layer_tensor(i);
            s->offset[i] = used[layer];
            used[layer] += ((layer ? sizes[i] / cfg->num_layers : sizes[i]) + 63) / 64 * 64;
        }
    }
    s->slot_floats = used[1];
    s->nonlayer_floats = used[0];
    s->slots = base;
    s->nonlayer = base ? base + 2 * s->slot_floats : NULL;
    return 2 * s->slot_floats + s->nonlayer_floats;
}

// Where the kernels write a parameter's gradient: layer l's in slot l % 2, the others' in the
// non-layer scratch.
static float* grad_of(const GPT2* model, const floatX* param) {
    int i = 0;
    while (i + 1 < NUM_PARAMETER_TENSORS && param >= model->params.t[i + 1]) i++;
    size_t index = param - model->params.t[i];
    const GradScratch* s = &model->scratch;
    if (!is_layer_tensor(i)) return s->nonlayer + s->offset[i] + index;
    const size_t per_layer = model->param_sizes[i] / model->config.num_layers, l = index / per_layer;
    return s->slots + l % 2 * s->slot_floats + s->offset[i] + index % per_layer;
}

// Before layer l's first gradient is written (the fcproj bias's, by the layernorm backward above it).
static void start_layer_grads(GPT2* model, int l) {
    dev_memset_zero(model->scratch.slots + l % 2 * model->scratch.slot_floats, model->scratch.slot_zeroed * sizeof(float));
}

// Once layer l's gradients are all written: each of its tensors into its place in grads.
static void fold_layer_grads(GPT2* model, int l) {
    const int mode = model->layer_grads_stale ? GRAD_WRITE : GRAD_ADD;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (!is_layer_tensor(i)) continue;
        const floatX* param = model->params.t[i] + model->param_sizes[i] / model->config.num_layers * l;
        gradX_fold(model->grads + (param - model->params.t[0]), grad_of(model, param),
                   model->param_sizes[i] / model->config.num_layers, mode);
    }
}

// Before the backward: wte's gradient the head has written in the forward, the others start from zeros.
static void start_nonlayer_grads(GPT2* model) {
    dev_memset_zero(model->scratch.nonlayer, model->scratch.nonlayer_zeroed * sizeof(float));
}

// After the encoder's backward. wte's scratch is then spent: the next micro-step's head writes it.
static void fold_nonlayer_grads(GPT2* model) {
    const int mode = model->layer_grads_stale ? GRAD_WRITE : GRAD_ADD;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (is_layer_tensor(i)) continue;
        gradX_fold(model->grads + (model->params.t[i] - model->params.t[0]), grad_of(model, model->params.t[i]),
                   model->param_sizes[i], mode);
    }
    model->wte_grad_stale = 1;
}

// --batch-invariant's share of wte's gradient that the encoder's backward kept apart, into grads.
static void add_kept_wte_grad(GPT2* model) {
    gradX_fold(model->grads, model->wte_encoder_grad, model->param_sizes[P_WTE], GRAD_ADD);
}

static float float_from_gradX(gradX g) { // bf16 is the top half of an fp32
    const uint32_t bits = (uint32_t)g << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static const gradX gradX_nan = 0x7fc0; // bf16's quiet NaN
#else
static const int grads_in_scratch = 0;

static size_t lay_out_grad_scratch(GradScratch* s, const GPT2Config* cfg, float* base) {
    (void)s, (void)cfg, (void)base;
    return 0;
}
// At the same offset in the gradients as the parameter in the parameters.
static float* grad_of(const GPT2* model, const floatX* param) { return model->grads + (param - model->params.t[0]); }
static void start_layer_grads(GPT2* model, int l) { (void)model, (void)l; }
static void fold_layer_grads(GPT2* model, int l) { (void)model, (void)l; }
static void start_nonlayer_grads(GPT2* model) { (void)model; }
static void fold_nonlayer_grads(GPT2* model) { (void)model; }
static void add_kept_wte_grad(GPT2* model) {
    float_accumulate(model->grads, model->wte_encoder_grad, model->param_sizes[P_WTE]);
}
static float float_from_gradX(gradX g) { return g; }
static const gradX gradX_nan = NAN;
#endif

// ---- the gradients' sums over the ranks -------------------------------------------------------
// Appends the pieces of count gradients at offset: one summed on every rank (ZeRO stage 0), or one
// per shard it touches, summed into that shard's rank (stage 1).
static int add_sum_pieces(CommPiece* out, int n, size_t offset, size_t count, int zero_stage, size_t shard) {
    if (zero_stage == 0) {
        if (count > 0) out[n++] = (CommPiece){offset, count, -1};
        return n;
    }
    while (count > 0) {
        const size_t owner = offset / shard, left_in_shard = (owner + 1) * shard - offset;
        const size_t len = count < left_in_shard ? count : left_in_shard;
        out[n++] = (CommPiece){offset, len, (int)owner};
        offset += len, count -= len;
    }
    return n;
}

int gpt2_sum_pieces(const size_t sizes[NUM_PARAMETER_TENSORS], int L, int bucket, int zero_stage, int world,
                    CommPiece* out) {
    size_t offset[NUM_PARAMETER_TENSORS], n = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) offset[i] = n, n += sizes[i];
    const size_t shard = shard_size(n, world);
    int pieces = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (bucket < L && is_layer_tensor(i)) {
            const size_t per_layer = sizes[i] / (size_t)L;
            pieces = add_sum_pieces(out, pieces, offset[i] + (size_t)bucket * per_layer, per_layer, zero_stage, shard);
        } else if (bucket == L && !is_layer_tensor(i)) {
            pieces = add_sum_pieces(out, pieces, offset[i], sizes[i], zero_stage, shard);
        }
    }
    // ZeRO's reduce-scatter summed the padding too (zeros on every rank, which the norm reads).
    if (bucket == L && zero_stage == 1) pieces = add_sum_pieces(out, pieces, n, shard * (size_t)world - n, 1, shard);
    return pieces;
}

// Queues the sums over the ranks of bucket's gradients (gpt2_sum_pieces), which are complete.
static void start_bucket_sums(GPT2* model, int bucket) {
    const int n = gpt2_sum_pieces(model->param_sizes, model->config.num_layers, bucket, model->zero_stage,
                                  model->world, model->sum_pieces);
    comm_sum_pieces_begin(model->grads, model->sum_pieces, n, COMM_GRADX);
}

MemoryPlan gpt2_memory_plan(const GPT2BuildSpec* spec) {
    const GPT2Config* cfg = &spec->config;
    size_t sizes[NUM_PARAMETER_TENSORS], n = gpt2_parameter_sizes(cfg, sizes);
    size_t shard = shard_size(n, spec->world), padded = shard * (size_t)spec->world;
    size_t opt_alloc = spec->zero_stage == 1 ? shard : n; // this rank's optimizer state
    size_t arrays = 2 + (sizeof(floatX) != sizeof(float)); // m, v and the master weights
    MemoryPlan p;
    p.parameters = padded * sizeof(floatX);
    GradScratch scratch;
    p.gradient_scratch = lay_out_grad_scratch(&scratch, cfg, NULL) * sizeof(float);
    // and, with --batch-invariant, the encoder's share of wte's kept apart (gpt2_backward)
    p.gradients = padded * sizeof(gradX) + p.gradient_scratch +
                  (spec->group_sequences ? sizes[P_WTE] * sizeof(float) : 0);
    p.optimizer = arrays * (spec->offload ? DEV_SLOTS * offload_piece_floats(opt_alloc) : opt_alloc) * sizeof(float);
    p.host_optimizer = spec->offload ? arrays * opt_alloc * sizeof(float) : 0;
    Activations unused;
    Carver sizing = {NULL, 0};
    carve_activations(&unused, spec, &sizing);
    p.activations = sizing.used;
    p.attention_state = (size_t)cfg->num_layers * attention_saved_bytes(spec->B, spec->T, cfg->num_heads);
    p.staging = piece_floats(padded) * sizeof(float);
    // gpt2_get_weights with ZeRO and offload: this rank's piece goes up before the gather
    if (spec->offload && spec->zero_stage == 1) p.staging += gathered_piece_floats(shard, spec->world) * sizeof(float);
    p.total = p.parameters + p.gradients + p.optimizer + p.activations + p.staging;
    return p;
}

static void point_parameters(ParameterTensors* p, floatX* base, const size_t* sizes) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        p->t[i] = base;
        base += sizes[i];
    }
}

// gpt2_build and gpt2_build_forward_only: the same model, with or without what training needs.
static void build(GPT2* model, const GPT2BuildSpec* spec, int training) {
    const GPT2Config* cfg = &spec->config;
    int B = spec->B, T = spec->T, zero_stage = spec->zero_stage;
    memset(model, 0, sizeof(*model));
    if (spec->world != comm_world())
        fatal("internal: a model built for %d ranks in a run of %d", spec->world, comm_world());
    const char* problem = gpt2_config_problem(cfg);
    if (problem) fatal("impossible model configuration: %s", problem);
    if (T > cfg->max_seq_len)
        fatal("sequence length -t %d is above the model's maximum of %d", T, cfg->max_seq_len);
    model->config = *cfg;
    model->B = B;
    model->T = T;
    model->recompute = spec->recompute;
    model->head_slice_tokens = spec->head_slice_tokens;
    model->group_sequences = spec->group_sequences;
    model->num_parameters = gpt2_parameter_sizes(cfg, model->param_sizes);
    size_t n = model->num_parameters;
    model->zero_stage = zero_stage;
    model->rank = comm_rank();
    model->world = comm_world();
    model->shard = shard_size(n, model->world);
    model->sum_pieces = xmalloc(GPT2_MAX_SUM_PIECES(model->world) * sizeof(CommPiece), "gradient sum pieces");
    size_t padded = model->shard * model->world;
    size_t lo = 0, hi = n; // this rank's optimizer range: everything, or its shard clipped to n
    if (zero_stage == 1) {
        lo = model->rank * model->shard < n ? model->rank * model->shard : n;
        hi = lo + model->shard < n ? lo + model->shard : n;
    }
    model->opt_offset = lo;
    model->opt_count = hi - lo;
    // With ZeRO the master shard is a whole shard long, so that it can be all-gathered.
    size_t opt_alloc = zero_stage == 1 ? model->shard : n;

    if (spec->offload != 0 && spec->offload != 1) fatal("internal: a model built before its offload was chosen");
    model->offload = training && spec->offload;
    model->training = training;
    model->plan = gpt2_memory_plan(spec);
    if (!training) { // the training plan less what only training holds
        model->plan.total -= model->plan.gradients + model->plan.optimizer;
        model->plan.gradients = model->plan.gradient_scratch = model->plan.optimizer = model->plan.host_optimizer = 0;
    }
    if (model->rank == 0) gpt2_print_memory_plan(spec, &model->plan, training);

    floatX* params = dev_malloc(padded * sizeof(floatX), "parameters");
    point_parameters(&model->params, params, model->param_sizes);
    dev_memset_zero(params, padded * sizeof(floatX));
    if (training) {
        model->grads = dev_malloc(padded * sizeof(gradX), "gradients");
        dev_memset_zero(model->grads, padded * sizeof(gradX)); // the padding stays zero
        size_t scratch = lay_out_grad_scratch(&model->scratch, cfg, NULL);
        if (scratch)
            lay_out_grad_scratch(&model->scratch, cfg, dev_malloc(scratch * sizeof(float), "fp32 gradient scratch"));
        size_t wte = model->param_sizes[P_WTE];
        if (model->group_sequences) {
            model->wte_encoder_grad = dev_malloc(wte * sizeof(float), "wte gradient of the encoder");
            dev_memset_zero(model->wte_encoder_grad, wte * sizeof(float));
        }
        size_t bytes = opt_alloc * sizeof(float);
        int has_master = sizeof(floatX) != sizeof(float);
        if (spec->offload) { // the state in host memory, a piece of each array on the device
            if (has_master) model->master = dev_malloc_host(bytes, "master weights (offloaded)");
            model->adam_m = dev_malloc_host(bytes, "AdamW first moment (offloaded)");
            model->adam_v = dev_malloc_host(bytes, "AdamW second moment (offloaded)");
            if (has_master) memset(model->master, 0, bytes);
            memset(model->adam_m, 0, bytes);
            memset(model->adam_v, 0, bytes);
            size_t piece = offload_piece_floats(opt_alloc) * sizeof(float);
            for (int slot = 0; slot < DEV_SLOTS; slot++) {
                if (has_master) model->piece_master[slot] = dev_malloc(piece, "offloaded master weights' piece");
                model->piece_m[slot] = dev_malloc(piece, "offloaded AdamW first moment's piece");
                model->piece_v[slot] = dev_malloc(piece, "offloaded AdamW second moment's piece");
            }
        } else {
            if (has_master) model->master = dev_malloc(bytes, "master weights");
            model->adam_m = dev_malloc(bytes, "AdamW first moment");
            model->adam_v = dev_malloc(bytes, "AdamW second moment");
            if (has_master) dev_memset_zero(model->master, bytes);
            dev_memset_zero(model->adam_m, bytes);
            dev_memset_zero(model->adam_v, bytes);
        }
    }

    Carver carver = {dev_malloc(model->plan.activations, "activations"), 0};
    carve_activations(&model->acts, spec, &carver);
    // Tokens for four forwards with targets before the first wait; losses for one forward, grown
    // (once, with a wait) to the micro-batches of a step.
    model->staged_capacity = 8 * (size_t)B * T;
    model->staged_tokens = dev_malloc_host(model->staged_capacity * sizeof(int), "staged tokens");
    model->losses_capacity = (size_t)B * T;
    model->host_losses = dev_malloc_host(model->losses_capacity * sizeof(float), "losses");
}

void gpt2_build(GPT2* model, const GPT2BuildSpec* spec) { build(model, spec, 1); }

void gpt2_build_forward_only(GPT2* model, const GPT2Config* cfg, int B, int T) {
    GPT2BuildSpec spec = {.config = *cfg, .B = B, .T = T, .world = 1, .head_slice_tokens = GPT2_HEAD_SLICE_TOKENS};
    build(model, &spec, 0);
}

void gpt2_free(GPT2* model) {
    dev_free(model->params.t[0]);
    dev_free(model->grads);
    dev_free(model->scratch.slots);
    dev_free(model->wte_encoder_grad);
    if (model->offload) {
        dev_free_host(model->master);
        dev_free_host(model->adam_m);
        dev_free_host(model->adam_v);
        for (int slot = 0; slot < DEV_SLOTS; slot++) {
            dev_free(model->piece_master[slot]);
            dev_free(model->piece_m[slot]);
            dev_free(model->piece_v[slot]);
        }
    } else {
        dev_free(model->master);
        dev_free(model->adam_m);
        dev_free(model->adam_v);
    }
    dev_free(model->acts.encoded);
    dev_free_host(model->staged_tokens);
    dev_free_host(model->host_losses);
    free(model->sum_pieces);
    memset(model, 0, sizeof(*model));
}

void gpt2_print_memory_plan(const GPT2BuildSpec* spec, const MemoryPlan* p, int training) {
    double MiB = 1024.0 * 1024.0;
    int has_master = sizeof(floatX) != sizeof(float);
    size_t sizes[NUM_PARAMETER_TENSORS];
    printf("memory plan (B %d, T %d, recompute %d, %s attention, head slices of %d tokens):\n", spec->B, spec->T,
           spec->recompute, attention_name(), spec->head_slice_tokens);
    printf("  parameters   %10.1f MiB  (%zu x %zu bytes)\n", p->parameters / MiB,
           gpt2_parameter_sizes(&spec->config, sizes), sizeof(floatX));
    if (training) {
        if (p->gradient_scratch)
            printf("  gradients    %10.1f MiB  (bf16, and %.1f MiB of it their fp32 scratch: two layers', wte's, "
                   "wpe's and lnf's; GRADS=BF16)\n", p->gradients / MiB, p->gradient_scratch / MiB);
        else
            printf("  gradients    %10.1f MiB\n", p->gradients / MiB);
        if (spec->offload)
            printf("  optimizer    %10.1f MiB  (%d pieces each of AdamW m, v%s; the state itself, %.1f MiB, in "
                   "pinned host memory: --offload)\n", p->optimizer / MiB, DEV_SLOTS,
                   has_master ? ", master weights" : "", p->host_optimizer / MiB);
        else
            printf("  optimizer    %10.1f MiB  (AdamW m, v%s, fp32; %s)\n", p->optimizer / MiB,
                   has_master ? ", master weights" : "",
                   spec->zero_stage == 1 ? "ZeRO 1: this rank's shard" : "all parameters");
    } else {
        printf("  gradients and optimizer: none (forward only)\n");
    }
    printf("  activations  %10.1f MiB  (of which attention state %.1f MiB)\n", p->activations / MiB,
           p->attention_state / MiB);
    printf("  staging      %10.1f MiB  (a piece of fp32 weights while they are loaded or gathered)\n",
           p->staging / MiB);
    printf("  total        %10.1f MiB\n", p->total / MiB);
}

// ---- weights -----------------------------------------------------------------------------

// A source of fp32 weights: writes parameters [start, start + count) to dst (device memory).
typedef void (*WeightSource)(float* dst, size_t start, size_t count, const void* context);

// Loads the weights from source, tensor by tensor in pieces of at most GPT2_PIECE_FLOATS (a piece of
// a tensor starts at a multiple of it, so at an even index: gpt2_initial_weights_range) through one
// staging piece: the parameters (rounded to nearest when floatX is bf16) and the master weights this
// rank keeps.
static void load_weights(GPT2* model, WeightSource source, const void* context) {
    size_t lo = model->opt_offset, hi = lo + model->opt_count;
    float* staging = dev_malloc(piece_floats(model->num_parameters) * sizeof(float), "staging of the weights");
    size_t first = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; first += model->param_sizes[i], i++) {
        for (size_t s = first, end = first + model->param_sizes[i]; s < end; s += GPT2_PIECE_FLOATS) {
            size_t e = end - s < GPT2_PIECE_FLOATS ? end : s + GPT2_PIECE_FLOATS;
            source(staging, s, e - s, context);
            floatX_from_float(model->params.t[0] + s, staging, e - s);
            size_t a = s > lo ? s : lo, b = e < hi ? e : hi; // the master weights of the piece this rank keeps
            if (!model->master || a >= b) continue;
            if (model->offload) dev_download(model->master + (a - lo), staging + (a - s), (b - a) * sizeof(float));
            else dev_copy(model->master + (a - lo), staging + (a - s), (b - a) * sizeof(float));
        }
    }
    dev_free(staging);
}

typedef struct {
    const GPT2Config* config;
    unsigned long long seed;
} InitialWeights;

static void initial_weights_source(float* dst, size_t start, size_t count, const void* context) {
    const InitialWeights* init = context;
    gpt2_initial_weights_range(dst, init->config, init->seed, start, count);
}

static void host_weights_source(float* dst, size_t start, size_t count, const void* context) {
    dev_upload(dst, (const float*)context + start, count * sizeof(float));
}

void gpt2_init_random(GPT2* model, unsigned long long seed) {
    InitialWeights init = {&model->config, seed};
    load_weights(model, initial_weights_source, &init);
}

void gpt2_set_weights(GPT2* model, const float* host) {
#if defined(FLOATX_MAX)
    // fp16 holds magnitudes up to 65504 only: a larger weight (which an fp32 or bf16 model file can
    // hold) would become infinite.
    int tensor;
    size_t index;
    if (gpt2_find_beyond(&model->config, host, 0, model->num_parameters, FLOATX_MAX, &tensor, &index)) {
        size_t sizes[NUM_PARAMETER_TENSORS], first = 0;
        gpt2_parameter_sizes(&model->config, sizes);
        for (int t = 0; t < tensor; t++) first += sizes[t];
        fatal("weight %g (tensor %s, index %zu) is beyond fp16's range (magnitudes up to %g): the FP16 build "
              "cannot hold this model; use a build with PRECISION=BF16 or FP32", host[first + index],
              parameter_tensor_names[tensor], index, FLOATX_MAX);
    }
#endif
    load_weights(model, host_weights_source, host);
}

void gpt2_get_weights(const GPT2* model, float* host) {
    size_t n = model->num_parameters;
    if (!model->master) { // the parameters are the fp32 weights, whole on every rank
        dev_download(host, model->params.t[0], n * sizeof(float));
    } else if (model->zero_stage == 0) {
        if (model->offload) {
            dev_synchronize(); // the last update's downloads
            memcpy(host, model->master, n * sizeof(float));
        } else {
            dev_download(host, model->master, n * sizeof(float));
        }
    } else { // each rank holds one shard of the master weights: gathered a piece of each at a time
        size_t shard = model->shard, world = model->world;
        size_t piece = gathered_piece_floats(shard, world);
        float* gathered = dev_malloc(piece * world * sizeof(float), "staging of the gathered weights");
        // Offloaded, each rank's piece goes up first (after the last update's downloads).
        float* own = model->offload ? dev_malloc(piece * sizeof(float), "staging of this rank's weights") : NULL;
        if (own) dev_synchronize();
        for (size_t s = 0; s < shard; s += piece) {
            size_t len = shard - s < piece ? shard - s : piece;
            if (own) dev_upload(own, model->master + s, len * sizeof(float));
            comm_allgather(gathered, own ? own : model->master + s, len, COMM_FLOAT);
            for (size_t r = 0; r < world; r++) {
                size_t at = r * shard + s, keep = at >= n ? 0 : n - at < len ? n - at : len;
                if (keep) dev_download(host + at, gathered + r * len, keep * sizeof(float));
            }
        }
        dev_free(gathered);
        dev_free(own);
    }
}

// Tensor i (starting at parameter `offset`) within the parameters this rank keeps optimizer state
// for: [*a, *b), empty when *a >= *b.
static void optimizer_part(const GPT2* model, int i, size_t offset, size_t* a, size_t* b) {
    size_t lo = model->opt_offset, hi = lo + model->opt_count, end = offset + model->param_sizes[i];
    *a = offset > lo ? offset : lo;
    *b = end < hi ? end : hi;
}

// Copies into / out of the optimizer state (master, m, v), which with offload is host memory.
static void state_upload(const GPT2* model, float* state, const float* host, size_t bytes) {
    if (model->offload) memcpy(state, host, bytes);
    else dev_upload(state, host, bytes);
}
static void state_download(const GPT2* model, float* host, const float* state, size_t bytes) {
    if (model->offload) memcpy(host, state, bytes);
    else dev_download(host, state, bytes);
}

void gpt2_set_optimizer_state(GPT2* model, const float* weights, const float* m, const float* v,
                              int t, unsigned long long seed) {
    size_t lo = model->opt_offset, count = model->opt_count, bytes = count * sizeof(float);
    floatX* params = model->params.t[0];
    if (model->offload) dev_synchronize(); // no update's download may still land in the host arrays
    if (model->master) {
        // The parameters are rounded from the master weights on the device: with offload a piece at a
        // time through a staging piece.
        state_upload(model, model->master, weights, bytes);
        float* staging =
            model->offload ? dev_malloc(piece_floats(count) * sizeof(float), "staging of the master weights") : NULL;
        size_t offset = 0, a, b;
        for (int i = 0; i < NUM_PARAMETER_TENSORS; offset += model->param_sizes[i], i++) {
            optimizer_part(model, i, offset, &a, &b);
            for (size_t s = a; s < b; s += GPT2_PIECE_FLOATS) {
                size_t len = b - s < GPT2_PIECE_FLOATS ? b - s : GPT2_PIECE_FLOATS;
                const float* master = model->master + (s - lo);
                if (staging) {
                    dev_upload(staging, master, len * sizeof(float));
                    master = staging;
                }
                if (t > 0) round_master_weights(params + s, master, len, s - offset, t, gpt2_tensor_seed(seed, i));
                else floatX_from_float(params + s, master, len); // as at init
            }
        }
        dev_free(staging);
    } else {
        dev_upload(params + lo, weights, bytes);
    }
    state_upload(model, model->adam_m, m, bytes);
    state_upload(model, model->adam_v, v, bytes);
    if (model->zero_stage == 1)
        comm_allgather(params, params + model->rank * model->shard, model->shard, COMM_FLOATX);
}

void gpt2_get_optimizer_state(const GPT2* model, float* weights, float* m, float* v) {
    size_t bytes = model->opt_count * sizeof(float);
    if (model->offload) dev_synchronize(); // the last update's downloads
    if (model->master) state_download(model, weights, model->master, bytes);
    else dev_download(weights, model->params.t[0] + model->opt_offset, bytes); // fp32 parameters
    state_download(model, m, model->adam_m, bytes);
    state_download(model, v, model->adam_v, bytes);
}

// ---- forward and backward ----------------------------------------------------------------

// Pointers to layer l's weights.
typedef struct {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} LayerWeights;

static LayerWeights layer_weights(const ParameterTensors* p, const GPT2Config* cfg, int l) {
    size_t C = cfg->channels;
    LayerWeights w = {
        p->t[P_LN1W] + l * C, p->t[P_LN1B] + l * C,
        p->t[P_QKVW] + l * 3 * C * C, p->t[P_QKVB] + l * 3 * C,
        p->t[P_ATTPROJW] + l * C * C, p->t[P_ATTPROJB] + l * C,
        p->t[P_LN2W] + l * C, p->t[P_LN2B] + l * C,
        p->t[P_FCW] + l * 4 * C * C, p->t[P_FCB] + l * 4 * C,
        p->t[P_FCPROJW] + l * 4 * C * C, p->t[P_FCPROJB] + l * C};
    return w;
}

// Layer l's activations for a batch of N = B*T rows (strides use the current N, so a smaller batch
// packs densely at the start of each buffer).
typedef struct {
    floatX *input, *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    char* att_saved;
} LayerActs;

static LayerActs layer_acts(const GPT2* model, int l, int B, int T) {
    const Activations* a = &model->acts;
    size_t N = (size_t)B * T, C = model->config.channels;
    size_t l_ln = model->recompute >= 2 ? 0 : l, l_gelu = model->recompute >= 1 ? 0 : l;
    LayerActs s;
    s.input = l == 0 ? a->encoded : a->residual3 + (l - 1) * N * C;
    s.ln1 = a->ln1 + l_ln * N * C;
    s.ln1_mean = a->ln1_mean + l * N;
    s.ln1_rstd = a->ln1_rstd + l * N;
    s.qkv = a->qkv + l * N * 3 * C;
    s.atty = a->atty + l * N * C;
    s.att_saved = a->att_saved + l * attention_saved_bytes(B, T, model->config.num_heads);
    s.residual2 = a->residual2 + l * N * C;
    s.ln2 = a->ln2 + l_ln * N * ln2_ld(model->config.channels);
    s.ln2_mean = a->ln2_mean + l * N;
    s.ln2_rstd = a->ln2_rstd + l * N;
    s.fch = a->fch + l * N * 4 * C;
    s.fch_gelu = a->fch_gelu + l_gelu * N * 4 * C;
    s.residual3 = a->residual3 + l * N * C;
    return s;
}

// Copies n tokens into the next staging slot and queues their upload to dst.
static void upload_tokens(GPT2* model, int* dst, const int* tokens, size_t n) {
    if (model->staged_used + n > model->staged_capacity) {
        dev_synchronize(); // every queued upload has read its slot
        model->staged_used = 0;
    }
    int* slot = model->staged_tokens + model->staged_used;
    memcpy(slot, tokens, n * sizeof(int));
    model->staged_used += n;
    dev_upload_async(dst, slot, n * sizeof(int));
}

void gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss) {
    const GPT2Config* cfg = &model->config;
    int C = cfg->channels, NH = cfg->num_heads, L = cfg->num_layers;
    int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, N = B * T;
    if (B > model->B || T > model->T || B * T > model->B * model->T)
        fatal("internal: forward of %d x %d tokens on a model built for %d x %d", B, T, model->B, model->T);
    Activations* a = &model->acts;
    model->fwd_B = B;
    model->fwd_T = T;
    upload_tokens(model, a->inputs, inputs, (size_t)N);
    if (targets) upload_tokens(model, a->targets, targets, (size_t)N);
    // With --batch-invariant each product's rows in groups of group_sequences sequences (kernels.h:
    // group_rows); a forward-only B may not split into them, and then makes one group.
    int group = model->group_sequences && B % model->group_sequences == 0 ? model->group_sequences : 0;
    int group_rows = group ? group * T : N;

    encoder_forward(a->encoded, a->inputs, model->params.t[P_WTE], model->params.t[P_WPE], B, T, C);
    // Each residual add is the epilogue of the projection whose output it adds (attproj's into
    // residual2, fcproj's into residual3): one rounding of the fp32 sum, and no pass that reads the
    // projection's output back. The layernorms then read the residual stream alone, as recompute
    // (-r 2) does when it rebuilds ln1 and ln2 with the same calls.
    for (int l = 0; l < L; l++) {
        LayerWeights w = layer_weights(&model->params, cfg, l);
        LayerActs s = layer_acts(model, l, B, T);
        layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, s.input, w.ln1w, w.ln1b, N, C, C);
        matmul_forward(s.qkv, s.ln1, w.qkvw, w.qkvb, NULL, N, C, 3 * C, C, group_rows);
        attention_forward(s.atty, s.att_saved, s.qkv, B, T, C, NH);
        matmul_forward(s.residual2, s.atty, w.attprojw, w.attprojb, s.input, N, C, C, C, group_rows);
        layernorm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, s.residual2, w.ln2w, w.ln2b, N, C, ln2_ld(C));
        // fch_gelu has gelu_forward's bits of fch, which recompute (-r >= 1) rebuilds it with, so
        // every recompute level trains bit for bit alike
        matmul_forward_gelu(s.fch, s.fch_gelu, s.ln2, w.fcw, w.fcb, N, C, 4 * C, ln2_ld(C), group_rows);
        matmul_forward(s.residual3, s.fch_gelu, w.fcprojw, w.fcprojb, s.residual2, N, 4 * C, C, 4 * C, group_rows);
    }
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, layer_acts(model, L - 1, B, T).residual3,
                      model->params.t[P_LNFW], model->params.t[P_LNFB], N, C, C);
    if (!targets) return; // gpt2_logits_row makes the logits it is asked for

    // The head, one slice of sequences at a time (gpt2_head_slice_sequences): the classifier's
    // losses, and with dloss the head's backward: dL/dlnf into dbuf_c, where gpt2_backward starts,
    // and the head's share of wte's gradient.
    const floatX* wte = model->params.t[P_WTE];
    int slice = gpt2_head_slice_sequences(B, T, group, model->head_slice_tokens);
    for (int b0 = 0; b0 < B; b0 += slice) {
        int n = (b0 + slice <= B ? slice : B - b0) * T;
        int part = group ? gpt2_head_group_sequences(slice, group) * T : n; // rows per product and gradient sum
        size_t r0 = (size_t)b0 * T;
        head_classifier(a->losses + r0, a->dbuf_c + r0 * C, grad_of(model, wte), a->logits, a->targets + r0, dloss,
                        a->lnf + r0 * C, wte, n, C, V, Vp, part, model->wte_grad_stale ? GRAD_WRITE : GRAD_ADD);
        if (dloss > 0.0f) model->wte_grad_stale = 0;
    }
    size_t pending = model->losses_pending;
    if (pending + N > model->losses_capacity) {
        dev_synchronize(); // the pending downloads have landed
        float* grown = dev_malloc_host((pending + N) * sizeof(float), "losses");
        memcpy(grown, model->host_losses, pending * sizeof(float));
        dev_free_host(model->host_losses);
        model->host_losses = grown;
        model->losses_capacity = pending + N;
    }
    dev_download_async(model->host_losses + pending, a->losses, (size_t)N * sizeof(float));
    model->losses_pending = pending + N;
}

const float* gpt2_losses(GPT2* model, size_t* count) {
    dev_wait_downloads(); // not for a backward queued after the forward: it runs while the host reads
    *count = model->losses_pending;
    model->losses_pending = 0;
    return model->host_losses;
}

double gpt2_loss_sum(const float* losses, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += losses[i];
    return sum;
}

void gpt2_zero_grad(GPT2* model) {
    // In scratch (GRADS=BF16), the step's first micro-step writes every gradient: none needs zeros.
    size_t start[NUM_PARAMETER_TENSORS], count[NUM_PARAMETER_TENSORS];
    const int runs = grads_in_scratch ? 0 : gpt2_zeroed_gradient_runs(model->param_sizes, start, count);
    for (int i = 0; i < runs; i++) dev_memset_zero(model->grads + start[i], count[i] * sizeof(gradX));
    model->wte_grad_stale = model->layer_grads_stale = 1;
    if (model->group_sequences) dev_memset_zero(model->wte_encoder_grad, model->param_sizes[P_WTE] * sizeof(float));
}

// What the gradients need before their sum over the ranks, once the step's last backward is done:
// the encoder's share of wte's that --batch-invariant kept apart, and the tests' NaN.
static void complete_gradients(GPT2* model) {
    if (model->group_sequences) add_kept_wte_grad(model);
    if (model->nan_gradient_pending) dev_upload(model->grads, &gradX_nan, sizeof(gradX_nan));
    model->nan_gradient_pending = 0;
}

void gpt2_backward(GPT2* model, int sum_over_ranks) {
    const GPT2Config* cfg = &model->config;
    int B = model->fwd_B, T = model->fwd_T, N = B * T;
    int group = model->group_sequences ? model->group_sequences : B;
    if (B % group != 0) fatal("backward: a micro-batch of %d sequences does not split into groups of %d", B, group);
    int group_rows = group * T;
    int C = cfg->channels, NH = cfg->num_heads, L = cfg->num_layers;
    Activations* a = &model->acts;
    ParameterTensors* p = &model->params;
    // The encoder adds into wte's gradient, which the head's backward must have written this step.
    if (model->wte_grad_stale) fatal("internal: gpt2_backward without a forward with dloss > 0 since gpt2_zero_grad");
    // for the layers' weight matrices: written by a step's first product into each, or in scratch by
    // every micro-step's
    const int dweight_mode = model->layer_grads_stale || grads_in_scratch ? GRAD_WRITE : GRAD_ADD;
    // Each layer's gradients are summed over the ranks beside the layers below, once complete: after
    // the wait for their weight-gradient stream (and, in scratch, their fold) at the next layer's start.
    const int summing = sum_over_ranks && model->world > 1;

    // The head's backward ran in the forward, slice by slice, and left dL/dlnf in dbuf_c. The final
    // layernorm's backward writes dresidual (GRAD_WRITE), where the residual stream's gradient starts.
    start_nonlayer_grads(model);
    start_layer_grads(model, L - 1);
    floatX* final_residual = layer_acts(model, L - 1, B, T).residual3;
    layernorm_backward(a->dresidual, grad_of(model, p->t[P_LNFW]), grad_of(model, p->t[P_LNFB]),
                       grad_of(model, layer_weights(p, cfg, L - 1).fcprojb), a->dbuf_c, final_residual,
                       p->t[P_LNFW], a->lnf_mean, a->lnf_rstd, N, C, group_rows, GRAD_WRITE);

    // dresidual holds the gradient of the residual stream; going down through a block, each
    // branch's layernorm_backward adds its contribution to it (the residual add's backward is the
    // identity). When it has, dresidual is the whole gradient of the projection below it (attproj's,
    // or the previous block's fcproj), and the layernorm_backward also sums that projection's bias
    // gradient (dinp_sums), so the projection's matmul_backward is given no dbias.
    // fc's and qkv's weight gradients run beside the calls after them (matmul_backward_weights), the
    // layernorm backward that follows each among them. Each layer first waits for the layer above's,
    // which read dbuf_4c, dbuf_3c and (with recompute) ln2 and ln1, buffers that this layer rewrites.
    // In scratch (GRADS=BF16), the layer above's gradients are then complete and fold, and their slot
    // is made ready for the layer below this one, whose fcproj bias gradient this layer's last
    // layernorm backward sums.
    for (int l = L - 1; l >= 0; l--) {
        LayerWeights w = layer_weights(p, cfg, l);
        LayerActs s = layer_acts(model, l, B, T);
        matmul_backward_wait();
        if (l + 1 < L) {
            fold_layer_grads(model, l + 1);
            if (summing) start_bucket_sums(model, l + 1);
        }
        if (l > 0) start_layer_grads(model, l - 1);
        // With recompute, the layers' shared buffers still hold the forward's last layer (the head
        // and the final layernorm write others), so the top layer needs nothing rebuilt.
        const int rebuild = l < L - 1 ? model->recompute : 0;
        if (rebuild >= 1) gelu_forward(s.fch_gelu, s.fch, (size_t)N * 4 * C);
        if (rebuild >= 2)
            layernorm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, s.residual2, w.ln2w, w.ln2b, N, C, ln2_ld(C));
        // MLP branch
        matmul_backward_gelu(a->dbuf_4c, grad_of(model, w.fcprojw), NULL, a->dresidual, s.fch_gelu, w.fcprojw,
                             s.fch, N, 4 * C, C, group_rows, dweight_mode);
        matmul_backward(a->dbuf_c, NULL, NULL, a->dbuf_4c, s.ln2, w.fcw, N, C, 4 * C, ln2_ld(C), group_rows,
                        dweight_mode);
        matmul_backward_weights(grad_of(model, w.fcw), grad_of(model, w.fcb), a->dbuf_4c, s.ln2, N, C, 4 * C,
                                ln2_ld(C), group_rows, dweight_mode);
        layernorm_backward(a->dresidual, grad_of(model, w.ln2w), grad_of(model, w.ln2b), grad_of(model, w.attprojb),
                           a->dbuf_c, s.residual2, w.ln2w, s.ln2_mean, s.ln2_rstd, N, C, group_rows, GRAD_ADD);
        // attention branch
        if (rebuild >= 2)
            layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, s.input, w.ln1w, w.ln1b, N, C, C);
        matmul_backward(a->dbuf_c, grad_of(model, w.attprojw), NULL, a->dresidual, s.atty, w.attprojw, N, C, C, C,
                        group_rows, dweight_mode);
        // The attention backward sums the qkv bias gradient from the dqkv it writes.
        attention_backward(a->dbuf_3c, grad_of(model, w.qkvb), a->att_scratch, a->dbuf_c, s.qkv, s.atty, s.att_saved, B,
                           T, C, NH, group_rows);
        matmul_backward(a->dbuf_c, NULL, NULL, a->dbuf_3c, s.ln1, w.qkvw, N, C, 3 * C, C, group_rows, dweight_mode);
        matmul_backward_weights(grad_of(model, w.qkvw), NULL, a->dbuf_3c, s.ln1, N, C, 3 * C, C, group_rows,
                                dweight_mode);
        float* below_fcprojb = l > 0 ? grad_of(model, layer_weights(p, cfg, l - 1).fcprojb) : NULL;
        layernorm_backward(a->dresidual, grad_of(model, w.ln1w), grad_of(model, w.ln1b), below_fcprojb, a->dbuf_c,
                           s.input, w.ln1w, s.ln1_mean, s.ln1_rstd, N, C, group_rows, GRAD_ADD);
    }
    matmul_backward_wait();
    fold_layer_grads(model, 0);
    if (summing) start_bucket_sums(model, 0);
    // The encoder's share of wte's gradient (wte is tied to the head). With --batch-invariant it is
    // kept apart until the step's gradients are complete (complete_gradients): micro-batches of one
    // group give head, encoder, head, encoder, ..., a micro-batch of several groups all heads first
    // (its forward), and each order must add up to the same bits.
    // One call over all B sequences: encoder_backward sums sequence by sequence (kernels.h), so it
    // gives the bits of a call per group.
    float* dwte_encoder = model->group_sequences ? model->wte_encoder_grad : grad_of(model, p->t[P_WTE]);
    encoder_backward(dwte_encoder, grad_of(model, p->t[P_WPE]), a->dresidual, a->inputs, B, T, C);
    fold_nonlayer_grads(model);
    model->layer_grads_stale = 0;
    if (summing) {
        complete_gradients(model);
        start_bucket_sums(model, L);
        model->sums_started = 1;
    }
}

float gpt2_reduce_gradients(GPT2* model, double* loss) {
    gradX* grads = model->grads;
    size_t shard = model->shard;
    if (model->sums_started) { // by the last backward, bucket by bucket
        comm_sums_wait();
        model->sums_started = 0;
    } else {
        complete_gradients(model);
        if (model->zero_stage == 1) comm_reduce_scatter_sum(grads, shard, COMM_GRADX);
        else comm_allreduce_sum(grads, model->num_parameters, COMM_GRADX);
    }
    // The norm adds up the ranks' shards in both stages, so ZeRO changes no arithmetic.
    double sums[2] = {grad_norm_squared(grads + model->rank * shard, shard), *loss};
    comm_allreduce_host(sums, 2, COMM_SUM);
    *loss = sums[1] / model->world;
    return sqrtf((float)sums[0]);
}

void gpt2_update(GPT2* model, float norm, float lr, float beta1, float beta2, float eps,
                 float weight_decay, float grad_clip, float inv_loss_scale, int t, unsigned long long seed) {
    floatX* params = model->params.t[0];
    const gradX* grads = model->grads;
    // the clip factor from the true norm, then the loss scale undone: both in the one multiply of
    // each gradient value that AdamW does anyway
    float grad_scale = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
    grad_scale *= inv_loss_scale;
    size_t lo = model->opt_offset, offset = 0, a, b;
    int slot = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; offset += model->param_sizes[i], i++) {
        optimizer_part(model, i, offset, &a, &b);
        const int decay = gpt2_is_weight_matrix(i);
        // Offloaded, each piece goes up, is updated and comes back through the slots in turn, so
        // that one piece goes up and another comes down while a third is updated: the same kernel
        // on the same values, and a piece rounds as the whole part would (index0).
        const size_t step = model->offload ? GPT2_OFFLOAD_PIECE_FLOATS : b - a;
        for (size_t s = a; s < b; s += step) {
            size_t len = b - s < step ? b - s : step, bytes = len * sizeof(float);
            float *master = model->master ? model->master + (s - lo) : NULL;
            float *m = model->adam_m + (s - lo), *v = model->adam_v + (s - lo);
            float *dev_master = master, *dev_m = m, *dev_v = v;
            if (model->offload) {
                if (master) dev_slot_upload(slot, dev_master = model->piece_master[slot], master, bytes);
                dev_slot_upload(slot, dev_m = model->piece_m[slot], m, bytes);
                dev_slot_upload(slot, dev_v = model->piece_v[slot], v, bytes);
                dev_slot_ready(slot);
            }
            adamw_update(params + s, dev_master, grads + s, dev_m, dev_v, len, s - offset, lr, beta1, beta2, eps,
                         decay ? weight_decay : 0.0f, grad_scale, t, gpt2_tensor_seed(seed, i));
            if (model->offload) {
                if (master) dev_slot_download(slot, master, dev_master, bytes);
                dev_slot_download(slot, m, dev_m, bytes);
                dev_slot_download(slot, v, dev_v, bytes);
                slot = (slot + 1) % DEV_SLOTS;
            }
        }
    }
    if (model->zero_stage == 1) comm_allgather(params, params + model->rank * model->shard, model->shard, COMM_FLOATX);
}

void gpt2_inject_nan_gradient(GPT2* model) { model->nan_gradient_pending = 1; }

void gpt2_get_gradients(const GPT2* model, float* host) {
    size_t n = model->num_parameters;
    gradX* values = xmalloc(n * sizeof(gradX), "gradients");
    dev_download(values, model->grads, n * sizeof(gradX));
    for (size_t i = 0; i < n; i++) host[i] = float_from_gradX(values[i]);
    free(values);
}

void gpt2_logits_row(GPT2* model, int b, int t, int T, float* host_out) {
    const GPT2Config* cfg = &model->config;
    Activations* a = &model->acts;
    int C = cfg->channels;
    // The row's lnf first moves to the start of dbuf_c: cuBLASLt assumes aligned operands.
    dev_copy(a->dbuf_c, a->lnf + ((size_t)b * T + t) * C, (size_t)C * sizeof(floatX));
    matmul_forward(a->logits, a->dbuf_c, model->params.t[P_WTE], NULL, NULL, 1, C, cfg->padded_vocab_size, C, 1);
    float_from_floatX(a->row, a->logits, cfg->vocab_size);
    dev_download(host_out, a->row, cfg->vocab_size * sizeof(float));
}
