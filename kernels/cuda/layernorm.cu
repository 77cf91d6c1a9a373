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
__global__ void layernorm_backward_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                               const floatX* weight, const float* mean,
                                               const float* rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    const floatX* dy = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dnorm = (float)dy[c] * (float)weight[c];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * ((float)x[c] - m) * s;
    }
    float dnorm_mean = warp_sum(dnorm_sum) / C, dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
    floatX* dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float norm = ((float)x[c] - m) * s;
        float dnorm = (float)dy[c] * (float)weight[c];
        dx[c] = (floatX)((float)dx[c] + s * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
    }
}

struct DoutTimesNorm {
    const floatX *dout, *inp;
    const float *mean, *rstd;
    int C;
    __device__ float operator()(int r, int c) const {
        size_t i = (size_t)r * C + c;
        return (float)dout[i] * ((float)inp[i] - mean[r]) * rstd[r];
    }
};
struct Element {
    const floatX* x;
    int C;
    __device__ float operator()(int r, int c) const { return (float)x[(size_t)r * C + c]; }
};

void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean,
                        const float* rstd, int N, int C) {
    const int warps = 8;
    layernorm_backward_dinp_kernel<<<ceil_div(N, warps), warps * 32>>>(dinp, dout, inp, weight, mean,
                                                                       rstd, N, C);
    launchCheck();
    column_sums_accumulate(dweight, N, C, DoutTimesNorm{dout, inp, mean, rstd, C});
    column_sums_accumulate(dbias, N, C, Element{dout, C});
}
