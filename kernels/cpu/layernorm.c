// LayerNorm over the C channels of each row, and the residual add that feeds it, fp32 on the CPU.
#include "kernels/checks.h"
#include "kernels/constants.h"
#include "kernels/kernels.h"
#include "common/util.h"

#include <math.h>

void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                       const floatX* weight, const floatX* bias, int N, int C, int ld_out) {
    check_linear_ld("layernorm_forward", C, ld_out);
    const float eps = LAYERNORM_EPS;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        float sum = 0.0f;
        for (int c = 0; c < C; c++) sum += x[c];
        float m = sum / C;
        // Two passes: the variance from the centred values does not cancel catastrophically.
        float sum_squares = 0.0f;
        for (int c = 0; c < C; c++) sum_squares += (x[c] - m) * (x[c] - m);
        float s = 1.0f / sqrtf(sum_squares / C + eps);
        float* y = out + (size_t)i * ld_out;
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
        for (int c = C; c < ld_out; c++) y[c] = c == C ? 1.0f : 0.0f; // the bias columns (kernels.h)
        mean[i] = m;
        rstd[i] = s;
    }
}

// With norm = (x - mean) * rstd and dnorm = dout * weight:
// dx = rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm)).
void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* dinp_sums, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean,
                        const float* rstd, int N, int C, int group_rows, int dinp_mode) {
    check_row_groups("layernorm_backward", N, group_rows);
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        const float* dy = dout + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
        for (int c = 0; c < C; c++) {
            float dnorm = dy[c] * weight[c];
            dnorm_sum += dnorm;
            dnorm_norm_sum += dnorm * (x[c] - m) * s;
        }
        float dnorm_mean = dnorm_sum / C, dnorm_norm_mean = dnorm_norm_sum / C;
        float* dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            // Written as an add to 0.0f: the bits of adding into zeros, a zero's sign included.
            float prior = dinp_mode == GRAD_ADD ? dx[c] : 0.0f;
            dx[c] = prior + s * (dy[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean);
        }
    }
    // The parameter gradients sum over rows: threads split the channels, in blocks of 16 (a cache
    // line), and add the rows in order, so the sums do not depend on the number of threads. Each
    // row adds straight into the gradient, which is the same for every grouping of the rows: here
    // group_rows only has to divide N.
    #pragma omp parallel for schedule(static)
    for (int c_block = 0; c_block < C; c_block += 16) {
        int c_end = c_block + 16 < C ? c_block + 16 : C;
        for (int i = 0; i < N; i++) {
            const float* x = inp + (size_t)i * C;
            const float* dy = dout + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            for (int c = c_block; c < c_end; c++) {
                dweight[c] += dy[c] * (x[c] - m) * s;
                dbias[c] += dy[c];
            }
        }
    }
    // The bias gradient matmul_backward would make with dout = dinp: the same function, the same bits.
    if (dinp_sums) matmul_backward(NULL, NULL, dinp_sums, dinp, NULL, NULL, N, C, C, C, group_rows, GRAD_ADD);
}
