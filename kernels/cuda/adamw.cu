// AdamW and the gradient norm. In the BF16 build the fp32 master weights are updated and the bf16
// parameters get them stochastically rounded (cuRAND Philox, seeded by (seed, index in the tensor)), so
// small updates survive on average instead of always rounding away.
#include <curand_kernel.h>

#include "kernels/cuda/common.cuh"

#if defined(PRECISION_BF16)
// Rounds x to one of its two neighbouring bf16 values, the upper one with probability equal to the
// distance from the lower one: add 16 random bits below the kept 16, then truncate.
__device__ inline floatX stochastic_round(float x, unsigned int random) {
    unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) == 0x7f800000u) return (floatX)x; // inf and NaN stay as they are
    unsigned int rounded = (bits + (random & 0xffffu)) & 0xffff0000u;
    return __ushort_as_bfloat16((unsigned short)(rounded >> 16));
}
#endif

// The parameter that step t gives element `index` of a tensor with fp32 weight w: w itself, or in
// the BF16 build w stochastically rounded with Philox subsequence = index, offset = 4 t (a fresh
// random block per element and step).
__device__ inline floatX param_from_master(float w, size_t index, int t, unsigned long long seed) {
#if defined(PRECISION_BF16)
    curandStatePhilox4_32_10_t state;
    curand_init(seed, index, 4ull * (unsigned long long)t, &state);
    return stochastic_round(w, curand(&state));
#else
    (void)index, (void)t, (void)seed;
    return w;
#endif
}

__global__ void adamw_kernel(floatX* param, float* master, const float* grad, float* m, float* v,
                             size_t n, size_t index0, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float grad_scale, float bias_correction1,
                             float bias_correction2, int t, unsigned long long seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float w = master ? master[i] : (float)param[i];
        w -= lr * (mi / bias_correction1 / (sqrtf(vi / bias_correction2) + eps) + weight_decay * w);
        if (master) master[i] = w;
        param[i] = param_from_master(w, index0 + i, t, seed);
    }
}

__global__ void round_master_weights_kernel(floatX* param, const float* master, size_t n, size_t index0,
                                            int t, unsigned long long seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        param[i] = param_from_master(master[i], index0 + i, t, seed);
}

void round_master_weights(floatX* param, const float* master, size_t n, size_t index0, int t,
                          unsigned long long seed) {
    if (n == 0) return;
    unsigned int blocks = ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536;
    round_master_weights_kernel<<<blocks, 256>>>(param, master, n, index0, t, seed);
    launchCheck();
}

void adamw_update(floatX* param, float* master, const float* grad, float* m, float* v, size_t n,
                  size_t index0, float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t, unsigned long long seed) {
#if defined(PRECISION_BF16)
    if (!master) fatal("adamw_update: the BF16 build needs fp32 master weights");
#else
    if (master) fatal("adamw_update: the FP32 build keeps no master weights (master must be NULL)");
#endif
    if (n == 0) return;
    float bias_correction1 = 1.0f - powf(beta1, (float)t), bias_correction2 = 1.0f - powf(beta2, (float)t);
    unsigned int blocks = ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536;
    adamw_kernel<<<blocks, 256>>>(param, master, grad, m, v, n, index0, lr, beta1, beta2, eps, weight_decay,
                                  grad_scale, bias_correction1, bias_correction2, t, seed);
    launchCheck();
}

// A fixed grid (not the device's SM count) so the summation order, hence the result, is the same
// on every GPU.
#define NORM_BLOCKS 1024
#define NORM_THREADS 512

__global__ void sum_squares_kernel(float* partials, const float* grad, size_t n) {
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i];
        sum += g * g;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void sum_partials_kernel(float* result, const float* partials) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < NORM_BLOCKS; i += blockDim.x) sum += partials[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) *result = sum;
}

float grad_norm_squared(const float* grad, size_t n) {
    static float* partials; // NORM_BLOCKS partial sums, then the result
    if (!partials) partials = (float*)dev_malloc((NORM_BLOCKS + 1) * sizeof(float), "grad norm partials");
    sum_squares_kernel<<<NORM_BLOCKS, NORM_THREADS>>>(partials, grad, n);
    launchCheck();
    sum_partials_kernel<<<1, NORM_THREADS>>>(partials + NORM_BLOCKS, partials);
    launchCheck();
    float result;
    dev_download(&result, partials + NORM_BLOCKS, sizeof result);
    return result;
}
