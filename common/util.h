// Small helpers shared by every part: fatal errors with a clear message, checked allocation and
// checked file I/O. Every message names the thing (file, option) and the problem; the process then
// exits with status 1. Nothing here ever returns on failure.
#pragma once
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// Print "error: <message>\n" to stderr and exit(1).
void fatal(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

// malloc/calloc that exit with "out of host memory: <what> needs N bytes" on failure.
void* xmalloc(size_t bytes, const char* what);
void* xcalloc(size_t count, size_t size, const char* what);

// fopen that exits with "cannot open <path> (<mode>): <strerror>" on failure.
FILE* xfopen(const char* path, const char* mode);
// Read exactly count items or exit naming the path ("<path>: truncated, expected ... bytes at offset ...").
void xfread(void* dst, size_t size, size_t count, FILE* f, const char* path);
// Write exactly count items or exit naming the path and errno (disk full, ...).
void xfwrite(const void* src, size_t size, size_t count, FILE* f, const char* path);

// Size of a regular file in bytes, or exit naming the path if it cannot be inspected.
long long file_size(const char* path);

// The integer value of a command-line option, lo..hi, or exit naming the option and the value.
long long parse_int_option(const char* s, const char* option, long long lo, long long hi);

// Exit unless N rows split into whole groups of sum_rows (the --batch-invariant grouping of the
// parameter gradients' sums): "<what>: N rows do not split into groups of sum_rows".
void check_row_groups(const char* what, long long N, long long sum_rows);
// The same for N = B T rows whose groups must also be whole sequences of T rows (sum_rows a
// multiple of T): attention_backward's bias sums.
void check_sequence_groups(const char* what, long long B, long long T, long long sum_rows);

// Exit unless a linear layer's input rows are ld = C (packed) or C + LINEAR_BIAS_COLUMNS (with the
// bias columns, kernels.h) elements apart: "<what>: rows of C values ld elements apart".
void check_linear_ld(const char* what, long long C, long long ld);

// Monotonic wall clock in seconds.
double wall_seconds(void);

#ifdef __cplusplus
}
#endif
