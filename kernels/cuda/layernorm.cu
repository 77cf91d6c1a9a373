// LayerNorm over rows of C, eps 1e-5, statistics in fp32.
// Memory-bound: each kernel reads every input element once, with 16-byte loads. One warp per row;
// lane l holds the row's vectors of X128 elements at columns (l + 32 v) X128, v < VECS, in registers
// (VECS fixed at compile time, the smallest that covers C, at most LN_MAX_VECS). Wider rows load
// their further vectors again where a pass needs them, and the backward then sums the parameter
// gradients in a pass of their own (layernorm_backward): right for any C, only slower. Where C is
// not a multiple of X128, or an array is not 16-byte aligned, rows are not aligned and every load is
// per element (load_x128's fallback).
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/constants.h"

#define LN_WARPS 8       // row slots per block of the backward, 32 * LN_WARPS threads
// Rows per block of the forward, one a warp. A block's slot on the SM frees only when its last row
// is done, and each warp has a single row's loads to wait for, so small blocks keep more rows in
// flight: in training, blocks of 2 warps were about 15% faster a call than blocks of 8 (the same bits).
// At the 47-64 registers it takes (BF16, sm_90), blocks of 2 warps fill at least as many warp slots
// as blocks of 8 from sm_80 to sm_90 (on sm_86, at most 16 blocks an SM: 32 warps either way in BF16).
#define LN_FWD_WARPS 2
#define LN_MAX_VECS 8    // registers for C up to 2048 in BF16, 1024 in FP32
// Rows per block of the backward that sums the parameter gradients as it goes, each block writing
// one partial sum per column: at N = 65536, 256 blocks, one wave on 132 SMs at two blocks each (128
// registers per thread in BF16 at C = 768), and 256 partials per column for the second pass.
#define LN_BWD_CHUNK 256
// Its column sums are those of its two-pass form (LayernormColumns by column_sums_accumulate) bit for
// bit, and those of dinp (dinp_sums) matmul_backward's dbias, only if its blocks add their rows as
// column_partial_sums_kernel does: chunks of COLSUM_ROWS rows, each taken by COLSUM_LANES row lanes
// (warps here) in turn, the lanes' sums added in lane order.
static_assert(LN_BWD_CHUNK == COLSUM_ROWS && LN_WARPS == COLSUM_LANES,
              "layernorm_backward's column sums must add like column_sums_accumulate");

// Calls launch(std::integral_constant<int, VECS>()) for the smallest VECS <= LN_MAX_VECS with at
// least ceil(C / (32 X128)) vectors per lane, or LN_MAX_VECS for wider rows.
template <int VECS = 1, class Launch> static void with_vecs(int C, Launch launch) {
    if constexpr (VECS < LN_MAX_VECS) {
        if (VECS * 32 * X128 < C) return with_vecs<VECS + 1>(C, launch);
    }
    launch(std::integral_constant<int, VECS>());
}

__device__ inline int lane_column(int lane, int v) { return (lane + 32 * v) * X128; }

// The X128 elements of p at i .. i + X128 as stored (0 from end on): one 16-byte load when `vector`.
// Half the registers of load_x128's floats in BF16, for rows kept across a reduction.
__device__ inline PackedX load_packed(const floatX* p, size_t i, size_t end, bool vector) {
    PackedX packed;
    if (vector) packed = *(const PackedX*)(p + i);
    else
        for (int k = 0; k < X128; k++) packed.v[k] = i + k < end ? p[i + k] : (floatX)0.0f;
    return packed;
}

// An empty asm that may change p's bits, so that the compiler converts them to float again where
// they are used next: otherwise it keeps the floats of the first pass over the row alive across the
// reductions, twice the registers of the packed row in BF16 (158 per thread instead of 128 at
// C = 768: one block of the backward per SM instead of two).
__device__ inline void keep_packed(PackedX& p) {
    uint4& bits = reinterpret_cast<uint4&>(p);
    asm volatile("" : "+r"(bits.x), "+r"(bits.y), "+r"(bits.z), "+r"(bits.w));
}

// out (rows ld_out apart, with the bias columns of kernels.h after C when ld_out > C), mean and rstd
// = the layernorm of inp's rows.
template <int VECS>
__global__ void __launch_bounds__(32 * LN_FWD_WARPS)
    layernorm_forward_kernel(floatX* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                             const floatX* __restrict__ inp, const floatX* __restrict__ weight,
                             const floatX* __restrict__ bias, int N, int C, int ld_out, bool vector) {
    const int row = blockIdx.x * LN_FWD_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    // f(vals, c) for each vector of this lane (elements past C are 0): those held in x, then any
    // beyond them loaded again. x holds the row as loaded, not as floats: the row in half the
    // registers in BF16 (63 in all instead of 95 at C = 1600, sm_90), so more blocks an SM.
    PackedX x[VECS];
    auto each_vector = [&](auto f) {
#pragma unroll
        for (int v = 0; v < VECS; v++) keep_packed(x[v]);
#pragma unroll
        for (int v = 0; v < VECS; v++)
            if (lane_column(lane, v) < C) {
                float vals[X128];
                for (int k = 0; k < X128; k++) vals[k] = (float)x[v].v[k];
                f(vals, lane_column(lane, v));
            }
        for (int c = lane_column(lane, VECS); c < C; c += 32 * X128) {
            float vals[X128];
            load_x128(vals, inp + (size_t)row * C, c, C, vector);
            f(vals, c);
        }
    };
    // All loads first, so that they are in flight together.
#pragma unroll
    for (int v = 0; v < VECS; v++)
        if (lane_column(lane, v) < C) x[v] = load_packed(inp + (size_t)row * C, lane_column(lane, v), C, vector);
    float sum = 0.0f;
    each_vector([&](const float vals[X128], int) {
        for (int k = 0; k < X128; k++) sum += vals[k];
    });
    const float m = warp_sum(sum) / C;
    // The variance from the centred values, not E[x^2] - m^2, which cancels badly when |mean| >> std.
    float squares = 0.0f;
    each_vector([&](const float vals[X128], int c) {
        for (int k = 0; k < X128 && c + k < C; k++) squares += (vals[k] - m) * (vals[k] - m);
    });
    const float s = rsqrtf(warp_sum(squares) / C + LAYERNORM_EPS);
    each_vector([&](const float vals[X128], int c) {
        float w[X128], bi[X128], y[X128];
        load_x128(w, weight, c, C, vector);
        load_x128(bi, bias, c, C, vector);
        for (int k = 0; k < X128; k++) y[k] = (vals[k] - m) * s * w[k] + bi[k];
        store_x128(out + (size_t)row * ld_out, y, c, C, vector);
    });
    for (int c = C + lane; c < ld_out; c += 32) out[(size_t)row * ld_out + c] = (floatX)(c == C ? 1.0f : 0.0f);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                       const floatX* bias, int N, int C, int ld_out) {
    check_linear_ld("layernorm_forward", C, ld_out);
    if (N == 0) return;
    const bool vector = C % X128 == 0 && ld_out % X128 == 0 && aligned16(inp, out, weight, bias);
    with_vecs(C, [&](auto vecs) {
        layernorm_forward_kernel<decltype(vecs)::value><<<ceil_div(N, LN_FWD_WARPS), 32 * LN_FWD_WARPS>>>(
            out, mean, rstd, inp, weight, bias, N, C, ld_out, vector);
        launchCheck();
    });
}

// With norm = (x - mean) * rstd and dnorm = dout * weight:
// dinp += rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm)) (with add_dinp false, dinp is
// not read and the sum starts from 0.0f: the bits of adding into zeros), and, per column,
// dweight += sum over rows of dout * norm, dbias += sum of dout.
// Block b is chunk b of chunk_rows rows (group_chunk_rows: within one group); its warps take the
// chunk's rows in turn, each reading x and dout once and updating dinp. With PARAM_SUMS (chunks of
// LN_BWD_CHUNK rows) each warp also adds its columns' dout * norm and dout in registers; at the end
// the warps' sums are added in warp order and written as the chunk's partials: dweight's at
// partials[blockIdx.x * C], dbias's gridDim.x * C further on, for add_column_partials_kernel.
// With sum_dinp (and PARAM_SUMS), each warp also adds the dinp it stores (rounded to floatX, as a
// later pass would read it) into its own slots of the dynamic shared memory (LN_WARPS x VECS x X128
// x 32 floats: the registers are full), and the chunk's column sums of dinp go 2 gridDim.x * C
// further on.
// With stage_dinp (vector rows, add_dinp), each lane copies its vectors of the row's dinp into shared memory
// by cp.async as the row starts (LN_WARPS x VECS x 32 x 16 bytes, before the sums), so that they
// arrive while x and dout are loaded and reduced: loaded after the reductions, they had each row
// wait for memory twice (there are no registers left to hold them sooner).
template <int VECS, bool PARAM_SUMS>
__global__ void __launch_bounds__(32 * LN_WARPS)
    layernorm_backward_kernel(floatX* __restrict__ dinp, float* __restrict__ partials,
                              const floatX* __restrict__ dout, const floatX* __restrict__ inp,
                              const floatX* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int C, int group_rows, int chunk_rows, bool vector,
                              bool add_dinp, bool sum_dinp, bool stage_dinp) {
    int row0, row_end;
    group_chunk_rows(blockIdx.x, group_rows, chunk_rows, &row0, &row_end);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float dweight[VECS][X128] = {}, dbias[VECS][X128] = {};
    extern __shared__ float4 dynamic_shared[];
    // [warp][v][lane]: this lane's vectors of its warp's row of dinp.
    PackedX* dinp_stage = reinterpret_cast<PackedX*>(dynamic_shared) + warp * VECS * 32 + lane;
    // [warp][v][k / 4][lane][k % 4]: a lane adds 4 columns at a time, conflict-free, into its own
    // slots, which it zeroes first.
    float4* warp_dinp_sums = dynamic_shared + (stage_dinp ? LN_WARPS * VECS * 32 : 0);
    auto dinp_sums4 = [&](int w, int v, int q, int l) -> float4& { // columns 4q .. 4q + 3 of vector v
        return warp_dinp_sums[((w * VECS + v) * (X128 / 4) + q) * 32 + l];
    };
    auto dinp_sum = [&](int w, int v, int k, int l) -> float& { return (&dinp_sums4(w, v, k / 4, l).x)[k % 4]; };
    sum_dinp = PARAM_SUMS && sum_dinp;
    if (sum_dinp)
        for (int v = 0; v < VECS; v++)
            for (int k = 0; k < X128; k++) dinp_sum(warp, v, k, lane) = 0.0f;
    for (int r = row0 + warp; r < row_end; r += LN_WARPS) {
        const size_t start = (size_t)r * C;
        if (stage_dinp) {
            asm volatile("" ::: "memory"); // the row before read its stage first
#pragma unroll
            for (int v = 0; v < VECS; v++)
                if (lane_column(lane, v) < C)
                    cp_async_16(&dinp_stage[v * 32], dinp + start + lane_column(lane, v), true);
            cp_async_commit();
        }
        const float m = mean[r], s = rstd[r];
        PackedX x[VECS], dy[VECS];
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            if (lane_column(lane, v) >= C) continue;
            x[v] = load_packed(inp + start, lane_column(lane, v), C, vector);
            dy[v] = load_packed(dout + start, lane_column(lane, v), C, vector);
        }
        // f(x, dy, norm, dnorm, c, v) for each vector of this lane: the VECS loaded above, then any
        // beyond them loaded again (v = VECS). Past C, x and dy are 0 and so are dnorm and dy * norm.
        auto each_vector = [&](auto f) {
            auto terms = [&](const PackedX& xv, const PackedX& dyv, int c, int v) {
                float w[X128], norm[X128], dnorm[X128];
                load_x128(w, weight, c, C, vector);
                for (int k = 0; k < X128; k++) {
                    norm[k] = ((float)xv.v[k] - m) * s;
                    dnorm[k] = (float)dyv.v[k] * w[k];
                }
                f(dyv, norm, dnorm, c, v);
            };
#pragma unroll
            for (int v = 0; v < VECS; v++)
                if (lane_column(lane, v) < C) terms(x[v], dy[v], lane_column(lane, v), v);
            for (int c = lane_column(lane, VECS); c < C; c += 32 * X128)
                terms(load_packed(inp + start, c, C, vector), load_packed(dout + start, c, C, vector), c, VECS);
        };
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
        each_vector([&](const PackedX& dyv, const float norm[X128], const float dnorm[X128], int, int v) {
            for (int k = 0; k < X128; k++) {
                dnorm_sum += dnorm[k];
                dnorm_norm_sum += dnorm[k] * norm[k];
                if (PARAM_SUMS && v < VECS) {
                    dweight[v][k] = fmaf((float)dyv.v[k], norm[k], dweight[v][k]);
                    dbias[v][k] += (float)dyv.v[k];
                }
            }
        });
        const float dnorm_mean = warp_sum(dnorm_sum) / C, dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            keep_packed(x[v]);
            keep_packed(dy[v]);
        }
        if (stage_dinp) cp_async_wait<0>();
        each_vector([&](const PackedX&, const float norm[X128], const float dnorm[X128], int c, int v) {
            float dx[X128] = {};
            if (stage_dinp && v < VECS)
                for (int k = 0; k < X128; k++) dx[k] = (float)dinp_stage[v * 32].v[k];
            else if (add_dinp)
                load_x128(dx, dinp + start, c, C, vector);
            for (int k = 0; k < X128; k++) dx[k] += s * (dnorm[k] - dnorm_mean - norm[k] * dnorm_norm_mean);
            store_x128(dinp + start, dx, c, C, vector);
            if (sum_dinp && v < VECS)
                for (int q = 0; q < X128 / 4; q++) {
                    float4 sums = dinp_sums4(warp, v, q, lane);
                    sums.x += (float)(floatX)dx[4 * q];
                    sums.y += (float)(floatX)dx[4 * q + 1];
                    sums.z += (float)(floatX)dx[4 * q + 2];
                    sums.w += (float)(floatX)dx[4 * q + 3];
                    dinp_sums4(warp, v, q, lane) = sums;
                }
        });
    }
    if constexpr (!PARAM_SUMS) return;
    if (sum_dinp) { // each column's warp sums added in warp order
        __syncthreads();
        for (int i = threadIdx.x; i < VECS * X128 * 32; i += blockDim.x) {
            const int l = i % 32, v = i / 32 / X128, k = i / 32 % X128, col = lane_column(l, v) + k;
            float total = dinp_sum(0, v, k, l);
            for (int w = 1; w < LN_WARPS; w++) total += dinp_sum(w, v, k, l);
            if (col < C) partials[((size_t)2 * gridDim.x + blockIdx.x) * C + col] = total;
        }
    }
    // Warp 0's sums, plus warp 1's, ... in turn through shared memory ([v][k][lane]: no bank
    // conflicts); the last warp writes the totals.
    __shared__ float block_sums[2][VECS * X128][32];
    for (int w = 0; w < LN_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int v = 0; v < VECS; v++) {
                for (int k = 0; k < X128; k++) {
                    float totals[2] = {dweight[v][k], dbias[v][k]};
                    for (int j = 0; j < 2; j++) {
                        float* sum = &block_sums[j][v * X128 + k][lane];
                        if (w > 0) totals[j] += *sum;
                        if (w < LN_WARPS - 1) *sum = totals[j];
                        else if (lane_column(lane, v) + k < C)
                            partials[((size_t)j * gridDim.x + blockIdx.x) * C + lane_column(lane, v) + k] = totals[j];
                    }
                }
            }
        }
        __syncthreads();
    }
}

// The backward's column sums for its two-pass form: per element dout * norm (with the fused multiply-
// add of layernorm_backward_kernel's sums) and dout, and with SUMS 3 dinp as stored.
template <int SUMS_> struct LayernormColumns {
    static constexpr int SUMS = SUMS_;
    const floatX *dout, *inp, *dinp;
    const float *mean, *rstd;
    int C;
    __device__ void add(int r, int c, float sums[SUMS][X128]) const {
        const bool vector = C % X128 == 0;
        const float m = mean[r], s = rstd[r];
        float dy[X128], x[X128];
        load_x128(dy, dout + (size_t)r * C, c, C, vector);
        load_x128(x, inp + (size_t)r * C, c, C, vector);
        for (int k = 0; k < X128; k++) {
            sums[0][k] = fmaf(dy[k], (x[k] - m) * s, sums[0][k]);
            sums[1][k] += dy[k];
        }
        if constexpr (SUMS == 3) {
            float d[X128];
            load_x128(d, dinp + (size_t)r * C, c, C, vector);
            for (int k = 0; k < X128; k++) sums[2][k] += d[k];
        }
    }
};

// Launches layernorm_backward_kernel<VECS, PARAM_SUMS> on `blocks` chunks of chunk_rows rows.
template <int VECS, bool PARAM_SUMS>
static void launch_backward_rows(int blocks, int chunk_rows, floatX* dinp, float* partials, const floatX* dout,
                                 const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int C,
                                 int group_rows, bool vector, bool add_dinp, bool sum_dinp, bool in_registers) {
    auto kernel = layernorm_backward_kernel<VECS, PARAM_SUMS>;
    const size_t sums_bytes = sum_dinp ? LN_WARPS * VECS * X128 * 32 * sizeof(float) : 0;
    const size_t stage_bytes = LN_WARPS * VECS * 32 * sizeof(PackedX);
    // Staged only where two blocks still fit on an SM by shared memory (with the 1 KB the system
    // keeps per block), as they do by registers: on a 100 KB SM (RTX 3090, 4090) up to C = 768
    // in BF16.
    static const size_t static_bytes = [&] { // the kernel's own shared memory, asked once per kernel
        cudaFuncAttributes attributes;
        cudaCheck(cudaFuncGetAttributes(&attributes, kernel));
        return attributes.sharedSizeBytes;
    }();
    const bool stage_dinp = add_dinp && vector && in_registers &&
                            2 * (static_bytes + sums_bytes + stage_bytes + 1024) <= device_shared_per_sm;
    const size_t shared = sums_bytes + (stage_dinp ? stage_bytes : 0);
    if (static_bytes + shared > 48 * 1024) // beyond the default limit of a block
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    kernel<<<blocks, 32 * LN_WARPS, shared>>>(dinp, partials, dout, inp, weight, mean, rstd, C, group_rows, chunk_rows,
                                              vector, add_dinp, sum_dinp, stage_dinp);
    launchCheck();
}

void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* dinp_sums, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean,
                        const float* rstd, int N, int C, int group_rows, int dinp_mode) {
    check_row_groups("layernorm_backward", N, group_rows);
    if (N == 0) return;
    const bool vector = C % X128 == 0 && aligned16(dinp, dout, inp, weight);
    const bool in_registers = C <= LN_MAX_VECS * 32 * X128;
    const int groups = N / group_rows, parts = (int)ceil_div(group_rows, LN_BWD_CHUNK), chunks = groups * parts;
    const bool add_dinp = dinp_mode == GRAD_ADD;
    // One pass where its chunks fill the SMs at least once; where they do not (B 16 x T 1024 is 64
    // chunks for an H100's 132 SMs) its few warps a row at a time are latency-bound (0.126 ms a
    // call at d24 against 0.131 for twice the rows), and the rows go in two passes over all the SMs:
    // dinp, a block for every LN_WARPS rows, then the column sums, in the same order (the same bits).
    const ColumnSumTargets targets{{dweight, dbias, dinp_sums}};
    if (in_registers && row_chunks_fill_sms(N, group_rows)) {
        const int sums = dinp_sums ? 3 : 2;
        float* partials = column_partials_buffer(sums * (size_t)chunks * C);
        with_vecs(C, [&](auto vecs) {
            launch_backward_rows<decltype(vecs)::value, true>(chunks, LN_BWD_CHUNK, dinp, partials, dout, inp, weight,
                                                              mean, rstd, C, group_rows, vector, add_dinp,
                                                              dinp_sums != NULL, in_registers);
        });
        add_column_partials(targets, sums, partials, groups, parts, C);
        return;
    }
    const int blocks = groups * (int)ceil_div(group_rows, LN_WARPS);
    with_vecs(C, [&](auto vecs) {
        launch_backward_rows<decltype(vecs)::value, false>(blocks, LN_WARPS, dinp, NULL, dout, inp, weight, mean, rstd,
                                                           C, group_rows, vector, add_dinp, false, in_registers);
    });
    if (dinp_sums)
        column_sums_accumulate(targets, N, C, group_rows, LayernormColumns<3>{dout, inp, dinp, mean, rstd, C});
    else
        column_sums_accumulate(targets, N, C, group_rows, LayernormColumns<2>{dout, inp, dinp, mean, rstd, C});
}
