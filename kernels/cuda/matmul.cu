// Linear layers through cuBLASLt, fp32 accumulation (never TF32: CUBLAS_COMPUTE_32F), floatX
// inputs and outputs, fp32 weight gradients. cuBLAS is column-major: a row-major (rows, cols) matrix is a column-major
// (cols, rows) one, so every product below is written for the transposed matrices.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

// What the epilogue does after the product (and the bias): nothing, or GELU_BACKWARD: D = x *
// gelu'(aux), the aux matrix having D's shape and ld ldd, with cuBLASLt's own GELU (see
// gelu_epilogue for how close it is to gelu_backward's).
enum Epilogue { PLAIN, GELU_BACKWARD };

// ---- the choice of cuBLASLt's algorithm -----------------------------------------------------
// cuBLASLt's heuristic ranks its algorithms by a model, and its first choice is often not the
// fastest: for the products of GPT-2 124M at 64K tokens on an H100, one of its next 7 candidates
// was up to 28% faster (the lm head's forward; dinp of qkv and attproj 10-20%), and the trained
// step is 2.3 ms shorter with the fastest (PERFORMANCE.md). So each product shape is tuned on its
// first call: the heuristic's candidates are timed on that call's data, and the fastest is kept
// for the rest of the run (rerunning a product is harmless: its output overlaps none of its
// inputs, kernels.h). Only candidates that compute the very bits of the heuristic's first choice
// qualify (no split-K, and the same hash of the whole output on that call's data), so the results
// do not depend on which candidate wins the timing: reruns stay bit-identical, and a reference
// curve made without tuning still holds. Products that accumulate into their output (the weight
// gradients) are not tuned: each timing run would add again; for them the heuristic's choice was
// within 3% of the best. Nor are products under TUNE_MIN_FLOPS: tuning runs a shape's product
// about 32 times, which only hundreds of calls of that shape repay, and generation makes a new
// shape with every token (GPT-2 124M's products there are 4.8 GFLOP at most; in training at 64K
// tokens, 77 to 630 GFLOP). MATMUL_TUNE=0 turns the tuning off, =2 also prints each shape's
// choice on stderr.
#define TUNE_CANDIDATES 8
#define TUNE_MIN_FLOPS 1e10

struct MatmulShape { // everything the heuristic sees
    int m, n, k, lda, ldb, ldd;
    bool transpose_a, transpose_b, bias, c_in;
    cublasLtEpilogue_t epilogue;
    cudaDataType_t d_type;
};
static bool same_shape(const MatmulShape& x, const MatmulShape& y) {
    return x.m == y.m && x.n == y.n && x.k == y.k && x.lda == y.lda && x.ldb == y.ldb && x.ldd == y.ldd &&
           x.transpose_a == y.transpose_a && x.transpose_b == y.transpose_b && x.bias == y.bias &&
           x.c_in == y.c_in && x.epilogue == y.epilogue && x.d_type == y.d_type;
}
struct TunedAlgo {
    MatmulShape shape;
    cublasLtMatmulAlgo_t algo;
};

static int tuning_level(void) {
    static int level = -1;
    if (level < 0) {
        const char* value = getenv("MATMUL_TUNE");
        if (!value || !value[0]) level = 1;
        else if (strlen(value) == 1 && value[0] >= '0' && value[0] <= '2') level = value[0] - '0';
        else fatal("MATMUL_TUNE=%s: use 1 (time cuBLASLt's candidates once per shape, the default), 2 (the same, "
                   "printing each choice) or 0 (its heuristic's first choice)", value);
    }
    return level;
}

// An order-independent hash of n 16-bit words: the sum of a mix of each word with its index.
__global__ void hash_words_kernel(unsigned long long* hash, const unsigned short* words, size_t n) {
    unsigned long long sum = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long x = (i << 16 | words[i]) + 0x9e3779b97f4a7c15ull; // splitmix64's finalizer
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        sum += x ^ (x >> 31);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) atomicAdd(hash, sum);
}

static unsigned long long hash_output(const void* d, size_t bytes) {
    static unsigned long long* hash = NULL;
    if (!hash) cudaCheck(cudaMalloc(&hash, sizeof *hash));
    cudaCheck(cudaMemset(hash, 0, sizeof *hash));
    hash_words_kernel<<<2 * device_sm_count, 256>>>(hash, (const unsigned short*)d, bytes / 2);
    cudaCheck(cudaGetLastError());
    unsigned long long result;
    cudaCheck(cudaMemcpy(&result, hash, sizeof result, cudaMemcpyDeviceToHost));
    return result;
}

// The algorithm for a product: with `tune`, the tuned one of its shape (tuned on its first call:
// `run` runs the product with a candidate, overwriting d, `d_bytes` long), else the heuristic's
// first choice.
template <class Run>
static cublasLtMatmulAlgo_t choose_algo(const MatmulShape& shape, cublasLtMatmulDesc_t desc,
                                        cublasLtMatrixLayout_t layout_a, cublasLtMatrixLayout_t layout_b,
                                        cublasLtMatrixLayout_t layout_d, bool tune, const void* d, size_t d_bytes,
                                        Run run) {
    static TunedAlgo tuned[256];
    static int num_tuned = 0;
    if (tune) {
        for (int i = 0; i < num_tuned; i++)
            if (same_shape(tuned[i].shape, shape)) return tuned[i].algo;
    }
    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &cublaslt_workspace_bytes, sizeof cublaslt_workspace_bytes));
    cublasLtMatmulHeuristicResult_t candidates[TUNE_CANDIDATES];
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, layout_a, layout_b, layout_d, layout_d,
                                               preference, tune ? TUNE_CANDIDATES : 1, candidates, &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    if (found == 0)
        fatal("cuBLASLt has no algorithm for a %dx%dx%d matmul (bias %s, transpose %d/%d, epilogue %d)", shape.m,
              shape.n, shape.k, shape.bias ? "yes" : "no", shape.transpose_a, shape.transpose_b, (int)shape.epilogue);
    if (!tune || num_tuned == (int)(sizeof tuned / sizeof tuned[0])) return candidates[0].algo;

    auto split_k = [](const cublasLtMatmulAlgo_t& algo) {
        int splits = 1;
        size_t written;
        cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                         sizeof splits, &written));
        return splits;
    };
    int best = 0;
    if (found > 1 && split_k(candidates[0].algo) == 1) { // no other algorithm adds split-K's partial sums alike
        cudaEvent_t start, stop;
        cudaCheck(cudaEventCreate(&start));
        cudaCheck(cudaEventCreate(&stop));
        unsigned long long first_hash = 0;
        float best_ms = INFINITY, first_ms = INFINITY;
        int other_bits = 0;
        for (int i = 0; i < found; i++) {
            if (split_k(candidates[i].algo) != 1) continue;
            run(candidates[i].algo); // also the timing's warm-up
            const unsigned long long hash = hash_output(d, d_bytes);
            if (i == 0) first_hash = hash;
            else if (hash != first_hash) {
                other_bits++;
                continue;
            }
            float ms = INFINITY;
            for (int repeat = 0; repeat < 3; repeat++) { // the least of three: noise only adds
                cudaCheck(cudaEventRecord(start));
                run(candidates[i].algo);
                cudaCheck(cudaEventRecord(stop));
                cudaCheck(cudaEventSynchronize(stop));
                float elapsed;
                cudaCheck(cudaEventElapsedTime(&elapsed, start, stop));
                ms = fminf(ms, elapsed);
            }
            if (i == 0) first_ms = ms;
            if (ms < best_ms) best_ms = ms, best = i;
        }
        if (tuning_level() == 2)
            fprintf(stderr, "matmul %dx%dx%d: candidate %d of %d, %.4f ms (the heuristic's first: %.4f ms; %d with other bits)\n",
                    shape.m, shape.n, shape.k, best + 1, found, best_ms, first_ms, other_bits);
        cudaCheck(cudaEventDestroy(start));
        cudaCheck(cudaEventDestroy(stop));
    }
    tuned[num_tuned++] = TunedAlgo{shape, candidates[best].algo};
    return candidates[best].algo;
}

// D (m, n, column-major, ld ldd) = op(A) (m, k) @ op(B) (k, n) [+ D if accumulate, or + c_in (D's
// shape and type) if given] [+ bias (m)], in fp32, then the epilogue with `aux`. D is floatX, or
// float where d_type is CUDA_R_32F (weight gradients).
static void matmul_cublaslt(void* d, const floatX* a, const floatX* b, const floatX* bias,
                            int m, int n, int k, bool transpose_a, bool transpose_b,
                            int lda, int ldb, int ldd, bool accumulate,
                            Epilogue epilogue = PLAIN, const floatX* aux = NULL,
                            cudaDataType_t d_type = CUDA_FLOATX, const floatX* c_in = NULL) {
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    cublasLtEpilogue_t mode = epilogue == GELU_BACKWARD ? CUBLASLT_EPILOGUE_DGELU
                              : bias                    ? CUBLASLT_EPILOGUE_BIAS
                                                        : CUBLASLT_EPILOGUE_DEFAULT;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &mode, sizeof mode));
    if (bias) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof bias));
    }
    if (epilogue != PLAIN) {
        int64_t aux_ld = ldd;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                   sizeof aux));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                   sizeof aux_ld));
    }
    cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_a, CUDA_FLOATX, transpose_a ? k : m,
                                           transpose_a ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_b, CUDA_FLOATX, transpose_b ? n : k,
                                           transpose_b ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_d, d_type, m, n, ldd));
    float alpha = 1.0f, beta = accumulate || c_in ? 1.0f : 0.0f;
    const void* c = c_in ? (const void*)c_in : d;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, layout_a, b, layout_b, &beta, c, layout_d, d,
                                   layout_d, &algo, cublaslt_workspace, cublaslt_workspace_bytes, 0));
    };
    const MatmulShape shape = {m, n, k, lda, ldb, ldd, transpose_a, transpose_b, bias != NULL, c_in != NULL, mode,
                               d_type};
    const size_t d_bytes = ((size_t)ldd * (n - 1) + m) * (d_type == CUDA_R_32F ? 4 : 2);
    const bool tune = !accumulate && 2.0 * m * n * k >= TUNE_MIN_FLOPS && tuning_level() > 0;
    run(choose_algo(shape, desc, layout_a, layout_b, layout_d, tune, d, d_bytes, run));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// ---- products over groups of rows ------------------------------------------------------------
// A product that makes each row of its output from the same row of its input (the forward's, dinp)
// must, where its rows come in groups (kernels.h: group_rows, sum_rows), give each row the bits of
// a product over its group alone. A cuBLASLt call per group does, but costs: with --batch-invariant
// 8 the d12 step's products of 8K rows took 4-60% longer than one of 64K (profile_step, H200,
// PERFORMANCE.md). One call over all rows gives the same bits where its algorithm sums each output
// over k as the group's does. A kernel's order of summation is fixed by its code and the shape, not
// by the data, so that holds for every call of the two shapes or for none: the first call of each
// grouped shape runs the product both ways and compares hashes of the whole output, and the later
// calls make one call over all rows where they agreed, a call per group where they did not
// (MATMUL_TUNE=2 prints which).
struct GroupedShape {
    int m, n, k, group_n, lda, ldb, ldd;
    bool transpose_a, bias, c_in;
    Epilogue epilogue;
    bool one_call; // the verdict
};
static bool same_grouping(const GroupedShape& x, const GroupedShape& y) {
    return x.m == y.m && x.n == y.n && x.k == y.k && x.group_n == y.group_n && x.lda == y.lda && x.ldb == y.ldb &&
           x.ldd == y.ldd && x.transpose_a == y.transpose_a && x.bias == y.bias && x.c_in == y.c_in &&
           x.epilogue == y.epilogue;
}

// D (m, n, floatX) = op(A) @ B (k, n, not transposed) [+ c_in] [+ bias], then the epilogue with aux,
// where each of D's columns (a row of the layer's output) must have the bits of a product over its
// group of group_n columns alone (a divisor of n).
static void matmul_cublaslt_rows(int group_n, floatX* d, const floatX* a, const floatX* b, const floatX* bias,
                                 int m, int n, int k, bool transpose_a, int lda, int ldb, int ldd,
                                 Epilogue epilogue, const floatX* aux, const floatX* c_in) {
    auto columns = [&](int col0, int cols) {
        const size_t at = (size_t)col0 * ldd;
        matmul_cublaslt(d + at, a, b + (size_t)col0 * ldb, bias, m, cols, k, transpose_a, false, lda, ldb, ldd, false,
                        epilogue, aux ? aux + at : NULL, CUDA_FLOATX, c_in ? c_in + at : NULL);
    };
    auto in_groups = [&] {
        for (int col0 = 0; col0 < n; col0 += group_n) columns(col0, group_n);
    };
    if (group_n == n) {
        columns(0, n);
        return;
    }
    static GroupedShape checked[64];
    static int num_checked = 0;
    GroupedShape shape = {m, n, k, group_n, lda, ldb, ldd, transpose_a, bias != NULL, c_in != NULL, epilogue, false};
    for (int i = 0; i < num_checked; i++) {
        if (same_grouping(checked[i], shape)) {
            if (checked[i].one_call) columns(0, n);
            else in_groups();
            return;
        }
    }
    const size_t d_bytes = ((size_t)ldd * (n - 1) + m) * sizeof(floatX);
    columns(0, n);
    const unsigned long long whole = hash_output(d, d_bytes);
    in_groups(); // last, so that d holds the groups' bits whatever the verdict
    shape.one_call = hash_output(d, d_bytes) == whole;
    if (tuning_level() == 2)
        fprintf(stderr, "matmul %dx%dx%d in groups of %d columns: %s\n", m, n, k, group_n,
                shape.one_call ? "one call (the groups' bits)" : "a call per group (one call has other bits)");
    if (num_checked < (int)(sizeof checked / sizeof checked[0])) checked[num_checked++] = shape;
}

void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                    const floatX* residual, int N, int C, int OC, int ld_inp, int group_rows) {
    check_linear_ld("matmul_forward", C, ld_inp);
    check_row_groups("matmul_forward", N, group_rows);
    // out^T (OC, N) = weight (as column-major (C, OC))^T @ inp^T (C, N) + residual^T (OC, N): the
    // residual add in cuBLASLt's epilogue (beta = 1) reads the residual once, where a pass of its own
    // would read the product back and write the sum again.
    matmul_cublaslt_rows(group_rows, out, weight, inp, bias, OC, N, C, true, C, ld_inp, OC, PLAIN, NULL, residual);
}

// dweight += the first C rows of each column of `product` (column-major (ld, OC): inp's columns with
// the bias columns, times dout), dbias += its row C (the ones column's: dout's column sums).
__global__ void add_weight_and_bias_gradients_kernel(float* dweight, float* dbias, const float* product, int C,
                                                     int OC, int ld) {
    const int oc = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c <= C; c += gridDim.x * blockDim.x) {
        const float value = product[(size_t)oc * ld + c];
        if (c < C) dweight[(size_t)oc * C + c] += value;
        else dbias[oc] += value;
    }
}

// dinp = dout @ weight (then the epilogue on it, with aux `pre`), its rows in groups of sum_rows;
// dweight += dout^T @ inp and dbias += column sums of dout, in groups of sum_rows rows: one cuBLASLt
// call per group, the weight's accumulating in fp32, so every group's sum has the same shape
// whatever N (cuBLASLt may pick another kernel, which sums in another order, for another shape).
static void linear_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                            const floatX* weight, int N, int C, int OC, int ld_inp, int sum_rows,
                            Epilogue dinp_epilogue, const floatX* pre) {
    check_row_groups("matmul_backward", N, sum_rows);
    check_linear_ld("matmul_backward", C, ld_inp);
    // dinp^T (C, N) = weight (column-major (C, OC)) @ dout^T (OC, N).
    if (dinp) matmul_cublaslt_rows(sum_rows, dinp, weight, dout, NULL, C, N, OC, false, C, OC, C, dinp_epilogue, pre, NULL);
    if (dweight && dbias && ld_inp > C) {
        // inp has the bias columns (kernels.h): the product over them, (ld_inp, OC) per group, is the
        // weight gradient's with dbias as its row C, for 1% more of the product's work instead of a
        // pass over dout (at fc's shape in GPT-2 124M, B 64: 0.42 + 0.01 ms against 0.40 + 0.16 for the
        // product and the pass, H100). It is written, not accumulated, so cuBLASLt's candidates are
        // tuned for it; then both gradients add it.
        static void* buffer;
        static size_t capacity;
        float* product = (float*)grow_scratch(&buffer, &capacity, (size_t)ld_inp * OC * sizeof(float),
                                              "the weight and bias gradients' product");
        for (int row0 = 0; row0 < N; row0 += sum_rows) {
            matmul_cublaslt(product, inp + (size_t)row0 * ld_inp, dout + (size_t)row0 * OC, NULL, ld_inp, OC, sum_rows,
                            false, true, ld_inp, OC, ld_inp, false, PLAIN, NULL, CUDA_R_32F);
            add_weight_and_bias_gradients_kernel<<<dim3(ceil_div(C + 1, 256), OC), 256>>>(dweight, dbias, product,
                                                                                           C, OC, ld_inp);
            launchCheck();
        }
        return;
    }
    // dweight^T (C, OC) += inp^T (C, rows) @ dout (column-major (OC, rows))^T for each group of rows.
    for (int row0 = 0; dweight && row0 < N; row0 += sum_rows)
        matmul_cublaslt(dweight, inp + (size_t)row0 * ld_inp, dout + (size_t)row0 * OC, NULL, C, OC, sum_rows, false,
                        true, ld_inp, OC, C, true, PLAIN, NULL, CUDA_R_32F);
    if (dbias) column_sums_accumulate(dbias, N, OC, sum_rows, MatrixColumns{dout, OC});
}

void matmul_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                     const floatX* inp, const floatX* weight, int N, int C, int OC, int ld_inp, int sum_rows) {
    linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, ld_inp, sum_rows, PLAIN, NULL);
}

// Whether the GELU's backward goes into cuBLASLt's epilogue for activations `width` wide; if not,
// the matmul and gelu_backward run in turn. The epilogue's GELU agrees with gelu_backward (the
// tanh form) only to a few 1e-3 (measured in an FP32 build: 3.7e-3 relative on one gradient
// element): well inside bf16's rounding, but the FP32 build must match the CPU to 1e-5. cuBLASLt
// also wants the aux matrix's leading dimension a multiple of 8 (any model with an even channel
// count has 4C one).
static bool gelu_epilogue(int width) {
#if defined(PRECISION_BF16)
    return width % 8 == 0;
#else
    (void)width;
    return false;
#endif
}

void matmul_backward_gelu(floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                          const floatX* inp, const floatX* weight, const floatX* pre, int N, int C, int OC,
                          int sum_rows) {
    if (!gelu_epilogue(C)) {
        matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, C, sum_rows);
        gelu_backward(dinp, pre, dinp, (size_t)N * C);
        return;
    }
    linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, C, sum_rows, GELU_BACKWARD, pre);
}
