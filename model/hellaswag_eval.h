// HellaSwag accuracy of a model as llm.c measures it ("acc_norm", completion style; llm.c's
// dev/data/hellaswag.py and llmc/dataloader.h's evalloader_stat_losses): each of an example's 4
// endings is scored by the mean loss of its tokens, each given the context and the ending's tokens
// before it, and the model predicts the ending of the lowest score (the first of equal ones).
#pragma once
#include "../data/hellaswag.h"
#include "gpt2.h"

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

#ifdef __cplusplus
}
#endif
