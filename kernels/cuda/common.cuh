// Shared by the CUDA kernel files: checked calls, the library handles, floatX helpers, block
// reductions, a 16-byte elementwise map and a deterministic column reduction.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h> // CUtensorMap
#include <cuda_runtime.h>
#include <curand.h>
#include <stdint.h>

#include "common/util.h"
#include "kernels/checks.h"
#include "kernels/kernels.h"

// Every CUDA, cuBLAS and cuRAND call goes through one of these: a failure names the call, the file
// and the line, then exits.
#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
#define cublasCheck(call) cublas_check((call), #call, __FILE__, __LINE__)
#define curandCheck(call) curand_check((call), #call, __FILE__, __LINE__)
// After every kernel launch: launch errors (bad configuration, no kernel image for this GPU).
#define launchCheck() cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

static inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
    if (err != cudaSuccess) fatal("CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(err),
                                  cudaGetErrorString(err), call, file, line);
}
static inline void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        fatal("cuBLAS error %d (%s) in %s at %s:%d", (int)status, cublasGetStatusString(status), call,
              file, line);
}
static inline void curand_check(curandStatus_t status, const char* call, const char* file, int line) {
    if (status != CURAND_STATUS_SUCCESS)
        fatal("cuRAND error %d in %s at %s:%d", (int)status, call, file, line);
}

// Created by backend_init (backend.cu). Work runs on the default stream, but for the weight gradients
// of matmul_backward_weights (matmul.cu), which have a second stream and workspace of their own.
extern cublasHandle_t cublas_handle;
extern cublasLtHandle_t cublaslt_handle;
extern void* cublaslt_workspace;
extern size_t cublaslt_workspace_bytes;
extern int device_sm_count;
extern size_t device_shared_per_sm; // bytes of shared memory an SM has for its blocks
// The __CUDA_ARCH__ of the code the current GPU runs of this build: 750 for an sm_75 build, also
// where a newer card runs it through the driver's JIT (800 likewise for an sm_80 build), 900 for
// the sm_90a code of an H100/H200.
int device_code_arch(void);

// cp.async (sm_80 on): global to shared memory without passing through registers, so that a load
// can be in flight while the thread works on something else. A thread sees its own copies once
// cp_async_wait has let their group through.
// sm_75 (Turing, FP16 build) has no cp.async: there the copy is a plain load and store, done when the
// call returns, which is one of the moments an asynchronous copy may land at; so code that is right
// with cp.async (it reads a buffer only after the wait and a barrier, and never copies into one
// that others may still read) is right with these too, only without the overlap.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
// 16 bytes; zeros where !valid.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
#else
    *(uint4*)dst = valid ? *(const uint4*)src : make_uint4(0, 0, 0, 0);
#endif
}
// 4 bytes; zeros where !valid.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
#else
    *(uint32_t*)dst = valid ? *(const uint32_t*)src : 0u;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending> __device__ __forceinline__ void cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

// A TMA tensor map (cuda.h's CUtensorMap) of a (depth, rows, width) matrix whose rows are row_stride
// elements apart (a multiple of 16 bytes), in boxes of box_rows rows by 128 bytes of a row, with the
// 128-byte swizzle that wgmma's shared-memory descriptors read (16-byte chunk c of box row r at chunk
// c ^ (r % 8)). Loads give zeros outside the matrix; stores and adds skip it. The Wgmma flash
// attention kernels and the fc layer's product with its GELU load their tiles through these.
CUtensorMap tensor_map_3d(const void* base, CUtensorMapDataType type, size_t element_bytes, int depth, int rows,
                          int width, int row_stride, int box_rows);
// Whether this GPU runs `kernel`'s sm_90a code (wgmma, TMA): an H100/H200 (compute capability 9.0),
// a build that holds that code (GPU_ARCH including 90, built as sm_90a), and no KERNEL_PATH.
bool sm90a_code_runs(const void* kernel);
// The card whose kernels KERNEL_PATH=sm75|sm80|sm86 asks for (75, 80 or 86), 0 when it is unset.
int forced_kernel_path(void);

// Working memory that grows on demand and is never returned (reused by later calls of the same
// layer). Safe because the work that uses a buffer runs in order on one stream, and cudaFree
// synchronizes the device.
void* grow_scratch(void** buffer, size_t* capacity, size_t bytes, const char* what);

// floatX's type for cuBLASLt and TMA.
#if defined(PRECISION_BF16)
#define CUDA_FLOATX CUDA_R_16BF
#define TENSOR_MAP_FLOATX CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
#elif defined(PRECISION_FP16)
#define CUDA_FLOATX CUDA_R_16F
#define TENSOR_MAP_FLOATX CU_TENSOR_MAP_DATA_TYPE_FLOAT16
#else
#define CUDA_FLOATX CUDA_R_32F
#define TENSOR_MAP_FLOATX CU_TENSOR_MAP_DATA_TYPE_FLOAT32
#endif

#if !defined(PRECISION_FP32)
// Two floatX (bf16 or fp16) in one 32-bit word, lo in the low half: how the tensor-core kernels
// pack operands and store pairs of outputs.
#if defined(PRECISION_BF16)
typedef __nv_bfloat162 floatX2;
__device__ __forceinline__ floatX2 floatX2_from_floats(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
__device__ __forceinline__ float2 floats_from_floatX2(floatX2 v) { return __bfloat1622float2(v); }
#else
typedef __half2 floatX2;
__device__ __forceinline__ floatX2 floatX2_from_floats(float lo, float hi) { return __floats2half2_rn(lo, hi); }
__device__ __forceinline__ float2 floats_from_floatX2(floatX2 v) { return __half22float2(v); }
#endif
__device__ __forceinline__ uint32_t pack_floatX2(float lo, float hi) {
    floatX2 v = floatX2_from_floats(lo, hi);
    return *(uint32_t*)&v;
}
#endif

// floatX elements in one 16-byte vector.
#define X128 ((int)(16 / sizeof(floatX)))
struct __align__(16) PackedX {
    floatX v[16 / sizeof(floatX)];
};
// True when every pointer given is 16-byte aligned, as 16-byte loads and stores (PackedX, float4) need.
template <typename... T> __host__ __device__ inline bool aligned16(const T*... p) {
    return ((uintptr_t)p | ...) % 16 == 0;
}

static inline unsigned int ceil_div(size_t a, size_t b) { return (unsigned int)((a + b - 1) / b); }

// adamw_update (kernels.h) on gradients of type G: float, or in a GRADS=BF16 build also gradX's bf16,
// each gradient widened to a float before the same arithmetic, so bf16 gradients update as their
// float values would. adamw_update is the gradX instance; the kernel tests hold the two against
// each other (adamw.cu).
template <typename G>
void adamw_update_typed(floatX* param, float* master, const G* grad, float* m, float* v, size_t n, size_t index0,
                        float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t,
                        unsigned long long seed);

__device__ inline float warp_sum(float x) {
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
    return x;
}
__device__ inline float warp_max(float x) {
    for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
    return x;
}
// Reduction over the whole block (blockDim.x a multiple of 32, at most 1024) in a fixed order, so
// the result is bit-identical from run to run. Every thread gets the result.
template <float (*warp_reduce)(float)> __device__ inline float block_reduce(float x, float identity) {
    __shared__ float warp_results[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    x = warp_reduce(x);
    __syncthreads(); // warp_results may still be read by a previous call
    if (lane == 0) warp_results[warp] = x;
    __syncthreads();
    x = lane < warps ? warp_results[lane] : identity;
    return warp_reduce(x);
}
__device__ inline float block_sum(float x) { return block_reduce<warp_sum>(x, 0.0f); }
__device__ inline float block_max(float x) { return block_reduce<warp_max>(x, -INFINITY); }

#define LOG2E 1.4426950408889634f // exp(x) = exp2(x * LOG2E)
// 2^x in one MUFU instruction (relative error about 2^-22); results below 2^-126 become 0, which
// in a softmax vanish beside the row's largest term, 1.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Loads the X128 elements of p at i .. i + X128 (those below end; `fill` from end on) as floats:
// one 16-byte load when `vector` (i aligned and the whole vector inside the array), else one by one.
__device__ inline void load_x128(float out[X128], const floatX* p, size_t i, size_t end, bool vector,
                                 float fill = 0.0f) {
    if (vector) {
        PackedX packed = *(const PackedX*)(p + i);
        for (int k = 0; k < X128; k++) out[k] = (float)packed.v[k];
    } else {
        for (int k = 0; k < X128; k++) out[k] = i + k < end ? (float)p[i + k] : fill;
    }
}
// Stores vals as X128 floatX at p[i ..]: one 16-byte store when `vector`, else the elements below end.
__device__ inline void store_x128(floatX* p, const float vals[X128], size_t i, size_t end, bool vector) {
    PackedX packed;
    for (int k = 0; k < X128; k++) packed.v[k] = (floatX)vals[k];
    if (vector) *(PackedX*)(p + i) = packed;
    else
        for (int k = 0; k < X128 && i + k < end; k++) p[i + k] = packed.v[k];
}

// out[i] = op(a[i], b[i]) for i < n, in fp32, rounded once to floatX. One thread per 16 bytes,
// vector loads and stores when all three arrays are 16-byte aligned.
template <class Op>
__global__ void map2_kernel(floatX* out, const floatX* a, const floatX* b, size_t n, Op op) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * X128;
    if (i >= n) return;
    bool aligned = (((uintptr_t)out | (uintptr_t)a | (uintptr_t)b) % 16) == 0;
    if (aligned && i + X128 <= n) {
        PackedX pa = *(const PackedX*)(a + i), pb = *(const PackedX*)(b + i), po;
        for (int k = 0; k < X128; k++) po.v[k] = (floatX)op((float)pa.v[k], (float)pb.v[k]);
        *(PackedX*)(out + i) = po;
    } else {
        for (size_t k = i; k < i + X128 && k < n; k++) out[k] = (floatX)op((float)a[k], (float)b[k]);
    }
}
template <class Op> void map2(floatX* out, const floatX* a, const floatX* b, size_t n, Op op) {
    if (n == 0) return;
    const int threads = 256;
    map2_kernel<<<ceil_div(ceil_div(n, X128), threads), threads>>>(out, a, b, n, op);
    launchCheck();
}

// dst[c] += sum over rows r < N of value(r, c), for c < C, deterministically and in groups of
// group_rows rows (kernels.h): blocks of COLSUM_COLS columns x COLSUM_ROWS rows of one group write
// fp32 partial sums, then a second pass adds each group's partials in row order and the groups' sums
// in turn, rounding once per group into dst. `value` is a device functor with Value::SUMS (1 to 3)
// sums per column and add(int row, int col, float sums[SUMS][X128]), which adds a row's columns
// col .. col + X128 - 1 (0 from C on) into each sum, so each thread reads 16 bytes per row: with one
// 2-byte element per thread the sums were latency-bound. Every column's sum runs in the same order
// either way.
#define COLSUM_ROWS 256
#define COLSUM_LANES 8 // row lanes per block: lane y adds rows y, y + 8, ... of its chunk
// Whether N rows in groups of group_rows make at least one chunk of COLSUM_ROWS rows (none crossing a
// group's end) for every SM: the layernorm backward's condition for its one pass.
static inline bool row_chunks_fill_sms(int N, int group_rows) {
    return (N / group_rows) * (int)ceil_div(group_rows, COLSUM_ROWS) >= device_sm_count;
}
// Rows [*row0, *row_end) of chunk `chunk` when each group of group_rows rows is cut into chunks of
// chunk_rows (the last one of a group shorter): chunk c is part c % parts of group c / parts, and no
// chunk crosses a group's end, so a group's partial sums depend on its own rows only.
// (chunk is a block index, unsigned: its division and remainder stay unsigned ones.)
__device__ inline void group_chunk_rows(unsigned chunk, int group_rows, int chunk_rows, int* row0, int* row_end) {
    const int parts = (group_rows + chunk_rows - 1) / chunk_rows, group = chunk / parts;
    *row0 = group * group_rows + chunk % parts * chunk_rows;
    *row_end = min(*row0 + chunk_rows, (group + 1) * group_rows);
}
#define COLSUM_COLS (32 * X128)
// The plain value functor: the elements of a row-major matrix with C columns.
struct MatrixColumns {
    static constexpr int SUMS = 1;
    const floatX* x;
    int C;
    __device__ void add(int r, int c, float sums[1][X128]) const {
        float v[X128];
        load_x128(v, x + (size_t)r * C, c, C, C % X128 == 0);
        for (int k = 0; k < X128; k++) sums[0][k] += v[k];
    }
};
// Sum j's partials at partials[(j * gridDim.y + chunk) * C].
template <class Value>
__global__ void column_partial_sums_kernel(float* partials, int C, int group_rows, Value value) {
    constexpr int SUMS = Value::SUMS;
    __shared__ float sums[SUMS][COLSUM_LANES][X128][33]; // [sum][row lane][element][thread]: conflict-free
    // blockIdx.y is the chunk of rows.
    int row0, row_end;
    group_chunk_rows(blockIdx.y, group_rows, COLSUM_ROWS, &row0, &row_end);
    const int col = (blockIdx.x * 32 + threadIdx.x) * X128;
    float sum[SUMS][X128] = {};
    if (col < C)
        for (int r = row0 + threadIdx.y; r < row_end; r += COLSUM_LANES) value.add(r, col, sum);
    for (int j = 0; j < SUMS; j++)
        for (int k = 0; k < X128; k++) sums[j][threadIdx.y][k][threadIdx.x] = sum[j][k];
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        for (int j = 0; j < SUMS; j++)
            for (int k = 0; k < X128 && col + k < C; k++) {
                float total = sum[j][k];
                for (int lane = 1; lane < COLSUM_LANES; lane++) total += sums[j][lane][k][threadIdx.x];
                partials[((size_t)j * gridDim.y + blockIdx.y) * C + col + k] = total;
            }
    }
}
// The second pass for up to three sums at once (one launch: each is a latency-bound tail of C threads):
// sum j adds partials + j * groups * parts * C into dst[j].
struct ColumnSumTargets {
    float* dst[3];
};
__global__ void add_column_partials_kernel(ColumnSumTargets targets, const float* partials, int groups, int parts,
                                           int C);
void add_column_partials(ColumnSumTargets targets, int sums, const float* partials, int groups, int parts, int C);
float* column_partials_buffer(size_t count);
// targets.dst[j] += sum j of each column, for j < Value::SUMS.
template <class Value>
void column_sums_accumulate(ColumnSumTargets targets, int N, int C, int group_rows, Value value) {
    check_row_groups("column sums", N, group_rows);
    int groups = N / group_rows, parts = (int)ceil_div(group_rows, COLSUM_ROWS);
    float* partials = column_partials_buffer((size_t)Value::SUMS * groups * parts * C);
    column_partial_sums_kernel<<<dim3(ceil_div(C, COLSUM_COLS), groups * parts), dim3(32, COLSUM_LANES)>>>(
        partials, C, group_rows, value);
    launchCheck();
    add_column_partials(targets, Value::SUMS, partials, groups, parts, C);
}
template <class Value> void column_sums_accumulate(float* dst, int N, int C, int group_rows, Value value) {
    static_assert(Value::SUMS == 1, "one sum for one target");
    column_sums_accumulate(ColumnSumTargets{{dst}}, N, C, group_rows, value);
}
