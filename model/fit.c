#include "model/fit.h"

#include <stdio.h>
#include <string.h>

static int plan_fits(const GPT2BuildSpec* spec, size_t memory, MemoryPlan* plan) {
    *plan = gpt2_memory_plan(spec);
    return memory > FIT_MARGIN_BYTES && plan->total <= memory - FIT_MARGIN_BYTES;
}

int gpt2_fit_narrowest_head_slice_tokens(const GPT2BuildSpec* run) {
    return run->group_sequences > 0 ? GPT2_HEAD_SLICE_TOKENS : GPT2_HEAD_NARROWEST_SLICE_TOKENS;
}

// Whether the run fits at B = 1 with model cfg, T, recompute level r and ZeRO stage z (offloading
// where run->offload allows it).
static int fits_one_sequence(const GPT2BuildSpec* run, const GPT2Config* cfg, int T, int r, int z, size_t memory) {
    GPT2BuildSpec spec = *run;
    spec.offload = run->offload != 0; // offloaded where allowed: 1, GPT2_OFFLOAD_AUTO or _NEEDED
    spec.config = *cfg;
    spec.B = 1;
    spec.T = T;
    spec.recompute = r;
    spec.zero_stage = z;
    spec.head_slice_tokens = gpt2_fit_narrowest_head_slice_tokens(run);
    MemoryPlan plan;
    return plan_fits(&spec, memory, &plan);
}

// The largest B at offload level `offload` (and the lowest recompute level for it, then at the
// highest the widest narrower head slices) that fits.
static int fit_at(const GPT2BuildSpec* run, int offload, int seqs_per_gpu, int recompute_lo, int recompute_hi,
                  size_t memory, Fit* fit) {
    int multiple = run->group_sequences > 0 ? run->group_sequences : 1;
    int narrowest = gpt2_fit_narrowest_head_slice_tokens(run);
    fit->spec = *run;
    fit->spec.offload = offload;
    for (int B = seqs_per_gpu; B >= 1; B--) {
        if (seqs_per_gpu % B != 0 || B % multiple != 0) continue;
        fit->spec.B = B;
        fit->spec.head_slice_tokens = GPT2_HEAD_SLICE_TOKENS;
        for (int r = recompute_lo; r <= recompute_hi; r++) {
            fit->spec.recompute = r;
            if (plan_fits(&fit->spec, memory, &fit->plan)) return 1;
        }
        for (int tokens = GPT2_HEAD_SLICE_TOKENS / 2; tokens >= narrowest; tokens /= 2) {
            fit->spec.head_slice_tokens = tokens;
            if (plan_fits(&fit->spec, memory, &fit->plan)) return 1;
        }
    }
    return 0;
}

int gpt2_fit(const GPT2BuildSpec* run, int seqs_per_gpu, int recompute_lo, int recompute_hi, size_t memory,
             Fit* fit) {
    if (run->offload == 0 || run->offload == 1)
        return fit_at(run, run->offload, seqs_per_gpu, recompute_lo, recompute_hi, memory, fit);
    Fit kept;
    int fits_kept = fit_at(run, 0, seqs_per_gpu, recompute_lo, recompute_hi, memory, &kept);
    int fits_offloaded = fit_at(run, 1, seqs_per_gpu, recompute_lo, recompute_hi, memory, fit);
    int for_speed = run->offload == GPT2_OFFLOAD_AUTO && fits_kept && fit->spec.B >= FIT_OFFLOAD_B_GAIN * kept.spec.B &&
                    (long long)seqs_per_gpu * run->T >= FIT_OFFLOAD_MIN_TOKENS;
    if (fits_offloaded && (!fits_kept || for_speed)) return 1;
    *fit = kept;
    return fits_kept;
}

int gpt2_fit_offload(const GPT2BuildSpec* spec, size_t memory) {
    if (spec->offload == 0 || spec->offload == 1) return spec->offload;
    GPT2BuildSpec kept = *spec;
    kept.offload = 0;
    kept.head_slice_tokens = gpt2_fit_narrowest_head_slice_tokens(spec);
    MemoryPlan plan;
    return !plan_fits(&kept, memory, &plan);
}

int gpt2_fit_head_slice_tokens(const GPT2BuildSpec* spec, size_t memory) {
    GPT2BuildSpec sliced = *spec;
    MemoryPlan plan;
    int narrowest = gpt2_fit_narrowest_head_slice_tokens(spec);
    sliced.head_slice_tokens = GPT2_HEAD_WIDEST_SLICE_TOKENS;
    while (sliced.head_slice_tokens > narrowest && !plan_fits(&sliced, memory, &plan))
        sliced.head_slice_tokens /= 2;
    return sliced.head_slice_tokens;
}

// Appends "; " and the formatted text to buf (n bytes) when there is room.
static void append(char* buf, size_t n, const char* text) {
    size_t used = strlen(buf);
    snprintf(buf + used, n - used, "%s%s", used ? "; " : "", text);
}

void gpt2_fit_advice(char* buf, size_t n, const GPT2BuildSpec* run, int recompute_hi, size_t memory) {
    const GPT2Config* cfg = &run->config;
    int T = run->T, world = run->world, zero_stage = run->zero_stage;
    char item[128];
    buf[0] = '\0';
    for (int d = 2; d <= T; d++) { // the longest T' < T that divides T, so that -d still divides
        if (T % d == 0 && fits_one_sequence(run, cfg, T / d, recompute_hi, zero_stage, memory)) {
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
            fits_one_sequence(run, &smaller, T, recompute_hi, zero_stage, memory)) {
            snprintf(item, sizeof item, "GPT-2 %s at -t %d", gpt2_preset_names[i], T);
            append(buf, n, item);
            break;
        }
    }
    if (recompute_hi < 2 && fits_one_sequence(run, cfg, T, 2, zero_stage, memory))
        append(buf, n, "-r 2 (or leave -r out: -b auto picks it)");
    if (world > 1 && zero_stage == 0 && fits_one_sequence(run, cfg, T, recompute_hi, 1, memory))
        append(buf, n, "-z 1 (ZeRO stage 1 shards the optimizer state over the GPUs)");
    GPT2BuildSpec offloaded = *run;
    offloaded.offload = 1;
    if (run->offload == 0 && fits_one_sequence(&offloaded, cfg, T, recompute_hi, zero_stage, memory))
        append(buf, n, "--offload auto (AdamW's state in host memory)");
    if (!buf[0]) snprintf(buf, n, "nothing shorter or smaller fits either");
}
