#define _GNU_SOURCE // nftw
#include "tests/lib/testutil.h"

#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"

static int passed, failed;

TestRng test_rng(uint64_t seed) {
    TestRng r = {seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull};
    return r;
}

static uint64_t next_u64(TestRng* r) { // splitmix64
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double test_uniform(TestRng* r) { return (double)(next_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

double test_normal(TestRng* r) {
    double u1 = test_uniform(r), u2 = test_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void test_fill_uniform(float* p, size_t n, float lo, float hi, TestRng* r) {
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (float)test_uniform(r);
}

void test_fill_normal(float* p, size_t n, float std, TestRng* r) {
    for (size_t i = 0; i < n; i++) p[i] = std * (float)test_normal(r);
}

void test_poison(float* p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

void test_check(int ok, const char* name, const char* fmt, ...) {
    if (ok) passed++; else failed++;
    printf("%s %s", ok ? "PASS" : "FAIL", name);
    if (fmt && fmt[0]) {
        va_list ap;
        va_start(ap, fmt);
        printf(": ");
        vprintf(fmt, ap);
        va_end(ap);
    }
    printf("\n");
    fflush(stdout);
}

// want_d[i] (float64) or want_f[i] (float32), whichever is given.
static double want_at(const double* want_d, const float* want_f, size_t i) {
    return want_d ? want_d[i] : (double)want_f[i];
}

static int close_to(const char* name, const float* got, const double* want_d, const float* want_f, size_t n,
                    double rtol, double atol) {
    size_t worst = 0, bad = 0;
    double worst_excess = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want_at(want_d, want_f, i));
        double tol = atol + rtol * fabs(want_at(want_d, want_f, i));
        double excess = isnan(err) ? INFINITY : err - tol;
        if (!(err <= tol)) bad++;
        if (excess > worst_excess) { worst_excess = excess; worst = i; }
    }
    int ok = bad == 0;
    if (n == 0) test_check(1, name, "empty");
    else test_check(ok, name, "%zu elements, %zu outside tolerance (rtol %.1e, atol %.1e); worst [%zu] got %.9g want %.9g",
                    n, bad, rtol, atol, worst, (double)got[worst], want_at(want_d, want_f, worst));
    return ok;
}

int test_close(const char* name, const float* got, const double* want, size_t n, double rtol, double atol) {
    return close_to(name, got, want, NULL, n, rtol, atol);
}

int test_close_f(const char* name, const float* got, const float* want, size_t n, double rtol, double atol) {
    return close_to(name, got, NULL, want, n, rtol, atol);
}

// Runs fn(arg) in a child and checks that it exits with status 1 and an "error: " message that
// contains want1 and want2 (when not NULL).
void test_expect_fatal(const char* name, void (*fn)(const void*), const void* arg,
                         const char* want1, const char* want2) {
    int fds[2];
    if (pipe(fds) != 0) fatal("pipe: cannot create");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fatal("fork failed");
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    char msg[4096];
    size_t len = 0;
    ssize_t got;
    while ((got = read(fds[0], msg + len, sizeof(msg) - 1 - len)) > 0) len += (size_t)got;
    msg[len] = 0;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int ok = code == 1 && strncmp(msg, "error: ", 7) == 0 && strstr(msg, want1) &&
             (!want2 || strstr(msg, want2));
    char* nl = strchr(msg, '\n');
    if (nl) *nl = 0;
    test_check(ok, name, "exit status %d, message \"%s\"", code, msg);
}

char test_tmpdir[512];

void test_tmpdir_create(const char* suite) {
    snprintf(test_tmpdir, sizeof test_tmpdir, "/tmp/%s_XXXXXX", suite);
    if (!mkdtemp(test_tmpdir)) fatal("cannot create a temporary directory under /tmp");
}

char* test_tmp_path(const char* name) {
    static char buf[8][1024];
    static int next;
    char* p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", test_tmpdir, name);
    return p;
}

static int remove_entry(const char* path, const struct stat* sb, int type, struct FTW* ftw) {
    (void)sb, (void)type, (void)ftw;
    return remove(path);
}

void test_tmpdir_remove(void) { nftw(test_tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

int test_summary(const char* suite) {
    printf("%s: %d passed, %d failed\n", suite, passed, failed);
    return failed ? 1 : 0;
}
