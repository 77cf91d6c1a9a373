// GELU, tanh approximation, as per-element functors: gelu.cu's passes and the fc product's epilogue
// (matmul_gelu.cu) compute it with this same code, so that gelu(pre) has the same bits either way.
#pragma once
#include "kernels/cuda/common.cuh"

#define GELU_SCALE 0.7978845608028654f // sqrt(2 / pi)

// BF16, FP16: 0.5 x (1 + tanh u) written as x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
// one exp2 and one reciprocal (MUFU), 7 instructions where tanhf took about 25; the approximate exp2
// and division err by up to about 3e-5 relative, well inside bf16's rounding (3.9e-3) and fp16's
// (4.9e-4), and the fc product's epilogue (matmul_gelu.cu) is bound by the GELU's instructions.
// FP32, which must match the CPU to 1e-5: tanhf.
struct GeluForward {
    __device__ float operator()(float x, float) const {
#if !defined(PRECISION_FP32)
        const float minus_2u_log2e = x * fmaf(x * x, -2.0f * LOG2E * GELU_SCALE * 0.044715f, -2.0f * LOG2E * GELU_SCALE);
        return __fdividef(x, 1.0f + fast_exp2(minus_2u_log2e));
#else
        float cube = 0.044715f * x * x * x;
        return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
#endif
    }
};
// d/dx of the above: 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx, u = sqrt(2/pi) (x + 0.044715 x^3).
struct GeluBackward {
    __device__ float operator()(float x, float dout) const {
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float tanh_u = tanhf(u);
        float sech2 = 1.0f - tanh_u * tanh_u;
        float local = 0.5f * (1.0f + tanh_u) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        return local * dout;
    }
};
