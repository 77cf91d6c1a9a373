// Text generation: sampling the next token from a row of logits (temperature, top-k, top-p), and
// continuing a sequence with the model by running the forward over the whole context for every
// new token (no key/value cache: README.md, "Generate text", says what that costs).
#pragma once
#include <stdint.h>

#include "model/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float temperature; // 0: greedy (the most likely token, the lowest id among equals)
    int top_k;         // sample among the k most likely tokens; 0: all
    float top_p;       // ... and among the fewest most likely whose probability reaches p; 1: all
} SamplerOptions;

typedef struct {
    SamplerOptions opt;
    uint64_t rng;      // xorshift64* state, never 0; saved in the training state for a bit-exact resume
    int V;
    float* logits;     // (V) the row being sampled
    float* probs;      // (V)
    struct RankedToken* ranked; // (V) for top-p
} Sampler;

// The sampler's RNG state for a seed (never 0).
uint64_t sampler_seed(unsigned long long seed);
void sampler_init(Sampler* s, int V, SamplerOptions opt, uint64_t rng);
void sampler_free(Sampler* s);
// The next token for logits (V values). Draws one number from the RNG unless greedy.
int sampler_next(Sampler* s, const float* logits);

// Appends up to n_new tokens to tokens[0, n_context) (room for n_context + n_new), each sampled from
// the model's logits at the last position of the newest model->T tokens (a window that slides once
// the sequence is longer than the model was built for). After each token, on_token(token, ctx) is
// called (when not NULL); a non-zero return stops the generation. Returns the tokens appended.
int gpt2_generate(GPT2* model, Sampler* s, int* tokens, int n_context, int n_new,
                  int (*on_token)(int token, void* ctx), void* ctx);

#ifdef __cplusplus
}
#endif
