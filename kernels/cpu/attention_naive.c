// Naive causal attention on the CPU: the T x T probabilities are materialised and kept for the
// backward, which materialises dP (then dS) as well. The structure follows the GPU naive build:
// scores, softmax, weighted sum; backward dP = dO V^T, softmax backward, then three products.
#include "kernels/cpu/attention_cpu.h"
#include "kernels/constants.h"

#include <math.h>
#include <string.h>

size_t attention_naive_saved_bytes(int B, int T, int NH) {
    return (size_t)B * NH * T * T * sizeof(float);
}

size_t attention_naive_scratch_bytes(int B, int T, int C, int NH) {
    (void)C;
    return (size_t)B * NH * T * T * sizeof(float);
}

void attention_naive_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    const int HS = C / NH;
    const float scale = ATTENTION_SCALE(HS);
    // Every (b, h, row) is independent; rows differ in length, so hand them out dynamically.
#pragma omp parallel for collapse(3) schedule(dynamic, 8)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)(b * T + t) * 3 + 0) * C + h * HS;
                float* p = att + (((size_t)b * NH + h) * T + t) * T;
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)(b * T + t2) * 3 + 1) * C + h * HS;
                    p[t2] = attention_dot(q, k, HS) * scale;
                    if (p[t2] > maxval) maxval = p[t2];
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    p[t2] = expf(p[t2] - maxval);
                    sum += p[t2];
                }
                const float inv_sum = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++) p[t2] *= inv_sum;
                for (int t2 = t + 1; t2 < T; t2++) p[t2] = 0.0f; // masked: the full matrix is defined

                float* o = out + (size_t)(b * T + t) * C + h * HS;
                memset(o, 0, (size_t)HS * sizeof(float));
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + ((size_t)(b * T + t2) * 3 + 2) * C + h * HS;
                    for (int i = 0; i < HS; i++) o[i] += p[t2] * v[i];
                }
            }
        }
    }
}

void attention_naive_backward_cpu(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int C, int NH) {
    const int HS = C / NH;
    const float scale = ATTENTION_SCALE(HS);
    // One (b, h) per task: dK and dV of a key row collect contributions from every query row of
    // the same head, so splitting a head between threads would race.
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* P = att + ((size_t)b * NH + h) * T * T;
            float* dS = scratch + ((size_t)b * NH + h) * T * T;
            for (int t = 0; t < T; t++) {
                for (int which = 0; which < 3; which++) {
                    memset(dqkv + ((size_t)(b * T + t) * 3 + which) * C + h * HS, 0,
                           (size_t)HS * sizeof(float));
                }
            }
            // dP = dO V^T, then in place dS = P * (dP - rowsum(P * dP)) (softmax backward).
            for (int t = 0; t < T; t++) {
                const float* dout_t = dout + (size_t)(b * T + t) * C + h * HS;
                const float* p = P + (size_t)t * T;
                float* ds = dS + (size_t)t * T;
                float rowdot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + ((size_t)(b * T + t2) * 3 + 2) * C + h * HS;
                    ds[t2] = attention_dot(dout_t, v, HS);
                    rowdot += p[t2] * ds[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) ds[t2] = p[t2] * (ds[t2] - rowdot);
            }
            // dQ = dS K * scale, dK = dS^T Q * scale, dV = P^T dO.
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)(b * T + t) * 3 + 0) * C + h * HS;
                float* dq = dqkv + ((size_t)(b * T + t) * 3 + 0) * C + h * HS;
                const float* dout_t = dout + (size_t)(b * T + t) * C + h * HS;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)(b * T + t2) * 3 + 1) * C + h * HS;
                    float* dk = dqkv + ((size_t)(b * T + t2) * 3 + 1) * C + h * HS;
                    float* dv = dqkv + ((size_t)(b * T + t2) * 3 + 2) * C + h * HS;
                    const float ds = dS[(size_t)t * T + t2] * scale;
                    const float p = P[(size_t)t * T + t2];
                    for (int i = 0; i < HS; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                        dv[i] += p * dout_t[i];
                    }
                }
            }
        }
    }
}
