// Tests of the CPU attention, both variants whatever ATTN the build uses:
// (1) forward (and flash's m, l) against a float64 reference attention written here;
// (2) backward against central finite differences of that reference, loss = sum(w * out);
// (3) flash against naive on many shapes and block sizes (T not a multiple of the blocks, odd HS);
// (4) memory: the flash path allocates nothing of size T x T, and its saved + scratch are O(B*NH*T);
// plus the generic attention_* of the build against the reference.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/kernels.h"
#include "tests/lib/testutil.h"

// ---- allocation recorder -------------------------------------------------------------------
// The test binary replaces malloc, calloc, realloc and free with thin wrappers around glibc's own,
// which note the largest single request while `recording` is set (from any thread).
extern void* __libc_malloc(size_t bytes);
extern void* __libc_calloc(size_t count, size_t size);
extern void* __libc_realloc(void* p, size_t bytes);
extern void __libc_free(void* p);

static int recording;
static size_t largest_allocation;

static void note_allocation(size_t bytes) {
    if (!__atomic_load_n(&recording, __ATOMIC_RELAXED)) return;
    size_t seen = __atomic_load_n(&largest_allocation, __ATOMIC_RELAXED);
    while (bytes > seen && !__atomic_compare_exchange_n(&largest_allocation, &seen, bytes, 1,
                                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

void* malloc(size_t bytes) {
    note_allocation(bytes);
    return __libc_malloc(bytes);
}

void* calloc(size_t count, size_t size) {
    note_allocation(count * size);
    return __libc_calloc(count, size);
}

void* realloc(void* p, size_t bytes) {
    note_allocation(bytes);
    return __libc_realloc(p, bytes);
}

void free(void* p) { __libc_free(p); }

static void start_recording(void) {
    __atomic_store_n(&largest_allocation, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&recording, 1, __ATOMIC_SEQ_CST);
}

static size_t stop_recording(void) {
    __atomic_store_n(&recording, 0, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&largest_allocation, __ATOMIC_RELAXED);
}

// ---- float64 reference -------------------------------------------------------------------
// Causal attention straight from the definition: for each row, scores s_j = q.k_j / sqrt(HS) for
// j <= t, softmax, weighted sum of v. row_max and row_sum (B, NH, T) may be NULL; row_sum is
// sum_j exp(s_j - row_max).
static void reference_attention(double* out, double* row_max, double* row_sum, const double* qkv,
                                int B, int T, int C, int NH) {
    const int HS = C / NH;
    double* scores = xmalloc((size_t)T * sizeof(double), "reference scores");
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const double* q = qkv + ((size_t)(b * T + t) * 3 + 0) * C + h * HS;
                double maxval = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const double* k = qkv + ((size_t)(b * T + j) * 3 + 1) * C + h * HS;
                    double s = 0.0;
                    for (int d = 0; d < HS; d++) s += q[d] * k[d];
                    scores[j] = s / sqrt((double)HS);
                    maxval = fmax(maxval, scores[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= t; j++) sum += exp(scores[j] - maxval);
                double* o = out + (size_t)(b * T + t) * C + h * HS;
                for (int d = 0; d < HS; d++) o[d] = 0.0;
                for (int j = 0; j <= t; j++) {
                    const double* v = qkv + ((size_t)(b * T + j) * 3 + 2) * C + h * HS;
                    const double p = exp(scores[j] - maxval) / sum;
                    for (int d = 0; d < HS; d++) o[d] += p * v[d];
                }
                const size_t row = ((size_t)b * NH + h) * T + t;
                if (row_max) row_max[row] = maxval;
                if (row_sum) row_sum[row] = sum;
            }
        }
    }
    free(scores);
}

static double weighted_loss(const double* qkv, const float* w, double* out, int B, int T, int C, int NH) {
    reference_attention(out, NULL, NULL, qkv, B, T, C, NH);
    double loss = 0.0;
    for (size_t i = 0; i < (size_t)B * T * C; i++) loss += w[i] * out[i];
    return loss;
}

// d loss / d qkv by central differences in float64, for loss = sum(w * attention(qkv)).
static void finite_difference_gradient(double* grad, const float* qkv, const float* w, int B, int T,
                                       int C, int NH) {
    const size_t n = (size_t)B * T * 3 * C;
    const double step = 1e-4;
    double* x = xmalloc(n * sizeof(double), "finite differences input");
    double* out = xmalloc((size_t)B * T * C * sizeof(double), "finite differences output");
    for (size_t i = 0; i < n; i++) x[i] = qkv[i];
    for (size_t i = 0; i < n; i++) {
        x[i] = (double)qkv[i] + step;
        const double up = weighted_loss(x, w, out, B, T, C, NH);
        x[i] = (double)qkv[i] - step;
        const double down = weighted_loss(x, w, out, B, T, C, NH);
        x[i] = qkv[i];
        grad[i] = (up - down) / (2.0 * step);
    }
    free(x);
    free(out);
}

// ---- running the variants ----------------------------------------------------------------
typedef struct {
    int B, T, C, NH;
    float *qkv, *dout;              // inputs
    float *out, *dqkv, *m, *l;      // outputs (m, l only for flash)
} Run;

// Inputs qkv and dout ~ N(0, 1).
static Run run_alloc(int B, int T, int C, int NH, TestRng* rng) {
    Run r = {B, T, C, NH, NULL, NULL, NULL, NULL, NULL, NULL};
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_rows = (size_t)B * NH * T;
    r.qkv = xmalloc(n_qkv * sizeof(float), "qkv");
    r.dout = xmalloc(n_out * sizeof(float), "dout");
    r.out = xmalloc(n_out * sizeof(float), "out");
    r.dqkv = xmalloc(n_qkv * sizeof(float), "dqkv");
    r.m = xmalloc(n_rows * sizeof(float), "m");
    r.l = xmalloc(n_rows * sizeof(float), "l");
    test_fill_normal(r.qkv, n_qkv, 1.0f, rng);
    test_fill_normal(r.dout, n_out, 1.0f, rng);
    return r;
}

// Peaked softmax: q and k become integers in [-10, 10]. With HS a power of 4 (scale a power of 2)
// every score is exact in fp32, yet large (std ~37 at any HS, row maxima ~100): exp(s) overflows
// fp32 unless the running max is subtracted, and the max jumps between K/V blocks (the rescaling
// path). Exact scores keep the problem well conditioned, so the tolerances stay tight.
static void make_peaked(Run* r, TestRng* rng) {
    for (int bt = 0; bt < r->B * r->T; bt++) {
        for (int i = 0; i < 2 * r->C; i++) { // q then k of row bt
            r->qkv[(size_t)bt * 3 * r->C + i] = (float)((int)(test_uniform(rng) * 21.0) - 10);
        }
    }
}

static void run_free(Run* r) {
    free(r->qkv);
    free(r->dout);
    free(r->out);
    free(r->dqkv);
    free(r->m);
    free(r->l);
}

static void poison_outputs(Run* r) {
    test_poison(r->out, (size_t)r->B * r->T * r->C);
    test_poison(r->dqkv, (size_t)r->B * r->T * 3 * r->C);
    test_poison(r->m, (size_t)r->B * r->NH * r->T);
    test_poison(r->l, (size_t)r->B * r->NH * r->T);
}

static void run_naive(Run* r) {
    poison_outputs(r);
    float* att = xmalloc(attention_naive_saved_bytes(r->B, r->T, r->NH), "att");
    float* scratch = xmalloc(attention_naive_scratch_bytes(r->B, r->T, r->C, r->NH), "naive scratch");
    test_poison(att, attention_naive_saved_bytes(r->B, r->T, r->NH) / sizeof(float));
    test_poison(scratch, attention_naive_scratch_bytes(r->B, r->T, r->C, r->NH) / sizeof(float));
    attention_naive_forward_cpu(r->out, att, r->qkv, r->B, r->T, r->C, r->NH);
    attention_naive_backward_cpu(r->dqkv, scratch, r->dout, r->qkv, att, r->B, r->T, r->C, r->NH);
    free(att);
    free(scratch);
}

static void run_flash(Run* r, int block_q, int block_k) {
    poison_outputs(r);
    float* D = xmalloc(attention_flash_scratch_bytes(r->B, r->T, r->C, r->NH), "D");
    test_poison(D, attention_flash_scratch_bytes(r->B, r->T, r->C, r->NH) / sizeof(float));
    attention_flash_forward_cpu(r->out, r->m, r->l, r->qkv, r->B, r->T, r->C, r->NH, block_q, block_k);
    attention_flash_backward_cpu(r->dqkv, D, r->dout, r->qkv, r->out, r->m, r->l, r->B, r->T, r->C,
                                 r->NH, block_q, block_k);
    free(D);
}

// The generic attention_* of this build (the variant ATTN selects), through its void* buffers. Its
// qkv bias gradient (groups of one sequence, added to random values) against a float64 sum of the
// dqkv it wrote.
static void run_generic(Run* r) {
    poison_outputs(r);
    const int C3 = 3 * r->C;
    float* saved = xmalloc(attention_saved_bytes(r->B, r->T, r->NH), "saved");
    float* scratch = xmalloc(attention_scratch_bytes(r->B, r->T, r->C, r->NH), "scratch");
    float* dbias = xmalloc(C3 * sizeof(float), "dbias");
    double* want = xmalloc(C3 * sizeof(double), "dbias reference");
    test_poison(saved, attention_saved_bytes(r->B, r->T, r->NH) / sizeof(float));
    test_poison(scratch, attention_scratch_bytes(r->B, r->T, r->C, r->NH) / sizeof(float));
    for (int c = 0; c < C3; c++) want[c] = dbias[c] = (float)c / C3 - 0.5f;
    attention_forward(r->out, saved, r->qkv, r->B, r->T, r->C, r->NH);
    attention_backward(r->dqkv, dbias, scratch, r->dout, r->qkv, r->out, saved, r->B, r->T, r->C, r->NH, r->T);
    for (size_t i = 0; i < (size_t)r->B * r->T * C3; i++) want[i % C3] += r->dqkv[i];
    char name[160];
    snprintf(name, sizeof name, "generic (%s) qkv bias gradient vs float64 sums of dqkv B%d T%d C%d", attention_name(),
             r->B, r->T, r->C);
    test_close(name, dbias, want, C3, 1e-5, 1e-6);
    free(saved);
    free(scratch);
    free(dbias);
    free(want);
}

// ---- (1), (2): against the float64 reference and finite differences -------------------------
// fp32 kernels on O(1) inputs with short rows: measured errors are <= 2e-7 (forward) and <= 6e-7
// (gradients of size up to ~3); central differences in float64 with step 1e-4 are exact to ~1e-8.
#define FWD_RTOL 1e-5
#define FWD_ATOL 1e-6
#define GRAD_RTOL 1e-5
#define GRAD_ATOL 2e-6

typedef struct {
    double *out, *row_max, *row_sum, *grad;
} Reference;

static Reference reference_compute(const Run* r) {
    const size_t n_qkv = (size_t)r->B * r->T * 3 * r->C, n_rows = (size_t)r->B * r->NH * r->T;
    Reference ref;
    ref.out = xmalloc((size_t)r->B * r->T * r->C * sizeof(double), "reference out");
    ref.row_max = xmalloc(n_rows * sizeof(double), "reference row max");
    ref.row_sum = xmalloc(n_rows * sizeof(double), "reference row sum");
    ref.grad = xmalloc(n_qkv * sizeof(double), "reference gradient");
    double* qkv = xmalloc(n_qkv * sizeof(double), "reference qkv");
    for (size_t i = 0; i < n_qkv; i++) qkv[i] = r->qkv[i];
    reference_attention(ref.out, ref.row_max, ref.row_sum, qkv, r->B, r->T, r->C, r->NH);
    finite_difference_gradient(ref.grad, r->qkv, r->dout, r->B, r->T, r->C, r->NH);
    free(qkv);
    return ref;
}

static void reference_free(Reference* ref) {
    free(ref->out);
    free(ref->row_max);
    free(ref->row_sum);
    free(ref->grad);
}

static void check_reference(const char* variant, const Run* r, const Reference* ref, int check_ml) {
    char shape[64], name[160];
    snprintf(shape, sizeof shape, "B%d T%d C%d NH%d", r->B, r->T, r->C, r->NH);
    snprintf(name, sizeof name, "%s forward vs float64 %s", variant, shape);
    test_close(name, r->out, ref->out, (size_t)r->B * r->T * r->C, FWD_RTOL, FWD_ATOL);
    if (check_ml) {
        const size_t n_rows = (size_t)r->B * r->NH * r->T;
        snprintf(name, sizeof name, "%s m vs float64 row max %s", variant, shape);
        test_close(name, r->m, ref->row_max, n_rows, FWD_RTOL, FWD_ATOL);
        snprintf(name, sizeof name, "%s l vs float64 row sum %s", variant, shape);
        test_close(name, r->l, ref->row_sum, n_rows, FWD_RTOL, FWD_ATOL);
    }
    snprintf(name, sizeof name, "%s dqkv vs finite differences %s", variant, shape);
    test_close(name, r->dqkv, ref->grad, (size_t)r->B * r->T * 3 * r->C, GRAD_RTOL, GRAD_ATOL);
}

static void test_against_reference(int B, int T, int C, int NH, int block_q, int block_k, TestRng* rng) {
    Run r = run_alloc(B, T, C, NH, rng);
    Reference ref = reference_compute(&r);
    char variant[64];
    run_naive(&r);
    check_reference("naive", &r, &ref, 0);
    run_flash(&r, block_q, block_k);
    snprintf(variant, sizeof variant, "flash %dx%d", block_q, block_k);
    check_reference(variant, &r, &ref, 1);
    run_generic(&r);
    snprintf(variant, sizeof variant, "generic (%s)", attention_name());
    check_reference(variant, &r, &ref, 0);
    reference_free(&ref);
    run_free(&r);
}

// ---- (3): flash against naive --------------------------------------------------------------
// Both are fp32 sums of up to T = 200 terms in different orders. The gradients are sums of terms
// that cancel (dS = P * (dP - D), with D = dO.O in flash but rowsum(P * dP) in naive), so their
// rounding error scales with the largest terms, not with the element: elements near zero have no
// relative accuracy. Hence a floor of 1e-5 of the tensor's largest magnitude; the measured worst
// difference is 1.3e-6 of it (peaked dK), 7e-7 otherwise, while any real bug is off by far more.
static double abs_floor(const float* x, size_t n) {
    double largest = 0.0;
    for (size_t i = 0; i < n; i++) largest = fmax(largest, fabs((double)x[i]));
    return 1e-5 * largest;
}

// Copies part `which` (0 q, 1 k, 2 v) of a (B*T, 3, C) tensor into a contiguous (B*T, C) one.
static void extract_part(float* dst, const float* qkv, int BT, int C, int which) {
    for (int bt = 0; bt < BT; bt++) {
        memcpy(dst + (size_t)bt * C, qkv + ((size_t)bt * 3 + which) * C, (size_t)C * sizeof(float));
    }
}

static void test_flash_vs_naive(int B, int T, int NH, int HS, int block_q, int block_k, int peaked,
                                TestRng* rng) {
    const int C = NH * HS;
    const size_t n_out = (size_t)B * T * C, n_rows = (size_t)B * NH * T;
    const char* kind = peaked ? " peaked" : "";
    Run flash = run_alloc(B, T, C, NH, rng);
    Run naive = run_alloc(B, T, C, NH, rng);
    if (peaked) make_peaked(&flash, rng);
    memcpy(naive.qkv, flash.qkv, 3 * n_out * sizeof(float));
    memcpy(naive.dout, flash.dout, n_out * sizeof(float));
    run_naive(&naive);
    run_flash(&flash, block_q, block_k);

    char name[160];
    snprintf(name, sizeof name, "flash %dx%d vs naive B%d T%d NH%d HS%d%s: out", block_q, block_k, B,
             T, NH, HS, kind);
    test_close_f(name, flash.out, naive.out, n_out, 1e-5, abs_floor(naive.out, n_out));
    float* got = xmalloc(n_out * sizeof(float), "flash gradient part");
    float* want = xmalloc(n_out * sizeof(float), "naive gradient part");
    const char* part_names[3] = {"dQ", "dK", "dV"};
    for (int which = 0; which < 3; which++) {
        extract_part(got, flash.dqkv, B * T, C, which);
        extract_part(want, naive.dqkv, B * T, C, which);
        snprintf(name, sizeof name, "flash %dx%d vs naive B%d T%d NH%d HS%d%s: %s", block_q, block_k,
                 B, T, NH, HS, kind, part_names[which]);
        test_close_f(name, got, want, n_out, 1e-5, abs_floor(want, n_out));
    }
    free(got);
    free(want);

    // out, m and l against the float64 attention, row max and row sum of exp(s - max).
    double* qkv = xmalloc(3 * n_out * sizeof(double), "reference qkv");
    double* out = xmalloc(n_out * sizeof(double), "reference out");
    double* row_max = xmalloc(n_rows * sizeof(double), "reference row max");
    double* row_sum = xmalloc(n_rows * sizeof(double), "reference row sum");
    for (size_t i = 0; i < 3 * n_out; i++) qkv[i] = flash.qkv[i];
    reference_attention(out, row_max, row_sum, qkv, B, T, C, NH);
    snprintf(name, sizeof name, "flash %dx%d B%d T%d NH%d HS%d%s: out vs float64", block_q, block_k,
             B, T, NH, HS, kind);
    test_close(name, flash.out, out, n_out, 1e-5, abs_floor(naive.out, n_out));
    snprintf(name, sizeof name, "flash %dx%d B%d T%d NH%d HS%d%s: m vs float64", block_q, block_k,
             B, T, NH, HS, kind);
    test_close(name, flash.m, row_max, n_rows, 1e-5, 1e-6);
    snprintf(name, sizeof name, "flash %dx%d B%d T%d NH%d HS%d%s: l vs float64", block_q, block_k,
             B, T, NH, HS, kind);
    test_close(name, flash.l, row_sum, n_rows, 1e-5, 0.0);
    free(qkv);
    free(out);
    free(row_max);
    free(row_sum);
    run_free(&flash);
    run_free(&naive);
}

// ---- (4): memory -----------------------------------------------------------------------------
static void test_flash_memory(TestRng* rng) {
    const int B = 1, T = 2048, NH = 2, C = 128;
    const size_t t_by_t = (size_t)T * T * sizeof(float);
    Run r = run_alloc(B, T, C, NH, rng);

    // The recorder must see a T x T request made through ordinary malloc (here via xmalloc).
    start_recording();
    void* probe = xmalloc(t_by_t, "allocation recorder probe");
    size_t seen = stop_recording();
    free(probe);
    test_check(seen >= t_by_t, "allocation recorder sees a T x T malloc", "recorded %zu of %zu bytes",
               seen, t_by_t);

    poison_outputs(&r);
    float* D = xmalloc(attention_flash_scratch_bytes(B, T, C, NH), "D");
    test_poison(D, (size_t)B * NH * T);
    start_recording();
    attention_flash_forward_cpu(r.out, r.m, r.l, r.qkv, B, T, C, NH, ATTN_FLASH_BLOCK_Q, ATTN_FLASH_BLOCK_K);
    attention_flash_backward_cpu(r.dqkv, D, r.dout, r.qkv, r.out, r.m, r.l, B, T, C, NH,
                                 ATTN_FLASH_BLOCK_Q, ATTN_FLASH_BLOCK_K);
    const size_t largest = stop_recording();
    test_check(largest * 64 <= t_by_t, "flash T=2048 allocates nothing near T x T",
               "largest single allocation %zu bytes, T*T*4 = %zu", largest, t_by_t);
    // The bound above means something only if the calls did their work.
    int finite = 1;
    for (size_t i = 0; i < (size_t)B * T * 3 * C; i++) finite &= isfinite(r.dqkv[i]);
    for (size_t i = 0; i < (size_t)B * T * C; i++) finite &= isfinite(r.out[i]);
    test_check(finite, "flash T=2048 wrote every output", "%s", finite ? "" : "NaN or inf left");
    free(D);
    run_free(&r);

    // What the model allocates for attention: O(B*NH*T) for flash, O(B*NH*T^2) for naive.
    const size_t rows_bytes = (size_t)B * NH * T * sizeof(float);
    const size_t flash_bytes =
        attention_flash_saved_bytes(B, T, NH) + attention_flash_scratch_bytes(B, T, C, NH);
    const size_t naive_bytes =
        attention_naive_saved_bytes(B, T, NH) + attention_naive_scratch_bytes(B, T, C, NH);
    test_check(flash_bytes <= 3 * rows_bytes, "flash saved + scratch is O(B*NH*T)",
               "%zu bytes, B*NH*T floats = %zu bytes", flash_bytes, rows_bytes);
    test_check(naive_bytes >= 2 * rows_bytes * T, "naive saved + scratch materialise T x T",
               "%zu bytes, B*NH*T*T floats = %zu bytes", naive_bytes, rows_bytes * T);
#ifdef ATTN_FLASH
    const char* build = "flash";
    const size_t build_bytes = flash_bytes;
#else
    const char* build = "naive";
    const size_t build_bytes = naive_bytes;
#endif
    test_check(strcmp(attention_name(), build) == 0, "attention_name matches the build",
               "got %s, built with %s", attention_name(), build);
    const size_t generic_bytes = attention_saved_bytes(B, T, NH) + attention_scratch_bytes(B, T, C, NH);
    test_check(generic_bytes == build_bytes, "generic saved + scratch bytes are the build's variant's",
               "%zu vs %zu", generic_bytes, build_bytes);
}

// The bias gradient's groups must be whole sequences: groups of 2 rows at T 4 (8 rows) are refused
// before anything runs (hence NULL buffers but dbias).
static void backward_partial_groups(const void* arg) {
    (void)arg;
    float dbias[12];
    attention_backward(NULL, dbias, NULL, NULL, NULL, NULL, NULL, 2, 4, 4, 1, 2);
}

int main(void) {
    TestRng rng = test_rng(1234);
    test_expect_fatal("attention_backward refuses bias groups that are not whole sequences", backward_partial_groups,
                      NULL, "attention_backward", "not whole sequences of 4");

    // (1), (2): small shapes (finite differences cost a forward per element), block sizes that
    // leave partial blocks, block_q > block_k and block_q < block_k.
    test_against_reference(1, 1, 4, 1, 4, 4, &rng);
    test_against_reference(2, 7, 6, 2, 3, 2, &rng);
    test_against_reference(1, 13, 10, 2, 2, 5, &rng);
    test_against_reference(2, 9, 12, 3, 16, 16, &rng);

    // (3): flash against naive.
    const int Ts[] = {1, 63, 65, 200};
    const struct { int B, NH, HS, block_q, block_k; } shapes[] = {
        {1, 1, 64, 16, 16}, {2, 3, 5, 7, 5}, {1, 4, 64, 32, 64}, {2, 4, 16, 64, 32}, {2, 3, 5, 5, 7},
        {1, 1, 64, ATTN_FLASH_BLOCK_Q, ATTN_FLASH_BLOCK_K},
    };
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            test_flash_vs_naive(shapes[s].B, Ts[i], shapes[s].NH, shapes[s].HS, shapes[s].block_q,
                                shapes[s].block_k, 0, &rng);
        }
    }
    test_flash_vs_naive(2, 200, 3, 64, 16, 16, 1, &rng);
    test_flash_vs_naive(1, 65, 2, 16, 7, 5, 1, &rng);

    // (4): memory.
    test_flash_memory(&rng);
    return test_summary("test_attention_cpu");
}
