// Linear layers through cuBLASLt, fp32 accumulation (never TF32: CUBLAS_COMPUTE_32F), floatX
// inputs and outputs. cuBLAS is column-major: a row-major (rows, cols) matrix is a column-major
// (cols, rows) one, so every product below is written for the transposed matrices.
#include "kernels/cuda/common.cuh"

// D (m, n, column-major, ld ldd) = op(A) (m, k) @ op(B) (k, n) [+ bias (m)] [+ D if accumulate].
static void matmul_cublaslt(floatX* d, const floatX* a, const floatX* b, const floatX* bias,
                            int m, int n, int k, bool transpose_a, bool transpose_b,
                            int lda, int ldb, int ldd, bool accumulate) {
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    if (bias) {
        cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                   sizeof epilogue));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof bias));
    }
    cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_a, CUDA_FLOATX, transpose_a ? k : m,
                                           transpose_a ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_b, CUDA_FLOATX, transpose_b ? n : k,
                                           transpose_b ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_d, CUDA_FLOATX, m, n, ldd));
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
        fatal("cuBLASLt has no algorithm for a %dx%dx%d matmul (bias %s, transpose %d/%d)", m, n, k,
              bias ? "yes" : "no", transpose_a, transpose_b);
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

struct OutputColumn {
    const floatX* dout;
    int OC;
    __device__ float operator()(int r, int c) const { return (float)dout[(size_t)r * OC + c]; }
};

void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                     const floatX* inp, const floatX* weight, int N, int C, int OC) {
    // dinp^T (C, N) = weight (column-major (C, OC)) @ dout^T (OC, N).
    matmul_cublaslt(dinp, weight, dout, NULL, C, N, OC, false, false, C, OC, C, false);
    // dweight^T (C, OC) += inp^T (C, N) @ dout (column-major (OC, N))^T.
    matmul_cublaslt(dweight, inp, dout, NULL, C, OC, N, false, true, C, OC, C, true);
    if (dbias) column_sums_accumulate(dbias, N, OC, OutputColumn{dout, OC});
}
