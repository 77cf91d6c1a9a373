// The head of one slice of rows (kernels.h, head_classifier), fp32 on the CPU: the logits, the
// classifier, and the head's backward from the dlogits written over the logits.
#include "kernels/kernels.h"

size_t head_scratch_bytes(int N, int C, int Vp) {
    (void)C;
    return (size_t)N * Vp * sizeof(floatX);
}

void head_classifier(float* losses, floatX* dinp, float* dweight, void* scratch, const int* targets, float dloss,
                     const floatX* inp, const floatX* weight, int N, int C, int V, int Vp, int group_rows,
                     int dweight_mode) {
    floatX* logits = (floatX*)scratch;
    matmul_forward(logits, inp, weight, NULL, NULL, N, C, Vp, C, group_rows);
    fused_classifier(logits, losses, targets, dloss, N, V, Vp, dloss > 0.0f);
    if (dloss > 0.0f) matmul_backward(dinp, dweight, NULL, logits, inp, weight, N, C, Vp, C, group_rows, dweight_mode);
}
