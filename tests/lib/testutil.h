// Helpers shared by the C tests: a deterministic RNG, poisoning, comparisons that print the worst
// element, and pass/fail counting. A test binary ends with `return test_summary("name");`, which
// prints "name: N passed, N failed" and returns non-zero if anything failed.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct { uint64_t s; } TestRng;
TestRng test_rng(uint64_t seed);
double test_uniform(TestRng* r);                 // in [0, 1)
double test_normal(TestRng* r);                  // N(0, 1)
void test_fill_uniform(float* p, size_t n, float lo, float hi, TestRng* r);
void test_fill_normal(float* p, size_t n, float std, TestRng* r);
void test_poison(float* p, size_t n);            // NaN everywhere: an unwritten element fails

// Counts one check; prints "PASS name" or "FAIL name: message".
void test_check(int ok, const char* name, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
// Compares got against want element by element: |got - want| <= atol + rtol * |want|, NaN fails.
// Prints the worst element and counts one check. Returns 1 when all elements pass.
int test_close(const char* name, const float* got, const double* want, size_t n, double rtol,
               double atol);
int test_close_f(const char* name, const float* got, const float* want, size_t n, double rtol,
                 double atol);
// Runs fn(arg) in a forked child (for code that exits through fatal()) and counts one check: the
// child must exit with status 1 and an "error: " message containing want1 and want2 (if not NULL).
void test_expect_fatal(const char* name, void (*fn)(const void*), const void* arg, const char* want1,
                       const char* want2);
// A scratch directory /tmp/<suite>_XXXXXX for a test's files: created once, paths inside it (each
// call returns one of 8 rotating buffers), and removed with everything in it at the end.
extern char test_tmpdir[512];
void test_tmpdir_create(const char* suite);
char* test_tmp_path(const char* name);
void test_tmpdir_remove(void);
int test_summary(const char* suite);
