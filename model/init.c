#include "model/init.h"

#include <math.h>
#include <stdlib.h>

#include "common/util.h"
#include "kernels/kernels.h"

void gpt2_initial_weights(float* w, const GPT2Config* cfg, unsigned long long seed) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(cfg, sizes);
    float residual_std = 0.02f / sqrtf(2.0f * cfg->num_layers);
    float* ones = xmalloc((size_t)cfg->num_layers * cfg->channels * sizeof(float), "init");
    for (size_t i = 0; i < (size_t)cfg->num_layers * cfg->channels; i++) ones[i] = 1.0f;
    unsigned long long offset = 0; // position in the Philox sequence, advanced tensor by tensor
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = sizes[i];
        int is_ln_weight = i == P_LN1W || i == P_LN2W || i == P_LNFW;
        int is_weight_matrix = i == P_WTE || i == P_WPE || i == P_QKVW || i == P_ATTPROJW ||
                               i == P_FCW || i == P_FCPROJW;
        if (is_weight_matrix) {
            float std = (i == P_ATTPROJW || i == P_FCPROJW) ? residual_std : 0.02f;
            init_normal(w, n, 0.0f, std, seed, offset);
            offset += (n + 3) / 4 * 4;
            // wte's rows past V (the padding, which no token reaches and no gradient changes) are
            // zero, as in llm.c's and Hugging Face's models. Their random numbers are still drawn, so
            // every other weight keeps its place in the Philox sequence and its value.
            if (i == P_WTE) {
                size_t real = (size_t)cfg->vocab_size * cfg->channels;
                dev_memset_zero(w + real, (n - real) * sizeof(float));
            }
        } else if (is_ln_weight) {
            dev_upload(w, ones, n * sizeof(float));
        } else {
            dev_memset_zero(w, n * sizeof(float));
        }
        w += n;
    }
    free(ones);
}
