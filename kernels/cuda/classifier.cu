// Softmax + cross-entropy + dlogits fused: one block per row reads the logits once for the
// statistics (online max and sum of exponentials) and once more to overwrite them with the
// gradient. Probabilities are never stored.
#include <math.h>

#include "kernels/cuda/common.cuh"

__global__ void fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss,
                                        int V, int Vp, int write_dlogits) {
    floatX* x = logits + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    float target_logit = (float)x[target]; // read before any thread overwrites the row
    bool vector = Vp % X128 == 0 && (uintptr_t)logits % 16 == 0;
    // Online softmax statistics over this thread's elements: running max m and sum of exp(x - m).
    float m = -INFINITY, sum = 0.0f;
    for (size_t i = (size_t)threadIdx.x * X128; i < (size_t)V; i += (size_t)blockDim.x * X128) {
        float vals[X128];
        load_x128(vals, x, i, V, vector);
        for (int k = 0; k < X128 && i + k < (size_t)V; k++) {
            if (vals[k] > m) {
                sum = sum * expf(m - vals[k]) + 1.0f;
                m = vals[k];
            } else {
                sum += expf(vals[k] - m);
            }
        }
    }
    float row_max = block_max(m);
    float row_sum = block_sum(m == -INFINITY ? 0.0f : sum * expf(m - row_max));
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(row_sum) + row_max - target_logit;
    if (!write_dlogits) return;
    float inv_sum = 1.0f / row_sum;
    for (size_t i = (size_t)threadIdx.x * X128; i < (size_t)Vp; i += (size_t)blockDim.x * X128) {
        float vals[X128];
        load_x128(vals, x, i, Vp, vector);
        PackedX out;
        for (int k = 0; k < X128; k++) {
            size_t col = i + k;
            float p = expf(vals[k] - row_max) * inv_sum;
            out.v[k] = (floatX)(col < (size_t)V ? dloss * (p - (col == (size_t)target ? 1.0f : 0.0f)) : 0.0f);
        }
        if (vector) {
            *(PackedX*)(x + i) = out;
        } else {
            for (int k = 0; k < X128 && i + k < (size_t)Vp; k++) x[i + k] = out.v[k];
        }
    }
}

void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                      int N, int V, int Vp, int write_dlogits) {
    if (N == 0) return;
    fused_classifier_kernel<<<N, 512>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    launchCheck();
}
