// Sampling and generation (see generate.h).
#include "model/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct RankedToken {
    float p;
    int id;
};

uint64_t sampler_seed(unsigned long long seed) { return seed * 0x9E3779B97F4A7C15ull + 1; }

static uint64_t rng_next(uint64_t* state) { // xorshift64*
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545F4914F6CDD1Dull;
}

void sampler_init(Sampler* s, int V, SamplerOptions opt, uint64_t rng) {
    s->opt = opt;
    s->rng = rng ? rng : 1;
    s->V = V;
    s->logits = xmalloc((size_t)V * sizeof(float), "sampler");
    s->probs = xmalloc((size_t)V * sizeof(float), "sampler");
    s->ranked = xmalloc((size_t)V * sizeof(struct RankedToken), "sampler");
}

void sampler_free(Sampler* s) {
    free(s->logits);
    free(s->probs);
    free(s->ranked);
}

// The k-th largest of x[0, n) by selection on a copy in work.
static float kth_largest(const float* x, int n, int k, float* work) {
    memcpy(work, x, (size_t)n * sizeof(float));
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = work[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (work[i] > pivot) i++;
            while (work[j] < pivot) j--;
            if (i <= j) { float t = work[i]; work[i] = work[j]; work[j] = t; i++; j--; }
        }
        if (want <= j) hi = j; else if (want >= i) lo = i; else break;
    }
    return work[want];
}

// Most likely first; equal probabilities by id, so the kept set never depends on qsort's order.
static int by_probability(const void* a, const void* b) {
    const struct RankedToken *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

// Zeroes every probability outside the nucleus: the fewest most likely tokens whose share of `sum`
// reaches top_p. Returns the sum of what is kept.
static double keep_nucleus(float* probs, int V, double sum, float top_p, struct RankedToken* ranked) {
    int n = 0;
    for (int i = 0; i < V; i++)
        if (probs[i] > 0.0f) ranked[n++] = (struct RankedToken){probs[i], i};
    qsort(ranked, (size_t)n, sizeof *ranked, by_probability);
    double kept = 0.0;
    int m = 0;
    while (m < n && (m == 0 || kept < top_p * sum)) kept += ranked[m++].p;
    for (int i = m; i < n; i++) probs[ranked[i].id] = 0.0f;
    return kept;
}

int sampler_next(Sampler* s, const float* logits) {
    int V = s->V, best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->opt.temperature == 0.0f) return best;
    float threshold = -INFINITY;
    if (s->opt.top_k > 0 && s->opt.top_k < V) threshold = kth_largest(logits, V, s->opt.top_k, s->probs);
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        s->probs[i] = logits[i] >= threshold ? expf((logits[i] - logits[best]) / s->opt.temperature) : 0.0f;
        sum += s->probs[i];
    }
    if (s->opt.top_p < 1.0f) sum = keep_nucleus(s->probs, V, sum, s->opt.top_p, s->ranked);
    double r = (double)(rng_next(&s->rng) >> 40) / 16777216.0 * sum, acc = 0.0;
    for (int i = 0; i < V; i++) {
        acc += s->probs[i];
        if (s->probs[i] > 0.0f && r < acc) return i;
    }
    return best; // r fell past the last sum by rounding: the most likely token is always kept
}

int gpt2_generate(GPT2* model, Sampler* s, int* tokens, int n_context, int n_new,
                  int (*on_token)(int token, void* ctx), void* ctx) {
    for (int i = 0; i < n_new; i++) {
        int n = n_context + i, start = n > model->T ? n - model->T : 0, len = n - start;
        gpt2_forward(model, tokens + start, NULL, 1, len, 0.0f);
        gpt2_logits_row(model, 0, len - 1, len, s->logits);
        tokens[n] = sampler_next(s, s->logits);
        if (on_token && on_token(tokens[n], ctx)) return i + 1;
    }
    return n_new;
}
