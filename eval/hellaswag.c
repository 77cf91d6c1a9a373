// HellaSwag scoring with the model's forward, and the runs of train_gpt --hellaswag (see eval/hellaswag.h).
#include "eval/hellaswag.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void hellaswag_rank_examples(int n, int rank, int world, int* first, int* end) {
    int per_rank = (n + world - 1) / world;
    *first = rank * per_rank < n ? rank * per_rank : n;
    *end = *first + per_rank < n ? *first + per_rank : n;
}

int hellaswag_prediction(const double scores[HELLASWAG_ENDINGS]) {
    int best = 0;
    for (int j = 1; j < HELLASWAG_ENDINGS; j++)
        if (scores[j] < scores[best]) best = j;
    return best;
}

// The token at position p of row (ex, j): the context, then ending j.
static int row_token(const HellaSwagExample* ex, int j, int p) {
    return p < ex->context_len ? ex->context[p] : ex->ending[j][p - ex->context_len];
}

int hellaswag_evaluate(GPT2* model, const HellaSwagExample* examples, int n, double* scores) {
    int first, end;
    hellaswag_rank_examples(n, comm_rank(), comm_world(), &first, &end);
    size_t B = (size_t)model->B, T = (size_t)model->T;
    int* inputs = xmalloc(B * T * sizeof(int), "HellaSwag batch");
    int* targets = xmalloc(B * T * sizeof(int), "HellaSwag batch");
    // Row r is ending r % 4 of example first + r / 4. The rows of a batch may belong to different
    // examples: a row's losses never depend on the other rows, nor on the padding after it (causal
    // attention).
    int rows_total = (end - first) * HELLASWAG_ENDINGS;
    for (int r0 = 0; r0 < rows_total; r0 += (int)B) {
        int rows = rows_total - r0 < (int)B ? rows_total - r0 : (int)B, len = 0;
        for (int r = r0; r < r0 + rows; r++) {
            int need = hellaswag_row_positions(&examples[first + r / HELLASWAG_ENDINGS], r % HELLASWAG_ENDINGS);
            if (need > len) len = need;
        }
        if (len > (int)T) fatal("internal: a HellaSwag row of %d positions on a model built for T = %zu", len, T);
        for (int r = 0; r < rows; r++) {
            const HellaSwagExample* ex = &examples[first + (r0 + r) / HELLASWAG_ENDINGS];
            int j = (r0 + r) % HELLASWAG_ENDINGS, need = hellaswag_row_positions(ex, j);
            // Position p predicts token p + 1; the padding's targets are valid ids whose losses are not read.
            for (int p = 0; p < len; p++) {
                inputs[r * len + p] = p < need ? row_token(ex, j, p) : GPT2_EOT;
                targets[r * len + p] = p < need ? row_token(ex, j, p + 1) : GPT2_EOT;
            }
        }
        gpt2_forward(model, inputs, targets, rows, len, 0.0f);
        size_t count;
        const float* row_losses = gpt2_losses(model, &count);
        for (int r = 0; r < rows; r++) {
            const HellaSwagExample* ex = &examples[first + (r0 + r) / HELLASWAG_ENDINGS];
            int j = (r0 + r) % HELLASWAG_ENDINGS;
            // The ending's tokens are the targets of positions context_len - 1 onwards.
            const float* losses = row_losses + (size_t)r * len + ex->context_len - 1;
            double sum = 0.0;
            for (int t = 0; t < ex->ending_len[j]; t++) sum += losses[t];
            scores[(size_t)(first * HELLASWAG_ENDINGS + r0 + r)] = sum / ex->ending_len[j];
        }
    }
    free(inputs);
    free(targets);
    double correct = 0.0;
    for (int i = first; i < end; i++)
        correct += hellaswag_prediction(&scores[(size_t)i * HELLASWAG_ENDINGS]) == examples[i].label;
    comm_allreduce_host(&correct, 1, COMM_SUM);
    return (int)correct;
}

void hellaswag_run_open(HellaSwagRun* hs, const char* path, int limit, const char* dump_path, int T,
                        int vocab_size, int rank, int world) {
    hellaswag_read(path, vocab_size, &hs->file);
    hs->n = limit > 0 && limit < hs->file.count ? limit : hs->file.count;
    for (int i = 0; i < hs->n; i++) {
        const HellaSwagExample* ex = &hs->file.examples[i];
        int j = 0; // the longest ending
        for (int k = 1; k < HELLASWAG_ENDINGS; k++) if (ex->ending_len[k] > ex->ending_len[j]) j = k;
        if (hellaswag_row_positions(ex, j) > T) {
            char shorter[64] = "";
            if (i > 0) snprintf(shorter, sizeof shorter, ", or --hellaswag-limit %d (the examples before it)", i);
            fatal("%s: example %d needs %d positions (its context of %d tokens and ending %d of %d, but the "
                  "ending's last token), more than -t %d; llm.c refuses such an example too: give a longer -t%s",
                  path, i, hellaswag_row_positions(ex, j), ex->context_len, j, ex->ending_len[j], T, shorter);
        }
    }
    hs->scores = xcalloc((size_t)hs->n * HELLASWAG_ENDINGS, sizeof(double), "HellaSwag scores");
    hs->dump = NULL;
    if (dump_path) {
        if (world > 1) snprintf(hs->dump_path, sizeof hs->dump_path, "%s.rank%d", dump_path, rank);
        else snprintf(hs->dump_path, sizeof hs->dump_path, "%s", dump_path);
        hs->dump = fopen(hs->dump_path, "w");
        if (!hs->dump) fatal("cannot write %s (--hellaswag-dump): %s", hs->dump_path, strerror(errno));
        fprintf(hs->dump, "step,example,label,prediction,loss0,loss1,loss2,loss3\n");
    }
    printf("hellaswag: %d of the %d examples of %s\n", hs->n, hs->file.count, path);
}

int hellaswag_run_step(HellaSwagRun* hs, GPT2* model, long long step) {
    int correct = hellaswag_evaluate(model, hs->file.examples, hs->n, hs->scores);
    int first, end;
    hellaswag_rank_examples(hs->n, comm_rank(), comm_world(), &first, &end);
    for (int i = first; hs->dump && i < end; i++) {
        const double* s = &hs->scores[(size_t)i * HELLASWAG_ENDINGS];
        fprintf(hs->dump, "%lld,%d,%d,%d,%.9g,%.9g,%.9g,%.9g\n", step, i, hs->file.examples[i].label,
                hellaswag_prediction(s), s[0], s[1], s[2], s[3]);
    }
    if (hs->dump && fflush(hs->dump) != 0) fatal("cannot write %s: %s", hs->dump_path, strerror(errno));
    return correct;
}

void hellaswag_run_close(HellaSwagRun* hs) {
    if (hs->dump && fclose(hs->dump) != 0) fatal("cannot write %s: %s", hs->dump_path, strerror(errno));
    free(hs->scores);
    hellaswag_free(&hs->file);
}
