#include "model/init.h"

#include <math.h>
#include <stdlib.h>

#include "common/util.h"
#include "kernels/kernels.h"

void gpt2_initial_weights_range(float* w, const GPT2Config* cfg, unsigned long long seed, size_t start,
                                size_t count) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(cfg, sizes);
    const float residual_std = 0.02f / sqrtf(2.0f * cfg->num_layers);
    const size_t end = start + count;
    float* ones = NULL;
    unsigned long long offset = 0; // tensor i's first place in the Philox sequence
    for (size_t i = 0, first = 0; i < NUM_PARAMETER_TENSORS; first += sizes[i], i++) {
        const size_t n = sizes[i], lo = first > start ? first : start, hi = first + n < end ? first + n : end;
        const int is_ln_weight = i == P_LN1W || i == P_LN2W || i == P_LNFW;
        const int is_weight_matrix = gpt2_is_weight_matrix((int)i);
        if (lo < hi) {
            float* out = w + (lo - start);
            if (is_weight_matrix) {
                // The normals come in pairs: a part that starts inside a pair would pair other numbers.
                if ((lo - first) % 2 != 0)
                    fatal("internal: initial weights from index %zu of tensor %zu: an odd start", lo - first, i);
                float std = (i == P_ATTPROJW || i == P_FCPROJW) ? residual_std : 0.02f;
                init_normal(out, hi - lo, 0.0f, std, seed, offset + (lo - first));
                // wte's rows past V (the padding, which no token reaches and no gradient changes) are
                // zero, as in llm.c's and Hugging Face's models. Their random numbers are still drawn,
                // so every other weight keeps its place in the Philox sequence and its value.
                size_t real = first + (size_t)cfg->vocab_size * cfg->channels;
                if (i == P_WTE && hi > real) {
                    size_t zero_from = lo > real ? lo : real;
                    dev_memset_zero(w + (zero_from - start), (hi - zero_from) * sizeof(float));
                }
            } else if (is_ln_weight) {
                if (!ones) { // the largest layernorm weight tensor is L x C
                    size_t most = (size_t)cfg->num_layers * cfg->channels;
                    ones = xmalloc(most * sizeof(float), "init");
                    for (size_t k = 0; k < most; k++) ones[k] = 1.0f;
                }
                dev_upload(out, ones, (hi - lo) * sizeof(float));
            } else {
                dev_memset_zero(out, (hi - lo) * sizeof(float));
            }
        }
        if (is_weight_matrix) offset += (n + 3) / 4 * 4;
    }
    free(ones);
}

void gpt2_initial_weights(float* w, const GPT2Config* cfg, unsigned long long seed) {
    gpt2_initial_weights_range(w, cfg, seed, 0, gpt2_parameter_sizes(cfg, (size_t[NUM_PARAMETER_TENSORS]){0}));
}
