// HellaSwag accuracy of a model as llm.c measures it ("acc_norm", completion style; llm.c's
// dev/data/hellaswag.py and llmc/dataloader.h's evalloader_stat_losses): each of an example's 4
// endings is scored by the mean loss of its tokens, each given the context and the ending's tokens
// before it, and the model predicts the ending of the lowest score (the first of equal ones).
// The examples come from llm.c's evaluation file (data/hellaswag.h, which prepare_data also writes).
#pragma once
#include <stdio.h>

#include "data/hellaswag.h"
#include "model/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

// The examples [*first, *end) of the first n that this rank evaluates: contiguous blocks of
// ceil(n / world), as llm.c's EvalLoader splits them.
void hellaswag_rank_examples(int n, int rank, int world, int* first, int* end);

// The ending of the lowest of 4 scores, the first of equal ones.
int hellaswag_prediction(const double scores[HELLASWAG_ENDINGS]);

// Scores this rank's part of examples [0, n) with the model: the rows (context + ending) run
// model->B at a time, each batch as long as its longest row, which must fit model->T (the caller
// checks: hellaswag_row_positions). Writes scores[4 * i + j], the mean loss of ending j of example i,
// for the rank's examples i (hellaswag_rank_examples) and returns how many examples all ranks
// together predicted right. Collective: every rank calls it.
int hellaswag_evaluate(GPT2* model, const HellaSwagExample* examples, int n, double* scores);

// train_gpt --hellaswag: the examples evaluated and where their scores go.
typedef struct {
    HellaSwagFile file;
    int n;          // the first n examples are evaluated
    double* scores; // every ending's score, 4 per example (this rank's examples filled)
    FILE* dump;     // --hellaswag-dump, or NULL
    char dump_path[4200];
} HellaSwagRun;

// Reads path (every rank the whole file), keeps its first `limit` examples (0: all) and refuses one
// whose context and ending do not fit T: llm.c's EvalLoader refuses such an example too (an assert)
// rather than cut it, since a cut context or ending would give another score. With dump_path, opens
// the CSV of every ending's score (dump_path.rankN on each of several ranks).
void hellaswag_run_open(HellaSwagRun* hs, const char* path, int limit, const char* dump_path, int T,
                        int vocab_size, int rank, int world);
// Evaluates the examples with the model (collective), appends this rank's scores of the step to the
// dump, and returns how many examples all ranks together predicted right.
int hellaswag_run_step(HellaSwagRun* hs, GPT2* model, long long step);
void hellaswag_run_close(HellaSwagRun* hs);

#ifdef __cplusplus
}
#endif
