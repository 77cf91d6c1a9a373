// model/gpt2.c, the orchestration, on a tiny GPT-2 with the CPU backend (fp32):
//  1. the build: the parameters laid out in the model file's order with DESIGN.md's shapes; every
//     activation region carved where the sizes of its tensor (counted here from DESIGN.md's model)
//     put it, each region rounded up to 256 bytes, at each recompute level, filling exactly the plan's activation bytes;
//     the model's plan equal to gpt2_memory_plan of the same build spec;
//  2. the forward: a loss for every position, near ln V for the untrained model;
//  3. the backward: the gradient of the largest entry of every parameter tensor against a central
//     finite difference of the mean loss, and gpt2_reduce_gradients' norm against the gradients' own
//     sum of squares;
//  4. --batch-invariant's groups: one micro-batch of 4 sequences and two of 2, with groups of 2
//     sequences, give the same gradient bits.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/gpt2.h"
#include "model/init.h"
#include "tests/lib/testutil.h"

enum { L = 2, C = 32, NH = 2, V = 100, VP = 128, MAX_T = 16, B = 4, T = 8 };

static GPT2BuildSpec tiny_spec(int batch, int recompute, int group_sequences) {
    GPT2Config cfg = {.max_seq_len = MAX_T, .vocab_size = V, .padded_vocab_size = VP, .num_layers = L,
                      .num_heads = NH, .channels = C};
    return (GPT2BuildSpec){.config = cfg, .B = batch, .T = T, .recompute = recompute, .world = 1,
                           .head_slice_tokens = GPT2_HEAD_SLICE_TOKENS, .group_sequences = group_sequences};
}

static size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

static void test_parameter_layout(void) {
    GPT2BuildSpec spec = tiny_spec(B, 0, 0);
    GPT2 m;
    gpt2_build(&m, &spec);
    // DESIGN.md's model file order: wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b,
    // fcw, fcb, fcprojw, fcprojb, lnfw, lnfb.
    const size_t want[NUM_PARAMETER_TENSORS] = {
        VP * C, MAX_T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
        L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    size_t total = 0;
    int bad = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t offset = (size_t)(m.params.t[i] - m.params.t[0]);
        if (m.param_sizes[i] != want[i] || offset != total) {
            printf("  %s: %zu values at %zu, want %zu at %zu\n", parameter_tensor_names[i], m.param_sizes[i],
                   offset, want[i], total);
            bad++;
        }
        total += want[i];
    }
    test_check(bad == 0 && m.num_parameters == total, "build: parameters in model-file order",
               "%d tensors wrong, %zu parameters (want %zu)", bad, m.num_parameters, total);
    gpt2_free(&m);
}

static void test_carve(int recompute) {
    GPT2BuildSpec spec = tiny_spec(B, recompute, 0);
    GPT2 m;
    gpt2_build(&m, &spec);
    const Activations* a = &m.acts;
    const size_t BT = (size_t)B * T, X = sizeof(floatX), F = sizeof(float);
    const size_t L_ln = recompute >= 2 ? 1 : L, L_gelu = recompute >= 1 ? 1 : L;
    const int head_rows = gpt2_head_slice_sequences(B, T, 0, GPT2_HEAD_SLICE_TOKENS) * T;
    const struct {
        const char* name;
        const void* at;
        size_t bytes;
    } regions[] = {
        {"encoded", a->encoded, BT * C * X},
        {"ln1", a->ln1, L_ln * BT * C * X},
        {"ln1_mean", a->ln1_mean, L * BT * F},
        {"ln1_rstd", a->ln1_rstd, L * BT * F},
        {"qkv", a->qkv, L * BT * 3 * C * X},
        {"atty", a->atty, L * BT * C * X},
        {"att_saved", a->att_saved, L * attention_saved_bytes(B, T, NH)},
        {"residual2", a->residual2, L * BT * C * X},
        {"ln2", a->ln2, L_ln * BT * linear_bias_ld(C) * X},
        {"ln2_mean", a->ln2_mean, L * BT * F},
        {"ln2_rstd", a->ln2_rstd, L * BT * F},
        {"fch", a->fch, L * BT * 4 * C * X},
        {"fch_gelu", a->fch_gelu, L_gelu * BT * 4 * C * X},
        {"residual3", a->residual3, L * BT * C * X},
        {"lnf", a->lnf, BT * C * X},
        {"lnf_mean", a->lnf_mean, BT * F},
        {"lnf_rstd", a->lnf_rstd, BT * F},
        {"logits", a->logits, head_scratch_bytes(head_rows, C, VP)},
        {"losses", a->losses, BT * F},
        {"dresidual", a->dresidual, BT * C * X},
        {"dbuf_c", a->dbuf_c, BT * C * X},
        {"dbuf_3c", a->dbuf_3c, BT * 3 * C * X},
        {"dbuf_4c", a->dbuf_4c, BT * 4 * C * X},
        {"att_scratch", a->att_scratch, attention_scratch_bytes(B, T, C, NH)},
        {"inputs", a->inputs, BT * sizeof(int)},
        {"targets", a->targets, BT * sizeof(int)},
        {"row", a->row, VP * F},
    };
    const int n = (int)(sizeof regions / sizeof regions[0]);
    const char* base = regions[0].at;
    size_t offset = 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        size_t at = (size_t)((const char*)regions[i].at - base);
        if (at != offset) {
            printf("  -r %d: %s at byte %zu, want %zu\n", recompute, regions[i].name, at, offset);
            bad++;
        }
        offset += round256(regions[i].bytes);
    }
    MemoryPlan plan = gpt2_memory_plan(&spec);
    char name[128];
    snprintf(name, sizeof name, "build -r %d: every activation region where its tensor's size puts it", recompute);
    test_check(bad == 0 && offset == m.plan.activations, name,
               "%d regions misplaced; %zu bytes counted, the plan has %zu", bad, offset, m.plan.activations);
    snprintf(name, sizeof name, "build -r %d: the model's plan is gpt2_memory_plan of its spec", recompute);
    test_check(memcmp(&plan, &m.plan, sizeof plan) == 0, name,
               "activations %zu and %zu, total %zu and %zu", m.plan.activations, plan.activations, m.plan.total,
               plan.total);
    gpt2_free(&m);
}

// The mean loss of the batch with the weights w.
static double mean_loss(GPT2* m, const float* w, const int* inputs, const int* targets) {
    gpt2_set_weights(m, w);
    gpt2_forward(m, inputs, targets, B, T, 0.0f);
    size_t count;
    const float* losses = gpt2_losses(m, &count);
    return gpt2_loss_sum(losses, count) / (double)count;
}

// The gradients of one step over the batch with the weights w, in micro-batches of `batch`
// sequences; returns the norm gpt2_reduce_gradients gives. The gradients stay in m->grads (host
// memory in the CPU backend).
static float step_gradients(GPT2* m, const float* w, const int* inputs, const int* targets, int batch) {
    gpt2_set_weights(m, w);
    gpt2_zero_grad(m);
    for (int b0 = 0; b0 < B; b0 += batch) {
        gpt2_forward(m, inputs + b0 * T, targets + b0 * T, batch, T, 1.0f / (float)(B * T));
        gpt2_backward(m, 0);
    }
    size_t count;
    const float* losses = gpt2_losses(m, &count);
    double loss = gpt2_loss_sum(losses, count) / (double)count;
    return gpt2_reduce_gradients(m, &loss);
}

static void test_forward_backward(TestRng* rng) {
    GPT2BuildSpec spec = tiny_spec(B, 0, 0);
    GPT2 m;
    gpt2_build(&m, &spec);
    int inputs[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int)(test_uniform(rng) * V);
        targets[i] = (int)(test_uniform(rng) * V);
    }
    size_t n = m.num_parameters;
    float* w = xmalloc(n * sizeof(float), "weights");
    gpt2_init_random(&m, 1337);
    gpt2_get_weights(&m, w);

    gpt2_forward(&m, inputs, targets, B, T, 0.0f);
    size_t count;
    const float* losses = gpt2_losses(&m, &count);
    int finite = 1;
    for (size_t i = 0; i < count; i++) finite &= isfinite(losses[i]) && losses[i] > 0.0f;
    double mean = gpt2_loss_sum(losses, count) / (double)count;
    test_check(count == (size_t)B * T && finite && fabs(mean - log((double)V)) < 0.1,
               "forward: a loss for every position, near ln V untrained", "%zu losses (want %d), mean %.4f, ln V %.4f",
               count, B * T, mean, log((double)V));

    float norm = step_gradients(&m, w, inputs, targets, B);
    float* grads = xmalloc(n * sizeof(float), "gradients");
    memcpy(grads, m.grads, n * sizeof(float));
    double sumsq = 0.0;
    for (size_t i = 0; i < n; i++) sumsq += (double)grads[i] * grads[i];
    test_check(fabs(norm - sqrt(sumsq)) <= 1e-5 * sqrt(sumsq), "backward: the reduced norm is the gradients' norm",
               "%.8g against %.8g", norm, sqrt(sumsq));

    const double h = 1e-2;
    int bad = 0;
    size_t offset = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        size_t best = offset;
        for (size_t i = offset; i < offset + m.param_sizes[t]; i++)
            if (fabsf(grads[i]) > fabsf(grads[best])) best = i;
        float saved = w[best];
        w[best] = saved + (float)h;
        double up = mean_loss(&m, w, inputs, targets);
        w[best] = saved - (float)h;
        double down = mean_loss(&m, w, inputs, targets);
        w[best] = saved;
        double fd = (up - down) / (2.0 * h);
        if (!(fabs(fd - grads[best]) <= 0.05 * fabs(fd) + 2e-4)) {
            printf("  %s[%zu]: gradient %.6g, finite difference %.6g\n", parameter_tensor_names[t], best - offset,
                   grads[best], fd);
            bad++;
        }
        offset += m.param_sizes[t];
    }
    test_check(bad == 0, "backward: every tensor's largest gradient against a central finite difference",
               "%d of %d tensors differ", bad, NUM_PARAMETER_TENSORS);
    gpt2_free(&m);

    // --batch-invariant 2: B 4 in one micro-batch and in two of 2 sum the same groups.
    GPT2BuildSpec whole_spec = tiny_spec(B, 0, 2), halves_spec = tiny_spec(B / 2, 0, 2);
    GPT2 whole, halves;
    gpt2_build(&whole, &whole_spec);
    gpt2_build(&halves, &halves_spec);
    float norm_whole = step_gradients(&whole, w, inputs, targets, B);
    float norm_halves = step_gradients(&halves, w, inputs, targets, B / 2);
    test_check(memcmp(whole.grads, halves.grads, n * sizeof(float)) == 0 && norm_whole == norm_halves,
               "backward: groups of 2 sequences give the same bits in micro-batches of 4 and of 2",
               "norms %.9g and %.9g", norm_whole, norm_halves);
    gpt2_free(&whole);
    gpt2_free(&halves);
    free(grads);
    free(w);
}

// gpt2_initial_weights_range in pieces that start at even indexes of each tensor (gpt2.c's pieces of
// GPT2_PIECE_FLOATS, here 998 values so that a small model has many, some across tensor ends) gives
// the bits of the whole init: each normal at its own place in the Philox sequence.
static void test_initial_weights_in_pieces(void) {
    GPT2Config cfg = tiny_spec(B, 0, 0).config;
    size_t sizes[NUM_PARAMETER_TENSORS], n = gpt2_parameter_sizes(&cfg, sizes);
    float *whole = xmalloc(n * sizeof(float), "init"), *pieces = xmalloc(n * sizeof(float), "init");
    gpt2_initial_weights(whole, &cfg, 1337);
    for (size_t i = 0; i < n; i++) pieces[i] = NAN;
    size_t first = 0, count = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; first += sizes[t], t++)
        for (size_t s = first; s < first + sizes[t]; s += 998, count++) {
            size_t len = first + sizes[t] - s < 998 ? first + sizes[t] - s : 998;
            gpt2_initial_weights_range(pieces + s, &cfg, 1337, s, len);
        }
    test_check(memcmp(whole, pieces, n * sizeof(float)) == 0, "initial weights in pieces",
               "%zu pieces of at most 998 values: %s", count,
               memcmp(whole, pieces, n * sizeof(float)) == 0 ? "the bits of the whole" : "bits differ");
    free(whole);
    free(pieces);
}

static int compare_pieces(const void* a, const void* b) {
    const CommPiece *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

// gpt2_sum_pieces against the layout: over all buckets the pieces cover the gradients once each
// (stage 0: num_parameters; stage 1: world * shard, the shard re-derived here as the multiple of 64
// at or above n / world), bucket l's lie in layer l's slice of a layer tensor and bucket L's in the
// other tensors or the padding, stage 0's are summed on every rank and one per tensor, stage 1's
// each inside the shard of the rank that receives it; never more than GPT2_MAX_SUM_PIECES.
static void test_sum_pieces(const GPT2Config* cfg, int world, int zero_stage) {
    size_t sizes[NUM_PARAMETER_TENSORS], start[NUM_PARAMETER_TENSORS + 1] = {0};
    const size_t n = gpt2_parameter_sizes(cfg, sizes);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) start[i + 1] = start[i] + sizes[i];
    const size_t shard = ((n + (size_t)world - 1) / (size_t)world + 63) / 64 * 64;
    const size_t end = zero_stage == 1 ? shard * (size_t)world : n;
    const int Lc = cfg->num_layers, cap = GPT2_MAX_SUM_PIECES(world);
    CommPiece* all = xmalloc((size_t)(Lc + 1) * cap * sizeof(CommPiece), "pieces");
    int total = 0, bad = 0;
    char first_bad[160] = "";
#define PIECE_BAD(...) do { if (!bad++) snprintf(first_bad, sizeof first_bad, __VA_ARGS__); } while (0)
    for (int bucket = 0; bucket <= Lc; bucket++) {
        CommPiece* out = all + total;
        for (int k = 0; k < cap; k++) out[k] = (CommPiece){0, 0, -2};
        const int count = gpt2_sum_pieces(sizes, Lc, bucket, zero_stage, world, out);
        if (count < 1 || count > cap) { PIECE_BAD("bucket %d: %d pieces", bucket, count); continue; }
        if (zero_stage == 0 && count != (bucket < Lc ? 12 : 4))
            PIECE_BAD("bucket %d: %d pieces at stage 0, not one per tensor", bucket, count);
        for (int k = 0; k < count; k++) {
            const CommPiece q = out[k];
            const size_t last = q.offset + q.count - 1;
            int t = 0;
            while (t < NUM_PARAMETER_TENSORS && start[t + 1] <= q.offset) t++;
            const int layer_tensor = t >= P_LN1W && t <= P_FCPROJB;
            if (q.count == 0 || last >= end)
                PIECE_BAD("bucket %d: piece [%zu, +%zu) outside the gradients", bucket, q.offset, q.count);
            else if (t < NUM_PARAMETER_TENSORS && last >= start[t + 1])
                PIECE_BAD("bucket %d: piece at %zu crosses tensors", bucket, q.offset);
            else if (bucket < Lc && (!layer_tensor || (q.offset - start[t]) / (sizes[t] / Lc) != (size_t)bucket ||
                                     (last - start[t]) / (sizes[t] / Lc) != (size_t)bucket))
                PIECE_BAD("bucket %d: piece at %zu is not in layer %d's slices", bucket, q.offset, bucket);
            else if (bucket == Lc && layer_tensor) PIECE_BAD("bucket L: piece at %zu in a layer tensor", q.offset);
            else if (zero_stage == 0 && q.root != -1)
                PIECE_BAD("stage 0: piece at %zu summed into rank %d", q.offset, q.root);
            else if (zero_stage == 1 && (q.root < 0 || q.root >= world || q.offset / shard != (size_t)q.root ||
                                         last / shard != (size_t)q.root))
                PIECE_BAD("stage 1: piece [%zu, +%zu) into rank %d, outside its shard", q.offset, q.count, q.root);
        }
        total += count;
    }
#undef PIECE_BAD
    qsort(all, total, sizeof(CommPiece), compare_pieces);
    size_t covered = 0;
    for (int k = 0; k < total && !bad; k++) {
        if (all[k].offset != covered) bad++, snprintf(first_bad, sizeof first_bad, "a gap or overlap at %zu", covered);
        covered = all[k].offset + all[k].count;
    }
    if (!bad && covered != end) bad++, snprintf(first_bad, sizeof first_bad, "covered %zu of %zu", covered, end);
    char name[96];
    snprintf(name, sizeof name, "sum pieces: L %d, C %d, %d rank(s), ZeRO %d", Lc, cfg->channels, world, zero_stage);
    test_check(bad == 0, name, "%d pieces over %d buckets cover [0, %zu) once%s%s", total, Lc + 1, end,
               bad ? "; first problem: " : "", first_bad);
    free(all);
}

int main(void) {
    backend_init(0);
    GPT2Config d12;
    memset(&d12, 0, sizeof d12);
    d12.max_seq_len = 1024, d12.vocab_size = 50257, d12.padded_vocab_size = gpt2_padded_vocab(50257);
    gpt2_preset("d12", &d12);
    const GPT2Config tiny = tiny_spec(B, 0, 0).config;
    const int worlds[] = {1, 2, 3, 8, 64};
    for (int w = 0; w < 5; w++)
        for (int z = 0; z <= 1; z++) {
            test_sum_pieces(&tiny, worlds[w], z);
            test_sum_pieces(&d12, worlds[w], z);
        }
    test_initial_weights_in_pieces();
    TestRng rng = test_rng(20261202);
    test_parameter_layout();
    for (int r = 0; r <= 2; r++) test_carve(r);
    test_forward_backward(&rng);
    return test_summary("test_gpt2");
}
