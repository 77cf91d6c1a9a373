// The two CPU attention variants with their block sizes explicit, so tests can run both in one
// binary whatever ATTN the build uses. kernels/cpu/attention.c binds the generic attention_* of
// kernels/kernels.h to one of them. Layouts as in kernels.h: qkv (B, T, 3, NH, HS), out
// (B, T, NH, HS), causal, scale 1/sqrt(HS), HS = C/NH; dqkv is overwritten.
#pragma once
#include <stddef.h>

// Default flash tile: 32 query rows x 32 key rows. At HS = 64 the Q, K and V tiles and the output
// accumulator are 8 KB each, so one tile's working set (~36 KB with the score tile) stays in L1/L2,
// and the masked half of a diagonal tile wastes little work; T = 1024 still has 32 query blocks per
// head, enough to keep the loops long.
#define ATTN_FLASH_BLOCK_Q 32
#define ATTN_FLASH_BLOCK_K 32

// Dot product of two head vectors, shared by both variants.
static inline float attention_dot(const float* a, const float* b, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

// Naive: att (B, NH, T, T) gets the softmax probabilities (zeros above the diagonal) and is what
// the backward needs; scratch (B, NH, T, T) holds dP and then dS during the backward.
size_t attention_naive_saved_bytes(int B, int T, int NH);
size_t attention_naive_scratch_bytes(int B, int T, int C, int NH);
void attention_naive_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_naive_backward_cpu(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int C, int NH);

// Flash: m and l (B, NH, T) each are the row max of the scaled scores and the sum of exp(s - m)
// over the row; the backward recomputes the probabilities from them and needs D (B, NH, T),
// D_i = rowsum(dout_i * out_i), as scratch. Nothing of size T x T is ever allocated.
size_t attention_flash_saved_bytes(int B, int T, int NH);   // m then l
size_t attention_flash_scratch_bytes(int B, int T, int C, int NH);  // D
void attention_flash_forward_cpu(float* out, float* m, float* l, const float* qkv, int B, int T,
                                 int C, int NH, int block_q, int block_k);
void attention_flash_backward_cpu(float* dqkv, float* D, const float* dout, const float* qkv,
                                  const float* out, const float* m, const float* l, int B, int T,
                                  int C, int NH, int block_q, int block_k);
