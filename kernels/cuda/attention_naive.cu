// Naive causal self-attention: the scores (B, NH, T, T) are materialised by batched cuBLAS GEMMs
// straight on the qkv layout (B, T, 3, NH, HS) (each head's q, k, v rows are 3C apart), a softmax
// kernel turns them into probabilities in place, and they are kept in `saved` for the backward.
#if defined(ATTN_FLASH)
#error "ATTN=flash for the CUDA backend is not written yet; build with ATTN=naive"
#endif
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/constants.h"

size_t attention_saved_bytes(int B, int T, int NH) { return (size_t)B * NH * T * T * sizeof(floatX); }
size_t attention_scratch_bytes(int B, int T, int C, int NH) {
    (void)C;
    return (size_t)B * NH * T * T * sizeof(floatX); // dP, then dS in place
}
const char* attention_name(void) { return "naive"; }
const char* attention_kernels(void) { return ""; }

// The per-(b, h) matrices of one call, for cublasGemmBatchedEx's pointer arrays: matrix j of
// batch item (b, h) starts at base[j] + b * batch_stride[j] + h * head_stride[j] (in elements).
#define MAX_MATRICES 9
struct BatchMatrices {
    const floatX* base[MAX_MATRICES];
    size_t batch_stride[MAX_MATRICES], head_stride[MAX_MATRICES];
};

__global__ void fill_pointers_kernel(const floatX** pointers, BatchMatrices mats, int count, int B, int NH) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count * B * NH) return;
    int j = i / (B * NH), b = i % (B * NH) / NH, h = i % NH;
    pointers[i] = mats.base[j] + b * mats.batch_stride[j] + h * mats.head_stride[j];
}

// Device pointer arrays for `count` matrices; matrix j's array is the result + j * B * NH.
static const floatX** batch_pointers(const BatchMatrices* mats, int count, int B, int NH) {
    static void* buffer;
    static size_t capacity;
    const floatX** pointers = (const floatX**)grow_scratch(&buffer, &capacity,
                                                           (size_t)count * B * NH * sizeof(floatX*),
                                                           "attention pointer arrays");
    fill_pointers_kernel<<<ceil_div((size_t)count * B * NH, 256), 256>>>(pointers, *mats, count, B, NH);
    launchCheck();
    return pointers;
}

// For every batch item: C (m, n, column-major, ld ldc) = alpha op(A) (m, k) @ op(B) (k, n).
static void batched_gemm(int m, int n, int k, bool transpose_a, bool transpose_b, float alpha,
                         const floatX* const* a, int lda, const floatX* const* b, int ldb,
                         const floatX* const* c, int ldc, int batch) {
    float beta = 0.0f;
    cublasCheck(cublasGemmBatchedEx(cublas_handle, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                                    (const void* const*)a, CUDA_FLOATX, lda, (const void* const*)b,
                                    CUDA_FLOATX, ldb, &beta, (void* const*)c, CUDA_FLOATX, ldc, batch,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// One warp per row (b, h, i) of the T x T scores: causal softmax over j <= i, zeros above.
__global__ void softmax_forward_kernel(floatX* att, int rows, int T) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int i = row % T;
    floatX* s = att + (size_t)row * T;
    float m = -INFINITY;
    for (int j = lane; j <= i; j += 32) m = fmaxf(m, (float)s[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j <= i; j += 32) sum += expf((float)s[j] - m);
    float inv_sum = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32) s[j] = (floatX)(j <= i ? expf((float)s[j] - m) * inv_sum : 0.0f);
}

// dS = scale * P * (dP - sum_j P dP), in place over dP, per row (j <= i; zeros above).
__global__ void softmax_backward_kernel(floatX* dp, const floatX* p, int rows, int T, float scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int i = row % T;
    floatX* d = dp + (size_t)row * T;
    const floatX* pr = p + (size_t)row * T;
    float dot = 0.0f;
    for (int j = lane; j <= i; j += 32) dot += (float)pr[j] * (float)d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32)
        d[j] = (floatX)(j <= i ? scale * (float)pr[j] * ((float)d[j] - dot) : 0.0f);
}

void attention_forward(floatX* out, void* saved, const floatX* qkv, int B, int T, int C, int NH) {
    int HS = C / NH, batch = B * NH;
    size_t qkv_b = (size_t)T * 3 * C, att_b = (size_t)NH * T * T, out_b = (size_t)T * C;
    floatX* att = (floatX*)saved;
    enum { Q, K, V, ATT, OUT, COUNT };
    BatchMatrices mats = {{qkv, qkv + C, qkv + 2 * C, att, out},
                          {qkv_b, qkv_b, qkv_b, att_b, out_b},
                          {(size_t)HS, (size_t)HS, (size_t)HS, (size_t)T * T, (size_t)HS}};
    const floatX** ptr = batch_pointers(&mats, COUNT, B, NH);
    // S^T (T, T) = K^T Q over HS (rows of S are contiguous: row-major S is column-major S^T).
    batched_gemm(T, T, HS, true, false, ATTENTION_SCALE(HS), ptr + K * batch, 3 * C,
                 ptr + Q * batch, 3 * C, ptr + ATT * batch, T, batch);
    softmax_forward_kernel<<<ceil_div((size_t)batch * T, 8), 256>>>(att, batch * T, T);
    launchCheck();
    // out^T (HS, T) = V^T (HS, T) @ P^T.
    batched_gemm(HS, T, T, false, false, 1.0f, ptr + V * batch, 3 * C, ptr + ATT * batch, T,
                 ptr + OUT * batch, C, batch);
}

void attention_backward(floatX* dqkv, float* dbias, void* scratch, const floatX* dout, const floatX* qkv,
                        const floatX* out, const void* saved, int B, int T, int C, int NH, int group_rows) {
    (void)out; // the naive backward needs only the probabilities
    if (dbias) check_sequence_groups("attention_backward", B, T, group_rows);
    int HS = C / NH, batch = B * NH;
    size_t qkv_b = (size_t)T * 3 * C, att_b = (size_t)NH * T * T, out_b = (size_t)T * C;
    const floatX* att = (const floatX*)saved;
    floatX* datt = (floatX*)scratch;
    enum { Q, K, V, DQ, DK, DV, ATT, DATT, DOUT, COUNT };
    BatchMatrices mats = {{qkv, qkv + C, qkv + 2 * C, dqkv, dqkv + C, dqkv + 2 * C, att, datt, dout},
                          {qkv_b, qkv_b, qkv_b, qkv_b, qkv_b, qkv_b, att_b, att_b, out_b},
                          {(size_t)HS, (size_t)HS, (size_t)HS, (size_t)HS, (size_t)HS, (size_t)HS,
                           (size_t)T * T, (size_t)T * T, (size_t)HS}};
    const floatX** ptr = batch_pointers(&mats, COUNT, B, NH);
    // dP^T (T, T) = V^T dO over HS, i.e. dP[i][j] = dout_i . v_j.
    batched_gemm(T, T, HS, true, false, 1.0f, ptr + V * batch, 3 * C, ptr + DOUT * batch, C,
                 ptr + DATT * batch, T, batch);
    // dV^T (HS, T) = dO^T (HS, T) @ P: dv_j = sum_i P[i][j] dout_i.
    batched_gemm(HS, T, T, false, true, 1.0f, ptr + DOUT * batch, C, ptr + ATT * batch, T,
                 ptr + DV * batch, 3 * C, batch);
    softmax_backward_kernel<<<ceil_div((size_t)batch * T, 8), 256>>>(datt, att, batch * T, T,
                                                                     ATTENTION_SCALE(HS));
    launchCheck();
    // dQ^T (HS, T) = K^T @ dS^T: dq_i = sum_j dS[i][j] k_j.
    batched_gemm(HS, T, T, false, false, 1.0f, ptr + K * batch, 3 * C, ptr + DATT * batch, T,
                 ptr + DQ * batch, 3 * C, batch);
    // dK^T (HS, T) = Q^T @ dS: dk_j = sum_i dS[i][j] q_i.
    batched_gemm(HS, T, T, false, true, 1.0f, ptr + Q * batch, 3 * C, ptr + DATT * batch, T,
                 ptr + DK * batch, 3 * C, batch);
    if (dbias) column_sums_accumulate(dbias, B * T, 3 * C, group_rows, MatrixColumns{dqkv, 3 * C});
}
