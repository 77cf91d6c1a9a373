// The GPU flash attention (kernels/cuda/attention_flash.cu) against the CPU flash reference
// (kernels/cpu/attention_flash.c, fp32): O, (m, l), dQ, dK, dV on fresh random inputs for T in
// {1, 7, 64, 65, 127, 1024, 1025, 4096, 4161}, several B and NH (up to 96 (b, h)), head sizes 64, 32 and
// 128; in the BF16 and FP16 builds with every tile configuration the GPU can run
// (FLASH_ATTN_CONFIG=sm80 and sm86, sm75 in FP16, and sm90, the wgmma kernels, where the code is an
// H100/H200's), each with dQ from its own kernel and summed by atomics (FLASH_ATTN_DETERMINISTIC=1
// and 0; not with the sm75 tiles, which leave it out). GPU outputs are poisoned with 0xFF
// bytes (NaN in fp32, bf16 and fp16) before every run, so an unwritten element fails, and every case runs
// twice to check that the results are bit-identical (with atomic dQ: all but dQ, and both runs' dQ
// against the reference). The seed is printed; TEST_SEED=n repeats a run. On a GPU with the
// shared memory of sm_75 (64 KB a block) the cases of head size 128 are left out (the sm75 tiles do
// not take it). In the BF16 and FP16 builds a sequence of more than 2^31 - 1 qkv elements (T x 3C) must be refused, in forked children.
// The backward also adds the qkv bias gradient (the column sums of dqkv, in groups of one
// sequence) into random values: against a float64 sum of the dqkv the GPU stored (the sums' fp32
// rounding is at most about 60 additions deep: 1e-5 of the largest column's sum of magnitudes;
// one row left out would be off by about 1 / (B T) of it), bit for bit on the second run where dQ
// is deterministic, and bit for bit against B calls of one sequence each (--batch-invariant);
// groups of rows that are not whole sequences are refused (in a forked child). attention_kernels,
// the start-up line's tiles, names those FLASH_ATTN_CONFIG forces, and the wgmma ones unforced on
// an H100/H200 with sm_90a code ("" in FP32).
//
// The backward is checked on its own: the GPU and the CPU get the same inputs (the reference's O
// rounded to floatX, its m and l), so an error of the forward cannot hide one of the backward.
//
// Tolerances (|got - want| <= atol + rtol |want|, NaN fails):
// - m: both sides sum HS exact products (bf16 x bf16 fits in fp32) in fp32, in different orders:
//   |error| <= 2 HS 2^-24 sum_d |q_d k_d| scale, bounded with the largest |q| and |k|; 1e-6
//   relative for the GPU's exp2 units (m is kept times log2(e) and converted back).
// - l = sum_j exp(s_j - m): a shift of m moves every term by that much relative (twice m's bound),
//   fp32 sums of up to T terms add T 2^-24 relative, exp2 and expf 1e-5 more.
// - FP32 build: O and the gradients are fp32 sums of up to T terms on both sides: 1e-4 relative
//   (about T 2^-24 at T = 4096) and 1e-5 of the tensor's largest value for sums that cancel.
// - BF16 build: the inputs are rounded to bf16 before both sides see them; the GPU rounds P (for
//   O and dV) or dS (for dK and dQ) to bf16 before its tensor-core products, relative error at most
//   u = 2^-8 per term, and rounds the result once more (u relative). For O the term errors add up
//   to at most u sum_j p_j |v_j| / l <= u max|v|. The gradients sum terms of either sign, so their
//   rounding errors add up like the sums themselves: 2u relative plus 4u of the tensor's largest
//   value.
// - FP16 build: the same with fp16's unit roundoff, u = 2^-11 (11 significant bits). Its subnormals
//   (below 2^-14) round with an absolute error of up to 2^-25 instead: a P or dS term that small
//   errs by at most 2^-25 times |v|, |k| or |q|, which the bounds above (u of the largest value)
//   hold many times over at these sizes (T 2^-25 <= 2^-13 for T <= 4161).
// - Gradients also get an absolute floor for sums that cancel to about zero (at T = 1, dS = 0
//   exactly): dP_ij - D_i carries fp32 rounding of 2 HS 2^-24 max|dO| max|v|, which dQ and dK
//   multiply by P, |k| or |q| and the scale; 4 times that.
//
// Alone, from the repository root (sm_90, BF16; -DPRECISION_FP32 or -DPRECISION_FP16 for those builds):
//   gcc -O3 -march=native -fopenmp -I. -c kernels/cpu/attention_flash.c -o ref.o
//   nvcc -std=c++17 -O3 -arch=sm_90 -I. -DATTN_FLASH -DPRECISION_BF16 tests/gpu/test_attention_gpu.cu
//       kernels/cuda/attention_flash.cu kernels/cuda/backend.cu tests/lib/testutil.c common/util.c ref.o
//       -Xcompiler -fopenmp -lcublasLt -lcublas -lcurand
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/common.cuh"
extern "C" {
#include "kernels/cpu/attention_cpu.h"
#include "tests/lib/testutil.h"
}

typedef struct {
    int B, T, NH, HS;
    float qk_range; // q and k uniform in (-qk_range, qk_range): score std about qk_range^2 / 3
} Case;

static float* host_floats(size_t n) { return (float*)xmalloc(n * sizeof(float) + 1, "test array"); }

// Rounds a host array to what the GPU holds (bf16 in the BF16 build, unchanged in FP32).
static void round_to_floatX(float* p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (float)(floatX)p[i];
}

static void upload(floatX* dev, const float* host, size_t n) {
    floatX* staging = (floatX*)xmalloc(n * sizeof(floatX) + 1, "test staging");
    for (size_t i = 0; i < n; i++) staging[i] = (floatX)host[i];
    cudaCheck(cudaMemcpy(dev, staging, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(staging);
}

static void download(float* host, const floatX* dev, size_t n) {
    floatX* staging = (floatX*)xmalloc(n * sizeof(floatX) + 1, "test staging");
    cudaCheck(cudaMemcpy(staging, dev, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) host[i] = (float)staging[i];
    free(staging);
}

static void* device_alloc(size_t bytes) {
    void* p;
    cudaCheck(cudaMalloc(&p, bytes + 16));
    return p;
}

static double max_abs(const float* p, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)p[i]));
    return m;
}

// Slot `which` (0 q, 1 k, 2 v) of every row of a (B*T, 3, C) array into a (B*T, C) array.
static void extract_slot(float* dst, const float* qkv, int which, int rows, int C) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * C, qkv + ((size_t)r * 3 + which) * C, C * sizeof(float));
}

// Everything one case needs on both sides.
typedef struct {
    Case c;
    int C;
    size_t n_qkv, n_out, n_stat;
    float *qkv, *dout, *out_ref, *m_ref, *l_ref, *out_in, *dqkv_ref, *dbias_in; // host
    floatX *d_qkv, *d_dout, *d_out, *d_out_in, *d_dqkv;                         // device
    float *d_saved, *d_saved_in, *d_dbias;
    void* d_scratch;
} Problem;

// GPU results of one forward and one backward, in float.
typedef struct {
    float *out, *saved, *dqkv, *dbias;
} Results;

// The scratch of either dQ mode: the atomic dQ's accumulator (B, T, C) or the deterministic
// kernels' bias partials (B, ceil(T / 64), 3C), whichever is larger.
static size_t scratch_bytes(int B, int T, int C, int NH) {
    const char* mode = getenv("FLASH_ATTN_DETERMINISTIC");
    char* saved_mode = mode ? strdup(mode) : NULL;
    size_t largest = 0;
    const char* modes[] = {"0", "1"};
    for (int i = 0; i < 2; i++) {
        setenv("FLASH_ATTN_DETERMINISTIC", modes[i], 1);
        const size_t bytes = attention_scratch_bytes(B, T, C, NH);
        largest = bytes > largest ? bytes : largest;
    }
    if (saved_mode) setenv("FLASH_ATTN_DETERMINISTIC", saved_mode, 1);
    else unsetenv("FLASH_ATTN_DETERMINISTIC");
    free(saved_mode);
    return largest;
}

static void run_gpu(Results* r, const Problem* p) {
    const Case c = p->c;
    cudaCheck(cudaMemset(p->d_out, 0xFF, p->n_out * sizeof(floatX)));
    cudaCheck(cudaMemset(p->d_saved, 0xFF, attention_saved_bytes(c.B, c.T, c.NH)));
    attention_forward(p->d_out, p->d_saved, p->d_qkv, c.B, c.T, p->C, c.NH);
    cudaCheck(cudaDeviceSynchronize());
    download(r->out, p->d_out, p->n_out);
    cudaCheck(cudaMemcpy(r->saved, p->d_saved, 2 * p->n_stat * sizeof(float), cudaMemcpyDeviceToHost));

    cudaCheck(cudaMemset(p->d_dqkv, 0xFF, p->n_qkv * sizeof(floatX)));
    cudaCheck(cudaMemset(p->d_scratch, 0xFF, scratch_bytes(c.B, c.T, p->C, c.NH)));
    cudaCheck(cudaMemcpy(p->d_dbias, p->dbias_in, 3 * p->C * sizeof(float), cudaMemcpyHostToDevice));
    attention_backward(p->d_dqkv, p->d_dbias, p->d_scratch, p->d_dout, p->d_qkv, p->d_out_in, p->d_saved_in, c.B, c.T,
                       p->C, c.NH, c.T);
    cudaCheck(cudaDeviceSynchronize());
    download(r->dqkv, p->d_dqkv, p->n_qkv);
    cudaCheck(cudaMemcpy(r->dbias, p->d_dbias, 3 * p->C * sizeof(float), cudaMemcpyDeviceToHost));
}

// The qkv bias gradient from B backward calls over one sequence each, into `dbias` (--batch-invariant:
// the bits of one call over the B sequences in groups of one). The same scratch; saved re-laid out
// as (m, l) of the one sequence; dqkv poisoned again.
static void run_gpu_by_sequence(float* dbias, const Problem* p) {
    const Case c = p->c;
    const size_t seq_stat = (size_t)c.NH * c.T;
    float* saved_one = (float*)device_alloc(attention_saved_bytes(1, c.T, c.NH));
    cudaCheck(cudaMemset(p->d_dqkv, 0xFF, p->n_qkv * sizeof(floatX)));
    cudaCheck(cudaMemcpy(p->d_dbias, p->dbias_in, 3 * p->C * sizeof(float), cudaMemcpyHostToDevice));
    for (int b = 0; b < c.B; b++) {
        cudaCheck(cudaMemcpy(saved_one, p->d_saved_in + b * seq_stat, seq_stat * sizeof(float), cudaMemcpyDeviceToDevice));
        cudaCheck(cudaMemcpy(saved_one + seq_stat, p->d_saved_in + p->n_stat + b * seq_stat, seq_stat * sizeof(float),
                             cudaMemcpyDeviceToDevice));
        const size_t qkv0 = (size_t)b * c.T * 3 * p->C, out0 = (size_t)b * c.T * p->C;
        attention_backward(p->d_dqkv + qkv0, p->d_dbias, p->d_scratch, p->d_dout + out0, p->d_qkv + qkv0,
                           p->d_out_in + out0, saved_one, 1, c.T, p->C, c.NH, c.T);
    }
    cudaCheck(cudaMemcpy(dbias, p->d_dbias, 3 * p->C * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(saved_one));
}

static Problem make_problem(Case c, TestRng* rng) {
    Problem p;
    memset(&p, 0, sizeof(p));
    p.c = c;
    p.C = c.NH * c.HS;
    p.n_qkv = (size_t)c.B * c.T * 3 * p.C;
    p.n_out = (size_t)c.B * c.T * p.C;
    p.n_stat = (size_t)c.B * c.NH * c.T;
    p.qkv = host_floats(p.n_qkv);
    p.dout = host_floats(p.n_out);
    p.out_ref = host_floats(p.n_out);
    p.m_ref = host_floats(2 * p.n_stat); // m then l, the layout of `saved`
    p.l_ref = p.m_ref + p.n_stat;
    p.out_in = host_floats(p.n_out);
    p.dqkv_ref = host_floats(p.n_qkv);
    for (size_t row = 0; row < (size_t)c.B * c.T; row++) {
        float* r = p.qkv + row * 3 * p.C;
        test_fill_uniform(r, 2 * (size_t)p.C, -c.qk_range, c.qk_range, rng); // q and k
        test_fill_uniform(r + 2 * p.C, p.C, -1.0f, 1.0f, rng);                // v
    }
    test_fill_uniform(p.dout, p.n_out, -1.0f, 1.0f, rng);
    p.dbias_in = host_floats(3 * p.C);
    test_fill_uniform(p.dbias_in, 3 * p.C, -1.0f, 1.0f, rng);
    round_to_floatX(p.qkv, p.n_qkv);
    round_to_floatX(p.dout, p.n_out);

    // The reference: the CPU flash attention on exactly the GPU's inputs.
    attention_flash_forward_cpu(p.out_ref, p.m_ref, p.l_ref, p.qkv, c.B, c.T, p.C, c.NH, ATTN_FLASH_BLOCK_Q,
                                ATTN_FLASH_BLOCK_K);
    memcpy(p.out_in, p.out_ref, p.n_out * sizeof(float));
    round_to_floatX(p.out_in, p.n_out);
    float* D = host_floats(p.n_stat);
    attention_flash_backward_cpu(p.dqkv_ref, D, p.dout, p.qkv, p.out_in, p.m_ref, p.l_ref, c.B, c.T, p.C, c.NH,
                                 ATTN_FLASH_BLOCK_Q, ATTN_FLASH_BLOCK_K);
    free(D);

    p.d_qkv = (floatX*)device_alloc(p.n_qkv * sizeof(floatX));
    p.d_dout = (floatX*)device_alloc(p.n_out * sizeof(floatX));
    p.d_out = (floatX*)device_alloc(p.n_out * sizeof(floatX));
    p.d_out_in = (floatX*)device_alloc(p.n_out * sizeof(floatX));
    p.d_dqkv = (floatX*)device_alloc(p.n_qkv * sizeof(floatX));
    p.d_saved = (float*)device_alloc(attention_saved_bytes(c.B, c.T, c.NH));
    p.d_saved_in = (float*)device_alloc(attention_saved_bytes(c.B, c.T, c.NH));
    p.d_dbias = (float*)device_alloc(3 * p.C * sizeof(float));
    p.d_scratch = device_alloc(scratch_bytes(c.B, c.T, p.C, c.NH));
    upload(p.d_qkv, p.qkv, p.n_qkv);
    upload(p.d_dout, p.dout, p.n_out);
    upload(p.d_out_in, p.out_in, p.n_out);
    cudaCheck(cudaMemcpy(p.d_saved_in, p.m_ref, 2 * p.n_stat * sizeof(float), cudaMemcpyHostToDevice));
    return p;
}

static void free_problem(Problem* p) {
    free(p->qkv);
    free(p->dout);
    free(p->out_ref);
    free(p->m_ref);
    free(p->out_in);
    free(p->dqkv_ref);
    free(p->dbias_in);
    void* device[] = {p->d_qkv, p->d_dout, p->d_out, p->d_out_in, p->d_dqkv, p->d_saved, p->d_saved_in, p->d_scratch,
                      p->d_dbias};
    for (size_t i = 0; i < sizeof(device) / sizeof(device[0]); i++) cudaCheck(cudaFree(device[i]));
}

static void check_results(const Problem* p, const Results* r, const char* label) {
    const Case c = p->c;
    const int rows = c.B * c.T;
    char name[208];
#if !defined(PRECISION_FP32)
#if defined(PRECISION_BF16)
    const double u = 1.0 / 256.0; // unit roundoff of bf16 (8 significant bits)
#else
    const double u = 1.0 / 2048.0; // unit roundoff of fp16 (11 significant bits)
#endif
    const double out_rtol = 2 * u, grad_rtol = 2 * u, grad_atol_of_max = 4 * u;
#else
    const double out_rtol = 1e-4, grad_rtol = 1e-4, grad_atol_of_max = 1e-5;
#endif
    // The largest |q|, |k|, |v| for the bounds.
    float* slot = host_floats(p->n_out);
    double max_slot[3];
    for (int which = 0; which < 3; which++) {
        extract_slot(slot, p->qkv, which, rows, p->C);
        max_slot[which] = max_abs(slot, p->n_out);
    }
    const double scale = 1.0 / sqrt((double)c.HS);
    const double m_atol = 2.0 * c.HS * ldexp(1.0, -24) * c.HS * max_slot[0] * max_slot[1] * scale + 1e-7;
    const double l_rtol = 2 * m_atol + c.T * ldexp(1.0, -24) + 1e-5;
    const double grad_floor = 4.0 * 2 * c.HS * ldexp(1.0, -24) * max_abs(p->dout, p->n_out) * max_slot[2] *
                              fmax(max_slot[0], max_slot[1]) * scale;
#if !defined(PRECISION_FP32)
    const double out_atol = u * max_slot[2] + 1e-6;
#else
    const double out_atol = 1e-5 * max_abs(p->out_ref, p->n_out);
#endif

    snprintf(name, sizeof(name), "%s: O", label);
    test_close_f(name, r->out, p->out_ref, p->n_out, out_rtol, out_atol);
    snprintf(name, sizeof(name), "%s: m", label);
    test_close_f(name, r->saved, p->m_ref, p->n_stat, 1e-6, m_atol);
    snprintf(name, sizeof(name), "%s: l", label);
    test_close_f(name, r->saved + p->n_stat, p->l_ref, p->n_stat, l_rtol, 0.0);

    float* want = host_floats(p->n_out);
    const char* grad_names[3] = {"dQ", "dK", "dV"};
    for (int which = 0; which < 3; which++) {
        extract_slot(slot, r->dqkv, which, rows, p->C);
        extract_slot(want, p->dqkv_ref, which, rows, p->C);
        snprintf(name, sizeof(name), "%s: %s", label, grad_names[which]);
        test_close_f(name, slot, want, p->n_out, grad_rtol,
                     grad_atol_of_max * max_abs(want, p->n_out) + grad_floor);
    }
    free(want);
    free(slot);

    const int C3 = 3 * p->C;
    double *sums = (double*)xmalloc(C3 * sizeof(double), "sums"), *magnitudes = (double*)xmalloc(C3 * sizeof(double), "sums");
    double largest = 0.0;
    for (int col = 0; col < C3; col++) sums[col] = p->dbias_in[col], magnitudes[col] = fabs(p->dbias_in[col]);
    for (size_t i = 0; i < p->n_qkv; i++) sums[i % C3] += r->dqkv[i], magnitudes[i % C3] += fabs(r->dqkv[i]);
    for (int col = 0; col < C3; col++) largest = fmax(largest, magnitudes[col]);
    snprintf(name, sizeof(name), "%s: qkv bias gradient (column sums of dqkv)", label);
    test_close(name, r->dbias, sums, C3, 0.0, 1e-5 * largest);
    free(sums);
    free(magnitudes);
}

static int same_bits(const float* a, const float* b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

// Slots `from` .. 2 of every (3, C) row the same in a and b.
static int same_slots(const float* a, const float* b, int from, int rows, int C) {
    for (int r = 0; r < rows; r++)
        if (!same_bits(a + ((size_t)r * 3 + from) * C, b + ((size_t)r * 3 + from) * C, (size_t)(3 - from) * C)) return 0;
    return 1;
}

#if !defined(PRECISION_FP32)
// The tensor-core tile loads address a sequence's rows with 32-bit offsets: T x 3C past 2^31 - 1 elements
// (here T = 2^20, C = 768: 2.4e9) must be refused before anything runs (hence NULL buffers).
static const int TOO_LONG_T = 1 << 20, TOO_LONG_C = 768, TOO_LONG_NH = 12;
static void forward_too_long(const void* arg) {
    (void)arg;
    attention_forward(NULL, NULL, NULL, 1, TOO_LONG_T, TOO_LONG_C, TOO_LONG_NH);
}
static void backward_too_long(const void* arg) {
    (void)arg;
    attention_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, TOO_LONG_T, TOO_LONG_C, TOO_LONG_NH, TOO_LONG_T);
}
#endif

#if !defined(PRECISION_FP32)
// The tensor-core tiles (FLASH_ATTN_CONFIG) of this build; the wgmma tiles (sm90, last) run where the
// GPU runs this build's sm_90a code: an H100/H200, the test built with GPU_ARCH 90 (not an sm_75
// build's code compiled for it by the driver).
#if defined(PRECISION_FP16)
static const char* const TILE_CONFIGS[] = {"sm75", "sm80", "sm86", "sm90"};
#else
static const char* const TILE_CONFIGS[] = {"sm80", "sm86", "sm90"};
#endif
// How many of TILE_CONFIGS this GPU runs.
static size_t tile_configs_run(void) {
    const size_t all = sizeof(TILE_CONFIGS) / sizeof(TILE_CONFIGS[0]);
    return device_code_arch() == 900 ? all : all - 1;
}
#endif

static void run_case(Case c, TestRng* rng) {
    Problem p = make_problem(c, rng);
    Results first = {host_floats(p.n_out), host_floats(2 * p.n_stat), host_floats(p.n_qkv), host_floats(3 * p.C)};
    Results second = {host_floats(p.n_out), host_floats(2 * p.n_stat), host_floats(p.n_qkv), host_floats(3 * p.C)};
#if !defined(PRECISION_FP32)
    // FLASH_ATTN_CONFIG picks the tensor-core tiles, FLASH_ATTN_DETERMINISTIC how dQ is summed.
    const char* const* configs = TILE_CONFIGS;
    const size_t num_configs = tile_configs_run();
    const char* dq_modes[] = {"1", "0"};
#else
    const char* configs[] = {"fp32"}; // neither variable is used in FP32
    const size_t num_configs = 1;
    const char* dq_modes[] = {"1"};
#endif
    for (size_t k = 0; k < num_configs; k++)
        for (size_t d = 0; d < sizeof(dq_modes) / sizeof(dq_modes[0]); d++) {
            setenv("FLASH_ATTN_CONFIG", configs[k], 1);
            setenv("FLASH_ATTN_DETERMINISTIC", dq_modes[d], 1);
            const int atomic_dq = strcmp(dq_modes[d], "0") == 0;
            if (atomic_dq && strcmp(configs[k], "sm75") == 0) continue; // too large for a T4's shared memory
            char label[128];
            snprintf(label, sizeof(label), "B %d T %d NH %d HS %d qk %.0f %s%s", c.B, c.T, c.NH, c.HS, c.qk_range,
                     configs[k], atomic_dq ? " atomic dQ" : "");
            run_gpu(&first, &p);
            check_results(&p, &first, label);
            run_gpu(&second, &p);
            char name[208];
            const int rows = c.B * c.T;
            int same = same_bits(first.out, second.out, p.n_out) && same_bits(first.saved, second.saved, 2 * p.n_stat);
            if (atomic_dq) { // dQ adds in another order on every run: checked again, the rest bit for bit
                snprintf(name, sizeof(name), "%s (second run)", label);
                check_results(&p, &second, name);
                same = same && same_slots(first.dqkv, second.dqkv, 1, rows, p.C);
                snprintf(name, sizeof(name), "%s: O, m, l, dK, dV deterministic", label);
            } else {
                same = same && same_bits(first.dqkv, second.dqkv, p.n_qkv) && same_bits(first.dbias, second.dbias, 3 * p.C);
                snprintf(name, sizeof(name), "%s: deterministic", label);
            }
            test_check(same, name, "%s", same ? "two runs bit-identical" : "two runs differ");
            if (!atomic_dq && c.B > 1) {
                run_gpu_by_sequence(second.dbias, &p);
                snprintf(name, sizeof(name), "%s: qkv bias gradient batch-invariant", label);
                same = same_bits(first.dbias, second.dbias, 3 * p.C);
                test_check(same, name, "%s", same ? "B calls of one sequence give its bits" : "bits differ");
            }
        }
    unsetenv("FLASH_ATTN_CONFIG");
    unsetenv("FLASH_ATTN_DETERMINISTIC");
    Results* all[] = {&first, &second};
    for (int i = 0; i < 2; i++) {
        free(all[i]->out);
        free(all[i]->saved);
        free(all[i]->dqkv);
        free(all[i]->dbias);
    }
    free_problem(&p);
}

// The bias gradient's groups must be whole sequences: groups of 2 rows at T 4 are refused before
// anything runs (hence NULL buffers but dbias), in both builds.
static void backward_partial_groups(const void* arg) {
    (void)arg;
    float dbias[3 * 64];
    attention_backward(NULL, dbias, NULL, NULL, NULL, NULL, NULL, 2, 4, 64, 1, 2);
}

int main(void) {
    const char* seed_env = getenv("TEST_SEED");
    const unsigned long long seed = seed_env ? strtoull(seed_env, NULL, 10) : (unsigned long long)time(NULL);
    printf("test_attention_gpu: seed %llu (TEST_SEED=%llu repeats this run)\n", seed, seed);
    TestRng rng = test_rng(seed);
#if !defined(PRECISION_FP32) // in forked children, before this process touches the GPU
    test_expect_fatal("a sequence of T x 3C above 2^31 - 1 is refused (forward)", forward_too_long, NULL,
                      "T 1048576 x 3C 2304", "2^31 - 1");
    test_expect_fatal("a sequence of T x 3C above 2^31 - 1 is refused (backward)", backward_too_long, NULL,
                      "T 1048576 x 3C 2304", "2^31 - 1");
#endif
    test_expect_fatal("attention_backward refuses bias groups that are not whole sequences", backward_partial_groups,
                      NULL, "attention_backward", "not whole sequences of 4");
    cudaCheck(cudaSetDevice(0));

    test_check(strcmp(attention_name(), "flash") == 0, "attention_name is flash", "got %s", attention_name());
    // The start-up line's tiles: those FLASH_ATTN_CONFIG forces; unforced, an H100/H200's own with its
    // sm_90a code, else one of the mma.sync sets.
#if !defined(PRECISION_FP32)
    for (size_t k = 0; k < tile_configs_run(); k++) {
        setenv("FLASH_ATTN_CONFIG", TILE_CONFIGS[k], 1);
        char want[32];
        snprintf(want, sizeof want, "%s tiles", TILE_CONFIGS[k]);
        test_check(strcmp(attention_kernels(), want) == 0, "attention_kernels names the forced tiles",
                   "FLASH_ATTN_CONFIG=%s: got \"%s\"", TILE_CONFIGS[k], attention_kernels());
    }
    unsetenv("FLASH_ATTN_CONFIG");
    const char* own = attention_kernels();
    if (device_code_arch() == 900 && !forced_kernel_path())
        test_check(strcmp(own, "sm90 tiles") == 0, "attention_kernels: the wgmma tiles with sm_90a code",
                   "got \"%s\"", own);
    else
        test_check(strcmp(own, "sm75 tiles") == 0 || strcmp(own, "sm80 tiles") == 0 || strcmp(own, "sm86 tiles") == 0,
                   "attention_kernels: mma.sync tiles without sm_90a code", "got \"%s\"", own);
#else
    test_check(attention_kernels()[0] == '\0', "attention_kernels: one kind in FP32", "got \"%s\"",
               attention_kernels());
#endif
    test_check(attention_saved_bytes(3, 5, 7) == 2 * 3 * 5 * 7 * sizeof(float), "saved holds m and l (B, NH, T)",
               "got %zu bytes", attention_saved_bytes(3, 5, 7));

    const Case cases[] = {
        {3, 1, 2, 64, 2.0f},    {2, 7, 3, 64, 2.0f},    {2, 64, 2, 64, 2.0f},   {1, 65, 3, 64, 2.0f},
        {2, 127, 1, 64, 2.0f},  {1, 1024, 2, 64, 2.0f}, {2, 1025, 1, 64, 2.0f}, {1, 4096, 2, 64, 2.0f},
        {1, 4161, 1, 64, 2.0f}, // from T 4096 the wgmma forward's key tiles are 128 wide: a ragged last one
        {1, 1025, 2, 64, 4.0f}, // peaked softmax: scores up to about +-30, the running max moves a lot
        {2, 65, 2, 32, 2.0f},   {1, 1025, 2, 32, 2.0f}, {2, 127, 2, 128, 2.0f}, {1, 1025, 1, 128, 2.0f},
        // 96 (b, h): more than the last (b, h) that start longest first together (causal_tail: 74,
        // 44 and 53 for the wgmma kernels on an H100), so blocks of both orders run
        {8, 1025, 12, 64, 2.0f},
    };
    int most_shared;
    cudaCheck(cudaDeviceGetAttribute(&most_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (cases[i].HS == 128 && most_shared <= 64 * 1024) {
            printf("SKIP head size 128: this GPU gives a block %d bytes of shared memory (sm75 tiles)\n", most_shared);
            continue;
        }
        run_case(cases[i], &rng);
    }
    return test_summary("test_attention_gpu");
}
