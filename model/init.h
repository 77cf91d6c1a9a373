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

#ifdef __cplusplus
}
#endif
