// test_generate: greedy generation (temperature 0) against the argmax of the model's logits computed
// independently of the generation code, for every generated position. Built against either backend
// like the trainers (tests/test_generate_cpu like train_gpt_cpu, tests/test_generate like train_gpt).
//
//   test_generate MODEL TOKENS [--tolerance X]
//
// The prompt is the first 8 tokens of TOKENS. Two checks:
//  1. 40 tokens generated one at a time (a forward over the growing sequence for each) against one
//     forward over the whole final sequence: the token after position j must be the argmax of the
//     logits at j, for every generated position;
//  2. 40 tokens with a model built for T = 5, so that the context window slides: each token against
//     a forward over the 5 tokens before it (or all of them, at the start); a short window, so that
//     one token more or less of context changes the argmax.
// With --tolerance X > 0 a generated token may differ from the argmax when its logit is within X of
// the largest (near ties, which a bf16 forward may order differently for another sequence length).
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoints/checkpoint.h"
#include "common/util.h"
#include "data/tokenfile.h"
#include "model/generate.h"
#include "model/gpt2.h"
#include "tests/lib/testutil.h"

enum { PROMPT = 8, NEW = 40, WINDOW = 5 };

// Whether token `got` is an acceptable argmax of logits (V values); the margin between the two
// largest logits goes to *margin.
static int is_argmax(const float* logits, int V, int got, double tolerance, double* margin) {
    int best = 0, second = -1;
    for (int i = 1; i < V; i++) {
        if (logits[i] > logits[best]) { second = best; best = i; }
        else if (second < 0 || logits[i] > logits[second]) second = i;
    }
    *margin = (double)logits[best] - logits[second];
    return got == best || (double)logits[got] >= (double)logits[best] - tolerance;
}

static GPT2 build(const GPT2Config* cfg, const float* weights, int T) {
    GPT2 model;
    gpt2_build_forward_only(&model, cfg, 1, T);
    gpt2_set_weights(&model, weights);
    return model;
}

int main(int argc, char** argv) {
    double tolerance = 0.0;
    if (argc == 5 && strcmp(argv[3], "--tolerance") == 0) {
        char* end;
        errno = 0;
        tolerance = strtod(argv[4], &end);
        if (errno || *end || !(tolerance >= 0.0)) fatal("--tolerance: '%s' is not a number >= 0", argv[4]);
    } else if (argc != 3) {
        fatal("usage: test_generate MODEL TOKENS [--tolerance X]");
    }
    GPT2Config cfg;
    size_t nparams, ntokens;
    float* weights = model_file_read(argv[1], &cfg, &nparams);
    uint16_t* file_tokens = tokenfile_read(argv[2], cfg.vocab_size, &ntokens);
    if (ntokens < PROMPT) fatal("%s: fewer than %d tokens", argv[2], PROMPT);
    if (cfg.max_seq_len < PROMPT + NEW) fatal("%s: the model's maximum T is below %d", argv[1], PROMPT + NEW);
    backend_init(0);
    comm_init(0, 1, NULL, 10.0);
    int V = cfg.vocab_size, total = PROMPT + NEW;
    float* logits = xmalloc((size_t)V * sizeof(float), "logits");
    int* tokens = xmalloc((size_t)total * sizeof(int), "tokens");
    SamplerOptions greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f};

    for (int window = 0; window < 2; window++) {
        int T = window ? WINDOW : total;
        GPT2 model = build(&cfg, weights, T);
        for (int i = 0; i < PROMPT; i++) tokens[i] = file_tokens[i];
        for (int i = PROMPT; i < total; i++) tokens[i] = -1;
        Sampler s;
        sampler_init(&s, V, greedy, sampler_seed(1));
        int n = gpt2_generate(&model, &s, tokens, PROMPT, NEW, NULL, NULL);
        sampler_free(&s);
        if (!window) gpt2_forward(&model, tokens, NULL, 1, total, 0.0f); // every position at once
        int bad = -1;
        double min_margin = INFINITY;
        for (int j = PROMPT; j < total && bad < 0; j++) {
            if (window) { // the T tokens before j
                int start = j > T ? j - T : 0;
                gpt2_forward(&model, tokens + start, NULL, 1, j - start, 0.0f);
                gpt2_logits_row(&model, 0, j - start - 1, j - start, logits);
            } else {
                gpt2_logits_row(&model, 0, j - 1, total, logits);
            }
            double margin;
            if (tokens[j] < 0 || tokens[j] >= V || !is_argmax(logits, V, tokens[j], tolerance, &margin)) bad = j;
            else if (margin < min_margin) min_margin = margin;
        }
        const char* name = window ? "greedy tokens with a sliding window of 5 equal the argmax of a forward over the window"
                                  : "greedy tokens equal the argmax of one forward over the whole sequence";
        test_check(n == NEW && bad < 0, name, "%d tokens generated (want %d), first disagreement at position %d "
                   "(-1: none), smallest top-2 logit margin %.3g, tolerance %g", n, NEW, bad, min_margin, tolerance);
        gpt2_free(&model);
    }
    free(tokens);
    free(logits);
    free(file_tokens);
    free(weights);
    comm_free();
    return test_summary("test_generate");
}
