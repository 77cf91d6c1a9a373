// GELU with the tanh approximation, fp32 on the CPU.
#include "kernels/kernels.h"

#include <math.h>

#define GELU_SCALE 0.7978845608028654f // sqrt(2 / pi)
#define GELU_CUBIC 0.044715f

void gelu_forward(floatX* out, const floatX* inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x)));
    }
}

// d/dx of 0.5 x (1 + tanh(u)), u = s (x + a x^3): 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) s (1 + 3 a x^2).
void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float tanh_u = tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x));
        float du_dx = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
        float local_grad = 0.5f * (1.0f + tanh_u) + 0.5f * x * (1.0f - tanh_u * tanh_u) * du_dx;
        dinp[i] = local_grad * dout[i];
    }
}

// The CPU has no pass to save: the matmul and the GELU in turn, both ways.
void matmul_forward_gelu(floatX* pre, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                         int N, int C, int OC, int ld_inp, int group_rows) {
    matmul_forward(pre, inp, weight, bias, NULL, N, C, OC, ld_inp, group_rows);
    gelu_forward(out, pre, (size_t)N * OC);
}

void matmul_backward_gelu(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                          const floatX* weight, const floatX* pre, int N, int C, int OC, int group_rows,
                          int dweight_mode) {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, C, group_rows, dweight_mode);
    gelu_backward(dinp, pre, dinp, (size_t)N * C);
}
