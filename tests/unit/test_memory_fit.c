// -b auto's choice (model/fit.c) and the memory plan it rests on (gpt2_memory_plan). The plan's
// sizes are checked against a count of the tensors written out here from DESIGN.md's model (this
// build: fp32 CPU storage, its attention); the fit over budgets of 1 to 141 GiB, every GPT-2 size
// and T from 64 to 32768: B divides the per-GPU batch, the plan plus the margin never exceeds the
// budget, B is the largest that fits and its recompute level the lowest (head slices narrower than
// GPT2_HEAD_SLICE_TOKENS only at -r 2 where no level fits with those, never with a --batch-invariant
// group), a larger budget never gives a smaller B, the head's slices are the widest whose plan fits
// too, and a run that fits nowhere gets advice that fits.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/fit.h"
#include "tests/lib/testutil.h"

static const size_t GiB = (size_t)1 << 30;

// The build of cfg at B x T on `world` ranks, and its plan; a run for gpt2_fit (B and recompute
// chosen there) with its --batch-invariant group.
static GPT2BuildSpec build_spec(const GPT2Config* cfg, int B, int T, int recompute, int zero_stage, int world,
                                int head_slice_tokens) {
    return (GPT2BuildSpec){.config = *cfg, .B = B, .T = T, .recompute = recompute, .zero_stage = zero_stage,
                           .world = world, .head_slice_tokens = head_slice_tokens};
}
static MemoryPlan plan_of(const GPT2Config* cfg, int B, int T, int recompute, int zero_stage, int world,
                          int head_slice_tokens) {
    GPT2BuildSpec spec = build_spec(cfg, B, T, recompute, zero_stage, world, head_slice_tokens);
    return gpt2_memory_plan(&spec);
}
static GPT2BuildSpec run_of(const GPT2Config* cfg, int T, int zero_stage, int world, int group_sequences) {
    GPT2BuildSpec run = build_spec(cfg, 0, T, 0, zero_stage, world, GPT2_HEAD_SLICE_TOKENS);
    run.group_sequences = group_sequences;
    return run;
}

// gpt2_fit and gpt2_fit_advice of a run given by value.
static int fit_run(GPT2BuildSpec run, int seqs_per_gpu, int recompute_lo, int recompute_hi, size_t memory, Fit* fit) {
    return gpt2_fit(&run, seqs_per_gpu, recompute_lo, recompute_hi, memory, fit);
}
static void fit_advice(char* buf, size_t n, GPT2BuildSpec run, int recompute_hi, size_t memory) {
    gpt2_fit_advice(buf, n, &run, recompute_hi, memory);
}

static GPT2Config preset(const char* name, int max_T) {
    GPT2Config cfg = {.max_seq_len = max_T, .vocab_size = GPT2_VOCAB_SIZE,
                      .padded_vocab_size = gpt2_padded_vocab(GPT2_VOCAB_SIZE)};
    gpt2_preset(name, &cfg);
    return cfg;
}

// Activation bytes of the CPU build (float everywhere) counted tensor by tensor, before the
// 256-byte alignment of each of the 27 regions. The logits hold the head's largest slice: slice_tokens
// tokens of whole sequences, at least one (model/config.h).
static size_t expected_activations(const GPT2Config* cfg, size_t B, size_t T, int recompute, size_t slice_tokens) {
    size_t C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    size_t head_seqs = T < slice_tokens ? slice_tokens / T : 1;
    if (head_seqs > B) head_seqs = B;
    size_t BT = B * T, L_ln = recompute >= 2 ? 1 : L, L_gelu = recompute >= 1 ? 1 : L;
#ifdef ATTN_NAIVE
    size_t saved = B * NH * T * T, scratch = B * NH * T * T; // probabilities; dP
#else
    size_t saved = 2 * B * NH * T, scratch = B * NH * T;     // m and l; D
#endif
    size_t per_layer_kept = BT * C * (3 + 1 + 1 + 4 + 1) + 4 * BT + saved; // qkv atty res2 fch res3, stats
    size_t ln = L_ln * BT * C + L_ln * BT * linear_bias_ld(C); // ln1, ln2 with fc's bias columns
    size_t floats = L * per_layer_kept + ln + L_gelu * BT * 4 * C
                  + BT * C + BT * C + 2 * BT + head_seqs * T * Vp + BT // encoded, lnf, its stats, logits, losses
                  + BT * C * (1 + 1 + 3 + 4) + scratch + 2 * BT + Vp; // backward buffers, inputs, targets, row
    return floats * sizeof(float);
}

static void test_plan_sizes(void) {
    GPT2Config d12 = preset("d12", 1024);
    const size_t n = 124475904; // GPT-2 124M with the vocabulary padded to 50304 (llm.c's count)
    const size_t wte = 50304 * 768; // with --batch-invariant a second gradient of wte, the encoder's share
    MemoryPlan p = plan_of(&d12, 4, 1024, 0, 0, 1, GPT2_HEAD_SLICE_TOKENS);
    GPT2BuildSpec grouped = build_spec(&d12, 4, 1024, 0, 0, 1, GPT2_HEAD_SLICE_TOKENS);
    grouped.group_sequences = 2;
    MemoryPlan g = gpt2_memory_plan(&grouped);
    test_check(p.parameters == n * 4 && p.gradients == n * 4 && g.gradients == (n + wte) * 4,
               "plan: d12 parameters and gradients, and with --batch-invariant the encoder's share of wte's",
               "%zu, %zu and %zu bytes, want %zu, %zu and %zu", p.parameters, p.gradients, g.gradients, n * 4, n * 4,
               (n + wte) * 4);
    test_check(p.optimizer == 2 * n * 4 && p.staging == GPT2_PIECE_FLOATS * 4 && p.host_optimizer == 0,
               "plan: d12 AdamW m, v and a piece of fp32 staging", "optimizer %zu, staging %zu, host %zu bytes",
               p.optimizer, p.staging, p.host_optimizer);
    int bad = 0;
    for (int r = 0; r <= 2; r++) {
        int shapes[][2] = {{1, 64}, {4, 1024}, {3, 67}, {64, 1024}, {2, 16384}};
        for (int s = 0; s < 5; s++) {
            for (int slice = GPT2_HEAD_SLICE_TOKENS; slice <= GPT2_HEAD_WIDEST_SLICE_TOKENS; slice *= 2) {
                MemoryPlan q = plan_of(&d12, shapes[s][0], shapes[s][1], r, 0, 1, slice);
                size_t want = expected_activations(&d12, shapes[s][0], shapes[s][1], r, slice);
                if (q.activations < want || q.activations > want + 27 * 256) {
                    printf("  B %d T %d -r %d, head slices of %d tokens: %zu bytes of activations, counted %zu\n",
                           shapes[s][0], shapes[s][1], r, slice, q.activations, want);
                    bad++;
                }
                if (q.total != q.parameters + q.gradients + q.optimizer + q.activations + q.staging) bad++;
            }
        }
    }
    test_check(bad == 0, "plan: activations of every recompute level and head slice match the tensor count",
               "%d wrong", bad);
    // ZeRO stage 1 on 8 GPUs: each rank keeps 1/8 of the optimizer state, shards padded to 64.
    MemoryPlan z = plan_of(&d12, 4, 1024, 0, 1, 8, GPT2_HEAD_SLICE_TOKENS);
    size_t shard = (n + 7) / 8;
    shard = (shard + 63) / 64 * 64;
    test_check(z.optimizer == 2 * shard * 4 && z.parameters == 8 * shard * 4, "plan: ZeRO 1 shard of 8 ranks",
               "optimizer %zu bytes, want %zu", z.optimizer, 2 * shard * 4);
    // ... and offloaded: the shard's state in host memory; saving gathers the master weights through
    // the staging piece, each rank's part uploaded first through an eighth of one.
    GPT2BuildSpec zo = build_spec(&d12, 4, 1024, 0, 1, 8, GPT2_HEAD_SLICE_TOKENS);
    zo.offload = 1;
    MemoryPlan zp = gpt2_memory_plan(&zo);
    test_check(zp.host_optimizer == 2 * shard * 4 && zp.optimizer == 2 * DEV_SLOTS * GPT2_OFFLOAD_PIECE_FLOATS * 4 &&
                   zp.staging == (GPT2_PIECE_FLOATS + GPT2_PIECE_FLOATS / 8) * 4,
               "plan: ZeRO 1 shard of 8 ranks, offloaded", "host %zu, device %zu, staging %zu bytes",
               zp.host_optimizer, zp.optimizer, zp.staging);
}

static void test_fit_grid(void) {
    static const int Ts[] = {64, 256, 1024, 4096, 16384, 32768};
    static const int worlds[][2] = {{1, 0}, {8, 1}}; // GPUs, ZeRO stage
    const long long total_batch = 524288; // tokens per step, llm.c's GPT-2 124M batch
    int cases = 0, fitted = 0, not_dividing = 0, over = 0, not_largest = 0, not_lowest = 0, shrank = 0;
    int inconsistent = 0, falsely_empty = 0, slice_wrong = 0;
    int slices_of[6] = {0}; // fits with slices of 1024, 2048, ..., 32768 tokens
    const int narrowest = GPT2_HEAD_NARROWEST_SLICE_TOKENS, narrow = GPT2_HEAD_SLICE_TOKENS;
    for (int m = 0; m < GPT2_NUM_PRESETS; m++) {
        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
            int T = Ts[t];
            GPT2Config cfg = preset(gpt2_preset_names[m], T > 1024 ? T : 1024);
            for (int w = 0; w < 2; w++) {
                int world = worlds[w][0], zero = worlds[w][1];
                int seqs = (int)(total_batch / ((long long)T * world));
                int previous_B = 0;
                for (int gib = 1; gib <= 141; gib++) {
                    size_t budget = (size_t)gib * GiB;
                    Fit fit;
                    int ok = fit_run(run_of(&cfg, T, zero, world, 0), seqs, 0, 2, budget, &fit);
                    cases++;
                    MemoryPlan p;
                    if (!ok) {
                        p = plan_of(&cfg, 1, T, 2, zero, world, narrowest);
                        if (p.total + FIT_MARGIN_BYTES <= budget) falsely_empty++;
                        if (previous_B > 0) shrank++;
                        continue;
                    }
                    fitted++;
                    if (seqs % fit.spec.B != 0) not_dividing++;
                    if (fit.plan.total + FIT_MARGIN_BYTES > budget) over++;
                    int planned = fit.spec.head_slice_tokens;
                    p = plan_of(&cfg, fit.spec.B, T, fit.spec.recompute, zero, world, planned);
                    if (memcmp(&p, &fit.plan, sizeof p) != 0) inconsistent++;
                    for (int larger = fit.spec.B + 1; larger <= seqs; larger++) { // the next divisor
                        if (seqs % larger != 0) continue;
                        p = plan_of(&cfg, larger, T, 2, zero, world, narrowest);
                        if (p.total + FIT_MARGIN_BYTES <= budget) not_largest++;
                        break;
                    }
                    // The lowest recompute level at the narrow slices; narrower ones only at -r 2,
                    // the widest of them that fits: no cheaper choice for this B fits.
                    int cheaper_fits = 0;
                    if (planned < narrow)
                        cheaper_fits = plan_of(&cfg, fit.spec.B, T, fit.spec.recompute, zero, world, 2 * planned)
                                               .total + FIT_MARGIN_BYTES <= budget;
                    else if (fit.spec.recompute > 0)
                        cheaper_fits = plan_of(&cfg, fit.spec.B, T, fit.spec.recompute - 1, zero, world, narrow)
                                               .total + FIT_MARGIN_BYTES <= budget;
                    if (cheaper_fits || planned < narrowest || planned > narrow ||
                        (planned < narrow && fit.spec.recompute != 2))
                        not_lowest++;
                    if (fit.spec.B < previous_B) shrank++;
                    previous_B = fit.spec.B;
                    // The head's slices: those planned, or wider ones whose plan fits, and twice as
                    // wide, up to the widest, does not.
                    int slice = gpt2_fit_head_slice_tokens(&fit.spec, budget);
                    p = plan_of(&cfg, fit.spec.B, T, fit.spec.recompute, zero, world, slice);
                    int fits = p.total + FIT_MARGIN_BYTES <= budget, wider_fits = 0;
                    if (slice < GPT2_HEAD_WIDEST_SLICE_TOKENS) {
                        p = plan_of(&cfg, fit.spec.B, T, fit.spec.recompute, zero, world, 2 * slice);
                        wider_fits = p.total + FIT_MARGIN_BYTES <= budget;
                    }
                    int width = 0; // slice = narrowest << width
                    while (width < 5 && narrowest << width < slice) width++;
                    if (narrowest << width != slice || slice < planned || (slice != planned && !fits) || wider_fits)
                        slice_wrong++;
                    else
                        slices_of[width]++;
                }
            }
        }
    }
    printf("  %d cases (4 sizes x 6 T x 2 GPU counts x 141 budgets), %d fit\n", cases, fitted);
    test_check(fitted > cases / 2 && fitted < cases, "fit: some cases fit and some do not",
               "%d of %d fit", fitted, cases);
    test_check(not_dividing == 0, "fit: B always divides the per-GPU batch", "%d do not", not_dividing);
    printf("  head slices of 1024 / 2048 / 4096 / 8192 / 16384 / 32768 tokens in %d / %d / %d / %d / %d / %d fits\n",
           slices_of[0], slices_of[1], slices_of[2], slices_of[3], slices_of[4], slices_of[5]);
    test_check(slice_wrong == 0 && slices_of[0] > 0 && slices_of[3] > 0 && slices_of[4] > 0 && slices_of[5] > 0,
               "fit: the head's slices are the widest whose plan fits as well (1024 and 8192 to 32768 somewhere)",
               "%d wrong; 1024 / 2048 / 4096 / 8192 / 16384 / 32768 in %d / %d / %d / %d / %d / %d fits", slice_wrong,
               slices_of[0], slices_of[1], slices_of[2], slices_of[3], slices_of[4], slices_of[5]);
    test_check(over == 0 && inconsistent == 0, "fit: the plan plus the margin never exceeds the budget",
               "%d over, %d plans differ from gpt2_memory_plan", over, inconsistent);
    test_check(not_largest == 0 && falsely_empty == 0, "fit: B is the largest divisor that fits",
               "%d larger divisors fit, %d empty fits where B 1 -r 2 fits", not_largest, falsely_empty);
    test_check(not_lowest == 0,
               "fit: the recompute level is the lowest that fits, and narrower head slices come only at -r 2",
               "%d could be lower or wider", not_lowest);
    test_check(shrank == 0, "fit: a larger budget never gives a smaller B", "%d times it did", shrank);
}

// Where recompute pays: GPT-2 124M at T 1024 with 64 sequences per step on a 24 GiB card.
static void test_fit_example(void) {
    GPT2Config d12 = preset("d12", 1024);
    Fit small, big, fixed;
    int a = fit_run(run_of(&d12, 1024, 0, 1, 0), 64, 0, 2, 8 * GiB, &small);
    int b = fit_run(run_of(&d12, 1024, 0, 1, 0), 64, 0, 2, 141 * GiB, &big);
    int c = fit_run(run_of(&d12, 1024, 0, 1, 0), 64, 1, 1, 8 * GiB, &fixed);
    test_check(a && b && big.spec.B == 64 && big.spec.recompute == 0 && small.spec.B < 64,
               "fit: d12 T 1024: all 64 sequences at -r 0 on 141 GiB, fewer on 8 GiB",
               "8 GiB: B %d -r %d; 141 GiB: B %d -r %d", small.spec.B, small.spec.recompute, big.spec.B, big.spec.recompute);
    test_check(c && fixed.spec.recompute == 1 && fixed.spec.B <= small.spec.B, "fit: an explicit -r is kept",
               "B %d -r %d", fixed.spec.B, fixed.spec.recompute);
    printf("  d12 T 1024, 64 sequences: 8 GiB -> B %d -r %d (%.2f GiB planned); 141 GiB -> B %d -r %d\n",
           small.spec.B, small.spec.recompute, small.plan.total / (double)GiB, big.spec.B, big.spec.recompute);
    // --batch-invariant 8: B a multiple of 8, the largest such that fits, at the narrow head slices or
    // wider; none where only B < 8 fits.
    int wrong = 0, fitted = 0, refused = 0;
    for (size_t budget = GiB; budget <= 141 * GiB; budget += GiB / 2) {
        Fit any, grouped;
        int ok_any = fit_run(run_of(&d12, 1024, 0, 1, 0), 64, 0, 2, budget, &any);
        int ok_grouped = fit_run(run_of(&d12, 1024, 0, 1, 8), 64, 0, 2, budget, &grouped);
        if (ok_grouped) fitted++;
        else if (ok_any) refused++;
        // The largest multiple of 8 dividing 64 whose plan (which keeps the encoder's share of wte's
        // gradient apart) fits at some -r, by brute force.
        int want_B = 0;
        for (int B = 64; B >= 8 && !want_B; B /= 2)
            for (int r = 0; r <= 2 && !want_B; r++) {
                GPT2BuildSpec spec = run_of(&d12, 1024, 0, 1, 8);
                spec.B = B;
                spec.recompute = r;
                if (gpt2_memory_plan(&spec).total + FIT_MARGIN_BYTES <= budget) want_B = B;
            }
        // Never narrower head slices than GPT2_HEAD_SLICE_TOKENS: a group's gradient sums are its parts'.
        if (ok_grouped != (want_B > 0) ||
            (ok_grouped && (grouped.spec.B != want_B || !ok_any || grouped.plan.total + FIT_MARGIN_BYTES > budget ||
                            grouped.spec.head_slice_tokens != GPT2_HEAD_SLICE_TOKENS ||
                            gpt2_fit_head_slice_tokens(&grouped.spec, budget) < GPT2_HEAD_SLICE_TOKENS)))
            wrong++;
    }
    test_check(wrong == 0 && fitted > 0 && refused > 0, "fit: with a group of 8 sequences B is a multiple of 8",
               "%d budgets fit, %d refused where a smaller B fits, %d wrong", fitted, refused, wrong);
}

// The CPU build's plans are fp32 (20 bytes per parameter before activations), so the budgets below
// are chosen for them.
static void test_advice(void) {
    char advice[512];
    Fit fit;
    // GPT-2 124M at T 32768 in 8 GiB: the longest T that divides 32768 and fits, and not twice it.
    GPT2Config d12 = preset("d12", 32768);
    size_t budget = 8 * GiB;
    int ok = fit_run(run_of(&d12, 32768, 0, 1, 0), 16, 0, 2, budget, &fit);
    fit_advice(advice, sizeof advice, run_of(&d12, 32768, 0, 1, 0), 2, budget);
    printf("  d12 T 32768 in 8 GiB: %s\n", advice);
    const char* t = strstr(advice, "-t ");
    int shorter = t ? atoi(t + 3) : 0;
    int fits = 0, longer_fits = 1;
    if (shorter > 0 && shorter < 32768 && 32768 % shorter == 0) {
        fits = plan_of(&d12, 1, shorter, 2, 0, 1, GPT2_HEAD_SLICE_TOKENS).total + FIT_MARGIN_BYTES <= budget;
        longer_fits =
            plan_of(&d12, 1, 2 * shorter, 2, 0, 1, GPT2_HEAD_SLICE_TOKENS).total + FIT_MARGIN_BYTES <= budget;
    }
    test_check(!ok && fits && !longer_fits, "advice: the longest shorter T that fits", "'%s'", advice);

    // GPT-2 350M in 6 GiB: no T fits (its fixed state alone is 7 GB), GPT-2 124M does.
    GPT2Config d24 = preset("d24", 1024);
    fit_advice(advice, sizeof advice, run_of(&d24, 1024, 0, 1, 0), 2, 6 * GiB);
    printf("  d24 T 1024 in 6 GiB: %s\n", advice);
    d12 = preset("d12", 1024);
    fits = plan_of(&d12, 1, 1024, 2, 0, 1, GPT2_HEAD_SLICE_TOKENS).total + FIT_MARGIN_BYTES <= 6 * GiB;
    test_check(fits && strstr(advice, "GPT-2 d12 at -t 1024") && !strstr(advice, "-t 512"),
               "advice: a smaller GPT-2 that fits at this T", "'%s'", advice);

    GPT2Config d48 = preset("d48", 1024);
    fit_advice(advice, sizeof advice, run_of(&d48, 1024, 0, 1, 0), 2, GiB);
    test_check(strstr(advice, "nothing") != NULL, "advice: 1 GiB holds nothing", "'%s'", advice);

    // GPT-2 774M on 8 GPUs of 14 GiB: only with the optimizer state sharded.
    GPT2Config d36 = preset("d36", 1024);
    fit_advice(advice, sizeof advice, run_of(&d36, 1024, 0, 8, 0), 2, 14 * GiB);
    printf("  d36 T 1024 on 8 GPUs of 14 GiB: %s\n", advice);
    fits = plan_of(&d36, 1, 1024, 2, 1, 8, GPT2_HEAD_SLICE_TOKENS).total + FIT_MARGIN_BYTES <= 14 * GiB;
    test_check(fits && !fit_run(run_of(&d36, 1024, 0, 8, 0), 64, 0, 2, 14 * GiB, &fit) && strstr(advice, "-z 1"),
               "advice: ZeRO stage 1 on 8 GPUs", "'%s'", advice);
}

// The head's slices (gpt2_head_slice_sequences), at every width: within the logits buffer the plan
// sizes (the group = 0 slice), at least one sequence, and with groups of `group` sequences made of
// whole groups or splitting each group evenly, the same for every B that is a multiple of group (the
// products and gradient sums of a slice have shapes set by group and T only), a group longer than the
// narrow slice split as the narrow width splits it (the same gradient sums on a card with the memory
// for the wider slices and on one without).
static void test_head_slices(void) {
    int Ts[] = {1, 7, 64, 67, 1000, 1024, 4096, 8192, 10000, 16384};
    int wrong = 0, cases = 0;
    for (int tokens = GPT2_HEAD_SLICE_TOKENS; tokens <= GPT2_HEAD_WIDEST_SLICE_TOKENS; tokens *= 2) {
        for (int t = 0; t < (int)(sizeof Ts / sizeof Ts[0]); t++) {
            int T = Ts[t], fit = T < tokens ? tokens / T : 1;
            for (int B = 1; B <= 200; B++) {
                int s0 = gpt2_head_slice_sequences(B, T, 0, tokens);
                if (s0 != (B < fit ? B : fit)) wrong++;
                for (int group = 1; group <= B; group++) {
                    if (B % group != 0) continue;
                    int s = gpt2_head_slice_sequences(B, T, group, tokens);
                    int unbounded = gpt2_head_slice_sequences(group << 20, T, group, tokens);
                    cases++;
                    // Groups within a narrow slice: whole groups a slice (the parts' products are
                    // the groups' at any width). Longer ones: the narrow width's parts.
                    int narrow = gpt2_head_slice_sequences(B, T, group, GPT2_HEAD_SLICE_TOKENS);
                    int longer = (long long)group * T > GPT2_HEAD_SLICE_TOKENS;
                    if (s < 1 || s > s0 || (s % group != 0 && group % s != 0) ||
                        s != (B < unbounded ? B : unbounded) || (longer ? s != narrow : s % group != 0)) {
                        if (wrong++ < 5) printf("  B %d T %d group %d: slices of %d sequences\n", B, T, group, s);
                    }
                }
            }
        }
    }
    test_check(wrong == 0, "head slices: whole groups or even parts of one, at most the planned buffer",
               "%d of %d cases wrong", wrong, cases);
}

// --offload: the plan keeps a piece of each array on the device and the state in host memory;
// GPT2_OFFLOAD_AUTO offloads where nothing fits without it, or where offloading lets B grow 4 times
// with 64K tokens a step; with ZeRO as without.
static void test_offload(void) {
    GPT2Config d12 = preset("d12", 1024), d36 = preset("d36", 1024), d48 = preset("d48", 1024);
    const size_t n = 124475904;
    GPT2BuildSpec spec = build_spec(&d12, 4, 1024, 0, 0, 1, GPT2_HEAD_SLICE_TOKENS);
    spec.offload = 1;
    MemoryPlan off = gpt2_memory_plan(&spec), on = plan_of(&d12, 4, 1024, 0, 0, 1, GPT2_HEAD_SLICE_TOKENS);
    test_check(off.optimizer == 2 * DEV_SLOTS * GPT2_OFFLOAD_PIECE_FLOATS * 4 && off.host_optimizer == 2 * n * 4 &&
               off.total == on.total - on.optimizer + off.optimizer,
               "plan: d12 offloaded: a piece of m and v in each slot on the device, all of them in host memory",
               "device %zu, host %zu bytes", off.optimizer, off.host_optimizer);
    int wrong = 0, offloaded = 0, for_speed = 0, sharded_offloaded = 0;
    for (size_t gib = 1; gib <= 141; gib++) {
        for (int k = 0; k < 4; k++) { // 4K and 64K tokens a step; d36 on one GPU, d48 with ZeRO on 8
            int seqs = k % 2 ? 64 : 4, zero = k / 2;
            GPT2BuildSpec run = zero ? run_of(&d48, 1024, 1, 8, 0) : run_of(&d36, 1024, 0, 1, 0), kept = run,
                          forced = run;
            run.offload = GPT2_OFFLOAD_AUTO;
            forced.offload = 1;
            Fit auto_fit, kept_fit, forced_fit;
            int a = fit_run(run, seqs, 0, 2, gib * GiB, &auto_fit);
            int fits_kept = fit_run(kept, seqs, 0, 2, gib * GiB, &kept_fit);
            int f = fit_run(forced, seqs, 0, 2, gib * GiB, &forced_fit);
            int gains =
                fits_kept && f && forced_fit.spec.B >= FIT_OFFLOAD_B_GAIN * kept_fit.spec.B && seqs * 1024 >= 65536;
            Fit* want = (!fits_kept && f) || gains ? &forced_fit : &kept_fit;
            int same = auto_fit.spec.offload == want->spec.offload && auto_fit.spec.B == want->spec.B &&
                       auto_fit.spec.recompute == want->spec.recompute;
            if (a != (fits_kept || f) || (a && !same)) wrong++;
            offloaded += !fits_kept && a;
            for_speed += gains;
            sharded_offloaded += zero && a && auto_fit.spec.offload;
        }
    }
    test_check(wrong == 0 && offloaded > 0 && for_speed > 0 && sharded_offloaded > 0,
               "fit: --offload auto offloads where nothing fits without it or where it quadruples B at 64K "
               "tokens a step (d36; d48 with ZeRO on 8 GPUs)",
               "%d budgets of 1..141 GiB offloaded, %d of them for a larger B, %d with ZeRO, %d wrong",
               offloaded + for_speed, for_speed, sharded_offloaded, wrong);
    Fit small; // this build's plan (the CPU's, fp32 weights): d36 at 16 GiB fits B 1 -r 0, offloaded B 4 -r 2
    GPT2BuildSpec d36_16 = run_of(&d36, 1024, 0, 1, 0);
    d36_16.offload = GPT2_OFFLOAD_AUTO;
    int at_64 = fit_run(d36_16, 64, 0, 2, 16 * GiB, &small) && small.spec.offload == 1 && small.spec.B == 4;
    int at_4 = fit_run(d36_16, 4, 0, 2, 16 * GiB, &small) && small.spec.offload == 0 && small.spec.B == 1;
    test_check(at_64 && at_4, "fit: d36 at 16 GiB offloads for B 4 at 64 sequences a step, not at 4",
               "B %d -r %d offload %d", small.spec.B, small.spec.recompute, small.spec.offload);
    d36_16.offload = GPT2_OFFLOAD_NEEDED; // a host that cannot hold the state: offload only to fit
    Fit needed_16, needed_14;
    int kept_16 =
        fit_run(d36_16, 64, 0, 2, 16 * GiB, &needed_16) && needed_16.spec.offload == 0 && needed_16.spec.B == 1;
    int off_14 = fit_run(d36_16, 64, 0, 2, 14 * GiB, &needed_14) && needed_14.spec.offload == 1;
    test_check(kept_16 && off_14,
               "fit: GPT2_OFFLOAD_NEEDED at 16 GiB keeps B 1 on the GPU, at 14 GiB (nothing fits) offloads",
               "16 GiB: B %d offload %d; 14 GiB: B %d offload %d", needed_16.spec.B, needed_16.spec.offload,
               needed_14.spec.B, needed_14.spec.offload);
}

int main(void) {
    test_head_slices();
    test_plan_sizes();
    test_fit_grid();
    test_fit_example();
    test_advice();
    test_offload();
    return test_summary("memory_fit");
}
