// The evaluations of a training run: the validation loss and the HellaSwag accuracy, printed on one
// line and returned as log.csv's fields.
#pragma once
#include <stddef.h>

#include "data/dataloader.h"
#include "eval/hellaswag.h"
#include "model/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

// The mean loss over `seqs` sequences of every rank's part of the validation file. The loader reads
// one sequence at a time and they run B at a time, so the tokens do not depend on the micro-batch.
// Collective: every rank calls it.
float validation_loss(GPT2* model, DataLoader* val, int seqs, int B);

// The evaluations of a step: the validation loss (val not NULL) and the HellaSwag accuracy (hs not
// NULL), printed on one line ("step N: val loss ... | hellaswag ...") and written as log.csv's
// fields into val_field and hs_field (field_size bytes each; left as they are for an evaluation not
// made). Collective.
void evaluate(GPT2* model, DataLoader* val, int val_seqs, int B, HellaSwagRun* hs, long long step,
              char* val_field, char* hs_field, size_t field_size);

#ifdef __cplusplus
}
#endif
