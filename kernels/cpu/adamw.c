// The optimizer on the CPU: AdamW and the squared gradient norm for clipping.
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

// floatX is float here, so the weights need no fp32 master copy and no stochastic rounding: the
// seed and index0 are unused. A master copy, if one is given, is kept equal to param.
void adamw_update(floatX* param, float* master, const float* grad, float* m, float* v, size_t n,
                  size_t index0, float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t, unsigned long long seed) {
    (void)seed;
    (void)index0;
    float m_correction = 1.0f - powf(beta1, (float)t);
    float v_correction = 1.0f - powf(beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float m_i = beta1 * m[i] + (1.0f - beta1) * g;
        float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
        float w = master ? master[i] : param[i];
        w -= lr * (m_i / m_correction / (sqrtf(v_i / v_correction) + eps) + weight_decay * w);
        m[i] = m_i;
        v[i] = v_i;
        param[i] = w;
        if (master) master[i] = w;
    }
}

// floatX is float: the parameters are the fp32 weights.
void round_master_weights(floatX* param, const float* master, size_t n, size_t index0, int t,
                          unsigned long long seed) {
    (void)index0, (void)t, (void)seed;
    if (param != master) memcpy(param, master, n * sizeof(float));
}

// In double, over a fixed split into chunks summed in order, so the result does not depend on
// the number of threads.
#define NORM_CHUNKS 64

float grad_norm_squared(const float* grad, size_t n) {
    double chunk_sums[NORM_CHUNKS];
    #pragma omp parallel for schedule(static)
    for (int chunk = 0; chunk < NORM_CHUNKS; chunk++) {
        size_t begin = n * chunk / NORM_CHUNKS, end = n * (chunk + 1) / NORM_CHUNKS;
        double sum = 0.0;
        for (size_t i = begin; i < end; i++) sum += (double)grad[i] * grad[i];
        chunk_sums[chunk] = sum;
    }
    double total = 0.0;
    for (int chunk = 0; chunk < NORM_CHUNKS; chunk++) total += chunk_sums[chunk];
    return (float)total;
}
