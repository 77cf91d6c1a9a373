#include "model/fit.h"

#include <stdio.h>
#include <string.h>

static int plan_fits_sliced(const GPT2Config* cfg, int B, int T, int recompute, int zero_stage, int world,
                            int head_slice_tokens, size_t memory, MemoryPlan* plan) {
    *plan = gpt2_memory_plan(cfg, B, T, recompute, zero_stage, world, head_slice_tokens);
    return memory > FIT_MARGIN_BYTES && plan->total <= memory - FIT_MARGIN_BYTES;
}
static int plan_fits(const GPT2Config* cfg, int B, int T, int recompute, int zero_stage, int world,
                     size_t memory, MemoryPlan* plan) {
    return plan_fits_sliced(cfg, B, T, recompute, zero_stage, world, GPT2_HEAD_SLICE_TOKENS, memory, plan);
}

int gpt2_fit(const GPT2Config* cfg, int T, int seqs_per_gpu, int b_multiple, int world, int zero_stage,
             int recompute_lo, int recompute_hi, size_t memory, Fit* fit) {
    for (int B = seqs_per_gpu; B >= 1; B--) {
        if (seqs_per_gpu % B != 0 || B % b_multiple != 0) continue;
        for (int r = recompute_lo; r <= recompute_hi; r++) {
            if (plan_fits(cfg, B, T, r, zero_stage, world, memory, &fit->plan)) {
                fit->B = B;
                fit->recompute = r;
                return 1;
            }
        }
    }
    return 0;
}

int gpt2_fit_head_slice_tokens(const GPT2Config* cfg, int B, int T, int recompute, int zero_stage, int world,
                               size_t memory) {
    MemoryPlan plan;
    int tokens = GPT2_HEAD_WIDEST_SLICE_TOKENS;
    while (tokens > GPT2_HEAD_SLICE_TOKENS &&
           !plan_fits_sliced(cfg, B, T, recompute, zero_stage, world, tokens, memory, &plan))
        tokens /= 2;
    return tokens;
}

// Appends "; " and the formatted text to buf (n bytes) when there is room.
static void append(char* buf, size_t n, const char* text) {
    size_t used = strlen(buf);
    snprintf(buf + used, n - used, "%s%s", used ? "; " : "", text);
}

void gpt2_fit_advice(char* buf, size_t n, const GPT2Config* cfg, int T, int world, int zero_stage,
                     int recompute_hi, size_t memory) {
    MemoryPlan plan;
    char item[128];
    buf[0] = '\0';
    for (int d = 2; d <= T; d++) { // the longest T' < T that divides T, so that -d still divides
        if (T % d == 0 && plan_fits(cfg, 1, T / d, recompute_hi, zero_stage, world, memory, &plan)) {
            snprintf(item, sizeof item, "-t %d with this model", T / d);
            append(buf, n, item);
            break;
        }
    }
    size_t sizes[NUM_PARAMETER_TENSORS], params = gpt2_parameter_sizes(cfg, sizes);
    for (int i = GPT2_NUM_PRESETS - 1; i >= 0; i--) {
        GPT2Config smaller = *cfg;
        gpt2_preset(gpt2_preset_names[i], &smaller);
        if (gpt2_parameter_sizes(&smaller, sizes) < params &&
            plan_fits(&smaller, 1, T, recompute_hi, zero_stage, world, memory, &plan)) {
            snprintf(item, sizeof item, "GPT-2 %s at -t %d", gpt2_preset_names[i], T);
            append(buf, n, item);
            break;
        }
    }
    if (recompute_hi < 2 && plan_fits(cfg, 1, T, 2, zero_stage, world, memory, &plan))
        append(buf, n, "-r 2 (or leave -r out: -b auto picks it)");
    if (world > 1 && zero_stage == 0 && plan_fits(cfg, 1, T, recompute_hi, 1, world, memory, &plan))
        append(buf, n, "-z 1 (ZeRO stage 1 shards the optimizer state over the GPUs)");
    if (!buf[0]) snprintf(buf, n, "nothing shorter or smaller fits either");
}
