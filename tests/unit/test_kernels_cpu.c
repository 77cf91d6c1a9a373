// Tests of the CPU fp32 kernels of every layer but attention, the optimizer and the CPU backend.
// Each forward is compared with a float64 forward written here; each backward output with central
// finite differences, in float64, of the scalar L = sum(out * w) for random w (so dout = w).
// Outputs are poisoned (NaN) before each call so that an unwritten element fails; parameter
// gradients (which accumulate) are prefilled with known values and must come out as prefill + grad.
#include "kernels/kernels.h"
#include "common/util.h"
#include "tests/lib/testutil.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- helpers -----------------------------------------------------------------------------------
// Every array of a test case comes from here and is freed together by free_all().
#define MAX_ALLOCATIONS 64
static void* allocations[MAX_ALLOCATIONS];
static int allocation_count;

static void* remember(void* p) {
    if (allocation_count == MAX_ALLOCATIONS) fatal("test_kernels_cpu: more than %d arrays in one test", MAX_ALLOCATIONS);
    return allocations[allocation_count++] = p;
}
static float* floats(size_t n) { return remember(xmalloc(n * sizeof(float), "test array")); }
static double* doubles(size_t n) { return remember(xmalloc(n * sizeof(double), "test array")); }
static int* ints(size_t n) { return remember(xmalloc(n * sizeof(int), "test array")); }
static void free_all(void) {
    while (allocation_count > 0) free(allocations[--allocation_count]);
}

static float* random_floats(size_t n, float std, TestRng* rng) {
    float* p = floats(n);
    test_fill_normal(p, n, std, rng);
    return p;
}
static float* poisoned_floats(size_t n) {
    float* p = floats(n);
    test_poison(p, n);
    return p;
}
static float* copy_floats(const float* src, size_t n) {
    return memcpy(floats(n), src, n * sizeof(float));
}
static double* to_doubles(const float* src, size_t n) {
    double* p = doubles(n);
    for (size_t i = 0; i < n; i++) p[i] = src[i];
    return p;
}
// prefill + grad: what a gradient that accumulates must hold after the call.
static double* plus(const float* prefill, const double* grad, size_t n) {
    double* p = doubles(n);
    for (size_t i = 0; i < n; i++) p[i] = prefill[i] + grad[i];
    return p;
}
static double dot(const double* a, const float* b, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

// Central differences of loss(ctx) with respect to each element of x, an array loss reads.
typedef double (*LossFn)(void* ctx);
static double* finite_differences(double* x, size_t n, LossFn loss, void* ctx) {
    const double h = 1e-6;
    double* grad = doubles(n);
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + h;
        double up = loss(ctx);
        x[i] = saved - h;
        double down = loss(ctx);
        x[i] = saved;
        grad[i] = (up - down) / (2 * h);
    }
    return grad;
}

static const char* label(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static const char* label(const char* fmt, ...) {
    static char buffer[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buffer, sizeof(buffer), fmt, ap);
    va_end(ap);
    return buffer;
}

// ---- encoder -----------------------------------------------------------------------------------
typedef struct {
    int B, T, C;
    const int* inp;
    double *wte, *wpe, *out;
    const float* w;
} EncoderCase;

static void encoder_reference(EncoderCase* e) {
    for (int bt = 0; bt < e->B * e->T; bt++)
        for (int c = 0; c < e->C; c++)
            e->out[bt * e->C + c] = e->wte[e->inp[bt] * e->C + c] + e->wpe[(bt % e->T) * e->C + c];
}

static double encoder_loss(void* ctx) {
    EncoderCase* e = ctx;
    encoder_reference(e);
    return dot(e->out, e->w, (size_t)e->B * e->T * e->C);
}

static void test_encoder(int B, int T, int C, TestRng* rng) {
    const int V = 5; // fewer tokens than positions, so tokens repeat and their gradients add up
    const int maxT = T + 2;
    size_t n = (size_t)B * T * C;
    int* inp = ints((size_t)B * T);
    for (int i = 0; i < B * T; i++) inp[i] = (int)(test_uniform(rng) * V);
    float* wte = random_floats((size_t)V * C, 1.0f, rng);
    float* wpe = random_floats((size_t)maxT * C, 1.0f, rng);
    float* w = random_floats(n, 1.0f, rng);
    float* out = poisoned_floats(n);
    encoder_forward(out, inp, wte, wpe, B, T, C);
    EncoderCase e = {B, T, C, inp, to_doubles(wte, (size_t)V * C), to_doubles(wpe, (size_t)maxT * C),
                     doubles(n), w};
    encoder_reference(&e);
    test_close(label("encoder_forward B=%d T=%d C=%d", B, T, C), out, e.out, n, 1e-6, 1e-7);

    float* dwte_prefill = random_floats((size_t)V * C, 1.0f, rng);
    float* dwpe_prefill = random_floats((size_t)maxT * C, 1.0f, rng);
    float* dwte = copy_floats(dwte_prefill, (size_t)V * C);
    float* dwpe = copy_floats(dwpe_prefill, (size_t)maxT * C);
    encoder_backward(dwte, dwpe, w, inp, B, T, C);
    double* want_dwte = plus(dwte_prefill, finite_differences(e.wte, (size_t)V * C, encoder_loss, &e), (size_t)V * C);
    double* want_dwpe = plus(dwpe_prefill, finite_differences(e.wpe, (size_t)maxT * C, encoder_loss, &e), (size_t)maxT * C);
    test_close(label("encoder_backward dwte += B=%d T=%d C=%d", B, T, C), dwte, want_dwte, (size_t)V * C, 1e-5, 1e-5);
    test_close(label("encoder_backward dwpe += B=%d T=%d C=%d", B, T, C), dwpe, want_dwpe, (size_t)maxT * C, 1e-5, 1e-5);
    free_all();
}

// ---- layernorm ---------------------------------------------------------------------------------
typedef struct {
    int N, C;
    double *inp, *weight, *bias, *out, *mean, *rstd;
    const float* w;
} LayernormCase;

static void layernorm_reference(LayernormCase* l) {
    for (int i = 0; i < l->N; i++) {
        const double* x = l->inp + (size_t)i * l->C;
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < l->C; c++) mean += x[c];
        mean /= l->C;
        for (int c = 0; c < l->C; c++) var += (x[c] - mean) * (x[c] - mean);
        var /= l->C;
        double rstd = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < l->C; c++)
            l->out[(size_t)i * l->C + c] = (x[c] - mean) * rstd * l->weight[c] + l->bias[c];
        l->mean[i] = mean;
        l->rstd[i] = rstd;
    }
}

static double layernorm_loss(void* ctx) {
    LayernormCase* l = ctx;
    layernorm_reference(l);
    return dot(l->out, l->w, (size_t)l->N * l->C);
}

static void test_layernorm(int N, int C, int group_rows, TestRng* rng) {
    size_t n = (size_t)N * C;
    float* inp = random_floats(n, 2.0f, rng);
    for (size_t i = 0; i < n; i++) inp[i] += 0.5f; // a mean away from 0
    float* weight = random_floats(C, 1.0f, rng);
    float* bias = random_floats(C, 1.0f, rng);
    float* w = random_floats(n, 1.0f, rng);
    float *out = poisoned_floats(n), *mean = poisoned_floats(N), *rstd = poisoned_floats(N);
    layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, C);
    LayernormCase l = {N, C, to_doubles(inp, n), to_doubles(weight, C), to_doubles(bias, C),
                       doubles(n), doubles(N), doubles(N), w};
    layernorm_reference(&l);
    test_close(label("layernorm_forward out N=%d C=%d", N, C), out, l.out, n, 1e-5, 1e-5);
    test_close(label("layernorm_forward mean N=%d C=%d", N, C), mean, l.mean, N, 1e-5, 1e-6);
    test_close(label("layernorm_forward rstd N=%d C=%d", N, C), rstd, l.rstd, N, 1e-5, 1e-6);
    // Rows with a linear layer's bias columns after them (kernels.h): the same bits, then 1, 0, ...
    const int ld = linear_bias_ld(C);
    float *padded = poisoned_floats((size_t)N * ld), *padded_mean = poisoned_floats(N);
    float* padded_rstd = poisoned_floats(N);
    layernorm_forward(padded, padded_mean, padded_rstd, inp, weight, bias, N, C, ld);
    int padded_same = memcmp(padded_mean, mean, N * sizeof(float)) == 0 && memcmp(padded_rstd, rstd, N * sizeof(float)) == 0;
    for (int i = 0; i < N; i++) {
        padded_same &= memcmp(padded + (size_t)i * ld, out + (size_t)i * C, C * sizeof(float)) == 0;
        for (int c = C; c < ld; c++) padded_same &= padded[(size_t)i * ld + c] == (c == C ? 1.0f : 0.0f);
    }
    test_check(padded_same, label("layernorm_forward N=%d C=%d with the bias columns: the same bits, then 1, 0, ...", N, C),
               "%s", padded_same ? "equal" : "differ");

    // dinp accumulates too (it feeds the residual stream).
    float* dinp_prefill = random_floats(n, 1.0f, rng);
    float* dweight_prefill = random_floats(C, 1.0f, rng);
    float* dbias_prefill = random_floats(C, 1.0f, rng);
    float* dinp_sums_prefill = random_floats(C, 1.0f, rng);
    float* dinp = copy_floats(dinp_prefill, n);
    float* dweight = copy_floats(dweight_prefill, C);
    float* dbias = copy_floats(dbias_prefill, C);
    float* dinp_sums = copy_floats(dinp_sums_prefill, C);
    layernorm_backward(dinp, dweight, dbias, dinp_sums, w, inp, weight, mean, rstd, N, C, group_rows, GRAD_ADD);
    double* want_dinp = plus(dinp_prefill, finite_differences(l.inp, n, layernorm_loss, &l), n);
    double* want_dweight = plus(dweight_prefill, finite_differences(l.weight, C, layernorm_loss, &l), C);
    double* want_dbias = plus(dbias_prefill, finite_differences(l.bias, C, layernorm_loss, &l), C);
    test_close(label("layernorm_backward dinp += N=%d C=%d", N, C), dinp, want_dinp, n, 1e-4, 1e-5);
    test_close(label("layernorm_backward dweight += N=%d C=%d", N, C), dweight, want_dweight, C, 1e-4, 1e-5);
    test_close(label("layernorm_backward dbias += N=%d C=%d", N, C), dbias, want_dbias, C, 1e-4, 1e-5);
    // dinp_sums += the column sums of the updated dinp, summed here in double.
    double* want_dinp_sums = doubles(C);
    for (int c = 0; c < C; c++) {
        want_dinp_sums[c] = dinp_sums_prefill[c];
        for (int i = 0; i < N; i++) want_dinp_sums[c] += want_dinp[(size_t)i * C + c];
    }
    test_close(label("layernorm_backward dinp_sums += N=%d C=%d", N, C), dinp_sums, want_dinp_sums, C, 1e-4, 1e-5);
    // GRAD_WRITE: dinp written over poison, with the bits (and the dinp_sums) of GRAD_ADD into zeros.
    float *written = poisoned_floats(n), *into_zeros = floats(n);
    memset(into_zeros, 0, n * sizeof(float));
    float *written_sums = copy_floats(dinp_sums_prefill, C), *into_zeros_sums = copy_floats(dinp_sums_prefill, C);
    layernorm_backward(written, copy_floats(dweight_prefill, C), copy_floats(dbias_prefill, C), written_sums, w, inp,
                       weight, mean, rstd, N, C, group_rows, GRAD_WRITE);
    layernorm_backward(into_zeros, copy_floats(dweight_prefill, C), copy_floats(dbias_prefill, C), into_zeros_sums, w,
                       inp, weight, mean, rstd, N, C, group_rows, GRAD_ADD);
    int same = memcmp(written, into_zeros, n * sizeof(float)) == 0 &&
               memcmp(written_sums, into_zeros_sums, C * sizeof(float)) == 0;
    test_check(same, label("layernorm_backward GRAD_WRITE N=%d C=%d: over poison, the bits of GRAD_ADD into zeros", N, C),
               "%s", same ? "dinp and dinp_sums equal" : "bits differ");
    free_all();
}

// ---- matmul ------------------------------------------------------------------------------------
typedef struct {
    int N, C, OC;
    double *inp, *weight, *bias, *out; // bias NULL: no bias
    const float* w;
} MatmulCase;

static void matmul_reference(MatmulCase* m) {
    for (int n = 0; n < m->N; n++) {
        for (int oc = 0; oc < m->OC; oc++) {
            double sum = m->bias ? m->bias[oc] : 0.0;
            for (int c = 0; c < m->C; c++) sum += m->inp[(size_t)n * m->C + c] * m->weight[(size_t)oc * m->C + c];
            m->out[(size_t)n * m->OC + oc] = sum;
        }
    }
}

static double matmul_loss(void* ctx) {
    MatmulCase* m = ctx;
    matmul_reference(m);
    return dot(m->out, m->w, (size_t)m->N * m->OC);
}

static void test_matmul(int N, int C, int OC, int with_bias, int group_rows, TestRng* rng) {
    size_t n_inp = (size_t)N * C, n_weight = (size_t)OC * C, n_out = (size_t)N * OC;
    float* inp = random_floats(n_inp, 1.0f, rng);
    float* weight = random_floats(n_weight, 1.0f, rng);
    float* bias = with_bias ? random_floats(OC, 1.0f, rng) : NULL;
    float* w = random_floats(n_out, 1.0f, rng);
    float* out = poisoned_floats(n_out);
    matmul_forward(out, inp, weight, bias, NULL, N, C, OC, C, N);
    MatmulCase m = {N, C, OC, to_doubles(inp, n_inp), to_doubles(weight, n_weight),
                    with_bias ? to_doubles(bias, OC) : NULL, doubles(n_out), w};
    matmul_reference(&m);
    const char* sizes = label("N=%d C=%d OC=%d group_rows=%d%s", N, C, OC, group_rows, with_bias ? "" : " no bias");
    char name[256];
    snprintf(name, sizeof(name), "matmul_forward %s", sizes);
    test_close(name, out, m.out, n_out, 1e-5, 1e-5);
    // With a residual added (as large as the product, so one left out or added twice fails).
    float *residual = random_floats(n_out, 4.0f, rng), *out_residual = poisoned_floats(n_out);
    matmul_forward(out_residual, inp, weight, bias, residual, N, C, OC, C, N);
    double* want_residual = doubles(n_out);
    for (size_t i = 0; i < n_out; i++) want_residual[i] = m.out[i] + residual[i];
    snprintf(name, sizeof(name), "matmul_forward + residual %s", sizes);
    test_close(name, out_residual, want_residual, n_out, 1e-5, 1e-5);

    float* dinp = poisoned_floats(n_inp);
    float* dweight_prefill = random_floats(n_weight, 1.0f, rng);
    float* dweight = copy_floats(dweight_prefill, n_weight);
    float* dbias_prefill = with_bias ? random_floats(OC, 1.0f, rng) : NULL;
    float* dbias = with_bias ? copy_floats(dbias_prefill, OC) : NULL;
    matmul_backward(dinp, dweight, dbias, w, inp, weight, N, C, OC, C, group_rows, GRAD_ADD);
    double* want_dinp = finite_differences(m.inp, n_inp, matmul_loss, &m);
    double* dweight_alone = finite_differences(m.weight, n_weight, matmul_loss, &m);
    double* want_dweight = plus(dweight_prefill, dweight_alone, n_weight);
    snprintf(name, sizeof(name), "matmul_backward dinp = %s", sizes);
    test_close(name, dinp, want_dinp, n_inp, 1e-5, 1e-5);
    snprintf(name, sizeof(name), "matmul_backward dweight += %s", sizes);
    test_close(name, dweight, want_dweight, n_weight, 1e-5, 1e-5);
    // GRAD_WRITE: over poison, so that an element read or left unwritten fails.
    float* written_dweight = poisoned_floats(n_weight);
    matmul_backward(NULL, written_dweight, NULL, w, inp, weight, N, C, OC, C, group_rows, GRAD_WRITE);
    snprintf(name, sizeof(name), "matmul_backward dweight = (GRAD_WRITE) %s", sizes);
    test_close(name, written_dweight, dweight_alone, n_weight, 1e-5, 1e-5);
    if (with_bias) {
        double* want_dbias = plus(dbias_prefill, finite_differences(m.bias, OC, matmul_loss, &m), OC);
        snprintf(name, sizeof(name), "matmul_backward dbias += %s", sizes);
        test_close(name, dbias, want_dbias, OC, 1e-5, 1e-5);
    }

    // The same input with its bias columns (rows ld apart): the same bits (the CPU sums dbias from
    // dout either way).
    const int ld = linear_bias_ld(C);
    float* padded_inp = poisoned_floats((size_t)N * ld);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < ld; c++) padded_inp[(size_t)n * ld + c] = c < C ? inp[(size_t)n * C + c] : c == C ? 1.0f : 0.0f;
    float *padded_out = poisoned_floats(n_out), *padded_dinp = poisoned_floats(n_inp);
    float* padded_dweight = copy_floats(dweight_prefill, n_weight);
    float* padded_dbias = with_bias ? copy_floats(dbias_prefill, OC) : NULL;
    matmul_forward(padded_out, padded_inp, weight, bias, NULL, N, C, OC, ld, N);
    matmul_backward(padded_dinp, padded_dweight, padded_dbias, w, padded_inp, weight, N, C, OC, ld, group_rows, GRAD_ADD);
    int same = memcmp(padded_out, out, n_out * sizeof(float)) == 0 && memcmp(padded_dinp, dinp, n_inp * sizeof(float)) == 0 &&
               memcmp(padded_dweight, dweight, n_weight * sizeof(float)) == 0 &&
               (!with_bias || memcmp(padded_dbias, dbias, OC * sizeof(float)) == 0);
    snprintf(name, sizeof(name), "matmul with the bias columns = packed, bit for bit %s", sizes);
    test_check(same, name, "%s", same ? "out, dinp, dweight, dbias equal" : "bits differ");
    free_all();
}

// The matmul products and the gradient norm with 1, 2 and 3 threads must agree bit for bit.
static void test_thread_determinism(TestRng* rng) {
    const int N = 67, C = 72, OC = 600, RUNS = 3;
    float* inp = random_floats((size_t)N * C, 1.0f, rng);
    float* weight = random_floats((size_t)OC * C, 1.0f, rng);
    float* bias = random_floats(OC, 1.0f, rng);
    float* dout = random_floats((size_t)N * OC, 1.0f, rng);
    float* dweight_prefill = random_floats((size_t)OC * C, 1.0f, rng);
    float* dbias_prefill = random_floats(OC, 1.0f, rng);
    float *out[RUNS], *dinp[RUNS], *dweight[RUNS], *dbias[RUNS], norm[RUNS];
    int threads_before = omp_get_max_threads();
    for (int run = 0; run < RUNS; run++) {
        omp_set_num_threads(run + 1);
        out[run] = poisoned_floats((size_t)N * OC);
        dinp[run] = poisoned_floats((size_t)N * C);
        dweight[run] = copy_floats(dweight_prefill, (size_t)OC * C);
        dbias[run] = copy_floats(dbias_prefill, OC);
        matmul_forward(out[run], inp, weight, bias, NULL, N, C, OC, C, N);
        matmul_backward(dinp[run], dweight[run], dbias[run], dout, inp, weight, N, C, OC, C, N, GRAD_ADD);
        norm[run] = grad_norm_squared(dout, (size_t)N * OC);
    }
    omp_set_num_threads(threads_before);
    int matmul_same = 1, norm_same = 1;
    for (int run = 1; run < RUNS; run++) {
        matmul_same &= memcmp(out[0], out[run], (size_t)N * OC * sizeof(float)) == 0 &&
                       memcmp(dinp[0], dinp[run], (size_t)N * C * sizeof(float)) == 0 &&
                       memcmp(dweight[0], dweight[run], (size_t)OC * C * sizeof(float)) == 0 &&
                       memcmp(dbias[0], dbias[run], OC * sizeof(float)) == 0;
        norm_same &= memcmp(&norm[0], &norm[run], sizeof(float)) == 0;
    }
    test_check(matmul_same, "matmul forward and backward bit-identical with 1, 2 and 3 threads", "%s",
               matmul_same ? "out, dinp, dweight, dbias" : "results differ");
    test_check(norm_same, "grad_norm_squared bit-identical with 1, 2 and 3 threads", "%.9g %.9g %.9g",
               norm[0], norm[1], norm[2]);
    free_all();
}

// With group_rows = T, one call over B sequences must give the bits of B calls over one sequence
// each (what --batch-invariant relies on), for every kernel that sums parameter gradients; a
// group_rows that does not divide N is refused.
static void test_batch_invariance(TestRng* rng) {
    const int B = 3, T = 37, C = 24, OC = 72, V = 7, N = B * T;
    float* inp = random_floats((size_t)N * C, 1.0f, rng);
    float* weight = random_floats((size_t)OC * C, 1.0f, rng);
    float* dout = random_floats((size_t)N * OC, 1.0f, rng);
    float* pre = random_floats((size_t)N * OC, 1.0f, rng); // GELU input, as wide as dout for the gelu test
    float* dout_c = random_floats((size_t)N * C, 1.0f, rng);
    float *mean = floats(N), *rstd = floats(N), *normed = floats((size_t)N * C);
    layernorm_forward(normed, mean, rstd, inp, weight, weight + C, N, C, C);
    int* tokens = ints(N);
    for (int i = 0; i < N; i++) tokens[i] = (int)(test_uniform(rng) * V);
    // [0]: one call over B sequences; [1]: B calls over one sequence each.
    float *dweight[2], *dbias[2], *dgelu_w[2], *dgelu_b[2], *dln_w[2], *dln_b[2], *dln_s[2], *dwte[2], *dwpe[2];
    float* prefill = random_floats((size_t)OC * C, 1.0f, rng);
    for (int k = 0; k < 2; k++) {
        dweight[k] = copy_floats(prefill, (size_t)OC * C);
        dgelu_w[k] = copy_floats(prefill, (size_t)OC * C);
        dbias[k] = copy_floats(prefill, OC);
        dgelu_b[k] = copy_floats(prefill, C);
        dln_w[k] = copy_floats(prefill, C);
        dln_b[k] = copy_floats(prefill + C, C);
        dln_s[k] = copy_floats(prefill + 2 * C, C);
        dwte[k] = copy_floats(prefill, (size_t)V * C);
        dwpe[k] = copy_floats(prefill, (size_t)T * C);
    }
    float* dinp = floats((size_t)N * OC); // written and read by every call alike: not compared
    memset(dinp, 0, (size_t)N * OC * sizeof(float));
    for (int k = 0; k < 2; k++) {
        int calls = k == 0 ? 1 : B, rows = N / calls;
        for (int b = 0; b < calls; b++) {
            size_t r0 = (size_t)b * rows;
            matmul_backward(dinp, dweight[k], dbias[k], dout + r0 * OC, inp + r0 * C, weight, rows, C, OC, C, T,
                            GRAD_ADD);
            matmul_backward_gelu(dinp, dgelu_w[k], dgelu_b[k], dout_c + r0 * C, inp + r0 * C, weight,
                                 pre + r0 * C, rows, C, C, T, GRAD_ADD);
            layernorm_backward(dinp, dln_w[k], dln_b[k], dln_s[k], dout_c + r0 * C, inp + r0 * C, weight,
                               mean + r0, rstd + r0, rows, C, T, GRAD_ADD);
            encoder_backward(dwte[k], dwpe[k], dout_c + r0 * C, tokens + r0, rows / T, T, C);
        }
    }
    struct { const char* name; float** grad; size_t n; } grads[] = {
        {"matmul_backward dweight", dweight, (size_t)OC * C}, {"matmul_backward dbias", dbias, OC},
        {"matmul_backward_gelu dweight", dgelu_w, (size_t)C * C}, {"matmul_backward_gelu dbias", dgelu_b, C},
        {"layernorm_backward dweight", dln_w, C}, {"layernorm_backward dbias", dln_b, C},
        {"layernorm_backward dinp_sums", dln_s, C},
        {"encoder_backward dwte", dwte, (size_t)V * C}, {"encoder_backward dwpe", dwpe, (size_t)T * C}};
    for (size_t g = 0; g < sizeof grads / sizeof grads[0]; g++) {
        int same = memcmp(grads[g].grad[0], grads[g].grad[1], grads[g].n * sizeof(float)) == 0;
        test_check(same, label("%s: B=%d in one call = %d calls of one sequence, bit for bit", grads[g].name, B, B),
                   "%s", same ? "equal" : "bits differ");
    }
    // GRAD_WRITE over poison, in one call and in B calls (the first writing, the others adding): the
    // bits of GRAD_ADD into zeros.
    float* added = floats((size_t)OC * C);
    memset(added, 0, (size_t)OC * C * sizeof(float));
    matmul_backward(NULL, added, NULL, dout, inp, weight, N, C, OC, C, T, GRAD_ADD);
    for (int k = 0; k < 2; k++) {
        int calls = k == 0 ? 1 : B, rows = N / calls;
        float* written = poisoned_floats((size_t)OC * C);
        for (int b = 0; b < calls; b++)
            matmul_backward(NULL, written, NULL, dout + (size_t)b * rows * OC, inp + (size_t)b * rows * C, weight,
                            rows, C, OC, C, T, b == 0 ? GRAD_WRITE : GRAD_ADD);
        int same = memcmp(written, added, (size_t)OC * C * sizeof(float)) == 0;
        test_check(same, label("matmul_backward GRAD_WRITE in %d call(s), group_rows %d: GRAD_ADD's bits into zeros",
                               calls, T),
                   "%s", same ? "equal" : "bits differ");
    }
    free_all();
}

static void matmul_backward_bad_groups(const void* unused) {
    (void)unused;
    float x[30] = {0};
    matmul_backward(x, x, NULL, x, x, x, 10, 1, 1, 1, 3, GRAD_ADD);
}

// The classifier-sized product of the small training runs: timed, not asserted.
static void time_classifier_matmul(TestRng* rng) {
    const int N = 256, C = 64, OC = 50304;
    float* inp = random_floats((size_t)N * C, 1.0f, rng);
    float* weight = random_floats((size_t)OC * C, 0.02f, rng);
    float* out = floats((size_t)N * OC);
    float* dinp = floats((size_t)N * C);
    float* dweight = floats((size_t)OC * C);
    memset(dweight, 0, (size_t)OC * C * sizeof(float));
    matmul_forward(out, inp, weight, NULL, NULL, N, C, OC, C, N); // warm-up: first touch of the pages
    double start = wall_seconds();
    matmul_forward(out, inp, weight, NULL, NULL, N, C, OC, C, N);
    double forward_done = wall_seconds();
    matmul_backward(dinp, dweight, NULL, out, inp, weight, N, C, OC, C, N, GRAD_ADD);
    double backward_done = wall_seconds();
    double flops = 2.0 * N * C * OC;
    printf("timing: matmul N=%d C=%d OC=%d, OpenMP threads %d: forward %.1f ms (%.1f GFLOP/s), "
           "backward %.1f ms (%.1f GFLOP/s)\n", N, C, OC, omp_get_max_threads(),
           (forward_done - start) * 1e3, flops / (forward_done - start) * 1e-9,
           (backward_done - forward_done) * 1e3, 2 * flops / (backward_done - forward_done) * 1e-9);
    free_all();
}

// ---- gelu --------------------------------------------------------------------------------------
typedef struct {
    size_t n;
    double *inp, *out;
    const float* w;
} GeluCase;

static void gelu_reference(GeluCase* g) {
    for (size_t i = 0; i < g->n; i++) {
        double x = g->inp[i];
        g->out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}

static double gelu_loss(void* ctx) {
    GeluCase* g = ctx;
    gelu_reference(g);
    return dot(g->out, g->w, g->n);
}

static void test_gelu(size_t n, TestRng* rng) {
    float* inp = floats(n);
    test_fill_uniform(inp, n, -5.0f, 5.0f, rng);
    float* w = random_floats(n, 1.0f, rng);
    float* out = poisoned_floats(n);
    gelu_forward(out, inp, n);
    GeluCase g = {n, to_doubles(inp, n), doubles(n), w};
    gelu_reference(&g);
    test_close(label("gelu_forward n=%zu", n), out, g.out, n, 1e-6, 1e-6);
    float* dinp = poisoned_floats(n);
    gelu_backward(dinp, inp, w, n);
    test_close(label("gelu_backward dinp = n=%zu", n), dinp, finite_differences(g.inp, n, gelu_loss, &g), n, 1e-5, 1e-6);
    free_all();
}

// ---- classifier --------------------------------------------------------------------------------
typedef struct {
    int N, V, Vp;
    double* logits;
    const int* targets;
    double* losses;
} ClassifierCase;

// losses[i] = -log softmax(logits[i, :V])[target]; returns their sum.
static double classifier_loss(void* ctx) {
    ClassifierCase* k = ctx;
    double total = 0.0;
    for (int i = 0; i < k->N; i++) {
        const double* row = k->logits + (size_t)i * k->Vp;
        double max = row[0];
        for (int v = 1; v < k->V; v++) max = fmax(max, row[v]);
        double sum = 0.0;
        for (int v = 0; v < k->V; v++) sum += exp(row[v] - max);
        k->losses[i] = log(sum) + max - row[k->targets[i]];
        total += k->losses[i];
    }
    return total;
}

// dlogits = dloss * d(sum of losses)/dlogits, checked by finite differences of the float64 loss.
static void test_classifier(int N, int V, int Vp, float logit_std, TestRng* rng) {
    const float dloss = 1.0f / N;
    size_t n = (size_t)N * Vp;
    float* logits = random_floats(n, logit_std, rng);
    for (int i = 0; i < N; i++)
        for (int v = V; v < Vp; v++) logits[(size_t)i * Vp + v] = NAN; // padding must not be read
    int* targets = ints(N);
    for (int i = 0; i < N; i++) targets[i] = (int)(test_uniform(rng) * V);
    ClassifierCase k = {N, V, Vp, to_doubles(logits, n), targets, doubles(N)};
    double* dlogits_want = finite_differences(k.logits, n, classifier_loss, &k);
    for (size_t i = 0; i < n; i++) dlogits_want[i] = (i % Vp) < (size_t)V ? dloss * dlogits_want[i] : 0.0;
    classifier_loss(&k);

    float* unchanged = copy_floats(logits, n);
    float* losses = poisoned_floats(N);
    fused_classifier(unchanged, losses, targets, dloss, N, V, Vp, 0);
    const char* sizes = label("N=%d V=%d Vp=%d logit std %g", N, V, Vp, logit_std);
    char name[256];
    snprintf(name, sizeof(name), "fused_classifier losses, no dlogits, %s", sizes);
    test_close(name, losses, k.losses, N, 1e-5, 1e-6);
    snprintf(name, sizeof(name), "fused_classifier leaves logits alone without dlogits, %s", sizes);
    int untouched = memcmp(unchanged, logits, n * sizeof(float)) == 0;
    test_check(untouched, name, "%s", untouched ? "bit for bit" : "logits changed");

    losses = poisoned_floats(N);
    fused_classifier(logits, losses, targets, dloss, N, V, Vp, 1);
    snprintf(name, sizeof(name), "fused_classifier losses %s", sizes);
    test_close(name, losses, k.losses, N, 1e-5, 1e-6);
    snprintf(name, sizeof(name), "fused_classifier dlogits %s", sizes);
    test_close(name, logits, dlogits_want, n, 1e-4, 1e-7);
    int padding_zero = 1;
    for (int i = 0; i < N; i++)
        for (int v = V; v < Vp; v++) padding_zero &= logits[(size_t)i * Vp + v] == 0.0f;
    snprintf(name, sizeof(name), "fused_classifier padding columns exactly 0, %s", sizes);
    test_check(padding_zero, name, "%s", padding_zero ? "" : "a padding column is not 0");
    free_all();
}

// ---- optimizer ---------------------------------------------------------------------------------
// PyTorch's AdamW (torch.optim.AdamW, no amsgrad) in float64, step by step as it computes it.
static void adamw_reference(double* param, double* m, double* v, const float* grad, size_t n,
                            double lr, double beta1, double beta2, double eps, double weight_decay,
                            double grad_scale, int t) {
    double bias_correction1 = 1.0 - pow(beta1, t), bias_correction2 = 1.0 - pow(beta2, t);
    double step_size = lr / bias_correction1;
    for (size_t i = 0; i < n; i++) {
        double g = grad[i] * grad_scale;
        param[i] *= 1.0 - lr * weight_decay;
        m[i] += (g - m[i]) * (1.0 - beta1);
        v[i] = v[i] * beta2 + (1.0 - beta2) * g * g;
        double denom = sqrt(v[i]) / sqrt(bias_correction2) + eps;
        param[i] -= step_size * m[i] / denom;
    }
}

static void test_adamw(size_t n, int with_master, TestRng* rng) {
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
    float* param = random_floats(n, 1.0f, rng);
    float* master = with_master ? copy_floats(param, n) : NULL;
    float *m = floats(n), *v = floats(n);
    memset(m, 0, n * sizeof(float));
    memset(v, 0, n * sizeof(float));
    double *param_want = to_doubles(param, n), *m_want = doubles(n), *v_want = doubles(n);
    for (size_t i = 0; i < n; i++) m_want[i] = v_want[i] = 0.0;
    float* grad = floats(n);
    for (int t = 1; t <= 5; t++) {
        test_fill_normal(grad, n, 1.0f, rng);
        grad[0] = 0.0f; // a zero gradient: the update is weight decay and momentum only
        adamw_update(param, master, grad, m, v, n, 0, lr, beta1, beta2, eps, weight_decay, grad_scale, t, 1234);
        adamw_reference(param_want, m_want, v_want, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
    }
    const char* what = with_master ? ", with master" : "";
    test_close(label("adamw_update param after 5 steps n=%zu%s", n, what), param, param_want, n, 1e-5, 1e-6);
    test_close(label("adamw_update m after 5 steps n=%zu%s", n, what), m, m_want, n, 1e-5, 1e-7);
    test_close(label("adamw_update v after 5 steps n=%zu%s", n, what), v, v_want, n, 1e-5, 1e-8);
    if (with_master) {
        int same = memcmp(master, param, n * sizeof(float)) == 0;
        test_check(same, "adamw_update master equals param", "%s", same ? "bit for bit" : "they differ");
    }
    free_all();
}

static void test_grad_norm(size_t n, TestRng* rng) {
    float* grad = random_floats(n, 3.0f, rng);
    double want = 0.0;
    for (size_t i = 0; i < n; i++) want += (double)grad[i] * grad[i];
    float got = grad_norm_squared(grad, n);
    test_close(label("grad_norm_squared n=%zu", n), &got, &want, 1, 1e-6, 0.0);
    free_all();
}

// ---- backend -----------------------------------------------------------------------------------
static void test_init_normal(void) {
    const size_t n = 100001; // odd: the last value comes from a separate pair
    const float mean = 0.5f, std = 2.0f;
    float* x = poisoned_floats(n);
    init_normal(x, n, mean, std, 42, 0);
    double sum = 0.0, sum_squares = 0.0;
    for (size_t i = 0; i < n; i++) sum += x[i];
    double sample_mean = sum / n;
    for (size_t i = 0; i < n; i++) sum_squares += (x[i] - sample_mean) * (x[i] - sample_mean);
    double sample_std = sqrt(sum_squares / (n - 1));
    // 5 standard errors: mean std/sqrt(n) = 0.0063, std about std/sqrt(2n) = 0.0045.
    test_check(fabs(sample_mean - mean) < 0.032 && fabs(sample_std - std) < 0.023,
               "init_normal mean and std of 100001 values", "mean %.5f (want %.1f), std %.5f (want %.1f)",
               sample_mean, mean, sample_std, std);
    test_check(isfinite(x[n - 1]) && x[n - 1] != x[n - 2], "init_normal writes the last value of an odd count",
               "last two %g %g", x[n - 1], x[n - 2]);

    // The offset counts single values: a run at offset k continues the run at offset 0 from value
    // k, for even and odd k and counts.
    const size_t count = 7;
    float* run = poisoned_floats(2 * count + 1);
    init_normal(run, 2 * count + 1, mean, std, 42, 0);
    int repeated = memcmp(run, x, (2 * count + 1) * sizeof(float)) == 0;
    test_check(repeated, "init_normal same seed and offset gives the same values", "%s",
               repeated ? "first 15 of the 100001" : "they differ");
    int offsets_ok = 1;
    for (size_t offset = 1; offset <= count; offset++) {
        size_t rest = 2 * count + 1 - offset; // to the end of run: counts of both parities
        float* part = poisoned_floats(rest);
        init_normal(part, rest, mean, std, 42, offset);
        offsets_ok &= memcmp(part, run + offset, rest * sizeof(float)) == 0;
    }
    test_check(offsets_ok, "init_normal at offset k continues the sequence from value k",
               "%s", offsets_ok ? "offsets 1..7" : "some offset gives other values");
    float* other_seed = poisoned_floats(count);
    init_normal(other_seed, count, mean, std, 43, 0);
    int differs = memcmp(other_seed, run, count * sizeof(float)) != 0;
    test_check(differs, "init_normal another seed gives other values", "%s", differs ? "seed 43 vs 42" : "same values");
    free_all();
}

static void test_backend_memory(TestRng* rng) {
    backend_init(0);
    const char* description = backend_describe();
    test_check(strstr(description, "CPU") != NULL, "backend_describe names the CPU", "'%s'", description);
    const size_t n = 1001;
    float* host = random_floats(n, 1.0f, rng);
    float* device = dev_malloc(n * sizeof(float), "test buffer");
    float* device_copy = dev_malloc(n * sizeof(float), "test buffer");
    float* back = poisoned_floats(n);
    dev_upload(device, host, n * sizeof(float));
    floatX_from_float(device_copy, device, n);
    float_from_floatX(device, device_copy, n);
    dev_synchronize();
    dev_download(back, device, n * sizeof(float));
    int round_trip = memcmp(back, host, n * sizeof(float)) == 0;
    test_check(round_trip, "dev_upload, floatX conversions, dev_download round trip", "%s",
               round_trip ? "1001 floats bit for bit" : "values changed");
    dev_memset_zero(device, n * sizeof(float));
    dev_download(back, device, n * sizeof(float));
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= back[i] == 0.0f;
    test_check(zero, "dev_memset_zero", "%s", zero ? "1001 floats are 0" : "a value is not 0");
    dev_free(device);
    dev_free(device_copy);
    free_all();
}

int main(void) {
    TestRng rng = test_rng(1);
    test_backend_memory(&rng);
    test_init_normal();

    test_encoder(3, 5, 7, &rng);
    test_encoder(1, 1, 13, &rng);
    test_encoder(2, 3, 40, &rng);

    test_layernorm(5, 7, 5, &rng);
    test_layernorm(1, 13, 1, &rng);
    test_layernorm(9, 40, 3, &rng);

    test_matmul(1, 7, 5, 1, 1, &rng);
    test_matmul(5, 13, 37, 1, 5, &rng);
    test_matmul(17, 33, 29, 0, 17, &rng);
    test_matmul(3, 5, 530, 1, 3, &rng); // more rows of weight than one block of matmul_backward's dinp
    test_matmul(70, 16, 9, 1, 70, &rng); // more rows than one chunk of matmul_backward's dinp
    test_matmul(70, 16, 9, 1, 7, &rng);  // 10 groups of 7 rows
    test_thread_determinism(&rng);
    test_batch_invariance(&rng);
    test_expect_fatal("matmul_backward refuses groups that do not divide N", matmul_backward_bad_groups, NULL,
                      "10 rows do not split into groups of 3", NULL);

    test_gelu(37, &rng);

    test_classifier(5, 37, 48, 2.0f, &rng);
    test_classifier(3, 37, 37, 2.0f, &rng);
    test_classifier(1, 11, 16, 50.0f, &rng); // large logits: the softmax must subtract the max

    test_adamw(37, 0, &rng);
    test_adamw(37, 1, &rng);
    test_grad_norm(100003, &rng);
    test_grad_norm(1, &rng);

    time_classifier_matmul(&rng);
    return test_summary("test_kernels_cpu");
}
