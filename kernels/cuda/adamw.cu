// AdamW, the gradient norm, and in a GRADS=BF16 build the fold of fp32 gradients into the bf16 ones.
// AdamW and the norm read gradients of either type (template G) with the same arithmetic on the value
// as a float; kernels.h's functions are their gradX instances.
// In the BF16 build the fp32 master weights are updated and the bf16
// parameters get them stochastically rounded (cuRAND Philox, seeded by (seed, index in the tensor)), so
// small updates survive on average instead of always rounding away. In the FP16 build the fp16
// parameters get them rounded to nearest, as mixed-precision training with fp32 master weights does
// (PyTorch's AMP, NVIDIA's apex): fp16 keeps 11 significant bits to bf16's 8, so a step 8 times
// smaller survives rounding there, and the master weights, not the parameters, accumulate the
// updates.
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

// The parameter that step t gives element `index` of a tensor with fp32 weight w: w itself (FP32),
// w rounded to nearest (FP16), or in the BF16 build w stochastically rounded with Philox subsequence = index, offset = 4 t (a fresh
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

struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay, grad_scale, bias_correction1, bias_correction2;
    int t;
    unsigned long long seed;
};

// One element's update: m and v from the gradient, the fp32 weight w moved, and the parameter that
// w rounds to (element `index` of the whole tensor).
__device__ inline floatX adamw_element(float g, float& mi, float& vi, float& w, size_t index, const AdamWStep& s) {
    // The fused multiply-adds are written out: left to the compiler, which products it fused into
    // the sums changed with the type of the gradients (b1 * mi in one kernel, (1 - b1) * g in the
    // other), and with it the bits. These are the ones the fp32 gradients' kernel always had.
    g *= s.grad_scale;
    mi = fmaf(s.beta1, mi, (1.0f - s.beta1) * g);
    vi = fmaf(s.beta2, vi, (1.0f - s.beta2) * g * g);
    w -= s.lr * fmaf(s.weight_decay, w, mi / s.bias_correction1 / (sqrtf(vi / s.bias_correction2) + s.eps));
    return param_from_master(w, index, s.t, s.seed);
}

// Gradients 4i .. 4i + 3 as floats, in one load (16 bytes of float, 8 of bf16).
__device__ inline float4 load_grad4(const float* grad, size_t i) { return ((const float4*)grad)[i]; }
#if defined(GRADS_BF16)
__device__ inline float4 load_grad4(const gradX* grad, size_t i) {
    const uint2 bits = ((const uint2*)grad)[i];
    const float2 lo = __bfloat1622float2(*(const __nv_bfloat162*)&bits.x);
    const float2 hi = __bfloat1622float2(*(const __nv_bfloat162*)&bits.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
#endif

// Four elements per thread and iteration with 16-byte loads where every array is 16-byte aligned
// (bf16 gradients: 8-byte aligned) (ncu: one 4-byte element per thread left the update at about
// 80% of the memory bandwidth); the elements past the last multiple of 4, or all of them
// otherwise, one at a time. Either way each element gets the same arithmetic, so the result does
// not depend on the path.
template <typename G>
__global__ void adamw_kernel(floatX* param, float* master, const G* grad, float* m, float* v,
                             size_t n, size_t index0, AdamWStep step, bool vector) {
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    const size_t n4 = vector ? n / 4 : 0;
    for (size_t i = first; i < n4; i += stride) {
        const float4 g = load_grad4(grad, i);
        float4 mi = ((float4*)m)[i], vi = ((float4*)v)[i], w;
        if (master) w = ((float4*)master)[i];
        else w = make_float4((float)param[4 * i], (float)param[4 * i + 1], (float)param[4 * i + 2], (float)param[4 * i + 3]);
        floatX p[4];
        p[0] = adamw_element(g.x, mi.x, vi.x, w.x, index0 + 4 * i, step);
        p[1] = adamw_element(g.y, mi.y, vi.y, w.y, index0 + 4 * i + 1, step);
        p[2] = adamw_element(g.z, mi.z, vi.z, w.z, index0 + 4 * i + 2, step);
        p[3] = adamw_element(g.w, mi.w, vi.w, w.w, index0 + 4 * i + 3, step);
        ((float4*)m)[i] = mi;
        ((float4*)v)[i] = vi;
        if (master) ((float4*)master)[i] = w;
        for (int k = 0; k < 4; k++) param[4 * i + k] = p[k];
    }
    for (size_t i = 4 * n4 + first; i < n; i += stride) {
        float mi = m[i], vi = v[i], w = master ? master[i] : (float)param[i];
        param[i] = adamw_element((float)grad[i], mi, vi, w, index0 + i, step);
        m[i] = mi;
        v[i] = vi;
        if (master) master[i] = w;
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

template <typename G>
void adamw_update_typed(floatX* param, float* master, const G* grad, float* m, float* v, size_t n,
                        size_t index0, float lr, float beta1, float beta2, float eps, float weight_decay,
                        float grad_scale, int t, unsigned long long seed) {
#if !defined(PRECISION_FP32)
    if (!master) fatal("adamw_update: the " PRECISION_NAME " build needs fp32 master weights");
#else
    if (master) fatal("adamw_update: the FP32 build keeps no master weights (master must be NULL)");
#endif
    if (n == 0) return;
    const AdamWStep step = {lr, beta1, beta2, eps, weight_decay, grad_scale, 1.0f - powf(beta1, (float)t),
                            1.0f - powf(beta2, (float)t), t, seed};
    const bool vector = (uintptr_t)grad % (4 * sizeof(G)) == 0 && aligned16(m, v) &&
                        (master ? aligned16(master) : aligned16(param));
    const size_t threads = vector ? (n + 3) / 4 : n;
    unsigned int blocks = ceil_div(threads, 256) < 65536 ? ceil_div(threads, 256) : 65536;
    adamw_kernel<<<blocks, 256>>>(param, master, grad, m, v, n, index0, step, vector);
    launchCheck();
}
template void adamw_update_typed<float>(floatX*, float*, const float*, float*, float*, size_t, size_t, float, float,
                                        float, float, float, float, int, unsigned long long);
#if defined(GRADS_BF16)
template void adamw_update_typed<gradX>(floatX*, float*, const gradX*, float*, float*, size_t, size_t, float, float,
                                        float, float, float, float, int, unsigned long long);
#endif

void adamw_update(floatX* param, float* master, const gradX* grad, float* m, float* v, size_t n,
                  size_t index0, float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t, unsigned long long seed) {
    adamw_update_typed(param, master, grad, m, v, n, index0, lr, beta1, beta2, eps, weight_decay, grad_scale, t,
                       seed);
}

// A fixed grid (not the device's SM count) so the summation order, hence the result, is the same
// on every GPU.
#define NORM_BLOCKS 1024
#define NORM_THREADS 512

template <typename G>
__global__ void sum_squares_kernel(float* partials, const G* grad, size_t n) {
    float sum = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    // Four loads in flight before their squares are added, in the same order as one at a time (the
    // same bits): with one, the pass ran at a third of the memory's bandwidth (ncu: long-scoreboard
    // stalls).
    for (; i + 3 * stride < n; i += 4 * stride) {
        const float g0 = (float)grad[i], g1 = (float)grad[i + stride], g2 = (float)grad[i + 2 * stride],
                    g3 = (float)grad[i + 3 * stride];
        sum += g0 * g0;
        sum += g1 * g1;
        sum += g2 * g2;
        sum += g3 * g3;
    }
    for (; i < n; i += stride) {
        const float g = (float)grad[i];
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

float grad_norm_squared(const gradX* grad, size_t n) {
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

#if defined(GRADS_BF16)
// X128 (8) values per thread: one 16-byte load and store of bf16 and two of fp32 where dst and src
// are 16-byte aligned and the 8 values lie inside, else one at a time; the same sum and rounding.
__global__ void gradX_fold_kernel(gradX* dst, const float* src, size_t n, int mode) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    const bool vector = i + X128 <= n && (((uintptr_t)dst | (uintptr_t)src) % 16) == 0;
    float sum[X128];
    if (vector) {
        for (int k = 0; k < X128; k += 4) {
            const float4 v = *(const float4*)(src + i + k);
            sum[k] = v.x, sum[k + 1] = v.y, sum[k + 2] = v.z, sum[k + 3] = v.w;
        }
    } else {
        for (int k = 0; k < X128; k++) sum[k] = i + k < n ? src[i + k] : 0.0f;
    }
    if (mode == GRAD_ADD) {
        float old[X128];
        load_x128(old, dst, i, n, vector);
        for (int k = 0; k < X128; k++) sum[k] = old[k] + sum[k];
    }
    store_x128(dst, sum, i, n, vector); // floatX's conversion: to nearest even
}

void gradX_fold(gradX* dst, const float* src, size_t n, int mode) {
    if (n == 0) return;
    const int threads = 256;
    gradX_fold_kernel<<<ceil_div(ceil_div(n, X128), threads), threads>>>(dst, src, n, mode);
    launchCheck();
}
#endif
