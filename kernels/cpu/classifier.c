// Softmax + cross-entropy over the real vocabulary, fused with its backward, fp32 on the CPU.
#include "kernels/kernels.h"
#include "common/util.h"

#include <math.h>

// The largest of row[0 .. V), NaNs skipped as fmaxf skips them. In 8 lanes by compare and select
// (vector instructions; fmaxf itself is a library call for each element without -ffast-math, about
// a tenth of a CPU training step of a small model over GPT-2's vocabulary). A max is exact in any
// order, so the result is fmaxf's.
static float row_max(const float* row, int V) {
    float lanes[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int v = 0;
    for (; v + 8 <= V; v += 8)
        for (int j = 0; j < 8; j++) lanes[j] = row[v + j] > lanes[j] ? row[v + j] : lanes[j];
    for (; v < V; v++) lanes[0] = row[v] > lanes[0] ? row[v] : lanes[0];
    float max = lanes[0];
    for (int j = 1; j < 8; j++) max = lanes[j] > max ? lanes[j] : max;
    return max;
}

void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                      int N, int V, int Vp, int write_dlogits) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float* row = logits + (size_t)i * Vp;
        int target = targets[i];
        if (target < 0 || target >= V)
            fatal("fused_classifier: target %d of row %d is outside the vocabulary [0, %d)", target, i, V);
        float max = row_max(row, V);
        float target_logit = row[target];
        // exp(logit - max) is computed once: kept in the row when it becomes the gradient. Summed in
        // double: tens of thousands of fp32 additions of tiny terms onto a sum of order 1 drop the
        // smallest of them (1e-4 relative at V = 120K), and this is the reference the GPU is checked
        // against.
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            float e = expf(row[v] - max);
            sum += e;
            if (write_dlogits) row[v] = e;
        }
        losses[i] = (float)log(sum) - (target_logit - max);
        if (write_dlogits) {
            float scale = (float)(dloss / sum);
            for (int v = 0; v < V; v++) row[v] *= scale;
            row[target] -= dloss;
            for (int v = V; v < Vp; v++) row[v] = 0.0f;
        }
    }
}
