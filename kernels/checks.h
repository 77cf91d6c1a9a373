// Argument checks that both backends' kernels make on entry, with the same messages, so that a
// wrong call from the model fails alike on the CPU and on the GPU.
#pragma once
#include "common/util.h"
#include "kernels/kernels.h"

// Exit unless N rows split into whole groups of group_rows (the --batch-invariant groups of the
// parameter gradients' sums, kernels.h): "<what>: N rows do not split into groups of group_rows".
static inline void check_row_groups(const char* what, long long N, long long group_rows) {
    if (group_rows <= 0 || N % group_rows != 0)
        fatal("%s: %lld rows do not split into groups of %lld", what, N, group_rows);
}

// The same for N = B T rows whose groups must also be whole sequences of T rows (group_rows a
// multiple of T): attention_backward's bias sums.
static inline void check_sequence_groups(const char* what, long long B, long long T, long long group_rows) {
    check_row_groups(what, B * T, group_rows);
    if (group_rows % T != 0) fatal("%s: groups of %lld rows are not whole sequences of %lld", what, group_rows, T);
}

// Exit unless a linear layer's input rows are ld = C (packed) or linear_bias_ld(C) (with the bias
// columns) elements apart: "<what>: rows of C values ld elements apart".
static inline void check_linear_ld(const char* what, int C, long long ld) {
    if (ld != C && ld != linear_bias_ld(C))
        fatal("%s: rows of %d values %lld elements apart (%d, or %d with the bias columns)", what, C, ld, C,
              linear_bias_ld(C));
}
