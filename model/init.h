// The initial weights of a GPT-2 trained from scratch, in one place for the model (gpt2_init_random)
// and for scripts/profile_step.cu, whose kernels should see the magnitudes a training run gives them.
#pragma once
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// Writes all of cfg's parameters, fp32 in model-file order, to w (device memory): GPT-2's init
// (DESIGN.md) from the seed, N(0, 0.02), the residual projections N(0, 0.02/sqrt(2L)), biases 0 and
// layernorm weights 1, drawn with cuRAND Philox so that both backends get the same weights. wte's
// padded rows (V to Vp) are zero, and stay zero in training (no gradient reaches them).
void gpt2_initial_weights(float* w, const GPT2Config* cfg, unsigned long long seed);
// Parameters [start, start + count) of the same weights, to w (device memory, count values): the
// bits of gpt2_initial_weights' there, when every weight matrix's part starts at an even index of
// the matrix (its normals come in pairs), which gpt2's pieces do.
void gpt2_initial_weights_range(float* w, const GPT2Config* cfg, unsigned long long seed, size_t start,
                                size_t count);

#ifdef __cplusplus
}
#endif
