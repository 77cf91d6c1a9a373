// Softmax + cross-entropy over the real vocabulary, fused with its backward, fp32 on the CPU.
#include "kernels/kernels.h"
#include "common/util.h"

#include <math.h>

void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                      int N, int V, int Vp, int write_dlogits) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float* row = logits + (size_t)i * Vp;
        int target = targets[i];
        if (target < 0 || target >= V)
            fatal("fused_classifier: target %d of row %d is outside the vocabulary [0, %d)", target, i, V);
        float max = -INFINITY;
        for (int v = 0; v < V; v++) max = fmaxf(max, row[v]);
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
