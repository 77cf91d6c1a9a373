// The kernels of the FP32 build's flash attention (launched by attention_flash.cu; the BF16 and
// FP16 builds' tensor-core kernels are in attention_flash_tc_*.cuh): the same algorithm on CUDA cores
// in exact fp32, the forward, the dQ kernel and the dK/dV kernel (D comes from
// flash_backward_prepare in attention_flash.cu, as in the BF16 build).
//
// One warp per row: the 32 lanes take the 32 columns (keys or queries) of a tile for the scores,
// then the head dimensions (lane, lane + 32, ...) for the products with V, K, Q or dO. Rows of a
// block share the column tiles in shared memory, padded to an odd stride (conflict-free reads of
// one column per lane). Exact expf and fp32 sums.
#pragma once
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/constants.h"

#define F32_WARPS 4
#define F32_ROWS_PER_WARP 4
#define F32_ROWS (F32_WARPS * F32_ROWS_PER_WARP)
#define F32_COLS 32

// The padded row length of the shared tiles: DIMS_PER_LANE * 32 + 1 floats.
template <int DIMS_PER_LANE> __host__ __device__ constexpr int f32_stride() { return DIMS_PER_LANE * 32 + 1; }

// rows row0 .. row0 + count - 1 of a (T, HS) matrix with rows `stride` apart into a padded tile;
// rows at or past T and dimensions past HS are zeros.
template <int DIMS_PER_LANE>
__device__ void load_rows_f32(float* tile, const float* src, int row0, int count, int T, int HS, size_t stride) {
    constexpr int WIDTH = DIMS_PER_LANE * 32;
    for (int i = threadIdx.x; i < count * WIDTH; i += blockDim.x) {
        const int r = i / WIDTH, d = i % WIDTH;
        tile[r * f32_stride<DIMS_PER_LANE>() + d] = row0 + r < T && d < HS ? src[(size_t)(row0 + r) * stride + d] : 0.0f;
    }
}

// Where a block works: the first of its F32_ROWS rows (queries, or keys where KEY_ROWS), qkv's row
// length, where its head's rows of m, l and D start, and where its head's first element is in qkv and
// dqkv (q; k is C further on, v 2 C) and in out and dout (rows C apart).
struct F32Block {
    int C, row0;
    size_t stride, head_row0, qkv_head, out_head;
};
template <bool KEY_ROWS> __device__ F32Block f32_block(int T, int NH, int HS, int tail) {
    const CausalBlock place = causal_block<F32_ROWS, KEY_ROWS>(tail, NH);
    F32Block block;
    block.C = NH * HS;
    block.row0 = place.row0;
    block.stride = 3 * (size_t)block.C;
    block.head_row0 = ((size_t)place.b * NH + place.h) * T;
    block.qkv_head = (size_t)place.b * T * block.stride + place.h * HS;
    block.out_head = (size_t)place.b * T * block.C + place.h * HS;
    return block;
}

// A warp's rows row0 + warp * F32_ROWS_PER_WARP + i of `rows` (lane + 32 k holding dimension lane +
// 32 k) times `mul` into the rows of dst, `stride` apart; rows at or past T and dimensions past HS
// are not written.
template <int DIMS_PER_LANE>
__device__ void store_rows_f32(float* dst, size_t stride, const float (&rows)[F32_ROWS_PER_WARP][DIMS_PER_LANE],
                               float mul, int row0, int T, int HS) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < F32_ROWS_PER_WARP; i++) {
        const int row = row0 + warp * F32_ROWS_PER_WARP + i;
        if (row >= T) continue;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; k++)
            if (lane + 32 * k < HS) dst[row * stride + lane + 32 * k] = rows[i][k] * mul;
    }
}

__device__ inline float dot_f32(const float* a, const float* b, int HS) {
    float sum = 0.0f;
    for (int d = 0; d < HS; d++) sum += a[d] * b[d];
    return sum;
}

template <int DIMS_PER_LANE>
__global__ void flash_forward_f32_kernel(float* out, float* m_out, float* l_out, const float* qkv, int T, int NH, int HS,
                                        int tail) {
    constexpr int STRIDE = f32_stride<DIMS_PER_LANE>();
    extern __shared__ float smem_f32[];
    float* q_rows = smem_f32;
    float* k_tile = q_rows + F32_ROWS * STRIDE;
    float* v_tile = k_tile + F32_COLS * STRIDE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const F32Block block = f32_block<false>(T, NH, HS, tail);
    const int C = block.C, q0 = block.row0;
    const size_t stride = block.stride;
    const float* q_src = qkv + block.qkv_head;
    const float scale = ATTENTION_SCALE(HS);
    load_rows_f32<DIMS_PER_LANE>(q_rows, q_src, q0, F32_ROWS, T, HS, stride);
    float m_run[F32_ROWS_PER_WARP], l_run[F32_ROWS_PER_WARP], acc[F32_ROWS_PER_WARP][DIMS_PER_LANE] = {};
    for (int i = 0; i < F32_ROWS_PER_WARP; i++) {
        m_run[i] = -INFINITY;
        l_run[i] = 0.0f;
    }
    for (int c0 = 0; c0 < min(q0 + F32_ROWS, T); c0 += F32_COLS) {
        __syncthreads(); // the previous tile is no longer read
        load_rows_f32<DIMS_PER_LANE>(k_tile, q_src + C, c0, F32_COLS, T, HS, stride);
        load_rows_f32<DIMS_PER_LANE>(v_tile, q_src + 2 * C, c0, F32_COLS, T, HS, stride);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < F32_ROWS_PER_WARP; i++) {
            const int local = warp * F32_ROWS_PER_WARP + i, row = q0 + local, key = c0 + lane;
            if (row >= T || c0 > row) continue; // the whole warp agrees: uniform branch
            const bool visible = key <= row;
            const float s = visible ? dot_f32(q_rows + local * STRIDE, k_tile + lane * STRIDE, HS) * scale : -INFINITY;
            const float m_new = fmaxf(m_run[i], warp_max(s)); // finite: key c0 <= row is visible
            const float correction = expf(m_run[i] - m_new);
            const float p = visible ? expf(s - m_new) : 0.0f;
            l_run[i] = l_run[i] * correction + warp_sum(p);
            m_run[i] = m_new;
#pragma unroll
            for (int k = 0; k < DIMS_PER_LANE; k++) acc[i][k] *= correction;
            for (int j = 0; j < F32_COLS; j++) {
                const float pj = __shfl_sync(0xffffffff, p, j);
#pragma unroll
                for (int k = 0; k < DIMS_PER_LANE; k++) acc[i][k] += pj * v_tile[j * STRIDE + lane + 32 * k];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < F32_ROWS_PER_WARP; i++) {
        const int row = q0 + warp * F32_ROWS_PER_WARP + i;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; k++) acc[i][k] /= l_run[i];
        if (lane == 0 && row < T) {
            m_out[block.head_row0 + row] = m_run[i];
            l_out[block.head_row0 + row] = l_run[i];
        }
    }
    store_rows_f32<DIMS_PER_LANE>(out + block.out_head, C, acc, 1.0f, q0, T, HS);
}

// dQ: rows are queries; P = exp(s - m) / l and dP = dO V^T recomputed per key tile.
template <int DIMS_PER_LANE>
__global__ void flash_backward_dq_f32_kernel(float* dqkv, const float* dout, const float* qkv, const float* m,
                                             const float* l, const float* D, int T, int NH, int HS, int tail) {
    constexpr int STRIDE = f32_stride<DIMS_PER_LANE>();
    extern __shared__ float smem_f32[];
    float* q_rows = smem_f32;
    float* do_rows = q_rows + F32_ROWS * STRIDE;
    float* k_tile = do_rows + F32_ROWS * STRIDE;
    float* v_tile = k_tile + F32_COLS * STRIDE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const F32Block block = f32_block<false>(T, NH, HS, tail);
    const int C = block.C, q0 = block.row0;
    const size_t stride = block.stride, head_row0 = block.head_row0;
    const float* q_src = qkv + block.qkv_head;
    const float scale = ATTENTION_SCALE(HS);
    load_rows_f32<DIMS_PER_LANE>(q_rows, q_src, q0, F32_ROWS, T, HS, stride);
    load_rows_f32<DIMS_PER_LANE>(do_rows, dout + block.out_head, q0, F32_ROWS, T, HS, C);
    float dq[F32_ROWS_PER_WARP][DIMS_PER_LANE] = {};
    for (int c0 = 0; c0 < min(q0 + F32_ROWS, T); c0 += F32_COLS) {
        __syncthreads();
        load_rows_f32<DIMS_PER_LANE>(k_tile, q_src + C, c0, F32_COLS, T, HS, stride);
        load_rows_f32<DIMS_PER_LANE>(v_tile, q_src + 2 * C, c0, F32_COLS, T, HS, stride);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < F32_ROWS_PER_WARP; i++) {
            const int local = warp * F32_ROWS_PER_WARP + i, row = q0 + local, key = c0 + lane;
            if (row >= T || c0 > row) continue;
            float ds = 0.0f;
            if (key <= row) {
                const float s = dot_f32(q_rows + local * STRIDE, k_tile + lane * STRIDE, HS) * scale;
                const float p = expf(s - m[head_row0 + row]) / l[head_row0 + row];
                const float dp = dot_f32(do_rows + local * STRIDE, v_tile + lane * STRIDE, HS);
                ds = p * (dp - D[head_row0 + row]);
            }
            for (int j = 0; j < F32_COLS; j++) {
                const float dsj = __shfl_sync(0xffffffff, ds, j);
#pragma unroll
                for (int k = 0; k < DIMS_PER_LANE; k++) dq[i][k] += dsj * k_tile[j * STRIDE + lane + 32 * k];
            }
        }
    }
    store_rows_f32<DIMS_PER_LANE>(dqkv + block.qkv_head, stride, dq, scale, q0, T, HS);
}

// dK and dV: rows are keys, the tiles hold queries from the diagonal on.
template <int DIMS_PER_LANE>
__global__ void flash_backward_dkv_f32_kernel(float* dqkv, const float* dout, const float* qkv, const float* m,
                                              const float* l, const float* D, int T, int NH, int HS, int tail) {
    constexpr int STRIDE = f32_stride<DIMS_PER_LANE>();
    extern __shared__ float smem_f32[];
    float* k_rows = smem_f32;
    float* v_rows = k_rows + F32_ROWS * STRIDE;
    float* q_tile = v_rows + F32_ROWS * STRIDE;
    float* do_tile = q_tile + F32_COLS * STRIDE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const F32Block block = f32_block<true>(T, NH, HS, tail);
    const int C = block.C, k0 = block.row0;
    const size_t stride = block.stride, head_row0 = block.head_row0;
    const float* q_src = qkv + block.qkv_head;
    const float scale = ATTENTION_SCALE(HS);
    load_rows_f32<DIMS_PER_LANE>(k_rows, q_src + C, k0, F32_ROWS, T, HS, stride);
    load_rows_f32<DIMS_PER_LANE>(v_rows, q_src + 2 * C, k0, F32_ROWS, T, HS, stride);
    float dk[F32_ROWS_PER_WARP][DIMS_PER_LANE] = {}, dv[F32_ROWS_PER_WARP][DIMS_PER_LANE] = {};
    for (int c0 = k0 / F32_COLS * F32_COLS; c0 < T; c0 += F32_COLS) {
        __syncthreads();
        load_rows_f32<DIMS_PER_LANE>(q_tile, q_src, c0, F32_COLS, T, HS, stride);
        load_rows_f32<DIMS_PER_LANE>(do_tile, dout + block.out_head, c0, F32_COLS, T, HS, C);
        __syncthreads();
        const int query = c0 + lane;
        const float m_q = query < T ? m[head_row0 + query] : 0.0f;
        const float l_q = query < T ? l[head_row0 + query] : 1.0f;
        const float d_q = query < T ? D[head_row0 + query] : 0.0f;
#pragma unroll
        for (int i = 0; i < F32_ROWS_PER_WARP; i++) {
            const int local = warp * F32_ROWS_PER_WARP + i, key = k0 + local;
            if (key >= T || c0 + F32_COLS - 1 < key) continue;
            float p = 0.0f, ds = 0.0f;
            if (query >= key && query < T) {
                const float s = dot_f32(q_tile + lane * STRIDE, k_rows + local * STRIDE, HS) * scale;
                p = expf(s - m_q) / l_q;
                const float dp = dot_f32(do_tile + lane * STRIDE, v_rows + local * STRIDE, HS);
                ds = p * (dp - d_q);
            }
            for (int j = 0; j < F32_COLS; j++) {
                const float pj = __shfl_sync(0xffffffff, p, j), dsj = __shfl_sync(0xffffffff, ds, j);
#pragma unroll
                for (int k = 0; k < DIMS_PER_LANE; k++) {
                    dv[i][k] += pj * do_tile[j * STRIDE + lane + 32 * k];
                    dk[i][k] += dsj * q_tile[j * STRIDE + lane + 32 * k];
                }
            }
        }
    }
    store_rows_f32<DIMS_PER_LANE>(dqkv + block.qkv_head + C, stride, dk, scale, k0, T, HS);
    store_rows_f32<DIMS_PER_LANE>(dqkv + block.qkv_head + 2 * C, stride, dv, 1.0f, k0, T, HS);
}
