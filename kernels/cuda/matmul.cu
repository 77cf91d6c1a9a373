// Linear layers through cuBLASLt, fp32 accumulation (never TF32: CUBLAS_COMPUTE_32F), floatX
// inputs and outputs, fp32 weight gradients. cuBLAS is column-major: a row-major (rows, cols) matrix is a column-major
// (cols, rows) one, so every product below is written for the transposed matrices.
#include "kernels/cuda/common.cuh"

// What the epilogue does after the product (and the bias): nothing, or GELU_BACKWARD: D = x *
// gelu'(aux), the aux matrix having D's shape and ld ldd, with cuBLASLt's own GELU (see
// gelu_epilogue for how close it is to gelu_backward's).
enum Epilogue { PLAIN, GELU_BACKWARD };

// D (m, n, column-major, ld ldd) = op(A) (m, k) @ op(B) (k, n) [+ bias (m)] [+ D if accumulate],
// then the epilogue with `aux`. D is floatX, or float where d_type is CUDA_R_32F (weight gradients).
static void matmul_cublaslt(void* d, const floatX* a, const floatX* b, const floatX* bias,
                            int m, int n, int k, bool transpose_a, bool transpose_b,
                            int lda, int ldb, int ldd, bool accumulate,
                            Epilogue epilogue = PLAIN, const floatX* aux = NULL,
                            cudaDataType_t d_type = CUDA_FLOATX) {
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
    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference,
                                                     CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &cublaslt_workspace_bytes,
                                                     sizeof cublaslt_workspace_bytes));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, layout_a, layout_b, layout_d,
                                               layout_d, preference, 1, &heuristic, &found));
    if (found == 0)
        fatal("cuBLASLt has no algorithm for a %dx%dx%d matmul (bias %s, transpose %d/%d, epilogue %d)", m, n,
              k, bias ? "yes" : "no", transpose_a, transpose_b, (int)epilogue);
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, layout_a, b, layout_b, &beta, d,
                               layout_d, d, layout_d, &heuristic.algo, cublaslt_workspace,
                               cublaslt_workspace_bytes, 0));
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                    int N, int C, int OC) {
    // out^T (OC, N) = weight (as column-major (C, OC))^T @ inp^T (C, N).
    matmul_cublaslt(out, weight, inp, bias, OC, N, C, true, false, C, C, OC, false);
}

// dinp = dout @ weight (then the epilogue on it, with aux `pre`); dweight += dout^T @ inp and dbias
// += column sums of dout, in groups of sum_rows rows: one cuBLASLt call per group for each product,
// the weight's accumulating in fp32, so every group's products have the same shape whatever N
// (cuBLASLt may pick another kernel, which sums in another order, for another shape).
static void linear_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                            const floatX* weight, int N, int C, int OC, int sum_rows, Epilogue dinp_epilogue,
                            const floatX* pre) {
    check_row_groups("matmul_backward", N, sum_rows);
    // dinp^T (C, N) = weight (column-major (C, OC)) @ dout^T (OC, N).
    for (int row0 = 0; dinp && row0 < N; row0 += sum_rows)
        matmul_cublaslt(dinp + (size_t)row0 * C, weight, dout + (size_t)row0 * OC, NULL, C, sum_rows, OC, false, false,
                        C, OC, C, false, dinp_epilogue, pre ? pre + (size_t)row0 * C : NULL);
    // dweight^T (C, OC) += inp^T (C, rows) @ dout (column-major (OC, rows))^T for each group of rows.
    for (int row0 = 0; dweight && row0 < N; row0 += sum_rows)
        matmul_cublaslt(dweight, inp + (size_t)row0 * C, dout + (size_t)row0 * OC, NULL, C, OC, sum_rows, false, true,
                        C, OC, C, true, PLAIN, NULL, CUDA_R_32F);
    if (dbias) column_sums_accumulate(dbias, N, OC, sum_rows, MatrixColumns{dout, OC});
}

void matmul_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                     const floatX* inp, const floatX* weight, int N, int C, int OC, int sum_rows) {
    linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, sum_rows, PLAIN, NULL);
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
        matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, sum_rows);
        gelu_backward(dinp, pre, dinp, (size_t)N * C);
        return;
    }
    linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, sum_rows, GELU_BACKWARD, pre);
}
