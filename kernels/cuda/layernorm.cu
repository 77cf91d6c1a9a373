// LayerNorm over rows of C, eps 1e-5, statistics in fp32. One warp per row; the parameter
// gradients are deterministic column sums (common.cuh).
#include "kernels/cuda/common.cuh"

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += (float)x[c];
    float m = warp_sum(sum) / C;
    // Variance from the centred values (a second read of the row, from cache), not E[x^2] - m^2,
    // which cancels badly when |mean| >> std.
    float sq = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = (float)x[c] - m;
        sq += d * d;
    }
    float s = rsqrtf(warp_sum(sq) / C + 1e-5f);
    for (int c = lane; c < C; c += 32)
        out[(size_t)row * C + c] = (floatX)(((float)x[c] - m) * s * (float)weight[c] + (float)bias[c]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                       const floatX* weight, const floatX* bias, int N, int C) {
    const int warps = 8;
    layernorm_forward_kernel<<<ceil_div(N, warps), warps * 32>>>(out, mean, rstd, inp, weight, bias, N, C);
    launchCheck();
}

// dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * weight.
// One warp per row, each lane X128 elements at a time with 16-byte loads (when C is a multiple of
// X128, which keeps every row aligned); the second pass re-reads the row from cache. With 2-byte
// loads per lane this kernel was a third of the BF16 step, latency-bound far from DRAM speed.
__global__ void layernorm_backward_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                               const floatX* weight, const float* mean,
                                               const float* rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    bool vector = C % X128 == 0;
    const floatX* x = inp + (size_t)row * C;
    const floatX* dy = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        float xv[X128], dyv[X128], wv[X128];
        load_x128(xv, x, c, C, vector);
        load_x128(dyv, dy, c, C, vector);
        load_x128(wv, weight, c, C, vector);
        for (int k = 0; k < X128; k++) { // elements past C load as 0 and add nothing
            float dnorm = dyv[k] * wv[k];
            dnorm_sum += dnorm;
            dnorm_norm_sum += dnorm * (xv[k] - m) * s;
        }
    }
    float dnorm_mean = warp_sum(dnorm_sum) / C, dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
    floatX* dx = dinp + (size_t)row * C;
    for (int c = lane * X128; c < C; c += 32 * X128) {
        float xv[X128], dyv[X128], wv[X128], dxv[X128];
        load_x128(xv, x, c, C, vector);
        load_x128(dyv, dy, c, C, vector);
        load_x128(wv, weight, c, C, vector);
        load_x128(dxv, dx, c, C, vector);
        for (int k = 0; k < X128; k++)
            dxv[k] += s * (dyv[k] * wv[k] - dnorm_mean - (xv[k] - m) * s * dnorm_norm_mean);
        store_x128(dx, dxv, c, C, vector);
    }
}

// dout * norm, the weight's gradient per element.
struct DoutTimesNorm {
    const floatX *dout, *inp;
    const float *mean, *rstd;
    int C;
    __device__ void operator()(int r, int c, float out[X128]) const {
        const bool vector = C % X128 == 0;
        float x[X128];
        load_x128(out, dout + (size_t)r * C, c, C, vector);
        load_x128(x, inp + (size_t)r * C, c, C, vector);
        for (int k = 0; k < X128; k++) out[k] = out[k] * (x[k] - mean[r]) * rstd[r];
    }
};

void layernorm_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean,
                        const float* rstd, int N, int C, int sum_rows) {
    const int warps = 8;
    layernorm_backward_dinp_kernel<<<ceil_div(N, warps), warps * 32>>>(dinp, dout, inp, weight, mean,
                                                                       rstd, N, C);
    launchCheck();
    column_sums_accumulate(dweight, N, C, sum_rows, DoutTimesNorm{dout, inp, mean, rstd, C});
    column_sums_accumulate(dbias, N, C, sum_rows, MatrixColumns{dout, C});
}
