// The attention's softmax scale, 1/sqrt(HS), and the layernorm's epsilon, for every kernel of both
// backends. A test build may change them (make PERTURB=attn-scale|ln-eps, see the Makefile) to show
// that a recipe's verdict refuses a model whose arithmetic is subtly wrong; no other build does.
#pragma once

#ifndef ATTENTION_SCALE_FACTOR
#define ATTENTION_SCALE_FACTOR 1.0f
#endif
// (1.0f / sqrtf(HS) bit for bit when the factor is 1.)
#define ATTENTION_SCALE(HS) (ATTENTION_SCALE_FACTOR / sqrtf((float)(HS)))

#ifndef LAYERNORM_EPS
#define LAYERNORM_EPS 1e-5f
#endif
