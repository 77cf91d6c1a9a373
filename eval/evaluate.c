// The validation loss and the step's evaluations (see eval/evaluate.h).
#include "eval/evaluate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

float validation_loss(GPT2* model, DataLoader* val, int seqs, int B) {
    size_t T = (size_t)val->T;
    int* inputs = xmalloc((size_t)B * T * sizeof(int), "validation batch");
    int* targets = xmalloc((size_t)B * T * sizeof(int), "validation batch");
    dataloader_reset(val);
    double sum = 0.0;
    for (int done = 0; done < seqs;) {
        int rows = seqs - done < B ? seqs - done : B;
        for (int r = 0; r < rows; r++) {
            dataloader_next_batch(val);
            memcpy(inputs + r * T, val->inputs, T * sizeof(int));
            memcpy(targets + r * T, val->targets, T * sizeof(int));
        }
        gpt2_forward(model, inputs, targets, rows, (int)T, 0.0f);
        size_t count;
        const float* losses = gpt2_losses(model, &count);
        sum += gpt2_loss_sum(losses, count);
        done += rows;
    }
    free(inputs);
    free(targets);
    comm_allreduce_host(&sum, 1, COMM_SUM);
    return (float)(sum / ((double)seqs * T * comm_world()));
}

void evaluate(GPT2* model, DataLoader* val, int val_seqs, int B, HellaSwagRun* hs, long long step,
              char* val_field, char* hs_field, size_t field_size) {
    char line[256];
    int at = snprintf(line, sizeof line, "step %lld:", step);
    if (val) {
        float vl = validation_loss(model, val, val_seqs, B);
        at += snprintf(line + at, sizeof line - (size_t)at, " val loss %.6f", vl);
        snprintf(val_field, field_size, "%.9g", vl);
    }
    if (hs) {
        int correct = hellaswag_run_step(hs, model, step);
        double accuracy = (double)correct / hs->n;
        at += snprintf(line + at, sizeof line - (size_t)at, "%s hellaswag %.4f (%d/%d)", val ? " |" : "", accuracy,
                       correct, hs->n);
        snprintf(hs_field, field_size, "%.6f", accuracy);
    }
    if (val || hs) printf("%s\n", line);
}
