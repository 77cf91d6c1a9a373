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

// ---- the streams ------------------------------------------------------------------------------
// Every product runs on the default stream but the weight gradients of matmul_backward_weights,
// which run on a second stream beside the calls that follow them. A layernorm backward, bound by
// memory, then shares the GPU with a product instead of running alone with the tensor cores idle:
// with fc's and qkv's weight gradients so, GPT-2 124M's step at B 64 is a little shorter at the
// power cap (a fraction of a percent to 1%). Beside their own dinp instead, two products sharing the
// SMs took longer than one after the other. Only where the rows make a chunk of COLSUM_ROWS for
// every SM, though: with fewer, the layernorm backward takes its two passes (layernorm.cu), and its
// column pass beside a product took 3 times as long as alone (155 against 46 us a call at d48, B
// 16), so that at B 16 the overlap cost about as much as it saved (docs/performance.md).
// A stream's products have their own cuBLASLt workspace and weight-gradient partials, and all that
// goes with a product (its tuning's timing and hashes, weight_gradients' checks) runs on its stream.
struct MatmulStream {
    cudaStream_t stream;
    void* workspace; // cuBLASLt's; NULL: cublaslt_workspace
    void* parts;     // weight_gradients' partials (grow_scratch)
    size_t parts_capacity;
};
static MatmulStream default_stream = {0, NULL, NULL, 0};

// The second stream: `ready` marks the default stream's work before a weight gradient is queued on
// it, `done` the end of the last one queued.
static struct {
    MatmulStream on;
    cudaEvent_t ready, done;
} side;

static MatmulStream& side_stream(void) {
    if (!side.on.stream) {
        // Non-blocking: the legacy default stream would otherwise wait for it before each launch.
        cudaCheck(cudaStreamCreateWithFlags(&side.on.stream, cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&side.ready, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&side.done, cudaEventDisableTiming));
        side.on.workspace = dev_malloc(cublaslt_workspace_bytes, "cuBLASLt workspace of the second stream");
    }
    return side.on;
}

// ---- the choice of cuBLASLt's algorithm -----------------------------------------------------
// cuBLASLt's heuristic ranks its algorithms by a model, and its first choice is often not the
// fastest: for the products of GPT-2 124M at 64K tokens, one of its next 7 candidates was up to 28%
// faster (the lm head's forward; dinp of qkv and attproj 10-20%), and the trained step about 2%
// shorter with the fastest (docs/performance.md). So each product shape is tuned on its
// first call: the heuristic's candidates are timed on that call's data, and the fastest is kept
// for the rest of the run (rerunning a product is harmless: its output overlaps none of its
// inputs, kernels.h). Only candidates that compute the very bits of the heuristic's first choice
// qualify (no split-K, and the same hash of the whole output on that call's data), so the results
// do not depend on which candidate wins the timing: reruns stay bit-identical, and a reference
// curve made without tuning still holds. The least of 3 runs of each candidate in turn is what
// ranks them; medians of interleaved rounds, and timing the candidates in training, both chose
// worse or no better (performance.md, "Tried and not kept"). Products that accumulate into their
// output (the weight gradients after a step's first micro-batch, GRAD_ADD) take the heuristic's
// first choice: each timing run would add again, and the bits of their shape's tuned choice were
// checked without the add; for them the heuristic's choice was within 3% of the best (those that
// write their output, GRAD_WRITE, are tuned). Nor are products under TUNE_MIN_FLOPS: tuning runs a
// shape's product about 32 times, which only hundreds of calls of that shape repay, and generation
// makes a new shape with every token (GPT-2 124M's products there are 4.8 GFLOP at most; in
// training at 64K tokens, 77 to 630 GFLOP). MATMUL_TUNE=0 turns the tuning off, =2 also prints
// each shape's choice on stderr.
#define TUNE_CANDIDATES 8
#define TUNE_MIN_FLOPS 1e10

struct MatmulShape { // everything the heuristic sees
    int m, n, k, lda, ldb, ldd, batch;
    bool transpose_a, transpose_b, bias, c_in;
    cublasLtEpilogue_t epilogue;
    cudaDataType_t d_type;
};
static bool same_shape(const MatmulShape& x, const MatmulShape& y) {
    return x.m == y.m && x.n == y.n && x.k == y.k && x.lda == y.lda && x.ldb == y.ldb && x.ldd == y.ldd &&
           x.batch == y.batch && x.transpose_a == y.transpose_a && x.transpose_b == y.transpose_b && x.bias == y.bias &&
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

// After the work queued on `stream` (it waits for it).
static unsigned long long hash_output(const void* d, size_t bytes, cudaStream_t stream) {
    static unsigned long long* hash = NULL;
    if (!hash) cudaCheck(cudaMalloc(&hash, sizeof *hash));
    cudaCheck(cudaMemsetAsync(hash, 0, sizeof *hash, stream));
    hash_words_kernel<<<2 * device_sm_count, 256, 0, stream>>>(hash, (const unsigned short*)d, bytes / 2);
    cudaCheck(cudaGetLastError());
    unsigned long long result;
    cudaCheck(cudaMemcpyAsync(&result, hash, sizeof result, cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    return result;
}

// The algorithm for a product: with `tune`, the tuned one of its shape (tuned on its first call:
// `run` runs the product with a candidate on `stream`, overwriting d, `d_bytes` long), else the
// heuristic's first choice.
template <class Run>
static cublasLtMatmulAlgo_t choose_algo(const MatmulShape& shape, cublasLtMatmulDesc_t desc,
                                        cublasLtMatrixLayout_t layout_a, cublasLtMatrixLayout_t layout_b,
                                        cublasLtMatrixLayout_t layout_d, bool tune, const void* d, size_t d_bytes,
                                        cudaStream_t stream, Run run) {
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
            const unsigned long long hash = hash_output(d, d_bytes, stream);
            if (i == 0) first_hash = hash;
            else if (hash != first_hash) {
                other_bits++;
                continue;
            }
            float ms = INFINITY;
            for (int repeat = 0; repeat < 3; repeat++) { // the least of three: noise only adds
                cudaCheck(cudaEventRecord(start, stream));
                run(candidates[i].algo);
                cudaCheck(cudaEventRecord(stop, stream));
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

// `count` products at once (a strided batch), the i-th's A, B and D the first's plus i times these
// strides (elements).
struct Batch {
    int count;
    int64_t stride_a, stride_b, stride_d;
};

// D (m, n, column-major, ld ldd) = op(A) (m, k) @ op(B) (k, n) [+ D if accumulate, or + c_in (D's
// shape and type) if given] [+ bias (m)], in fp32, then the epilogue with `aux`, for each product of
// the batch, on `on`'s stream. D is floatX, or float where d_type is CUDA_R_32F (weight gradients).
static void matmul_cublaslt(MatmulStream& on, void* d, const floatX* a, const floatX* b, const floatX* bias,
                            int m, int n, int k, bool transpose_a, bool transpose_b,
                            int lda, int ldb, int ldd, bool accumulate,
                            Epilogue epilogue = PLAIN, const floatX* aux = NULL,
                            cudaDataType_t d_type = CUDA_FLOATX, const floatX* c_in = NULL,
                            Batch batch = {1, 0, 0, 0}) {
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
    if (batch.count > 1) {
        const cublasLtMatrixLayout_t layouts[3] = {layout_a, layout_b, layout_d};
        const int64_t strides[3] = {batch.stride_a, batch.stride_b, batch.stride_d};
        for (int i = 0; i < 3; i++) {
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch.count,
                                                         sizeof batch.count));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &strides[i], sizeof strides[i]));
        }
    }
    float alpha = 1.0f, beta = accumulate || c_in ? 1.0f : 0.0f;
    const void* c = c_in ? (const void*)c_in : d;
    void* workspace = on.workspace ? on.workspace : cublaslt_workspace;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, layout_a, b, layout_b, &beta, c, layout_d, d,
                                   layout_d, &algo, workspace, cublaslt_workspace_bytes, on.stream));
    };
    const MatmulShape shape = {m, n, k, lda, ldb, ldd, batch.count, transpose_a, transpose_b, bias != NULL,
                               c_in != NULL, mode, d_type};
    const size_t d_bytes =
        ((size_t)batch.stride_d * (batch.count - 1) + (size_t)ldd * (n - 1) + m) * (d_type == CUDA_R_32F ? 4 : 2);
    const bool tune = !accumulate && 2.0 * m * n * k * batch.count >= TUNE_MIN_FLOPS && tuning_level() > 0;
    run(choose_algo(shape, desc, layout_a, layout_b, layout_d, tune, d, d_bytes, on.stream, run));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// ---- products over groups of rows ------------------------------------------------------------
// A product that makes each row of its output from the same row of its input (the forward's, dinp)
// must, where its rows come in groups (kernels.h: group_rows), give each row the bits of
// a product over its group alone. A cuBLASLt call per group does, but costs: with --batch-invariant
// 8 the d12 step's products of 8K rows took 4-60% longer than one of 64K (profile_step). One call
// over all rows gives the same bits where its algorithm sums each output
// over k as the group's does. A kernel's order of summation is fixed by its code and the shape, not
// by the data, so that holds for every call of the two shapes or for none: the first call of each
// grouped shape runs the product both ways and compares hashes of the whole output, and the later
// calls make one call over all rows where they agreed, a call per group where they did not
// (MATMUL_TUNE=2 prints which).

// The verdicts of such checks (here and in weight_gradients below), by shape.
template <class Shape> struct Verdicts {
    Shape shapes[64];
    bool one_call[64];
    int count = 0;
    int find(const Shape& shape) const { // the verdict (1: one call, 0: a call per group), -1: not checked yet
        for (int i = 0; i < count; i++)
            if (shapes[i] == shape) return one_call[i];
        return -1;
    }
    void record(const Shape& shape, bool verdict) {
        if (count < 64) shapes[count] = shape, one_call[count++] = verdict;
    }
};

struct GroupedShape {
    int m, n, k, group_n, lda, ldb, ldd;
    bool transpose_a, bias, c_in;
    Epilogue epilogue;
    bool operator==(const GroupedShape& y) const {
        return m == y.m && n == y.n && k == y.k && group_n == y.group_n && lda == y.lda && ldb == y.ldb &&
               ldd == y.ldd && transpose_a == y.transpose_a && bias == y.bias && c_in == y.c_in &&
               epilogue == y.epilogue;
    }
};

// D (m, n, floatX) = op(A) @ B (k, n, not transposed) [+ c_in] [+ bias], then the epilogue with aux,
// where each of D's columns (a row of the layer's output) must have the bits of a product over its
// group of group_n columns alone (a divisor of n).
static void matmul_cublaslt_rows(int group_n, floatX* d, const floatX* a, const floatX* b, const floatX* bias,
                                 int m, int n, int k, bool transpose_a, int lda, int ldb, int ldd,
                                 Epilogue epilogue, const floatX* aux, const floatX* c_in) {
    auto columns = [&](int col0, int cols) {
        const size_t at = (size_t)col0 * ldd;
        matmul_cublaslt(default_stream, d + at, a, b + (size_t)col0 * ldb, bias, m, cols, k, transpose_a, false, lda,
                        ldb, ldd, false, epilogue, aux ? aux + at : NULL, CUDA_FLOATX, c_in ? c_in + at : NULL);
    };
    auto in_groups = [&] {
        for (int col0 = 0; col0 < n; col0 += group_n) columns(col0, group_n);
    };
    if (group_n == n) {
        columns(0, n);
        return;
    }
    static Verdicts<GroupedShape> verdicts;
    const GroupedShape shape = {m, n, k, group_n, lda, ldb, ldd, transpose_a, bias != NULL, c_in != NULL, epilogue};
    const int verdict = verdicts.find(shape);
    if (verdict >= 0) {
        if (verdict) columns(0, n);
        else in_groups();
        return;
    }
    const size_t d_bytes = ((size_t)ldd * (n - 1) + m) * sizeof(floatX);
    columns(0, n);
    const unsigned long long whole = hash_output(d, d_bytes, 0);
    in_groups(); // last, so that d holds the groups' bits whatever the verdict
    const bool one_call = hash_output(d, d_bytes, 0) == whole;
    if (tuning_level() == 2)
        fprintf(stderr, "matmul %dx%dx%d in groups of %d columns: %s\n", m, n, k, group_n,
                one_call ? "one call (the groups' bits)" : "a call per group (one call has other bits)");
    verdicts.record(shape, one_call);
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

// dweight (OC, C) += (or, with write_dweight, =) the first C rows of each column of `parts` products
// (column-major (ld, OC), part_stride floats apart), one product after the other, and dbias += their
// row C where dbias is given (inp with the bias columns: that row is dout's column sums). A thread
// takes 4 columns of a row: one 16-byte load a product and one store where `vector` (C, ld and
// part_stride multiples of 4, dweight and products 16-byte aligned), else the 4 one by one: with 4
// bytes in flight a thread the pass moved about half the memory's bandwidth (docs/performance.md).
// Every element gets the same adds in the same order either way.
__global__ void add_weight_gradient_parts_kernel(float* dweight, float* dbias, const float* products, int parts,
                                                 size_t part_stride, int C, int OC, int ld, bool write_dweight,
                                                 bool vector) {
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    const int quads = (C + 3) / 4; // a row's groups of 4 columns
    for (size_t i = first; i < (size_t)OC * quads; i += stride) {
        const int oc = (int)(i / quads), c = (int)(i % quads) * 4;
        float* sum = dweight + (size_t)oc * C + c;
        const float* column = products + (size_t)oc * ld + c;
        if (vector) {
            float4 value = write_dweight ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : *(const float4*)sum;
            for (int p = 0; p < parts; p++) {
                const float4 x = *(const float4*)(column + p * part_stride);
                value.x += x.x;
                value.y += x.y;
                value.z += x.z;
                value.w += x.w;
            }
            *(float4*)sum = value;
        } else {
            for (int k = 0; k < 4 && c + k < C; k++) {
                float value = write_dweight ? 0.0f : sum[k];
                for (int p = 0; p < parts; p++) value += column[p * part_stride + k];
                sum[k] = value;
            }
        }
    }
    if (dbias)
        for (size_t oc = first; oc < (size_t)OC; oc += stride) {
            float value = dbias[oc];
            for (int p = 0; p < parts; p++) value += products[p * part_stride + oc * ld + C];
            dbias[oc] = value;
        }
}

// The groups' products of a weight gradient at once: at most this many bytes of them.
#define WGRAD_PARTS_BYTES ((size_t)64 << 20)

// dweight += inp^T dout over groups of group_rows rows, group after group (kernels.h; with GRAD_WRITE
// the first group's sum is written, dweight not read), and where dbias is given (inp has the bias
// columns then) dbias += dout's column sums from the same products. A group's product is, without
// the bias columns, added to dweight by cuBLASLt's epilogue (the first written with GRAD_WRITE);
// with them (C + LINEAR_BIAS_COLUMNS rows instead of C) written, then added by
// add_weight_gradient_parts_kernel, row C into dbias (at fc's shape in GPT-2 124M, B 64, the bias row
// and the tiny add cost less than a fifth of a column-sum pass over dout; being written, it is tuned).
// With many groups (--batch-invariant) a call per group leaves much of the GPU idle: qkv's weight
// gradient at 8K rows a group is 54 tiles of 128 x 256 for 132 SMs. So where several groups'
// products fit in WGRAD_PARTS_BYTES, they are made by one strided batched call into partials, which
// one kernel adds group after group. That has the bits of a call per group where the batched
// kernel sums each product as the single call's does (and its epilogue's add is the same rounding):
// as for the row products above, the first call of each shape runs both and compares hashes, and
// later calls take the batched form only where they agreed.
struct WeightGradientShape {
    int rows, OC, group_rows, ld_inp, groups;
    bool operator==(const WeightGradientShape& y) const {
        return rows == y.rows && OC == y.OC && group_rows == y.group_rows && ld_inp == y.ld_inp && groups == y.groups;
    }
};

static void weight_gradients(MatmulStream& on, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                             int N, int C, int OC, int ld_inp, int group_rows, int dweight_mode) {
    const bool bias_row = dbias != NULL;
    const int rows = bias_row ? C + LINEAR_BIAS_COLUMNS : C; // a group's product: column-major (rows, OC)
    const int groups = N / group_rows;
    const size_t part = (size_t)rows * OC;
    int batch = 1; // groups a batched call: the largest divisor of groups that fits
    for (int b = 2; b <= groups; b++)
        if (groups % b == 0 && b * part * sizeof(float) <= WGRAD_PARTS_BYTES) batch = b;
    float* parts = bias_row || batch > 1 ? (float*)grow_scratch(&on.parts, &on.parts_capacity,
                                                                batch * part * sizeof(float),
                                                                "the weight gradients' products")
                                         : NULL;
    // 16-byte adds where rows (the products' ld) is a multiple of 4, and with it part = rows x OC.
    const bool vector = C % 4 == 0 && rows % 4 == 0 && aligned16(dweight, parts);
    const int add_blocks = (int)ceil_div((size_t)OC * ceil_div(C, 4), 256);
    // The parts of the groups from g0 on, added to dweight (written over it from group 0 with GRAD_WRITE).
    auto add_parts = [&](int g0, int count) {
        const bool write = dweight_mode == GRAD_WRITE && g0 == 0;
        add_weight_gradient_parts_kernel<<<add_blocks, 256, 0, on.stream>>>(dweight, dbias, parts, count, part, C, OC,
                                                                            rows, write, vector);
        launchCheck();
    };
    // `count` groups' products from group g0 on, each into parts (written) or into dweight (added,
    // or group 0's written with GRAD_WRITE).
    auto products = [&](int g0, int count, bool into_dweight) {
        const size_t row0 = (size_t)g0 * group_rows;
        const bool add = into_dweight && !(dweight_mode == GRAD_WRITE && g0 == 0);
        matmul_cublaslt(on, into_dweight ? (void*)dweight : (void*)parts, inp + row0 * ld_inp, dout + row0 * OC, NULL,
                        rows, OC, group_rows, false, true, ld_inp, OC, rows, add, PLAIN, NULL, CUDA_R_32F, NULL,
                        Batch{count, (int64_t)group_rows * ld_inp, (int64_t)group_rows * OC, (int64_t)part});
    };
    auto per_group = [&] {
        for (int g = 0; g < groups; g++) {
            products(g, 1, !bias_row);
            if (bias_row) add_parts(g, 1);
        }
    };
    auto batched = [&] {
        for (int g = 0; g < groups; g += batch) {
            products(g, batch, false);
            add_parts(g, batch);
        }
    };
    if (batch == 1) {
        per_group();
        return;
    }
    static Verdicts<WeightGradientShape> verdicts;
    const WeightGradientShape shape = {rows, OC, group_rows, ld_inp, groups};
    const int verdict = verdicts.find(shape);
    if (verdict >= 0) {
        if (verdict) batched();
        else per_group();
        return;
    }
    // Both forms from the same gradients: saved first, restored between them.
    const size_t weight_bytes = (size_t)OC * C * sizeof(float), bias_bytes = bias_row ? OC * sizeof(float) : 0;
    float* saved = (float*)dev_malloc(weight_bytes + bias_bytes, "the weight gradients before their check");
    auto copy = [&](void* to, const void* from, size_t bytes) {
        cudaCheck(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, on.stream));
    };
    copy(saved, dweight, weight_bytes);
    if (bias_row) copy(saved + (size_t)OC * C, dbias, bias_bytes);
    auto hash = [&] {
        const unsigned long long weight_hash = hash_output(dweight, weight_bytes, on.stream);
        return weight_hash ^ (bias_row ? hash_output(dbias, bias_bytes, on.stream) : 0);
    };
    batched();
    const unsigned long long batched_hash = hash();
    copy(dweight, saved, weight_bytes);
    if (bias_row) copy(dbias, saved + (size_t)OC * C, bias_bytes);
    per_group(); // last, so that the gradients have the per-group bits whatever the verdict
    const bool one_call = hash() == batched_hash; // hash waits for the stream, so `saved` is free
    dev_free(saved);
    if (tuning_level() == 2)
        fprintf(stderr, "weight gradient %dx%d over %d groups of %d rows, %d a call: %s\n", rows, OC, groups, group_rows,
                batch, one_call ? "batched (the per-group bits)" : "a call per group (batched has other bits)");
    verdicts.record(shape, one_call);
}

// dweight^T (C, OC) += (or = first, dweight_mode) inp^T (C, rows) @ dout (column-major (OC, rows))^T for
// each group of rows (weight_gradients, on `on`'s stream), and dbias += dout's column sums: from the
// same products where inp has the bias columns (kernels.h), else by column_sums_accumulate on the
// default stream.
static void weight_and_bias_gradients(MatmulStream& on, float* dweight, float* dbias, const floatX* dout,
                                      const floatX* inp, int N, int C, int OC, int ld_inp, int group_rows,
                                      int dweight_mode) {
    const bool bias_row = dweight && dbias && ld_inp > C;
    if (dweight)
        weight_gradients(on, dweight, bias_row ? dbias : NULL, dout, inp, N, C, OC, ld_inp, group_rows, dweight_mode);
    if (dbias && !bias_row) column_sums_accumulate(dbias, N, OC, group_rows, MatrixColumns{dout, OC});
}

// dinp = dout @ weight (then the epilogue on it, with aux `pre`), its rows in groups of group_rows;
// dweight += (or =, dweight_mode) dout^T @ inp and dbias += column sums of dout, summed group by group
// (weight_gradients).
static void linear_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                            const floatX* weight, int N, int C, int OC, int ld_inp, int group_rows, int dweight_mode,
                            Epilogue dinp_epilogue, const floatX* pre) {
    check_row_groups("matmul_backward", N, group_rows);
    check_linear_ld("matmul_backward", C, ld_inp);
    // dinp^T (C, N) = weight (column-major (C, OC)) @ dout^T (OC, N).
    if (dinp)
        matmul_cublaslt_rows(group_rows, dinp, weight, dout, NULL, C, N, OC, false, C, OC, C, dinp_epilogue, pre, NULL);
    weight_and_bias_gradients(default_stream, dweight, dbias, dout, inp, N, C, OC, ld_inp, group_rows, dweight_mode);
}

void matmul_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                     const floatX* weight, int N, int C, int OC, int ld_inp, int group_rows, int dweight_mode) {
    linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, ld_inp, group_rows, dweight_mode, PLAIN, NULL);
}

// On the second stream, after the default stream's work so far (the streams section above), where
// the rows make a chunk of COLSUM_ROWS rows for every SM; else on the default stream (see there).
void matmul_backward_weights(float* dweight, float* dbias, const floatX* dout, const floatX* inp, int N, int C, int OC,
                             int ld_inp, int group_rows, int dweight_mode) {
    check_row_groups("matmul_backward_weights", N, group_rows);
    check_linear_ld("matmul_backward_weights", C, ld_inp);
    if (!row_chunks_fill_sms(N, group_rows)) {
        weight_and_bias_gradients(default_stream, dweight, dbias, dout, inp, N, C, OC, ld_inp, group_rows,
                                  dweight_mode);
        return;
    }
    MatmulStream& on = side_stream();
    cudaCheck(cudaEventRecord(side.ready, 0));
    cudaCheck(cudaStreamWaitEvent(on.stream, side.ready, 0));
    weight_and_bias_gradients(on, dweight, dbias, dout, inp, N, C, OC, ld_inp, group_rows, dweight_mode);
    cudaCheck(cudaEventRecord(side.done, on.stream));
}

// The default stream's later work waits for the second stream's; the host does not.
void matmul_backward_wait(void) {
    if (side.on.stream) cudaCheck(cudaStreamWaitEvent(0, side.done, 0));
}

// Whether the GELU's backward goes into cuBLASLt's epilogue for activations `width` wide; if not,
// the matmul and gelu_backward run in turn. The epilogue's GELU agrees with gelu_backward (the
// tanh form) only to a few 1e-3 (measured in an FP32 build: 3.7e-3 relative on one gradient
// element): within bf16's rounding (3.9e-3), but 8 times fp16's (4.9e-4), and the FP32 build must
// match the CPU to 1e-5, so only the BF16 build takes it. cuBLASLt
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

void matmul_backward_gelu(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                          const floatX* weight, const floatX* pre, int N, int C, int OC, int group_rows,
                          int dweight_mode) {
    if (!gelu_epilogue(C)) {
        matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, C, group_rows, dweight_mode);
        gelu_backward(dinp, pre, dinp, (size_t)N * C);
        return;
    }
    linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, C, group_rows, dweight_mode, GELU_BACKWARD, pre);
}
