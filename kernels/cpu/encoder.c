// Token + position embedding, fp32 on the CPU.
#include "kernels/kernels.h"

void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                     int B, int T, int C) {
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* out_bt = out + ((size_t)b * T + t) * C;
            const float* wte_ix = wte + (size_t)inp[b * T + t] * C;
            const float* wpe_t = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) out_bt[c] = wte_ix[c] + wpe_t[c];
        }
    }
}

// Several positions may hold the same token, so threads split the channels, not the positions:
// each block of channels belongs to one thread, which adds the positions in order (b, t); this makes
// the sums race-free and independent of the number of threads.
void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* inp,
                      int B, int T, int C) {
    // Blocks of 16 channels: one cache line, so threads never write to the same line (C is a
    // multiple of 16 in every GPT-2 size).
    #pragma omp parallel for schedule(static)
    for (int c_block = 0; c_block < C; c_block += 16) {
        int c_end = c_block + 16 < C ? c_block + 16 : C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float* dout_bt = dout + ((size_t)b * T + t) * C;
                float* dwte_ix = dwte + (size_t)inp[b * T + t] * C;
                float* dwpe_t = dwpe + (size_t)t * C;
                for (int c = c_block; c < c_end; c++) {
                    dwte_ix[c] += dout_bt[c];
                    dwpe_t[c] += dout_bt[c];
                }
            }
        }
    }
}
