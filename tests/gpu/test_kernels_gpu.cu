// Every CUDA kernel against the CPU reference kernels (fp32, linked under cpu_<name>, see
// kernels/cpu_reference_names.h) on fresh random inputs of awkward sizes. GPU outputs are poisoned
// with 0xFF bytes (NaN in fp32, bf16 and fp16) before each run, so an unwritten element fails.
// The seed is printed; TEST_SEED=n reruns one case.
//
// Tolerances. FP32 build: 1e-5 relative (TF32 is off: cuBLAS runs CUBLAS_COMPUTE_32F), plus
// 1e-5 of the largest reference value as absolute slack for sums that cancel. BF16 build: the
// inputs are rounded to bf16 before both backends see them, so the only differences are the
// roundings to bf16 along the GPU path; each has relative error <= 2^-9, counted as 2^-8 for
// margin, so a result after k roundings gets k * 2^-8 relative (and of the largest value as
// absolute slack), with k counted at each check. FP16 build: the same with fp16's rounding, whose
// relative error is <= 2^-11 (11 significant bits), counted as 2^-10: k * 2^-10. Below fp16's
// smallest normal (6.1e-5) the error is absolute (up to 2^-25), which the slack of k * 2^-10 of the
// largest value covers wherever that value is above 0.03; so the gradients that seed a backward
// (dloss) are scaled by GRADIENT_SCALE in FP16, as training scales the loss (train.c's
// --loss-scale), and stay normal.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CPU_REFERENCE_DECLARATIONS_ONLY
#include "kernels/cpu_reference_names.h"
#include "kernels/cuda/common.cuh"
extern "C" {
#include "tests/lib/testutil.h"
}

#if defined(PRECISION_BF16)
static double tolerance(int roundings) { return roundings * (1.0 / 256.0); }
#elif defined(PRECISION_FP16)
static double tolerance(int roundings) { return roundings * (1.0 / 1024.0); }
#else
static double tolerance(int roundings) {
    (void)roundings;
    return 1e-5;
}
#endif

// Parameter gradients are float wherever a kernel writes them and nothing rounds them to floatX: only
// the order of the fp32 sums differs from the CPU's. (A GRADS=BF16 build rounds them into its bf16
// gradients afterwards, gradX_fold, tested bit for bit below.)
#if defined(PRECISION_FP16)
#define GRADIENT_SCALE 1024.0f
#else
#define GRADIENT_SCALE 1.0f
#endif
#define GRAD_TOLERANCE 1e-5

static TestRng rng;

// ---- host <-> device helpers -------------------------------------------------------------
static float* host_floats(size_t n) { return (float*)xmalloc(n * sizeof(float), "test array"); }

// Uploads host (n floats) as floatX and rounds the host copy to what the GPU holds, so the CPU
// reference sees exactly the GPU's inputs.
static floatX* upload_x(float* host, size_t n) {
    float* staging = (float*)dev_malloc(n * sizeof(float), "staging");
    floatX* dev = (floatX*)dev_malloc(n * sizeof(floatX), "test input");
    dev_upload(staging, host, n * sizeof(float));
    floatX_from_float(dev, staging, n);
    float_from_floatX(staging, dev, n);
    dev_download(host, staging, n * sizeof(float));
    dev_free(staging);
    return dev;
}
// Uploads host (n floats) as float: parameter gradients are float in every build.
static float* upload_f(const float* host, size_t n) {
    float* dev = (float*)dev_malloc(n * sizeof(float), "test input");
    dev_upload(dev, host, n * sizeof(float));
    return dev;
}
// Uploads host (n floats) as gradX, the gradients the norm and AdamW read: float, or in a GRADS=BF16
// build bf16, the host copy rounded to it as upload_x does.
static gradX* upload_g(float* host, size_t n) {
#if defined(GRADS_BF16)
    return upload_x(host, n);
#else
    return upload_f(host, n);
#endif
}
static void download_x(float* host, const floatX* dev, size_t n) {
    float* staging = (float*)dev_malloc(n * sizeof(float), "staging");
    float_from_floatX(staging, dev, n);
    dev_download(host, staging, n * sizeof(float));
    dev_free(staging);
}
static void* poisoned(size_t bytes) {
    void* p = dev_malloc(bytes, "test output");
    cudaCheck(cudaMemset(p, 0xff, bytes));
    return p;
}
static float* random_array(size_t n, float lo, float hi) {
    float* p = host_floats(n);
    test_fill_uniform(p, n, lo, hi, &rng);
    return p;
}
static double max_abs(const float* p, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)p[i]));
    return m;
}
// Compares a GPU floatX array with the CPU reference after `roundings` bf16 roundings (see top).
static void check_x(const char* name, const floatX* dev, const float* want, size_t n, int roundings) {
    float* got = host_floats(n);
    download_x(got, dev, n);
    double tol = tolerance(roundings);
    test_close_f(name, got, want, n, tol, tol * max_abs(want, n));
    free(got);
}
static void check_f(const char* name, const float* dev, const float* want, size_t n, double tol) {
    float* got = host_floats(n);
    dev_download(got, dev, n * sizeof(float));
    test_close_f(name, got, want, n, tol, tol * max_abs(want, n));
    free(got);
}
// sums[c] += the float64 sum of column c of the (n / C, C) matrix `dev` as the GPU stored it (rounded
// to floatX): what a kernel that sums the columns of its own output into sums must give.
static void add_stored_column_sums(float* sums, const floatX* dev, size_t n, int C) {
    float* got = host_floats(n);
    download_x(got, dev, n);
    double* total = (double*)xmalloc(C * sizeof(double), "sums");
    for (int c = 0; c < C; c++) total[c] = sums[c];
    for (size_t i = 0; i < n; i++) total[i % C] += got[i];
    for (int c = 0; c < C; c++) sums[c] = (float)total[c];
    free(got), free(total);
}
// A linear layer's input (N, C) with its bias columns (kernels.h): rows ld = linear_bias_ld(C)
// apart, each a 1 and zeros after the row's values.
static float* with_bias_columns(const float* inp, int N, int C) {
    const int ld = linear_bias_ld(C);
    float* padded = host_floats((size_t)N * ld);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < ld; c++) padded[(size_t)r * ld + c] = c < C ? inp[(size_t)r * C + c] : c == C ? 1.0f : 0.0f;
    return padded;
}
// A linear layer's input, N x C values in [-1, 1], its rows ld apart with the bias columns where ld > C.
static float* random_linear_input(int N, int C, int ld) {
    float* inp = random_array((size_t)N * C, -1, 1);
    if (ld == C) return inp;
    float* padded = with_bias_columns(inp, N, C);
    free(inp);
    return padded;
}
// Whether `dev_padded` (rows linear_bias_ld(C) apart) holds the bits of `dev_packed` (N, C) in
// each row, then exactly the bias columns.
static int same_rows_and_bias_columns(const floatX* dev_padded, const floatX* dev_packed, int N, int C) {
    const int ld = linear_bias_ld(C);
    floatX* padded = (floatX*)xmalloc((size_t)N * ld * sizeof(floatX), "copy");
    floatX* packed = (floatX*)xmalloc((size_t)N * C * sizeof(floatX), "copy");
    dev_download(padded, dev_padded, (size_t)N * ld * sizeof(floatX));
    dev_download(packed, dev_packed, (size_t)N * C * sizeof(floatX));
    int same = 1;
    for (int r = 0; r < N; r++) {
        same &= memcmp(padded + (size_t)r * ld, packed + (size_t)r * C, C * sizeof(floatX)) == 0;
        for (int c = C; c < ld; c++) same &= (float)padded[(size_t)r * ld + c] == (c == C ? 1.0f : 0.0f);
    }
    free(padded), free(packed);
    return same;
}
// Whether two device arrays hold the same bytes.
static int same_bytes(const void* dev_a, const void* dev_b, size_t bytes) {
    void *a = xmalloc(bytes, "copy"), *b = xmalloc(bytes, "copy");
    dev_download(a, dev_a, bytes);
    dev_download(b, dev_b, bytes);
    int same = memcmp(a, b, bytes) == 0;
    free(a), free(b);
    return same;
}
static int* upload_tokens(const int* host, size_t n) {
    int* dev = (int*)dev_malloc(n * sizeof(int), "tokens");
    dev_upload(dev, host, n * sizeof(int));
    return dev;
}

// ---- layers ------------------------------------------------------------------------------
// frequent: token 0 at every even position of the sequences b % 3 != 1 and nowhere in the others (as
// text has newline), so that it is a long bucket (kernels/cuda/encoder.cu) that some sequences lack.
static void test_encoder(int B, int T, int C, int vocab, int frequent) {
    char name[128];
    size_t N = (size_t)B * T;
    int* tokens = (int*)xmalloc(N * sizeof(int), "tokens");
    for (size_t i = 0; i < N; i++) {
        tokens[i] = (int)(test_uniform(&rng) * vocab); // many repeats
        const int b = (int)(i / T), t = (int)(i % T);
        if (frequent && b % 3 == 1 && tokens[i] == 0) tokens[i] = 1;
        if (frequent && b % 3 != 1 && t % 2 == 0) tokens[i] = 0;
    }
    float *wte = random_array((size_t)vocab * C, -1, 1), *wpe = random_array((size_t)T * C, -1, 1);
    int* d_tokens = upload_tokens(tokens, N);
    floatX *d_wte = upload_x(wte, (size_t)vocab * C), *d_wpe = upload_x(wpe, (size_t)T * C);
    floatX* d_out = (floatX*)poisoned(N * C * sizeof(floatX));
    float* want = host_floats(N * C);
    encoder_forward(d_out, d_tokens, d_wte, d_wpe, B, T, C);
    cpu_encoder_forward(want, tokens, wte, wpe, B, T, C);
    snprintf(name, sizeof name, "encoder_forward B=%d T=%d C=%d", B, T, C);
    check_x(name, d_out, want, N * C, 1);

    // Backward accumulates into random gradients; run it twice from the same start to check the
    // result is bit-identical (no atomics).
    float *dwte = random_array((size_t)vocab * C, -1, 1), *dwpe = random_array((size_t)T * C, -1, 1);
    float* dwte_start = host_floats((size_t)vocab * C); // dwte before the CPU reference adds into it
    memcpy(dwte_start, dwte, (size_t)vocab * C * sizeof(float));
    float* dout = random_array(N * C, -1, 1);
    float *d_dwte = upload_f(dwte, (size_t)vocab * C), *d_dwpe = upload_f(dwpe, (size_t)T * C);
    floatX* d_dout = upload_x(dout, N * C);
    float* d_dwte_again = upload_f(dwte, (size_t)vocab * C);
    float* d_dwpe_again = upload_f(dwpe, (size_t)T * C);
    encoder_backward(d_dwte, d_dwpe, d_dout, d_tokens, B, T, C);
    encoder_backward(d_dwte_again, d_dwpe_again, d_dout, d_tokens, B, T, C);
    cpu_encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    snprintf(name, sizeof name, "encoder_backward dwte B=%d T=%d C=%d", B, T, C);
    check_f(name, d_dwte, dwte, (size_t)vocab * C, GRAD_TOLERANCE);
    snprintf(name, sizeof name, "encoder_backward dwpe B=%d T=%d C=%d", B, T, C);
    check_f(name, d_dwpe, dwpe, (size_t)T * C, GRAD_TOLERANCE);
    // dwte bit for bit against its contract's order (kernels/cuda/encoder.cu): each token's positions
    // in a sequence summed from 0 in increasing order, the sequences' sums added to the gradient in
    // turn; dout as the GPU holds it (floatX).
    float *ordered = host_floats((size_t)vocab * C), *dout_stored = host_floats(N * C);
    float *sequence_sum = host_floats(C), *got = host_floats((size_t)vocab * C);
    memcpy(ordered, dwte_start, (size_t)vocab * C * sizeof(float));
    download_x(dout_stored, d_dout, N * C);
    for (int v = 0; v < vocab; v++)
        for (int b = 0; b < B; b++) {
            int seen = 0;
            for (int c = 0; c < C; c++) sequence_sum[c] = 0.0f;
            for (int t = 0; t < T; t++)
                if (tokens[b * T + t] == v) {
                    seen = 1;
                    for (int c = 0; c < C; c++) sequence_sum[c] += dout_stored[((size_t)b * T + t) * C + c];
                }
            if (seen)
                for (int c = 0; c < C; c++) ordered[(size_t)v * C + c] += sequence_sum[c];
        }
    dev_download(got, d_dwte, (size_t)vocab * C * sizeof(float));
    snprintf(name, sizeof name, "encoder_backward dwte B=%d T=%d C=%d in the contract's order, bit for bit", B, T, C);
    int in_order = memcmp(got, ordered, (size_t)vocab * C * sizeof(float)) == 0;
    test_check(in_order, name, "%s", in_order ? "equal" : "bits differ");
    free(ordered), free(dout_stored), free(sequence_sum), free(got), free(dwte_start);

    size_t bytes = (size_t)vocab * C * sizeof(floatX);
    void *first = xmalloc(bytes, "copy"), *second = xmalloc(bytes, "copy");
    dev_download(first, d_dwte, bytes);
    dev_download(second, d_dwte_again, bytes);
    snprintf(name, sizeof name, "encoder_backward deterministic B=%d T=%d C=%d", B, T, C);
    int same = memcmp(first, second, bytes) == 0;
    test_check(same, name, "%s", same ? "two runs equal" : "two runs differ");
    free(first), free(second), free(tokens), free(wte), free(wpe), free(want), free(dwte), free(dwpe), free(dout);
    dev_free(d_tokens), dev_free(d_wte), dev_free(d_wpe), dev_free(d_out), dev_free(d_dwte);
    dev_free(d_dwpe), dev_free(d_dout), dev_free(d_dwte_again), dev_free(d_dwpe_again);
}

static void test_layernorm(int N, int C, int group_rows) {
    char name[160];
    size_t n = (size_t)N * C;
    float *inp = random_array(n, -2, 3), *w = random_array(C, 0.5, 1.5), *b = random_array(C, -1, 1);
    floatX *d_inp = upload_x(inp, n), *d_w = upload_x(w, C), *d_b = upload_x(b, C);
    floatX* d_out = (floatX*)poisoned(n * sizeof(floatX));
    float *d_mean = (float*)poisoned(N * sizeof(float)), *d_rstd = (float*)poisoned(N * sizeof(float));
    float *out = host_floats(n), *mean = host_floats(N), *rstd = host_floats(N);
    layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, C);
    cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, C);
    snprintf(name, sizeof name, "layernorm_forward out N=%d C=%d", N, C);
    check_x(name, d_out, out, n, 1);
    snprintf(name, sizeof name, "layernorm_forward mean N=%d C=%d", N, C);
    check_f(name, d_mean, mean, N, 1e-5);
    snprintf(name, sizeof name, "layernorm_forward rstd N=%d C=%d", N, C);
    check_f(name, d_rstd, rstd, N, 1e-5);
    // Rows with the bias columns (a linear layer's input): the same values, then the columns.
    floatX* d_padded = (floatX*)poisoned((size_t)N * linear_bias_ld(C) * sizeof(floatX));
    float *d_padded_mean = (float*)poisoned(N * sizeof(float)), *d_padded_rstd = (float*)poisoned(N * sizeof(float));
    layernorm_forward(d_padded, d_padded_mean, d_padded_rstd, d_inp, d_w, d_b, N, C, linear_bias_ld(C));
    snprintf(name, sizeof name, "layernorm_forward N=%d C=%d with the bias columns: the same bits, then 1, 0, ...", N, C);
    int padded_same = same_rows_and_bias_columns(d_padded, d_out, N, C) &&
                      same_bytes(d_padded_mean, d_mean, N * sizeof(float)) &&
                      same_bytes(d_padded_rstd, d_rstd, N * sizeof(float));
    test_check(padded_same, name, "%s", padded_same ? "equal" : "differ");
    dev_free(d_padded), dev_free(d_padded_mean), dev_free(d_padded_rstd);

    float *dinp = random_array(n, -1, 1), *dw = random_array(C, -1, 1), *db = random_array(C, -1, 1);
    float *dout = random_array(n, -1, 1), *ds = random_array(C, -1, 1);
    floatX *d_dinp = upload_x(dinp, n), *d_dinp_again = upload_x(dinp, n);
    float *d_dw = upload_f(dw, C), *d_db = upload_f(db, C), *d_ds = upload_f(ds, C);
    float *d_dw_again = upload_f(dw, C), *d_db_again = upload_f(db, C), *d_ds_again = upload_f(ds, C);
    float* d_ds_matmul = upload_f(ds, C);
    floatX* d_dout = upload_x(dout, n);
    layernorm_backward(d_dinp, d_dw, d_db, d_ds, d_dout, d_inp, d_w, d_mean, d_rstd, N, C, group_rows, GRAD_ADD);
    // again from the same start: the same bits (no atomics)
    layernorm_backward(d_dinp_again, d_dw_again, d_db_again, d_ds_again, d_dout, d_inp, d_w, d_mean, d_rstd, N, C,
                       group_rows, GRAD_ADD);
    // One pass where its chunks of rows fill the SMs, two (dinp, then the column sums) where they do
    // not: each forced in turn by the SM count it sees, the same bits as the call above, and with
    // GRAD_WRITE and no dinp_sums (the other form of the calls) the same bits as each other.
    const int sm_count = device_sm_count;
    floatX* d_path_written[2];
    float *d_path_dw[2], *d_path_db[2];
    for (int path = 0; path < 2; path++) {
        device_sm_count = path == 0 ? 1 : 1 << 30;
        floatX* d_dinp_path = upload_x(dinp, n);
        float *d_dw_path = upload_f(dw, C), *d_db_path = upload_f(db, C), *d_ds_path = upload_f(ds, C);
        layernorm_backward(d_dinp_path, d_dw_path, d_db_path, d_ds_path, d_dout, d_inp, d_w, d_mean, d_rstd, N, C,
                           group_rows, GRAD_ADD);
        d_path_written[path] = (floatX*)poisoned(n * sizeof(floatX));
        d_path_dw[path] = upload_f(dw, C), d_path_db[path] = upload_f(db, C);
        layernorm_backward(d_path_written[path], d_path_dw[path], d_path_db[path], NULL, d_dout, d_inp, d_w, d_mean,
                           d_rstd, N, C, group_rows, GRAD_WRITE);
        device_sm_count = sm_count;
        snprintf(name, sizeof name, "layernorm_backward N=%d C=%d group_rows=%d in %s: the same bits", N, C, group_rows,
                 path == 0 ? "one pass" : "two passes");
        int same = same_bytes(d_dinp_path, d_dinp, n * sizeof(floatX)) && same_bytes(d_dw_path, d_dw, C * sizeof(float)) &&
                   same_bytes(d_db_path, d_db, C * sizeof(float)) && same_bytes(d_ds_path, d_ds, C * sizeof(float));
        test_check(same, name, "%s", same ? "dinp, dweight, dbias, dinp_sums equal" : "bits differ");
        dev_free(d_dinp_path), dev_free(d_dw_path), dev_free(d_db_path), dev_free(d_ds_path);
    }
    snprintf(name, sizeof name, "layernorm_backward GRAD_WRITE N=%d C=%d group_rows=%d: one pass = two passes, bit for bit",
             N, C, group_rows);
    int paths_same = same_bytes(d_path_written[0], d_path_written[1], n * sizeof(floatX)) &&
                     same_bytes(d_path_dw[0], d_path_dw[1], C * sizeof(float)) &&
                     same_bytes(d_path_db[0], d_path_db[1], C * sizeof(float));
    test_check(paths_same, name, "%s", paths_same ? "dinp, dweight, dbias equal" : "bits differ");
    for (int path = 0; path < 2; path++) dev_free(d_path_written[path]), dev_free(d_path_dw[path]), dev_free(d_path_db[path]);
    cpu_layernorm_backward(dinp, dw, db, NULL, dout, inp, w, mean, rstd, N, C, group_rows, GRAD_ADD);
    snprintf(name, sizeof name, "layernorm_backward dinp N=%d C=%d", N, C);
    check_x(name, d_dinp, dinp, n, 1);
    snprintf(name, sizeof name, "layernorm_backward dweight N=%d C=%d group_rows=%d", N, C, group_rows);
    check_f(name, d_dw, dw, C, GRAD_TOLERANCE);
    snprintf(name, sizeof name, "layernorm_backward dbias N=%d C=%d group_rows=%d", N, C, group_rows);
    check_f(name, d_db, db, C, GRAD_TOLERANCE);
    add_stored_column_sums(ds, d_dinp, n, C); // the sums are of dinp as the GPU stored it
    snprintf(name, sizeof name, "layernorm_backward dinp_sums N=%d C=%d group_rows=%d", N, C, group_rows);
    check_f(name, d_ds, ds, C, GRAD_TOLERANCE);
    snprintf(name, sizeof name, "layernorm_backward N=%d C=%d group_rows=%d: rerun bit for bit", N, C, group_rows);
    int same = same_bytes(d_dinp, d_dinp_again, n * sizeof(floatX)) &&
               same_bytes(d_dw, d_dw_again, C * sizeof(float)) && same_bytes(d_db, d_db_again, C * sizeof(float)) &&
               same_bytes(d_ds, d_ds_again, C * sizeof(float));
    test_check(same, name, "%s", same ? "dinp, dweight, dbias, dinp_sums equal" : "bits differ");
    // The model drops the projection's own dbias pass for these sums: they must be its bits.
    matmul_backward(NULL, NULL, d_ds_matmul, d_dinp, NULL, NULL, N, C, C, C, group_rows, GRAD_ADD);
    snprintf(name, sizeof name, "layernorm_backward N=%d C=%d group_rows=%d: dinp_sums = matmul_backward's dbias, bit for bit",
             N, C, group_rows);
    same = same_bytes(d_ds, d_ds_matmul, C * sizeof(float));
    test_check(same, name, "%s", same ? "equal" : "bits differ");
    // GRAD_WRITE: dinp written over poison, with the bits (and the dinp_sums) of GRAD_ADD into zeros.
    float* zeros = host_floats(n);
    for (size_t i = 0; i < n; i++) zeros[i] = 0.0f;
    floatX *d_written = (floatX*)poisoned(n * sizeof(floatX)), *d_into_zeros = upload_x(zeros, n);
    float *d_written_sums = upload_f(ds, C), *d_into_zeros_sums = upload_f(ds, C);
    for (int write : {1, 0}) // the parameter sums are not compared: they go into d_dw and d_db once more
        layernorm_backward(write ? d_written : d_into_zeros, d_dw, d_db, write ? d_written_sums : d_into_zeros_sums,
                           d_dout, d_inp, d_w, d_mean, d_rstd, N, C, group_rows, write ? GRAD_WRITE : GRAD_ADD);
    snprintf(name, sizeof name, "layernorm_backward GRAD_WRITE N=%d C=%d group_rows=%d: over poison, the bits of GRAD_ADD into zeros",
             N, C, group_rows);
    same = same_bytes(d_written, d_into_zeros, n * sizeof(floatX)) &&
           same_bytes(d_written_sums, d_into_zeros_sums, C * sizeof(float));
    test_check(same, name, "%s", same ? "dinp and dinp_sums equal" : "bits differ");
    free(zeros);
    dev_free(d_written), dev_free(d_into_zeros), dev_free(d_written_sums), dev_free(d_into_zeros_sums);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dinp), free(dw), free(db), free(dout), free(ds);
    dev_free(d_inp), dev_free(d_w), dev_free(d_b), dev_free(d_out), dev_free(d_mean), dev_free(d_rstd);
    dev_free(d_dinp), dev_free(d_dw), dev_free(d_db), dev_free(d_dout), dev_free(d_dinp_again), dev_free(d_dw_again);
    dev_free(d_db_again), dev_free(d_ds), dev_free(d_ds_again), dev_free(d_ds_matmul);
}

// layernorm_forward on arrays `offset` elements in (not 16-byte aligned unless offset is a multiple
// of X128: every load and store element by element), outputs poisoned: against the CPU, and bit for
// bit what the same rows give from aligned arrays.
static void test_layernorm_offset(int N, int C, size_t offset) {
    char name[160];
    size_t n = (size_t)N * C;
    float *inp = random_array(n + offset, -2, 3);
    float *w = random_array(C + offset, 0.5, 1.5), *bias = random_array(C + offset, -1, 1);
    floatX *d_inp = upload_x(inp, n + offset), *d_w = upload_x(w, C + offset), *d_bias = upload_x(bias, C + offset);
    floatX* d_out = (floatX*)poisoned((n + offset) * sizeof(floatX));
    float *d_mean = (float*)poisoned(N * sizeof(float)), *d_rstd = (float*)poisoned(N * sizeof(float));
    layernorm_forward(d_out + offset, d_mean, d_rstd, d_inp + offset, d_w + offset, d_bias + offset, N, C, C);
    float *out = host_floats(n), *mean = host_floats(N), *rstd = host_floats(N);
    cpu_layernorm_forward(out, mean, rstd, inp + offset, w + offset, bias + offset, N, C, C);
    snprintf(name, sizeof name, "layernorm_forward out N=%d C=%d offset=%zu", N, C, offset);
    check_x(name, d_out + offset, out, n, 1);
    snprintf(name, sizeof name, "layernorm_forward mean N=%d C=%d offset=%zu", N, C, offset);
    check_f(name, d_mean, mean, N, 1e-5);
    snprintf(name, sizeof name, "layernorm_forward rstd N=%d C=%d offset=%zu", N, C, offset);
    check_f(name, d_rstd, rstd, N, 1e-5);
    floatX *d_aligned_inp = upload_x(inp + offset, n), *d_aligned_w = upload_x(w + offset, C);
    floatX *d_aligned_bias = upload_x(bias + offset, C), *d_aligned_out = (floatX*)poisoned(n * sizeof(floatX));
    float *d_aligned_mean = (float*)poisoned(N * sizeof(float)), *d_aligned_rstd = (float*)poisoned(N * sizeof(float));
    layernorm_forward(d_aligned_out, d_aligned_mean, d_aligned_rstd, d_aligned_inp, d_aligned_w, d_aligned_bias, N, C,
                      C);
    snprintf(name, sizeof name, "layernorm_forward N=%d C=%d offset=%zu = the aligned call, bit for bit", N, C, offset);
    int same = same_bytes(d_out + offset, d_aligned_out, n * sizeof(floatX)) &&
               same_bytes(d_mean, d_aligned_mean, N * sizeof(float)) &&
               same_bytes(d_rstd, d_aligned_rstd, N * sizeof(float));
    test_check(same, name, "%s", same ? "out, mean, rstd equal" : "bits differ");
    free(inp), free(w), free(bias), free(out), free(mean), free(rstd);
    dev_free(d_inp), dev_free(d_w), dev_free(d_bias), dev_free(d_out), dev_free(d_mean), dev_free(d_rstd);
    dev_free(d_aligned_inp), dev_free(d_aligned_w), dev_free(d_aligned_bias), dev_free(d_aligned_out);
    dev_free(d_aligned_mean), dev_free(d_aligned_rstd);
}

// The GPU's input rows ld apart: C, or linear_bias_ld(C) with the bias columns (from which
// the backward takes dbias); the CPU's packed.
static void test_matmul(int N, int C, int OC, int with_bias, int group_rows, int ld) {
    char name[160];
    float *inp = random_array((size_t)N * C, -1, 1), *w = random_array((size_t)OC * C, -1, 1);
    float* bias = random_array(OC, -1, 1);
    floatX *d_inp = upload_x(inp, (size_t)N * C), *d_w = upload_x(w, (size_t)OC * C);
    if (ld > C) { // the rounded values again, with the bias columns
        float* padded = with_bias_columns(inp, N, C);
        dev_free(d_inp);
        d_inp = upload_x(padded, (size_t)N * ld);
        free(padded);
    }
    floatX* d_bias = upload_x(bias, OC);
    floatX* d_out = (floatX*)poisoned((size_t)N * OC * sizeof(floatX));
    float* out = host_floats((size_t)N * OC);
    matmul_forward(d_out, d_inp, d_w, with_bias ? d_bias : NULL, NULL, N, C, OC, ld, group_rows);
    cpu_matmul_forward(out, inp, w, with_bias ? bias : NULL, NULL, N, C, OC, C, N);
    snprintf(name, sizeof name, "matmul_forward N=%d C=%d OC=%d bias=%d ld=%d", N, C, OC, with_bias, ld);
    check_x(name, d_out, out, (size_t)N * OC, 1);
    // With a residual added in the same sum (one rounding): values as large as the product's, so a
    // residual left out, added twice or rounded apart fails.
    float* residual = random_array((size_t)N * OC, -8, 8);
    floatX* d_residual = upload_x(residual, (size_t)N * OC);
    floatX* d_sum = (floatX*)poisoned((size_t)N * OC * sizeof(floatX));
    matmul_forward(d_sum, d_inp, d_w, with_bias ? d_bias : NULL, d_residual, N, C, OC, ld, group_rows);
    cpu_matmul_forward(out, inp, w, with_bias ? bias : NULL, residual, N, C, OC, C, N);
    snprintf(name, sizeof name, "matmul_forward + residual N=%d C=%d OC=%d bias=%d ld=%d", N, C, OC, with_bias, ld);
    check_x(name, d_sum, out, (size_t)N * OC, 1);
    free(residual);
    dev_free(d_residual), dev_free(d_sum);

    float *dout = random_array((size_t)N * OC, -1, 1), *dw = random_array((size_t)OC * C, -1, 1);
    float *db = random_array(OC, -1, 1), *dinp = host_floats((size_t)N * C);
    floatX* d_dout = upload_x(dout, (size_t)N * OC);
    float *d_dw = upload_f(dw, (size_t)OC * C), *d_db = upload_f(db, OC);
    floatX* d_dinp = (floatX*)poisoned((size_t)N * C * sizeof(floatX));
    matmul_backward(d_dinp, d_dw, with_bias ? d_db : NULL, d_dout, d_inp, d_w, N, C, OC, ld, group_rows, GRAD_ADD);
    cpu_matmul_backward(dinp, dw, with_bias ? db : NULL, dout, inp, w, N, C, OC, C, group_rows, GRAD_ADD);
    snprintf(name, sizeof name, "matmul_backward dinp N=%d C=%d OC=%d ld=%d", N, C, OC, ld);
    check_x(name, d_dinp, dinp, (size_t)N * C, 1);
    snprintf(name, sizeof name, "matmul_backward dweight N=%d C=%d OC=%d group_rows=%d ld=%d", N, C, OC, group_rows, ld);
    check_f(name, d_dw, dw, (size_t)OC * C, GRAD_TOLERANCE);
    snprintf(name, sizeof name, "matmul_backward dbias N=%d C=%d OC=%d bias=%d group_rows=%d ld=%d", N, C, OC,
             with_bias, group_rows, ld);
    check_f(name, d_db, db, OC, GRAD_TOLERANCE); // unchanged random values when there is no bias
    free(inp), free(w), free(bias), free(out), free(dout), free(dw), free(db), free(dinp);
    dev_free(d_inp), dev_free(d_w), dev_free(d_bias), dev_free(d_out), dev_free(d_dout), dev_free(d_dw);
    dev_free(d_db), dev_free(d_dinp);
}

// The fc layer's product with its GELU (matmul_forward_gelu): pre against the CPU's product, out
// against the CPU's GELU of it and bit for bit gelu_forward of the pre the GPU wrote (what recompute
// rebuilds it with), and the same rows moved down by `shift` rows of the same call shape giving
// the same bits (the model's batch invariance: a row's outputs depend on its input alone, whatever
// its place in the product's tiles).
static void test_matmul_forward_gelu(int N, int C, int OC, int with_bias, int ld, int shift) {
    char name[160];
    float *inp = random_array((size_t)N * C, -1, 1), *w = random_array((size_t)OC * C, -1, 1);
    float* bias = random_array(OC, -1, 1);
    floatX *d_inp = upload_x(inp, (size_t)N * C), *d_w = upload_x(w, (size_t)OC * C), *d_bias = upload_x(bias, OC);
    if (ld > C) {
        float* padded = with_bias_columns(inp, N, C);
        dev_free(d_inp);
        d_inp = upload_x(padded, (size_t)N * ld);
        free(padded);
    }
    const size_t n = (size_t)N * OC;
    floatX *d_pre = (floatX*)poisoned(n * sizeof(floatX)), *d_out = (floatX*)poisoned(n * sizeof(floatX));
    matmul_forward_gelu(d_pre, d_out, d_inp, d_w, with_bias ? d_bias : NULL, N, C, OC, ld, N);
    float *pre = host_floats(n), *out = host_floats(n);
    cpu_matmul_forward_gelu(pre, out, inp, w, with_bias ? bias : NULL, N, C, OC, C, N);
    snprintf(name, sizeof name, "matmul_forward_gelu pre N=%d C=%d OC=%d bias=%d ld=%d", N, C, OC, with_bias, ld);
    check_x(name, d_pre, pre, n, 1);
    snprintf(name, sizeof name, "matmul_forward_gelu out N=%d C=%d OC=%d bias=%d ld=%d", N, C, OC, with_bias, ld);
    check_x(name, d_out, out, n, 2);
    floatX* d_gelu = (floatX*)poisoned(n * sizeof(floatX));
    gelu_forward(d_gelu, d_pre, n);
    snprintf(name, sizeof name, "matmul_forward_gelu out N=%d C=%d OC=%d = gelu_forward(pre), bit for bit", N, C, OC);
    int same = same_bytes(d_gelu, d_out, n * sizeof(floatX));
    test_check(same, name, "%s", same ? "equal" : "bits differ");
    // The input's rows moved down by shift (its last rows first), multiplied in a call of the same shape.
    floatX* d_moved = (floatX*)poisoned((size_t)N * ld * sizeof(floatX));
    dev_copy(d_moved + (size_t)shift * ld, d_inp, (size_t)(N - shift) * ld * sizeof(floatX));
    dev_copy(d_moved, d_inp + (size_t)(N - shift) * ld, (size_t)shift * ld * sizeof(floatX));
    floatX *d_moved_pre = (floatX*)poisoned(n * sizeof(floatX)), *d_moved_out = (floatX*)poisoned(n * sizeof(floatX));
    matmul_forward_gelu(d_moved_pre, d_moved_out, d_moved, d_w, with_bias ? d_bias : NULL, N, C, OC, ld, N);
    snprintf(name, sizeof name, "matmul_forward_gelu N=%d C=%d OC=%d: rows moved down by %d, bit for bit", N, C, OC,
             shift);
    const size_t kept = (size_t)(N - shift) * OC * sizeof(floatX);
    same = same_bytes(d_moved_pre + (size_t)shift * OC, d_pre, kept) &&
           same_bytes(d_moved_out + (size_t)shift * OC, d_out, kept);
    test_check(same, name, "%s", same ? "equal" : "bits differ");
    free(inp), free(w), free(bias), free(pre), free(out);
    dev_free(d_inp), dev_free(d_w), dev_free(d_bias), dev_free(d_pre), dev_free(d_out), dev_free(d_gelu);
    dev_free(d_moved), dev_free(d_moved_pre), dev_free(d_moved_out);
}

// matmul_backward twice from the same starting gradients gives the same bits (cuBLASLt's products
// and the column sums of dbias each run in a fixed order), and so does matmul_backward_weights, on
// the second stream and on the default one (each forced by the SM count it sees: the second stream
// is taken where the rows make a chunk for every SM). Its gradients are copied on the default stream
// right after matmul_backward_wait, the host waiting for nothing: were the copies not ordered after
// the second stream's products, they would take the gradients before those were made. With ld > C
// the input has the bias columns, and dbias comes from the product.
static void test_matmul_backward_rerun(int N, int C, int OC, int group_rows, int ld) {
    float* inp = random_linear_input(N, C, ld);
    float* w = random_array((size_t)OC * C, -1, 1);
    float *dout = random_array((size_t)N * OC, -1, 1), *dw = random_array((size_t)OC * C, -1, 1);
    float* db = random_array(OC, -1, 1);
    floatX *d_inp = upload_x(inp, (size_t)N * ld), *d_w = upload_x(w, (size_t)OC * C);
    floatX* d_dout = upload_x(dout, (size_t)N * OC);
    floatX* d_dinp = (floatX*)poisoned((size_t)N * C * sizeof(floatX));
    enum { RUNS = 4 };
    const char* runs[RUNS] = {"matmul_backward", "matmul_backward rerun", "matmul_backward_weights (second stream)",
                              "matmul_backward_weights (default stream)"};
    float *d_dw[RUNS], *d_db[RUNS];
    for (int run = 0; run < RUNS; run++) {
        if (run < 2) {
            d_dw[run] = upload_f(dw, (size_t)OC * C), d_db[run] = upload_f(db, OC);
            matmul_backward(d_dinp, d_dw[run], d_db[run], d_dout, d_inp, d_w, N, C, OC, ld, group_rows, GRAD_ADD);
        } else { // the copies' destinations poisoned, so that one left unwritten fails
            d_dw[run] = (float*)poisoned((size_t)OC * C * sizeof(float));
            d_db[run] = (float*)poisoned(OC * sizeof(float));
            float *made_dw = upload_f(dw, (size_t)OC * C), *made_db = upload_f(db, OC);
            const int sm_count = device_sm_count;
            device_sm_count = run == 2 ? 1 : N + 1; // N rows make at most N chunks
            matmul_backward_weights(made_dw, made_db, d_dout, d_inp, N, C, OC, ld, group_rows, GRAD_ADD);
            device_sm_count = sm_count;
            matmul_backward_wait();
            dev_copy(d_dw[run], made_dw, (size_t)OC * C * sizeof(float));
            dev_copy(d_db[run], made_db, OC * sizeof(float));
            dev_synchronize();
            dev_free(made_dw), dev_free(made_db);
        }
    }
    const char* names[] = {"dweight", "dbias"};
    const size_t sizes[] = {(size_t)OC * C, (size_t)OC};
    float** grads[] = {d_dw, d_db};
    for (int k = 0; k < 2; k++) {
        float* first = host_floats(sizes[k]);
        dev_download(first, grads[k][0], sizes[k] * sizeof(float));
        for (int run = 1; run < RUNS; run++) {
            float* other = host_floats(sizes[k]);
            dev_download(other, grads[k][run], sizes[k] * sizeof(float));
            char name[160];
            snprintf(name, sizeof name, "%s %s N=%d C=%d OC=%d group_rows=%d ld=%d: matmul_backward's bits", runs[run],
                     names[k], N, C, OC, group_rows, ld);
            int same = memcmp(first, other, sizes[k] * sizeof(float)) == 0;
            test_check(same, name, "%s", same ? "equal" : "bits differ");
            free(other);
        }
        free(first);
        for (int run = 0; run < RUNS; run++) dev_free(grads[k][run]);
    }
    free(inp), free(w), free(dout), free(dw), free(db);
    dev_free(d_inp), dev_free(d_w), dev_free(d_dout), dev_free(d_dinp);
}

// GRAD_WRITE (kernels.h): the weight gradient written over poison (NaN, so that an element read or left
// unwritten fails) has the bits of GRAD_ADD into zeros, through matmul_backward, matmul_backward_weights
// (the second stream) and, where the input has no bias columns, matmul_backward_gelu; dbias is added to
// in all of them. Shapes of their own, so that the first call of each (which checks the batched
// products of several groups against a call per group) also runs with GRAD_WRITE.
static void test_weight_gradient_write(int N, int C, int OC, int group_rows, int ld) {
    float* inp = random_linear_input(N, C, ld);
    float* w = random_array((size_t)OC * C, -1, 1);
    float *dout = random_array((size_t)N * OC, -1, 1), *db = random_array(OC, -1, 1);
    float* zeros = host_floats((size_t)OC * C);
    memset(zeros, 0, (size_t)OC * C * sizeof(float));
    float* pre = random_array((size_t)N * C, -2, 2);
    floatX *d_inp = upload_x(inp, (size_t)N * ld), *d_w = upload_x(w, (size_t)OC * C);
    floatX *d_dout = upload_x(dout, (size_t)N * OC), *d_pre = upload_x(pre, (size_t)N * C);
    floatX* d_dinp = (floatX*)poisoned((size_t)N * C * sizeof(floatX));
    enum { WRITTEN = 3 };
    const char* calls[WRITTEN] = {"matmul_backward", "matmul_backward_weights", "matmul_backward_gelu"};
    for (int call = 0; call < (ld == C ? WRITTEN : 2); call++) {
        // The reference after the written run, so that the written run is the shape's first call.
        float *d_dw[2] = {(float*)poisoned((size_t)OC * C * sizeof(float)), upload_f(zeros, (size_t)OC * C)};
        float* d_db[2] = {upload_f(db, OC), upload_f(db, OC)};
        for (int run = 0; run < 2; run++) {
            const int mode = run == 0 ? GRAD_WRITE : GRAD_ADD;
            if (call == 0)
                matmul_backward(d_dinp, d_dw[run], d_db[run], d_dout, d_inp, d_w, N, C, OC, ld, group_rows, mode);
            if (call == 1) {
                matmul_backward_weights(d_dw[run], d_db[run], d_dout, d_inp, N, C, OC, ld, group_rows, mode);
                matmul_backward_wait();
            }
            if (call == 2)
                matmul_backward_gelu(d_dinp, d_dw[run], d_db[run], d_dout, d_inp, d_w, d_pre, N, C, OC, group_rows, mode);
        }
        char name[200];
        snprintf(name, sizeof name, "%s GRAD_WRITE N=%d C=%d OC=%d group_rows=%d ld=%d: the bits of GRAD_ADD into zeros",
                 calls[call], N, C, OC, group_rows, ld);
        const int same = same_bytes(d_dw[0], d_dw[1], (size_t)OC * C * sizeof(float)) &&
                         same_bytes(d_db[0], d_db[1], OC * sizeof(float));
        test_check(same, name, "%s", same ? "dweight and dbias equal" : "bits differ");
        for (int run = 0; run < 2; run++) dev_free(d_dw[run]), dev_free(d_db[run]);
    }
    free(inp), free(w), free(dout), free(db), free(zeros), free(pre);
    dev_free(d_inp), dev_free(d_w), dev_free(d_dout), dev_free(d_pre), dev_free(d_dinp);
}

// The backward of a layer (N, OC) -> (N, C) whose input is gelu(pre), pre (N, C), with the GELU's
// backward fused into it, against the CPU's matmul and GELU backward in turn. In BF16, C a multiple
// of 8 takes cuBLASLt's DGELU epilogue, other widths the unfused fallback; FP32 and FP16 always take
// the fallback. dinp rounds once, after gelu' of a pre that was rounded on upload (2).
static void test_matmul_backward_gelu(int N, int C, int OC) {
    char name[128];
    float *inp = random_array((size_t)N * C, -1, 1), *w = random_array((size_t)OC * C, -1, 1);
    floatX *d_inp = upload_x(inp, (size_t)N * C), *d_w = upload_x(w, (size_t)OC * C);
    float *dout = random_array((size_t)N * OC, -1, 1), *dw = random_array((size_t)OC * C, -1, 1);
    float *db = random_array(OC, -1, 1), *gelu_pre = random_array((size_t)N * C, -4, 4);
    float* dinp = host_floats((size_t)N * C);
    floatX* d_dout = upload_x(dout, (size_t)N * OC);
    float *d_dw = upload_f(dw, (size_t)OC * C), *d_db = upload_f(db, OC);
    floatX* d_gelu_pre = upload_x(gelu_pre, (size_t)N * C);
    floatX* d_dinp = (floatX*)poisoned((size_t)N * C * sizeof(floatX));
    matmul_backward_gelu(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_gelu_pre, N, C, OC, N, GRAD_ADD);
    cpu_matmul_backward_gelu(dinp, dw, db, dout, inp, w, gelu_pre, N, C, OC, N, GRAD_ADD);
    snprintf(name, sizeof name, "matmul_backward_gelu dinp N=%d C=%d OC=%d", N, C, OC);
    check_x(name, d_dinp, dinp, (size_t)N * C, 2);
    snprintf(name, sizeof name, "matmul_backward_gelu dweight N=%d C=%d OC=%d", N, C, OC);
    check_f(name, d_dw, dw, (size_t)OC * C, GRAD_TOLERANCE);
    snprintf(name, sizeof name, "matmul_backward_gelu dbias N=%d C=%d OC=%d", N, C, OC);
    check_f(name, d_db, db, OC, GRAD_TOLERANCE);
    free(inp), free(w), free(dout), free(dw), free(db), free(gelu_pre), free(dinp);
    dev_free(d_inp), dev_free(d_w), dev_free(d_dout), dev_free(d_dw), dev_free(d_db), dev_free(d_gelu_pre);
    dev_free(d_dinp);
}

// With group_rows = group_rows = T, the products that make each row of their output from a row of
// their input (the forward's, dinp) over B sequences in one call must give the bits of B calls over
// one sequence each. matmul.cu decides on a shape's first call whether one cuBLASLt call may serve
// all its groups, so that call runs on other inputs first and the calls compared are later ones.
static void test_row_group_invariance(int B, int T, int C, int OC) {
    const int N = B * T, OUTPUTS = 6;
    const char* names[OUTPUTS] = {"matmul_forward", "matmul_forward + residual", "matmul_forward_gelu pre",
                                  "matmul_forward_gelu out", "matmul_backward dinp", "matmul_backward_gelu dinp"};
    const size_t sizes[OUTPUTS] = {(size_t)N * OC, (size_t)N * OC, (size_t)N * OC, (size_t)N * OC, (size_t)N * C,
                                   (size_t)N * C};
    float* w = random_array((size_t)OC * C, -1, 1); // its first OC values are the bias too
    floatX* d_w = upload_x(w, (size_t)OC * C);
    floatX* outs[2][OUTPUTS]; // [0]: one call over B sequences; [1]: B calls over one sequence each
    for (int k = 0; k < 2; k++)
        for (int o = 0; o < OUTPUTS; o++) outs[k][o] = (floatX*)poisoned(sizes[o] * sizeof(floatX));
    for (int set = 0; set < 2; set++) { // set 0: the first calls of these shapes; set 1: compared
        float *inp = random_array((size_t)N * C, -1, 1), *dout = random_array((size_t)N * OC, -1, 1);
        float *dout_c = random_array((size_t)N * C, -1, 1), *pre = random_array((size_t)N * C, -4, 4);
        floatX *x = upload_x(inp, (size_t)N * C), *d_dout = upload_x(dout, (size_t)N * OC);
        floatX *d_dout_c = upload_x(dout_c, (size_t)N * C), *d_pre = upload_x(pre, (size_t)N * C);
        for (int k = 0; k < (set == 0 ? 1 : 2); k++) {
            const int calls = k == 0 ? 1 : B, rows = N / calls;
            floatX** out = outs[k];
            for (int b = 0; b < calls; b++) {
                const size_t r0 = (size_t)b * rows;
                matmul_forward(out[0] + r0 * OC, x + r0 * C, d_w, d_w, NULL, rows, C, OC, C, T);
                matmul_forward(out[1] + r0 * OC, x + r0 * C, d_w, d_w, d_dout + r0 * OC, rows, C, OC, C, T);
                matmul_forward_gelu(out[2] + r0 * OC, out[3] + r0 * OC, x + r0 * C, d_w, d_w, rows, C, OC, C, T);
                matmul_backward(out[4] + r0 * C, NULL, NULL, d_dout + r0 * OC, x + r0 * C, d_w, rows, C, OC, C, T,
                                GRAD_ADD);
                matmul_backward_gelu(out[5] + r0 * C, NULL, NULL, d_dout_c + r0 * C, x + r0 * C, d_w, d_pre + r0 * C,
                                     rows, C, C, T, GRAD_ADD);
            }
        }
        free(inp), free(dout), free(dout_c), free(pre);
        dev_free(x), dev_free(d_dout), dev_free(d_dout_c), dev_free(d_pre);
    }
    for (int o = 0; o < OUTPUTS; o++) {
        char name[160];
        snprintf(name, sizeof name, "%s: B=%d T=%d C=%d OC=%d in one call (groups of T rows) = %d calls of one "
                 "sequence, bit for bit", names[o], B, T, C, OC, B);
        const int same = same_bytes(outs[0][o], outs[1][o], sizes[o] * sizeof(floatX));
        test_check(same, name, "%s", same ? "equal" : "bits differ");
        dev_free(outs[0][o]), dev_free(outs[1][o]);
    }
    free(w);
    dev_free(d_w);
}

// With group_rows = T, one call over B sequences must give the bits of B calls over one sequence
// each (--batch-invariant), for every kernel that sums parameter gradients. T = 300 gives each
// group two column-sum chunks, the second one short. matmul.cu decides on a shape's first call
// whether one batched cuBLASLt call may make several groups' weight gradients, so one call over the
// B sequences runs first, and the calls compared are later ones.
static void test_batch_invariance(int B, int T, int C, int OC) {
    const int N = B * T, vocab = 13;
    float *inp = random_array((size_t)N * C, -1, 1), *w = random_array((size_t)OC * C, -1, 1);
    float *dout = random_array((size_t)N * OC, -1, 1), *pre = random_array((size_t)N * C, -4, 4);
    const size_t largest = (size_t)(OC > T ? OC : T) * C; // of the gradients below (vocab < OC, T)
    float *dout_c = random_array((size_t)N * C, -1, 1), *prefill = random_array(largest, -1, 1);
    int* tokens = (int*)xmalloc((size_t)N * sizeof(int), "tokens");
    for (int i = 0; i < N; i++) tokens[i] = (int)(test_uniform(&rng) * vocab);
    int* d_tokens = upload_tokens(tokens, N);
    floatX *d_inp = upload_x(inp, (size_t)N * C), *d_w = upload_x(w, (size_t)OC * C);
    floatX *d_dout = upload_x(dout, (size_t)N * OC), *d_pre = upload_x(pre, (size_t)N * C);
    floatX* d_dout_c = upload_x(dout_c, (size_t)N * C);
    floatX* d_dinp = (floatX*)poisoned((size_t)N * OC * sizeof(floatX)); // scratch, not compared
    // The layernorm's output with the bias columns: the input of the matmul's second form (ln2 into fc).
    const int ld_ln = linear_bias_ld(C);
    floatX* d_ln_out = (floatX*)poisoned((size_t)N * ld_ln * sizeof(floatX));
    float *d_mean = (float*)poisoned(N * sizeof(float)), *d_rstd = (float*)poisoned(N * sizeof(float));
    layernorm_forward(d_ln_out, d_mean, d_rstd, d_inp, d_w, d_w + C, N, C, ld_ln);
    const char* names[] = {"matmul_backward dweight", "matmul_backward dbias", "matmul_backward_gelu dweight",
                           "matmul_backward_gelu dbias", "layernorm_backward dweight", "layernorm_backward dbias",
                           "encoder_backward dwte", "encoder_backward dwpe", "layernorm_backward dinp_sums",
                           "matmul_backward with the bias columns dweight",
                           "matmul_backward with the bias columns dbias"};
    const size_t sizes[] = {(size_t)OC * C, (size_t)OC, (size_t)C * C, (size_t)C, (size_t)C, (size_t)C,
                            (size_t)vocab * C, (size_t)T * C, (size_t)C, (size_t)OC * C, (size_t)OC};
    const int GRADS = 11;
    float* grads[3][GRADS]; // [0]: one call over B sequences; [1]: B calls over one sequence each; [2]: the first
    for (int k : {2, 0, 1}) {
        for (int g = 0; g < GRADS; g++) grads[k][g] = upload_f(prefill, sizes[g]);
        int calls = k == 1 ? B : 1, rows = N / calls;
        for (int b = 0; b < calls; b++) {
            size_t r0 = (size_t)b * rows;
            matmul_backward(d_dinp, grads[k][0], grads[k][1], d_dout + r0 * OC, d_inp + r0 * C, d_w, rows, C, OC, C,
                            T, GRAD_ADD);
            matmul_backward(d_dinp, grads[k][9], grads[k][10], d_dout + r0 * OC, d_ln_out + r0 * ld_ln, d_w, rows, C,
                            OC, ld_ln, T, GRAD_ADD);
            matmul_backward_gelu(d_dinp, grads[k][2], grads[k][3], d_dout_c + r0 * C, d_inp + r0 * C, d_w,
                                 d_pre + r0 * C, rows, C, C, T, GRAD_ADD);
            layernorm_backward(d_dinp, grads[k][4], grads[k][5], grads[k][8], d_dout_c + r0 * C, d_inp + r0 * C,
                               d_w, d_mean + r0, d_rstd + r0, rows, C, T, GRAD_ADD);
            encoder_backward(grads[k][6], grads[k][7], d_dout_c + r0 * C, d_tokens + r0, rows / T, T, C);
        }
    }
    for (int g = 0; g < GRADS; g++) {
        float *one = host_floats(sizes[g]), *split = host_floats(sizes[g]);
        dev_download(one, grads[0][g], sizes[g] * sizeof(float));
        dev_download(split, grads[1][g], sizes[g] * sizeof(float));
        char name[160];
        snprintf(name, sizeof name, "%s: B=%d T=%d in one call = %d calls of one sequence, bit for bit", names[g],
                 B, T, B);
        int same = memcmp(one, split, sizes[g] * sizeof(float)) == 0;
        test_check(same, name, "%s", same ? "equal" : "bits differ");
        free(one), free(split);
        dev_free(grads[0][g]), dev_free(grads[1][g]), dev_free(grads[2][g]);
    }
    free(inp), free(w), free(dout), free(pre), free(dout_c), free(prefill), free(tokens);
    dev_free(d_tokens), dev_free(d_inp), dev_free(d_w), dev_free(d_dout), dev_free(d_pre), dev_free(d_dout_c);
    dev_free(d_dinp), dev_free(d_ln_out), dev_free(d_mean), dev_free(d_rstd);
}

// gelu forward and backward; `offset` elements into the arrays makes them misaligned for the
// 16-byte path.
static void test_elementwise(size_t n, size_t offset) {
    char name[128];
    float *a = random_array(n + offset, -4, 4), *b = random_array(n + offset, -1, 1);
    floatX *d_a = upload_x(a, n + offset), *d_b = upload_x(b, n + offset);
    floatX* d_out = (floatX*)poisoned((n + offset) * sizeof(floatX));
    float* want = host_floats(n);
    gelu_forward(d_out + offset, d_a + offset, n);
    cpu_gelu_forward(want, a + offset, n);
    snprintf(name, sizeof name, "gelu_forward n=%zu offset=%zu", n, offset);
    check_x(name, d_out + offset, want, n, 1);
    gelu_backward(d_out + offset, d_a + offset, d_b + offset, n);
    cpu_gelu_backward(want, a + offset, b + offset, n);
    snprintf(name, sizeof name, "gelu_backward n=%zu offset=%zu", n, offset);
    check_x(name, d_out + offset, want, n, 1);
    free(a), free(b), free(want);
    dev_free(d_a), dev_free(d_b), dev_free(d_out);
}

static void test_classifier(int N, int V, int Vp) {
    char name[128];
    size_t n = (size_t)N * Vp;
    float* logits = host_floats(n);
    test_fill_normal(logits, n, 3.0f, &rng);
    int* targets = (int*)xmalloc(N * sizeof(int), "targets");
    for (int i = 0; i < N; i++) targets[i] = (int)(test_uniform(&rng) * V);
    targets[0] = V - 1; // the last real column
    floatX* d_logits = upload_x(logits, n);
    int* d_targets = upload_tokens(targets, N);
    float* d_losses = (float*)poisoned(N * sizeof(float));
    float* losses = host_floats(N);
    float dloss = GRADIENT_SCALE / N;
    // Without dlogits the logits must stay as they were.
    fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp, 0);
    float* kept = host_floats(n);
    download_x(kept, d_logits, n);
    snprintf(name, sizeof name, "fused_classifier keeps logits N=%d V=%d Vp=%d", N, V, Vp);
    int kept_same = memcmp(kept, logits, n * sizeof(float)) == 0;
    test_check(kept_same, name, "%s", kept_same ? "logits unchanged" : "logits changed");
    cudaCheck(cudaMemset(d_losses, 0xff, N * sizeof(float)));
    fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp, 1);
    cpu_fused_classifier(logits, losses, targets, dloss, N, V, Vp, 1);
    snprintf(name, sizeof name, "fused_classifier losses N=%d V=%d Vp=%d", N, V, Vp);
    check_f(name, d_losses, losses, N, 1e-5); // fp32 from identical inputs in both builds
    snprintf(name, sizeof name, "fused_classifier dlogits N=%d V=%d Vp=%d", N, V, Vp);
    check_x(name, d_logits, logits, n, 1);
    free(logits), free(targets), free(losses), free(kept);
    dev_free(d_logits), dev_free(d_targets), dev_free(d_losses);
}

// Whether head_classifier computes floatX logits (head.cu: always in FP16; BF16 off sm_90a, or C or
// Vp not a multiple of 8); sm90a_probe_kernel is built with this binary's code, as head.cu's kernel is.
__global__ void sm90a_probe_kernel(void) {}
static bool head_takes_floatX_logits(int C, int Vp) {
#if defined(PRECISION_BF16)
    return C % 8 != 0 || Vp % 8 != 0 || !sm90a_code_runs((const void*)sm90a_probe_kernel);
#else
    (void)C, (void)Vp;
    return sizeof(floatX) == 2;
#endif
}

// Whether head_classifier stages each logit less its target's in fp16 (head.cu, BF16 on sm_90a): the
// only path with far rows of its own.
static bool head_stages_fp16(int C, int Vp) { return sizeof(floatX) == 2 && !head_takes_floatX_logits(C, Vp); }

// The CPU's head as the GPU's other path computes it (head.cu): the logits in fp32, stored as floatX,
// then the classifier and the backward in fp32 on those stored logits. A far row's logits of hundreds
// are stored a few tenths of a nat apart in fp16 (several nats in bf16), which moves its probabilities
// by tens of percent; the reference must share that rounding, which is the path's, not an error.
// *largest: the largest |logit| of the real columns.
static void cpu_head_with_floatX_logits(float* losses, float* dinp, float* dweight, float* largest, const int* targets,
                                        float dloss, const float* inp, const float* weight, int N, int C, int V,
                                        int Vp, int group_rows) {
    float* logits = host_floats((size_t)N * Vp);
    cpu_matmul_forward(logits, inp, weight, NULL, NULL, N, C, Vp, C, group_rows);
    *largest = 0.0f;
    for (int r = 0; r < N; r++)
        for (int v = 0; v < V; v++) *largest = fmaxf(*largest, fabsf(logits[(size_t)r * Vp + v]));
    dev_free(upload_x(logits, (size_t)N * Vp)); // rounds the host copy as the GPU stores it
    cpu_fused_classifier(logits, losses, targets, dloss, N, V, Vp, 1);
    cpu_matmul_backward(dinp, dweight, NULL, logits, inp, weight, N, C, Vp, C, group_rows, GRAD_ADD);
    free(logits);
}

// Which rows test_head_classifier makes far (their largest logit far above their target's): none; row 1
// (inputs times 32: hundreds of nats, past fp32's exponentials); rows 1 and N - 2 (times 7: about 70
// nats, exponentials that fp32 still holds), in the first and last row blocks of the wgmma product
// (head.cu), with others between that have none; every row.
enum { FAR_NONE, FAR_ONE, FAR_TWO, FAR_ALL };
static float head_row_factor(int far, int r, int N) {
    if (far == FAR_ALL || ((far == FAR_ONE || far == FAR_TWO) && r == 1)) return 32.0f;
    return far == FAR_TWO && r == N - 2 ? 7.0f : 1.0f;
}

// head_classifier against the CPU's (matmul_forward, fused_classifier, matmul_backward in fp32).
// Logits of std about 3 (weights scaled by 3 / sqrt(C / 3)), far rows' inputs scaled up
// (head_row_factor), which the CUDA backend's H100/H200 path computes again (head.cu); the other rows'
// losses and dinp must keep the bits they have with no far rows. The GPU's losses differ from the
// CPU's by the fp16 staging of l - l_target (BF16: 2^-11 relative of a logit gap of a few units),
// dinp by the roundings of p~, of the product and of its row scale; dweight's increment by those of
// p~ and of inp's scaled rows. dweight starts from small random values, the size of its increments,
// so that both the sum and the increment are checked.
static void test_head_classifier(int N, int C, int V, int Vp, int group_rows, int far) {
    char name[160];
    // Every row far is for head.cu's far rows. The other paths' logits of hundreds (fp32, or floatX
    // as stored) sit at the edge of their tolerances, which rest on a far row or two.
    if (far == FAR_ALL && !head_stages_fp16(C, Vp)) {
        printf("SKIP head_classifier N=%d C=%d V=%d Vp=%d far=%d: no fp16-staged head here\n", N, C, V, Vp, far);
        return;
    }
    float *inp = random_array((size_t)N * C, -1, 1), *w = host_floats((size_t)Vp * C);
    test_fill_uniform(w, (size_t)Vp * C, -1, 1, &rng);
    const float w_scale = 3.0f / sqrtf(C / 3.0f);
    for (size_t i = 0; i < (size_t)Vp * C; i++) w[i] *= w_scale;
    // The rows that are not far are also checked against a call with none far (one or two far rows).
    const bool some_far = far != FAR_NONE && far != FAR_ALL;
    floatX* d_near_inp = some_far ? upload_x(inp, (size_t)N * C) : NULL; // before any row is made far
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) inp[(size_t)r * C + c] *= head_row_factor(far, r, N);
    int* targets = (int*)xmalloc(N * sizeof(int), "targets");
    for (int i = 0; i < N; i++) targets[i] = (int)(test_uniform(&rng) * V);
    targets[0] = V - 1; // the last real column
    float* dw = random_array((size_t)Vp * C, -1e-3f * GRADIENT_SCALE, 1e-3f * GRADIENT_SCALE);
    const float dloss = GRADIENT_SCALE / N;
    floatX *d_inp = upload_x(inp, (size_t)N * C), *d_w = upload_x(w, (size_t)Vp * C);
    int* d_targets = upload_tokens(targets, N);
    float* want_losses = host_floats(N);
    float *want_dinp = host_floats((size_t)N * C), *want_dw = host_floats((size_t)Vp * C);
    memcpy(want_dw, dw, (size_t)Vp * C * sizeof(float));
    // Absolute, of losses up to a few hundred. BF16: 0.02, and where the logits are staged in fp16
    // less the target's, half an fp16 rounding of each staged difference: up to 2^-11 of the row's
    // largest gap, which its loss bounds, so 2^-10 of the loss besides (rows that are not far reach
    // gaps of about 60, up to 0.03 nats). Where the GPU takes the other path (floatX logits), the
    // reference rounds its logits as the GPU stores them, and the GPU's own logits may round the other
    // way where its fp32 sum lies near a boundary: the target's and the largest, each up to half a
    // rounding's tolerance (bf16: 2^-9, fp16: 2^-11) of the largest.
    double loss_tol = sizeof(floatX) == 2 ? 0.02 : 1e-4;
    if (head_takes_floatX_logits(C, Vp)) {
        float largest;
        cpu_head_with_floatX_logits(want_losses, want_dinp, want_dw, &largest, targets, dloss, inp, w, N, C, V, Vp,
                                    group_rows);
        loss_tol = fmax(loss_tol, 2.0 * largest * tolerance(1) / 2.0);
    } else {
        void* scratch = xmalloc(cpu_head_scratch_bytes(N, C, Vp), "cpu head scratch");
        cpu_head_classifier(want_losses, want_dinp, want_dw, scratch, targets, dloss, inp, w, N, C, V, Vp,
                            group_rows, GRAD_ADD);
        free(scratch);
    }
    // Twice, each time into poisoned outputs and scratch: the second must give the first's bits.
    float* d_losses[2];
    floatX* d_dinp[2];
    float* d_dw[2];
    for (int run = 0; run < 2; run++) {
        d_losses[run] = (float*)poisoned(N * sizeof(float));
        d_dinp[run] = (floatX*)poisoned((size_t)N * C * sizeof(floatX));
        d_dw[run] = upload_f(dw, (size_t)Vp * C);
        void* d_scratch = poisoned(head_scratch_bytes(N, C, Vp));
        head_classifier(d_losses[run], d_dinp[run], d_dw[run], d_scratch, d_targets, dloss, d_inp, d_w, N, C, V, Vp,
                        group_rows, GRAD_ADD);
        dev_free(d_scratch);
    }
    float* got = host_floats((size_t)Vp * C);
    dev_download(got, d_losses[0], N * sizeof(float));
    snprintf(name, sizeof name, "head_classifier losses N=%d C=%d V=%d Vp=%d far=%d", N, C, V, Vp, far);
    test_close_f(name, got, want_losses, N, head_stages_fp16(C, Vp) ? 1.0 / 1024 : 0.0, loss_tol);
    snprintf(name, sizeof name, "head_classifier dinp N=%d C=%d V=%d Vp=%d far=%d", N, C, V, Vp, far);
    check_x(name, d_dinp[0], want_dinp, (size_t)N * C, 4);
    if (some_far) {
        // The rows that are not far, as head_classifier makes them with no far row among them.
        float *d_near_losses = (float*)poisoned(N * sizeof(float)), *d_near_dw = upload_f(dw, (size_t)Vp * C);
        floatX* d_near_dinp = (floatX*)poisoned((size_t)N * C * sizeof(floatX));
        void* d_scratch = poisoned(head_scratch_bytes(N, C, Vp));
        head_classifier(d_near_losses, d_near_dinp, d_near_dw, d_scratch, d_targets, dloss, d_near_inp, d_w, N, C, V,
                        Vp, group_rows, GRAD_ADD);
        int same = 1;
        for (int r = 0; r < N; r++)
            if (head_row_factor(far, r, N) == 1.0f)
                same &= same_bytes(d_near_losses + r, d_losses[0] + r, sizeof(float)) &&
                        same_bytes(d_near_dinp + (size_t)r * C, d_dinp[0] + (size_t)r * C, C * sizeof(floatX));
        snprintf(name, sizeof name, "head_classifier N=%d C=%d V=%d Vp=%d far=%d: the other rows' losses and dinp, "
                 "the bits they have with no far row", N, C, V, Vp, far);
        test_check(same, name, "%s", same ? "equal" : "bits differ");
        dev_free(d_near_losses), dev_free(d_near_dw), dev_free(d_near_dinp), dev_free(d_scratch);
    }
    // dweight's increment, the CPU's and the GPU's, less the same starting values
    dev_download(got, d_dw[0], (size_t)Vp * C * sizeof(float));
    for (size_t i = 0; i < (size_t)Vp * C; i++) got[i] -= dw[i], want_dw[i] -= dw[i];
    snprintf(name, sizeof name, "head_classifier dweight's increment N=%d C=%d V=%d Vp=%d groups of %d far=%d", N, C,
             V, Vp, group_rows, far);
    const double dw_tol = sizeof(floatX) == 2 ? tolerance(4) : GRAD_TOLERANCE;
    test_close_f(name, got, want_dw, (size_t)Vp * C, dw_tol, dw_tol * max_abs(want_dw, (size_t)Vp * C));
    snprintf(name, sizeof name, "head_classifier N=%d C=%d V=%d Vp=%d run twice, bit for bit", N, C, V, Vp);
    const int same = same_bytes(d_losses[0], d_losses[1], N * sizeof(float)) &&
                     same_bytes(d_dinp[0], d_dinp[1], (size_t)N * C * sizeof(floatX)) &&
                     same_bytes(d_dw[0], d_dw[1], (size_t)Vp * C * sizeof(float));
    test_check(same, name, "%s", same ? "equal" : "bits differ");
    // Without dloss: the losses alone, dinp and dweight untouched.
    floatX* d_dinp_kept = (floatX*)poisoned((size_t)N * C * sizeof(floatX));
    floatX* d_dinp_poison = (floatX*)poisoned((size_t)N * C * sizeof(floatX));
    float* d_losses_only = (float*)poisoned(N * sizeof(float));
    void* d_scratch = poisoned(head_scratch_bytes(N, C, Vp));
    head_classifier(d_losses_only, d_dinp_kept, d_dw[1], d_scratch, d_targets, 0.0f, d_inp, d_w, N, C, V, Vp,
                    group_rows, GRAD_ADD);
    snprintf(name, sizeof name, "head_classifier N=%d C=%d V=%d Vp=%d without dloss: the same losses, dinp and dweight "
             "untouched", N, C, V, Vp);
    const int untouched = same_bytes(d_losses_only, d_losses[0], N * sizeof(float)) &&
                          same_bytes(d_dinp_kept, d_dinp_poison, (size_t)N * C * sizeof(floatX)) &&
                          same_bytes(d_dw[1], d_dw[0], (size_t)Vp * C * sizeof(float));
    test_check(untouched, name, "%s", untouched ? "as said" : "differ");
    // GRAD_WRITE over poison (NaN): the bits of GRAD_ADD into zeros.
    memset(got, 0, (size_t)Vp * C * sizeof(float));
    float *d_dw_written = (float*)poisoned((size_t)Vp * C * sizeof(float)), *d_dw_added = upload_f(got, (size_t)Vp * C);
    const int modes[2] = {GRAD_WRITE, GRAD_ADD};
    float* d_dw_modes[2] = {d_dw_written, d_dw_added};
    for (int run = 0; run < 2; run++)
        head_classifier(d_losses_only, d_dinp_kept, d_dw_modes[run], d_scratch, d_targets, dloss, d_inp, d_w, N, C, V,
                        Vp, group_rows, modes[run]);
    snprintf(name, sizeof name, "head_classifier N=%d C=%d V=%d Vp=%d GRAD_WRITE: the bits of GRAD_ADD into zeros", N,
             C, V, Vp);
    const int written = same_bytes(d_dw_written, d_dw_added, (size_t)Vp * C * sizeof(float));
    test_check(written, name, "%s", written ? "equal" : "bits differ");
    dev_free(d_dw_written), dev_free(d_dw_added);
    free(inp), free(w), free(targets), free(dw), free(want_losses), free(want_dinp), free(want_dw);
    free(got);
    dev_free(d_inp), dev_free(d_near_inp), dev_free(d_w), dev_free(d_targets), dev_free(d_dinp_kept),
        dev_free(d_dinp_poison);
    dev_free(d_losses_only), dev_free(d_scratch);
    for (int run = 0; run < 2; run++) dev_free(d_losses[run]), dev_free(d_dinp[run]), dev_free(d_dw[run]);
}

// floatX roundings (BF16 counted, FP16 alike): forward: the scores (their absolute error 2^-9 |s|
// becomes a relative error of exp(s); |s| <= ~2 here, so 2), the probabilities (1), the output (1): 4. Backward adds dP, dS
// and the output rounding, with the forward's 4 inside: 8.
static void test_attention(int B, int T, int C, int NH) {
    char name[128];
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    float* qkv = random_array(n_qkv, -1, 1);
    floatX* d_qkv = upload_x(qkv, n_qkv);
    floatX* d_out = (floatX*)poisoned(n_out * sizeof(floatX));
    void* d_saved = poisoned(attention_saved_bytes(B, T, NH));
    float* out = host_floats(n_out);
    void* saved = xmalloc(cpu_attention_saved_bytes(B, T, NH), "cpu saved");
    attention_forward(d_out, d_saved, d_qkv, B, T, C, NH);
    cpu_attention_forward(out, saved, qkv, B, T, C, NH);
    snprintf(name, sizeof name, "attention_forward B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check_x(name, d_out, out, n_out, 4);

    float* dout = random_array(n_out, -1, 1);
    floatX* d_dout = upload_x(dout, n_out);
    floatX* d_dqkv = (floatX*)poisoned(n_qkv * sizeof(floatX));
    void* d_scratch = poisoned(attention_scratch_bytes(B, T, C, NH));
    float* dqkv = host_floats(n_qkv);
    void* scratch = xmalloc(cpu_attention_scratch_bytes(B, T, C, NH), "cpu scratch");
    float* db = random_array(3 * C, -1, 1); // the qkv bias gradient, accumulated into
    float* d_db = upload_f(db, 3 * C);
    attention_backward(d_dqkv, d_db, d_scratch, d_dout, d_qkv, d_out, d_saved, B, T, C, NH, T);
    cpu_attention_backward(dqkv, NULL, scratch, dout, qkv, out, saved, B, T, C, NH, T);
    snprintf(name, sizeof name, "attention_backward B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check_x(name, d_dqkv, dqkv, n_qkv, 8);
    add_stored_column_sums(db, d_dqkv, n_qkv, 3 * C); // the bias gradient sums dqkv as the GPU stored it
    snprintf(name, sizeof name, "attention_backward qkv bias gradient B=%d T=%d C=%d NH=%d", B, T, C, NH);
    check_f(name, d_db, db, 3 * C, GRAD_TOLERANCE);
    free(db);
    dev_free(d_db);
    free(qkv), free(out), free(saved), free(dout), free(dqkv), free(scratch);
    dev_free(d_qkv), dev_free(d_out), dev_free(d_saved), dev_free(d_dout), dev_free(d_dqkv), dev_free(d_scratch);
}

// ---- optimizer and initialisation ----------------------------------------------------------
static void test_grad_norm(size_t n) {
    char name[128];
    float* g = random_array(n, -1, 1);
    gradX* d_g = upload_g(g, n);
    double got = grad_norm_squared(d_g, n), want = cpu_grad_norm_squared(g, n);
    snprintf(name, sizeof name, "grad_norm_squared n=%zu", n);
    test_check(fabs(got - want) <= 1e-5 * want, name, "got %.9g want %.9g", got, want);
    snprintf(name, sizeof name, "grad_norm_squared deterministic n=%zu", n);
    double again = grad_norm_squared(d_g, n);
    test_check(again == got, name, "%.9g then %.9g", got, again);
    free(g);
    dev_free(d_g);
}

// dst += src against the CPU's sums (exact: one fp32 addition each), n odd so that no vector width
// divides it.
static void test_float_accumulate(size_t n) {
    char name[128];
    float *dst = random_array(n, -1, 1), *src = random_array(n, -1, 1);
    float* d_dst = upload_f(dst, n);
    float* d_src = upload_f(src, n);
    float_accumulate(d_dst, d_src, n);
    cpu_float_accumulate(dst, src, n);
    snprintf(name, sizeof name, "float_accumulate n=%zu", n);
    check_f(name, d_dst, dst, n, 0.0);
    free(dst);
    free(src);
    dev_free(d_dst);
    dev_free(d_src);
}

static void test_adamw(size_t n) {
    char name[128];
    float *w = random_array(n, -1, 1), *g = random_array(n, -1, 1);
    float *m = random_array(n, -0.1, 0.1), *v = random_array(n, 0, 0.01);
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.7f;
    const int t = 3;
    const unsigned long long seed = 1234;
    gradX* d_g = upload_g(g, n);
    float *d_m = (float*)dev_malloc(n * sizeof(float), "m"), *d_v = (float*)dev_malloc(n * sizeof(float), "v");
    dev_upload(d_m, m, n * sizeof(float));
    dev_upload(d_v, v, n * sizeof(float));
#if !defined(PRECISION_FP32)
    float* d_master = (float*)dev_malloc(n * sizeof(float), "master");
    dev_upload(d_master, w, n * sizeof(float));
    float* w_bf16 = (float*)xmalloc(n * sizeof(float), "w");
    memcpy(w_bf16, w, n * sizeof(float));
    floatX* d_w = upload_x(w_bf16, n); // the floatX parameters; the CPU updates the fp32 master
    cudaCheck(cudaMemset(d_w, 0xff, n * sizeof(floatX)));
    adamw_update(d_w, d_master, d_g, d_m, d_v, n, 0, lr, b1, b2, eps, wd, scale, t, seed);
    float* d_updated = d_master;
#else
    floatX* d_w = upload_x(w, n);
    adamw_update(d_w, NULL, d_g, d_m, d_v, n, 0, lr, b1, b2, eps, wd, scale, t, seed);
    float* d_updated = d_w;
#endif
    cpu_adamw_update(w, NULL, g, m, v, n, 0, lr, b1, b2, eps, wd, scale, t, seed);
    snprintf(name, sizeof name, "adamw_update weights n=%zu", n);
    check_f(name, d_updated, w, n, 1e-5);
    snprintf(name, sizeof name, "adamw_update m n=%zu", n);
    check_f(name, d_m, m, n, 1e-5);
    snprintf(name, sizeof name, "adamw_update v n=%zu", n);
    check_f(name, d_v, v, n, 1e-5);
#if defined(PRECISION_FP16)
    // Rounded to nearest: each fp16 weight within half an ulp of its master value (11 significant
    // bits; below 2^-14, fp16's subnormals, the ulp is 2^-24), and round_master_weights gives the
    // step's weights back bit for bit.
    float *master = host_floats(n), *param = host_floats(n);
    dev_download(master, d_master, n * sizeof(float));
    download_x(param, d_w, n);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        int exponent;
        frexpf(master[i], &exponent);
        double ulp = ldexp(1.0, exponent - 11 > -24 ? exponent - 11 : -24);
        if (!(fabs((double)param[i] - master[i]) <= ulp / 2)) off++;
    }
    snprintf(name, sizeof name, "adamw_update rounds the fp16 weights to nearest n=%zu", n);
    test_check(off == 0, name, "%zu of %zu fp16 weights are not the nearest to their master", off, n);
    floatX* d_rebuilt = (floatX*)poisoned(n * sizeof(floatX));
    round_master_weights(d_rebuilt, d_master, n, 0, t, seed);
    snprintf(name, sizeof name, "round_master_weights rebuilds the step's fp16 weights n=%zu", n);
    const int rebuilt = same_bytes(d_rebuilt, d_w, n * sizeof(floatX));
    test_check(rebuilt, name, "%s", rebuilt ? "bit for bit" : "the fp16 weights differ");
    dev_free(d_rebuilt), dev_free(d_master);
    free(master), free(param), free(w_bf16);
#elif defined(PRECISION_BF16)
    // Stochastic rounding: each bf16 weight is one of the two bf16 neighbours of its master value;
    // about a quarter (E[min(f, 1 - f)] for uniform fractions f) go to the farther one, and the
    // rounding errors average to zero.
    float *master = host_floats(n), *param = host_floats(n);
    dev_download(master, d_master, n * sizeof(float));
    download_x(param, d_w, n);
    size_t outside = 0, farther = 0;
    double mean_error = 0;
    for (size_t i = 0; i < n; i++) {
        int exponent;
        frexpf(master[i], &exponent);
        double ulp = ldexp(1.0, exponent - 8); // bf16 keeps 8 significant bits
        double error = ((double)param[i] - master[i]) / ulp;
        if (!(fabs(error) < 1.0)) outside++;
        if (fabs(error) > 0.5) farther++;
        mean_error += error / n;
    }
    snprintf(name, sizeof name, "adamw_update stochastic rounding brackets n=%zu", n);
    test_check(outside == 0, name, "%zu of %zu bf16 weights are not a neighbour of the master", outside, n);
    snprintf(name, sizeof name, "adamw_update stochastic rounding is stochastic n=%zu", n);
    test_check(fabs((double)farther / n - 0.25) < 0.03 && fabs(mean_error) < 0.01, name,
               "%.4f rounded to the farther neighbour (want ~0.25), mean error %.4f ulp (want ~0)",
               (double)farther / n, mean_error);
    // A ZeRO shard updates a tensor in pieces: with index0 the pieces round exactly like the whole.
    size_t cut = n / 3;
    floatX* d_pieces = upload_x(w_bf16, n);
    dev_upload(d_master, w, n * sizeof(float)); // w is now the CPU-updated weights: any start will do
    dev_upload(d_m, m, n * sizeof(float));
    dev_upload(d_v, v, n * sizeof(float));
    adamw_update(d_w, d_master, d_g, d_m, d_v, n, 0, lr, b1, b2, eps, wd, scale, t + 1, seed);
    float* whole_master = host_floats(n);
    dev_download(whole_master, d_master, n * sizeof(float));
    dev_upload(d_master, w, n * sizeof(float));
    dev_upload(d_m, m, n * sizeof(float));
    dev_upload(d_v, v, n * sizeof(float));
    adamw_update(d_pieces, d_master, d_g, d_m, d_v, cut, 0, lr, b1, b2, eps, wd, scale, t + 1, seed);
    adamw_update(d_pieces + cut, d_master + cut, d_g + cut, d_m + cut, d_v + cut, n - cut, cut, lr,
                 b1, b2, eps, wd, scale, t + 1, seed);
    // The second piece starts 8 bytes past a 16-byte boundary: one element at a time, where the
    // whole went four at a time; the master weights must not tell the two apart.
    dev_download(master, d_master, n * sizeof(float));
    snprintf(name, sizeof name, "adamw_update in two pieces (the second unaligned) updates like the whole n=%zu", n);
    test_check(memcmp(master, whole_master, n * sizeof(float)) == 0, name, "%s",
               memcmp(master, whole_master, n * sizeof(float)) == 0 ? "master weights bit for bit" : "the master weights differ");
    free(whole_master);
    download_x(master, d_w, n);
    download_x(param, d_pieces, n);
    snprintf(name, sizeof name, "adamw_update in two pieces rounds like the whole n=%zu", n);
    test_check(memcmp(master, param, n * sizeof(float)) == 0, name, "%s",
               memcmp(master, param, n * sizeof(float)) == 0 ? "bit for bit" : "the bf16 weights differ");
    // Rebuilding the bf16 weights of that step from its master weights gives them back exactly.
    cudaCheck(cudaMemset(d_pieces, 0xff, n * sizeof(floatX)));
    round_master_weights(d_pieces, d_master, n, 0, t + 1, seed);
    download_x(param, d_pieces, n);
    snprintf(name, sizeof name, "round_master_weights rebuilds the step's bf16 weights n=%zu", n);
    test_check(memcmp(master, param, n * sizeof(float)) == 0, name, "%s",
               memcmp(master, param, n * sizeof(float)) == 0 ? "bit for bit" : "the bf16 weights differ");
    dev_free(d_pieces);
    free(master), free(param), free(w_bf16);
    dev_free(d_master);
#endif
    free(w), free(g), free(m), free(v);
    dev_free(d_g), dev_free(d_m), dev_free(d_v), dev_free(d_w);
}

#if defined(GRADS_BF16)
// x rounded to bf16, to nearest even (finite x): add half an ulp of bf16, less one unless the kept
// last bit is odd, then cut the low 16 bits.
static float round_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &bits, sizeof x);
    return x;
}

// gradX_fold of n values at `offset` elements into their arrays (offset 0: the 16-byte path but for
// the tail; odd: one value at a time), mode GRAD_WRITE into poisoned bf16 (0xFFFF, NaN) and GRAD_ADD
// into random ones, against the CPU's fp32 sum rounded to nearest even, bit for bit. Every 5th value
// lies exactly halfway between two bf16 neighbours (the ties go to the even one); 16 values past the
// end must keep their poison.
static void test_gradX_fold(size_t n, size_t offset, int mode) {
    char name[160];
    const size_t guard = 16, total = offset + n + guard;
    float* src = random_array(total, -2, 2);
    for (size_t i = 0; i < total; i += 5) {
        uint32_t bits;
        memcpy(&bits, &src[i], sizeof bits);
        bits = (bits & 0xffff0000u) | 0x8000u;
        memcpy(&src[i], &bits, sizeof bits);
    }
    float* old = random_array(total, -2, 2);
    gradX* d_dst = (gradX*)poisoned(total * sizeof(gradX));
    if (mode == GRAD_ADD) {
        gradX* d_old = upload_x(old, offset + n); // old rounded to the bf16 it holds
        dev_copy(d_dst, d_old, (offset + n) * sizeof(gradX));
        dev_free(d_old);
    }
    float* d_src = upload_f(src, total);
    gradX_fold(d_dst + offset, d_src + offset, n, mode);
    uint16_t* got = (uint16_t*)xmalloc(total * sizeof(uint16_t), "folded");
    dev_download(got, d_dst, total * sizeof(gradX));
    size_t wrong = 0, first = n, guard_hit = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t k = offset + i;
        const float want = round_bf16(mode == GRAD_ADD ? old[k] + src[k] : src[k]); // the fp32 sum, rounded once
        uint32_t want_bits;
        memcpy(&want_bits, &want, sizeof want_bits);
        if (got[k] != (uint16_t)(want_bits >> 16) && wrong++ == 0) first = i;
    }
    for (size_t k = offset + n; k < total; k++) guard_hit += got[k] != 0xffffu;
    snprintf(name, sizeof name, "gradX_fold %s n=%zu offset=%zu: the fp32 %s rounded to nearest even, bit for bit",
             mode == GRAD_ADD ? "GRAD_ADD" : "GRAD_WRITE", n, offset, mode == GRAD_ADD ? "sum" : "value");
    test_check(wrong == 0, name, "%zu of %zu differ, the first at %zu (got 0x%04x)", wrong, n, first,
               wrong ? (unsigned)got[offset + first] : 0u);
    snprintf(name, sizeof name, "gradX_fold n=%zu offset=%zu writes nothing past its end", n, offset);
    test_check(guard_hit == 0, name, "%zu of the %zu values after the end changed", guard_hit, guard);
    free(src), free(old), free(got);
    dev_free(d_dst), dev_free(d_src);
}

// adamw_update on bf16 gradients against adamw_update_typed<float> on the same gradients as floats,
// from the same state: the bits of the master weights, the bf16 parameters, m and v. All arrays start
// `offset` elements in (odd: the one-at-a-time path).
static void test_adamw_bf16_grads(size_t n, size_t offset) {
    char name[160];
    const size_t total = offset + n;
    float *w = random_array(total, -1, 1), *g = random_array(total, -1, 1);
    float *m = random_array(total, -0.1, 0.1), *v = random_array(total, 0, 0.01);
    gradX* d_g = upload_g(g, total); // g is now the bf16 values
    float* d_g_float = upload_f(g, total);
    floatX* d_w[2];
    float *d_master[2], *d_m[2], *d_v[2];
    for (int k = 0; k < 2; k++) {
        float* w_copy = (float*)xmalloc(total * sizeof(float), "w");
        memcpy(w_copy, w, total * sizeof(float));
        d_w[k] = upload_x(w_copy, total);
        free(w_copy);
        d_master[k] = upload_f(w, total), d_m[k] = upload_f(m, total), d_v[k] = upload_f(v, total);
    }
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.7f;
    adamw_update(d_w[0] + offset, d_master[0] + offset, d_g + offset, d_m[0] + offset, d_v[0] + offset, n, offset,
                 lr, b1, b2, eps, wd, scale, 5, 99);
    adamw_update_typed(d_w[1] + offset, d_master[1] + offset, d_g_float + offset, d_m[1] + offset, d_v[1] + offset,
                       n, offset, lr, b1, b2, eps, wd, scale, 5, 99);
    const struct { const char* what; const void* a; const void* b; size_t bytes; } arrays[] = {
        {"master weights", d_master[0], d_master[1], total * sizeof(float)},
        {"bf16 weights", d_w[0], d_w[1], total * sizeof(floatX)},
        {"m", d_m[0], d_m[1], total * sizeof(float)},
        {"v", d_v[0], d_v[1], total * sizeof(float)}};
    for (const auto& a : arrays) {
        snprintf(name, sizeof name, "adamw_update on bf16 gradients: the %s of their float values n=%zu offset=%zu",
                 a.what, n, offset);
        const int same = same_bytes(a.a, a.b, a.bytes);
        test_check(same, name, "%s", same ? "bit for bit" : "they differ");
    }
    free(w), free(g), free(m), free(v);
    dev_free(d_g), dev_free(d_g_float);
    for (int k = 0; k < 2; k++) dev_free(d_w[k]), dev_free(d_master[k]), dev_free(d_m[k]), dev_free(d_v[k]);
}
#endif

static void test_init_normal(size_t n, unsigned long long seed, unsigned long long offset) {
    char name[128];
    float* d = (float*)poisoned(n * sizeof(float));
    float *got = host_floats(n), *want = host_floats(n);
    init_normal(d, n, 0.0f, 0.02f, seed, offset);
    dev_download(got, d, n * sizeof(float));
    cpu_init_normal(want, n, 0.0f, 0.02f, seed, offset);
    snprintf(name, sizeof name, "init_normal bit-identical to the CPU n=%zu seed=%llu offset=%llu", n, seed, offset);
    test_check(memcmp(got, want, n * sizeof(float)) == 0, name, "first values %.9g vs %.9g",
               (double)got[0], (double)want[0]);
    free(got), free(want);
    dev_free(d);
}

int main(void) {
    const char* seed_env = getenv("TEST_SEED");
    unsigned long long seed = seed_env ? strtoull(seed_env, NULL, 10) : (unsigned long long)time(NULL);
    printf("test_kernels_gpu seed %llu (TEST_SEED=%llu reruns it)\n", seed, seed);
    rng = test_rng(seed);
    backend_init(0);
    printf("%s, attention %s\n", backend_describe(), attention_name());

    test_encoder(3, 7, 37, 11, 0);
    test_encoder(2, 1, 768, 50, 0);
    test_encoder(4, 64, 72, 13, 0); // 16-byte rows; tokens recurring within and across sequences
    test_encoder(8, 300, 72, 3, 0); // long buckets only: about 800 positions each, summed per sequence
    test_encoder(5, 80, 37, 2, 0); // short buckets of about 200, staged 32 at a time across sequences, unaligned
    test_encoder(6, 700, 64, 400, 1); // a long bucket of 350 positions per sequence among short ones
    test_encoder(12, 200, 1100, 500, 1); // the same over two blocks of channels, rows not 16-byte aligned
    test_layernorm(1, 37, 1);
    test_layernorm(301, 771, 301);
    test_layernorm(513, 96, 513); // chunks of 256, 256 and 1 rows
    test_layernorm(900, 96, 300); // three groups of two row chunks each
    test_layernorm(600, 768, 600); // GPT-2's C; chunks of 256, 256 and 88 rows
    test_layernorm(520, 1001, 260); // C not a multiple of 8: rows unaligned; two groups of 256 + 4 rows
    test_layernorm(300, 1280, 300); // GPT-2 large's C: in BF16 40 KB of dinp sums and 10 KB of static
                                    // shared memory a block, past the 48 KB a launch gets without asking
    test_layernorm(777, 1600, 777); // GPT-2 XL's C: in BF16 some lanes hold 7 vectors of 8, others 6; a last
                                    // chunk of 9 rows
    test_layernorm(300, 2048, 300); // the widest rows in BF16's registers: 64 KB of dinp sums per block
    test_layernorm(70, 2101, 35); // wider than the registers hold (2048 in BF16, 1024 in FP32)
    test_layernorm_offset(7, 13, 1);
    test_layernorm_offset(64, 768, 3); // C a multiple of 8, arrays unaligned
    test_layernorm_offset(64, 768, 8); // aligned at an offset
    test_layernorm_offset(33, 771, 1);
    test_layernorm_offset(5, 2101, 5); // wider than the registers hold
    test_layernorm_offset(3, 1, 1);
    test_matmul(35, 37, 101, 1, 35, 37);
    test_matmul(1, 64, 40, 1, 1, 64);
    test_matmul(133, 96, 288, 0, 133, 96);
    test_matmul(300, 64, 264, 1, 300, 64); // 16-byte column sums for dbias, two row chunks
    test_matmul(600, 64, 264, 1, 300, 64); // two groups of two row chunks: one cuBLASLt call per group
    test_matmul(512, 128, 384, 1, 128, 128); // four groups
    test_matmul(64, 40, 20, 1, 32, 40);      // OC not a multiple of 8 (the column sums' element-wise loads)
    test_matmul(70, 40, 101, 1, 35, 40);     // groups whose rows start off 16-byte alignment
    // Inputs with the bias columns (the model's ln2 into fc): dbias from the weight gradient's product.
    test_matmul(35, 37, 101, 1, 35, linear_bias_ld(37));    // rows of an odd length
    test_matmul(133, 96, 288, 0, 133, linear_bias_ld(96));  // no bias: the plain product, strided
    test_matmul(600, 64, 264, 1, 300, linear_bias_ld(64));  // two groups, each its product and add
    test_matmul(1, 64, 40, 1, 1, linear_bias_ld(64));
    test_matmul(256, 768, 3072, 1, 256, linear_bias_ld(768)); // GPT-2 124M's fc
    test_matmul_backward_rerun(600, 64, 264, 300, 64);
    // On H100/H200 (BF16) its own kernel, in 128 x 256 tiles of 64-deep blocks: partial row, column
    // and depth blocks, two rows, blocks with several tiles each (3000 x 3072: 288 tiles), GPT-2's fc.
    test_matmul_forward_gelu(300, 768, 3072, 1, linear_bias_ld(768), 77);
    test_matmul_forward_gelu(3000, 256, 3072, 1, linear_bias_ld(256), 1000);
    test_matmul_forward_gelu(200, 40, 264, 1, 40, 3);
    test_matmul_forward_gelu(129, 96, 8, 0, linear_bias_ld(96), 1);
    test_matmul_forward_gelu(2, 64, 512, 1, 64, 1);
    test_matmul_forward_gelu(50, 37, 101, 1, 37, 10); // the fallback: rows and columns not 16-byte multiples
    test_matmul_backward_rerun(70, 40, 101, 35, 40);
    test_matmul_backward_rerun(600, 64, 264, 300, linear_bias_ld(64));
    // GPT-2 124M's fc at 8K tokens: a product long enough that the second stream is still running it
    // when matmul_backward_weights returns.
    test_matmul_backward_rerun(8192, 768, 3072, 8192, linear_bias_ld(768));
    test_weight_gradient_write(300, 64, 200, 300, 64);                      // one group: cuBLASLt's beta 0
    test_weight_gradient_write(600, 64, 264, 200, 64);                      // three groups, batched
    test_weight_gradient_write(70, 40, 101, 35, 40);                        // two groups, rows off alignment
    test_weight_gradient_write(600, 64, 264, 200, linear_bias_ld(64));      // the bias row, batched
    test_weight_gradient_write(8192, 768, 3072, 8192, linear_bias_ld(768)); // GPT-2 124M's fc
    test_matmul_backward_gelu(37, 96, 384);  // fused
    test_matmul_backward_gelu(35, 40, 101);  // fused (C 40)
    test_matmul_backward_gelu(33, 101, 64);  // unfused (C 101)
    test_row_group_invariance(3, 300, 96, 200);
    test_row_group_invariance(2, 35, 40, 101); // rows not 16-byte aligned
    test_row_group_invariance(4, 1024, 768, 2304); // GPT-2 124M's qkv at --batch-invariant 1
    test_batch_invariance(3, 300, 96, 200);
    test_batch_invariance(2, 600, 768, 768); // GPT-2's C in layernorm_backward's registers
    test_batch_invariance(2, 35, 40, 101); // rows not 16-byte aligned in every layer
    test_batch_invariance(4, 1024, 768, 2304); // GPT-2 124M's qkv at --batch-invariant 1
    test_elementwise(1, 0);
    test_elementwise(100003, 0);
    test_elementwise(100003, 3);
    test_classifier(5, 1000, 1024);
    test_classifier(3, 101, 107);
    test_classifier(4, 50257, 50304); // GPT-2's rows: cached, several loads in flight per thread, a ragged last vector
    test_classifier(3, 120001, 120008); // rows too long for shared memory: read from device memory twice
    test_head_classifier(300, 64, 1000, 1024, 300, FAR_TWO); // three row blocks, the middle one with no far row
    test_head_classifier(200, 96, 2500, 2504, 100, FAR_NONE); // a last tile of 200 columns, V not a multiple of 8
    test_head_classifier(130, 768, 50257, 50304, 130, FAR_ONE); // GPT-2's head
    test_head_classifier(260, 64, 1000, 1024, 130, FAR_ALL);
    test_head_classifier(50, 37, 300, 301, 50, FAR_NONE); // the other path (rows not 16-byte multiples): bf16 logits
    // head sizes 32 and 64: what both attention builds support (flash BF16 takes 32, 64 and 128)
    test_attention(2, 1, 64, 2);
    test_attention(3, 37, 192, 3);
    test_attention(2, 130, 128, 2);
    test_grad_norm(1000003);
    test_grad_norm(5000011); // four loads at a time, then the tail
    test_float_accumulate(1000003);
    test_adamw(100003);
#if defined(GRADS_BF16)
    for (int mode = GRAD_WRITE; mode <= GRAD_ADD; mode++) {
        test_gradX_fold(1, 0, mode);
        test_gradX_fold(100003, 0, mode); // 8 at a time, then a tail of 3
        test_gradX_fold(100003, 3, mode); // unaligned: one at a time
        test_gradX_fold(12345679, 0, mode); // many blocks
    }
    test_adamw_bf16_grads(100003, 0); // 4 at a time (8-byte loads of bf16), then the tail
    test_adamw_bf16_grads(100003, 1); // unaligned: one at a time
#endif
    test_init_normal(1000, 42, 0);
    test_init_normal(1001, 42, 12345);
    test_init_normal(7, 1337, 3);
    test_init_normal((1 << 22) + 3, 7, 5); // more than one upload chunk
    return test_summary("test_kernels_gpu");
}
