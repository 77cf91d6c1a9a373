// The backward kernels of the tensor-core (BF16, FP16) flash attention, launched by
// attention_flash.cu after its flash_backward_prepare (D and lse, shared with the FP32 build):
//   flash_backward_dkv_kernel         dK and dV, a block per block of key rows (with ATOMIC_DQ
//                                     also dQ, by float atomics or TMA adds)
//   flash_backward_dq_kernel          dQ, a block per block of query rows
//   flash_backward_dq_convert_kernel  the atomic dQ's fp32 sums into dqkv
// Their products and tile loads are in attention_flash_tc_mma.cuh; the forward in
// attention_flash_tc_forward.cuh. Given bias_partials, the dK/dV and dQ kernels also write the
// column sums of each 64-row tile of dqkv they store (the qkv bias gradient's partial sums, which
// attention_flash.cu adds up), so that nothing reads dqkv again for them.
//
// dQ has a kernel of its own, deterministic (why: attention_flash.cu). Tried and slower: one kernel
// that sums the partial dQ of the key blocks in a fixed order (a counter per query tile,
// acquire/release, blocks ordered by a ticket so the waits always end): the synchronisation per
// block and tile cost more than the second kernel does.
// FLASH_ATTN_DETERMINISTIC=0 (ATOMIC_DQ): the dK/dV kernel also adds each tile's dQ = dS K into an
// fp32 buffer (B, T, C), and a last kernel converts it: 5 tile products, 4 bytes per activation of
// scratch, and dQ's sums in a different order on every run. On mma.sync tiles every warp adds its
// part with float atomics (an instruction per pair of floats); on wgmma (REDUCE_BY_TMA) the
// warpgroup multiplies dQ from dS^T in shared memory and each warp adds its 16 rows by TMA
// (cp.reduce.async.bulk: one instruction per 2 KB, the L2 adding whole lines). The trade-off: two
// tile products fewer, but the adds keep the L2 busy (ncu at long T: the dK/dV kernel with the adds
// takes about as long as the deterministic dK/dV and dQ kernels together, its L2 throughput nearly
// twice theirs). Alone it is slower than the deterministic kernels at every length, and in training
// at the power cap no faster (docs/performance.md).
#pragma once
#include <math.h>

#include "kernels/cuda/attention_flash_tc_mma.cuh"
#include "kernels/constants.h"

// Adds a warp's (16 x NCOLS) accumulator to rows row0 .. (< T), columns col0 .. of a float matrix
// whose rows are `stride` floats apart, with float atomics (pairs in one instruction on sm_90).
template <int NCOLS>
__device__ __forceinline__ void atomic_add_rows(float* dst, const float acc[NCOLS / 8][4], int row0, int col0, int T,
                                                size_t stride) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = row0 + lane / 4 + half * 8;
        if (row >= T) continue;
#pragma unroll
        for (int nt = 0; nt < NCOLS / 8; nt++) {
            float* p = dst + (size_t)row * stride + col0 + nt * 8 + lane % 4 * 2;
#if __CUDA_ARCH__ >= 900
            atomicAdd((float2*)p, make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]));
#else
            atomicAdd(p, acc[nt][2 * half]);
            atomicAdd(p + 1, acc[nt][2 * half + 1]);
#endif
        }
    }
}

// Adds a warp's (16 x 64) fp32 accumulator to rows row0 .. row0 + 15 (those below T), columns
// col0 .. col0 + 63 of (batch, ., .) of the tensor map `map` (an fp32 (B, T, width) matrix in boxes
// of 16 rows by 32 columns with the 128-byte swizzle): the warp stores it into its 4 KB `tile` of
// shared memory in the boxes' layout, then lane 0 adds both boxes by TMA, in its bulk async-group
// (the L2 adds whole lines, where float atomics from every thread took an instruction per pair).
// Before the warp writes `tile` again, lane 0 must wait for that group's reads (bulk_wait_all).
__device__ __forceinline__ void reduce_warp_rows_by_tma(float* tile, const float acc[1][8][4], const CUtensorMap* map,
                                                        int col0, int row0, int batch) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            // Box nt / 4 (columns 32 (nt / 4) ..), row r, 16-byte chunk c at chunk c ^ (r % 8).
            const int r = lane / 4 + half * 8, c = nt % 4 * 2 + lane % 4 / 2;
            *(float2*)(tile + nt / 4 * 16 * 32 + r * 32 + (c ^ r % 8) * 4 + lane % 2 * 2) =
                make_float2(acc[0][nt][2 * half], acc[0][nt][2 * half + 1]);
        }
    fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
        tma_store_3d<true>(map, col0, row0, batch, tile);
        tma_store_3d<true>(map, col0 + 32, row0, batch, tile + 16 * 32);
        bulk_commit();
    }
}

// ---- backward: dK and dV (and dQ by atomics or TMA adds) ----------------------------------
// Each block owns ROWS key rows (16 per warp) with K and V as A operands (Mma::SHARED_A), streams
// (Q, dO, lse, D) tiles of COLS queries from its diagonal to the end, and accumulates
// dV = P^T dO and dK = scale dS^T Q in registers, working on the transposed scores S^T = K Q^T.
// ATOMIC_DQ: the block also writes dS^T to shared memory, and its warps add the tile's
// dQ = dS K (COLS x HS, unscaled) into the fp32 buffer dq_accum (B, T, C): with atomics on
// mma.sync, by TMA through dq_map on wgmma (reduce_warp_rows_by_tma).
// bias_partials (not NULL): the column sums of the dK and dV it stores, a row of 3C per tile of
// BIAS_TILE_ROWS rows (B, bias_tiles(T), 3C), in the columns of dqkv (store_tile_column_sums).
template <class Mma, int WARPS, int COLS, int STAGES, bool ATOMIC_DQ>
__global__ void __launch_bounds__(WARPS * 32)
    flash_backward_dkv_kernel(floatX* dqkv, float* dq_accum, float* bias_partials, const floatX* dout, const floatX* qkv,
                              const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap dout_map,
                              const __grid_constant__ CUtensorMap dq_map, const float* lse2, const float* D, int T,
                              int NH, int tail) {
    constexpr int HS = Mma::HS, ROWS = 16 * WARPS, THREADS = 32 * WARPS, STRIDE = Mma::STRIDE;
    // Atomic dQ on mma.sync: each of the COLS / 16 query m-tiles is split over SPLIT warps by head
    // dimension. On wgmma (REDUCE_BY_TMA): the block is one warpgroup, which multiplies the whole tile.
    constexpr bool REDUCE_BY_TMA = ATOMIC_DQ && Mma::TMA;
    constexpr int DQ_MTILES = COLS / 16, SPLIT = WARPS / DQ_MTILES, DQ_DIMS = HS / SPLIT;
    constexpr int DS_STRIDE = REDUCE_BY_TMA ? STRIDE : COLS + 8;
    static_assert(!ATOMIC_DQ || REDUCE_BY_TMA || (WARPS % DQ_MTILES == 0 && DQ_DIMS % 16 == 0), "dQ tile split");
    static_assert(!ATOMIC_DQ || REDUCE_BY_TMA || Mma::GROUP_WARPS == 1, "atomic dQ multiplies with mma.sync");
    static_assert(!REDUCE_BY_TMA || (WARPS == Mma::GROUP_WARPS && COLS == HS),
                  "wgmma dQ: one warpgroup per block, dS^T tiles laid out as K's");
    static_assert(!REDUCE_BY_TMA || ((2 * ROWS + 2 * STAGES * COLS) * STRIDE * sizeof(floatX) +
                                     2 * STAGES * COLS * sizeof(float)) % Mma::ALIGN == 0,
                  "wgmma dQ: dS^T and the dQ tiles start on the swizzle's alignment");
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint64_t landed[STAGES];
    floatX* k_tile = (floatX*)align_shared<Mma::ALIGN>(smem);
    floatX* v_tile = k_tile + ROWS * STRIDE;
    floatX* q_tiles = v_tile + ROWS * STRIDE; // STAGES stages each
    floatX* do_tiles = q_tiles + STAGES * COLS * STRIDE;
    float* lse_tiles = (float*)(do_tiles + STAGES * COLS * STRIDE);
    float* d_tiles = lse_tiles + STAGES * COLS;
    floatX* ds_tile = (floatX*)(d_tiles + STAGES * COLS); // ATOMIC_DQ: dS^T, ROWS x COLS
    float* dq_tiles = (float*)(ds_tile + ROWS * DS_STRIDE); // REDUCE_BY_TMA: each warp's 16 x HS dQ
    const int warp = warp_index(), lane = threadIdx.x % 32;
    const CausalBlock place = causal_block<ROWS, true>(tail, NH);
    const int C = NH * HS, b = place.b, h = place.h, k0 = place.row0;
    const int stride = 3 * C; // between rows of qkv and dqkv; T * stride < 2^31 (checked at launch)
    const floatX* q_src = qkv + (size_t)b * T * stride + h * HS;
    const floatX* k_src = q_src + C;
    const floatX* v_src = q_src + 2 * C;
    const floatX* do_src = dout + (size_t)b * T * C + h * HS;
    const float* lse_src = lse2 + ((size_t)b * NH + h) * T;
    const float* d_src = D + ((size_t)b * NH + h) * T;
    const int first_tile = k0 / COLS, num_tiles = (T + COLS - 1) / COLS; // tiles above the diagonal skipped

    const TileStream<Mma, COLS, THREADS, STAGES> qdo = {q_tiles, do_tiles, landed, first_tile, num_tiles, T,
                                                        q_src, do_src, stride, C,
                                                        &qkv_map, &dout_map, h * HS, h * HS, b};
    auto load_query_tile = [&](int tile) { // one commit group per tile (lse and D), empty past the last
        qdo.load(tile);
        if (tile < num_tiles) {
            const int stage = qdo.stage(tile), c0 = tile * COLS;
            load_vector_async<COLS, THREADS>(lse_tiles + stage * COLS, lse_src, c0, T);
            load_vector_async<COLS, THREADS>(d_tiles + stage * COLS, d_src, c0, T);
        }
        cp_async_commit();
    };

    qdo.init();
    load_tile_async<Mma, ROWS, THREADS>(k_tile, k_src, k0, T, stride); // in the first tile's group
    load_tile_async<Mma, ROWS, THREADS>(v_tile, v_src, k0, T, stride);
    __syncthreads(); // the barriers initialised
    for (int tile = first_tile; tile < first_tile + STAGES - 1; tile++) load_query_tile(tile);
    cp_async_wait<STAGES - 2>();
    Mma::tiles_ready(); // K and V, which wgmma reads with SHARED_A
    __syncthreads();
    const int r0 = k0 + warp * 16; // this warp's first key row
    const int group_first_row = k0 + warp / Mma::GROUP_WARPS * Mma::GROUP_WARPS * 16; // of the warps that multiply together
    // K and V as A operands: fragments, or with SHARED_A the group's rows of the tiles.
    uint32_t k_frag[1][HS / 16][4], v_frag[1][HS / 16][4];
    if constexpr (!Mma::SHARED_A) {
        load_a_fragments<Mma, 1>(k_frag, k_tile, warp * 16);
        load_a_fragments<Mma, 1>(v_frag, v_tile, warp * 16);
    }
    const floatX* k_group = k_tile + Mma::offset(group_first_row - k0, 0);
    const floatX* v_group = v_tile + Mma::offset(group_first_row - k0, 0);

    const float scale = ATTENTION_SCALE(HS), scale_log2 = scale * LOG2E;
    float dk_acc[1][HS / 8][4] = {}, dv_acc[1][HS / 8][4] = {};
    for (int tile = first_tile; tile < num_tiles; tile++) {
        qdo.wait(tile); // as in the forward: one barrier per tile
        __syncthreads();
        load_query_tile(tile + STAGES - 1);
        const int c0 = tile * COLS, stage = qdo.stage(tile);
        if (c0 + COLS - 1 >= group_first_row) { // some query of the tile sees some key of the warp group
            const floatX* q_tile = qdo.a_tile(tile);
            const floatX* do_tile = qdo.b_tile(tile);
            const float* lse_tile = lse_tiles + stage * COLS;
            const float* d_tile = d_tiles + stage * COLS;
            float p[1][COLS / 8][4], ds[1][COLS / 8][4];
            if constexpr (Mma::SHARED_A) {
                Mma::template gemm_shared_a_bt<COLS>(p, k_group, q_tile);   // S^T = K Q^T
                Mma::template gemm_shared_a_bt<COLS>(ds, v_group, do_tile); // dP^T = V dO^T
            } else {
                Mma::template gemm_a_bt<1, COLS>(p, k_frag, q_tile);
                Mma::template gemm_a_bt<1, COLS>(ds, v_frag, do_tile);
            }
            Mma::wait(p, ds);
            // Masked: queries before the key (diagonal tiles) and queries at or past T (last tile).
            if (c0 < r0 + 15 || c0 + COLS > T)
                mask_scores<1, COLS>(p, [&](int key, int col) { return c0 + col < r0 + key || c0 + col >= T; });
#pragma unroll
            for (int nt = 0; nt < COLS / 8; nt++) {
                // The thread's two columns are adjacent: one 8-byte load of each vector.
                const float2 lse = *(const float2*)(lse_tile + nt * 8 + lane % 4 * 2);
                const float2 d = *(const float2*)(d_tile + nt * 8 + lane % 4 * 2);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    p[0][nt][i] = fast_exp2(p[0][nt][i] * scale_log2 - (i % 2 ? lse.y : lse.x));
                    ds[0][nt][i] = p[0][nt][i] * (ds[0][nt][i] - (i % 2 ? d.y : d.x));
                }
            }
            if constexpr (ATOMIC_DQ) { // dS^T as the dK product rounds it, for dQ = dS K
                // Before the products: wgmma reads its A fragments, made from ds, while it runs.
                auto ds_offset = [&](int row, int col) {
                    if constexpr (REDUCE_BY_TMA) return Mma::offset(row, col); // laid out as K, for wgmma
                    else return row * DS_STRIDE + col;
                };
#pragma unroll
                for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                    for (int half = 0; half < 2; half++)
                        *(uint32_t*)(ds_tile + ds_offset(warp * 16 + lane / 4 + half * 8, nt * 8 + lane % 4 * 2)) =
                            pack_floatX2(ds[0][nt][2 * half], ds[0][nt][2 * half + 1]);
            }
            Mma::template gemm_c_b<1, COLS>(dv_acc, p, do_tile); // dV += P^T dO
            Mma::template gemm_c_b<1, COLS>(dk_acc, ds, q_tile); // dK += dS^T Q (scaled at the end)
            if constexpr (REDUCE_BY_TMA) {
                Mma::tiles_ready();
                if (lane == 0) bulk_wait_all<true>(); // the warp's last dQ tile has been read: write it again
                __syncthreads();
                float dq_acc[1][HS / 8][4];
                Mma::gemm_at_b(dq_acc, ds_tile, k_tile);
                Mma::wait(dv_acc, dk_acc, dq_acc);
                reduce_warp_rows_by_tma(dq_tiles + warp * 16 * HS, dq_acc, &dq_map, h * HS, c0 + warp * 16, b);
            } else {
                Mma::wait(dv_acc, dk_acc);
            }
        }
        if constexpr (ATOMIC_DQ && !REDUCE_BY_TMA) {
            // The warps whose keys some query of the tile sees are a prefix: dQ = dS K over their keys.
            const int key_steps = min(WARPS, (c0 + COLS - 1 - k0) / 16 + 1);
            __syncthreads();
            const int mq = warp % DQ_MTILES, d0 = warp / DQ_MTILES * DQ_DIMS;
            float dq_acc[1][DQ_DIMS / 8][4] = {};
            for (int ks = 0; ks < key_steps; ks++) {
                // A fragment of dS (queries x keys) from the stored dS^T (keys x queries), transposed.
                uint32_t a[1][4];
                ldmatrix_x4_trans(a[0], ds_tile + (ks * 16 + lane / 16 * 8 + lane % 8) * DS_STRIDE + mq * 16 + lane / 8 % 2 * 8);
                Mma::template mma_a_tile_rows<1, DQ_DIMS>(dq_acc, a, k_tile, ks * 16, d0);
            }
            atomic_add_rows<DQ_DIMS>(dq_accum + (size_t)b * T * C + h * HS, dq_acc[0], c0 + mq * 16, d0, T, C);
        } // dS^T is written again after the next tile's barrier
    }
    if constexpr (REDUCE_BY_TMA) {
        if (lane == 0) bulk_wait_all<false>(); // the dQ tiles read before the block's shared memory goes
    }
    const float k_scale[1][2] = {{scale, scale}}, v_scale[1][2] = {{1.0f, 1.0f}};
    const CausalBlock out = causal_block<ROWS, true>(tail, NH); // recomputed, not held across the loop
    const int out_r0 = out.row0 + warp * 16;
    static_assert(ROWS % BIAS_TILE_ROWS == 0 && 2 * WARPS * HS * sizeof(float) <= ROWS * STRIDE * sizeof(floatX),
                  "the block's rows whole tiles, and their slab sums fit where K was");
    float* slab_sums = (float*)k_tile; // dK's slabs, then dV's
    if (bias_partials) { // before the stores of dK and dV (slab_column_sums)
        __syncthreads(); // every warp's products are done with the K tile
        slab_column_sums<1, HS>(slab_sums, dk_acc, k_scale, warp, out_r0, T);
        slab_column_sums<1, HS>(slab_sums + WARPS * HS, dv_acc, v_scale, warp, out_r0, T);
        __syncthreads();
        const int tiles = bias_tiles(T), tile0 = out.row0 / BIAS_TILE_ROWS;
        float* partials = bias_partials + ((size_t)out.b * tiles + tile0) * stride + out.h * HS;
        store_tile_column_sums<ROWS / BIAS_TILE_ROWS, HS, THREADS>(partials + C, slab_sums, tiles - tile0, stride,
                                                                   threadIdx.x);
        store_tile_column_sums<ROWS / BIAS_TILE_ROWS, HS, THREADS>(partials + 2 * C, slab_sums + WARPS * HS,
                                                                   tiles - tile0, stride, threadIdx.x);
    }
    store_rows<1, HS>(dqkv + (size_t)out.b * T * stride + C + out.h * HS, dk_acc, k_scale, out_r0, T, stride);
    store_rows<1, HS>(dqkv + (size_t)out.b * T * stride + 2 * C + out.h * HS, dv_acc, v_scale, out_r0, T, stride);
}

// ---- backward: dQ --------------------------------------------------------------------------
// Each block owns ROWS query rows (16 M_TILES per warp) with Q and dO as A operands, streams the
// K/V tiles at or below the diagonal, recomputes P and dP, and accumulates dQ = scale dS K.
// bias_partials (not NULL): the column sums of the dQ it stores, as the dK/dV kernel's.
template <class Mma, int WARPS, int M_TILES, int COLS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32)
    flash_backward_dq_kernel(floatX* dqkv, float* bias_partials, const floatX* dout, const floatX* qkv,
                             const __grid_constant__ CUtensorMap qkv_map, const float* lse2, const float* D, int T,
                             int NH, int tail) {
    constexpr int HS = Mma::HS, ROWS = 16 * WARPS * M_TILES, THREADS = 32 * WARPS, STRIDE = Mma::STRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint64_t landed[STAGES];
    floatX* q_tile = (floatX*)align_shared<Mma::ALIGN>(smem);
    floatX* do_tile = q_tile + ROWS * STRIDE;
    floatX* k_tiles = do_tile + ROWS * STRIDE; // STAGES stages each
    floatX* v_tiles = k_tiles + STAGES * COLS * STRIDE;
    const int warp = warp_index(), lane = threadIdx.x % 32;
    const CausalBlock place = causal_block<ROWS, false>(tail, NH);
    const int C = NH * HS, b = place.b, h = place.h, q0 = place.row0;
    const int stride = 3 * C; // between rows of qkv and dqkv; T * stride < 2^31 (checked at launch)
    const floatX* q_src = qkv + (size_t)b * T * stride + h * HS;
    const int num_tiles = (min(q0 + ROWS, T) + COLS - 1) / COLS;
    const TileStream<Mma, COLS, THREADS, STAGES> kv = {k_tiles, v_tiles, landed, 0, num_tiles, T,
                                                       q_src + C, q_src + 2 * C, stride, stride,
                                                       &qkv_map, &qkv_map, C + h * HS, 2 * C + h * HS, b};
    auto load_kv_tile = [&](int tile) { // as in the forward
        kv.load(tile);
        cp_async_commit();
    };

    kv.init();
    load_tile_async<Mma, ROWS, THREADS>(q_tile, q_src, q0, T, stride); // in the first tile's group
    load_tile_async<Mma, ROWS, THREADS>(do_tile, dout + (size_t)b * T * C + h * HS, q0, T, C);
    __syncthreads(); // the barriers initialised
    for (int tile = 0; tile < STAGES - 1; tile++) load_kv_tile(tile);
    cp_async_wait<STAGES - 2>();
    Mma::tiles_ready(); // Q and dO, which wgmma reads with SHARED_A
    __syncthreads();
    const int r0 = q0 + warp * 16 * M_TILES; // this warp's first query row
    constexpr int GROUP_ROWS = Mma::GROUP_WARPS * 16 * M_TILES; // of the warps that multiply together
    const int group_row = warp / Mma::GROUP_WARPS * GROUP_ROWS; // their first, in the block
    const int group_last_row = q0 + group_row + GROUP_ROWS - 1; // as in the forward
    static_assert(!Mma::SHARED_A || M_TILES == 1, "A from shared memory: the group's rows one block of the tile");
    // Q and dO as A operands: fragments, or with SHARED_A the group's rows of the tiles.
    uint32_t q_frag[M_TILES][HS / 16][4], do_frag[M_TILES][HS / 16][4];
    if constexpr (!Mma::SHARED_A) {
        load_a_fragments<Mma, M_TILES>(q_frag, q_tile, warp * 16 * M_TILES);
        load_a_fragments<Mma, M_TILES>(do_frag, do_tile, warp * 16 * M_TILES);
    }
    const floatX* q_group = q_tile + Mma::offset(group_row, 0);
    const floatX* do_group = do_tile + Mma::offset(group_row, 0);
    float row_lse[M_TILES][2], row_d[M_TILES][2]; // rows g and g + 8 of each m-tile
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = r0 + mt * 16 + lane / 4 + half * 8;
            const size_t i = ((size_t)b * NH + h) * T + row;
            row_lse[mt][half] = row < T ? lse2[i] : 0.0f;
            row_d[mt][half] = row < T ? D[i] : 0.0f;
        }

    const float scale = ATTENTION_SCALE(HS), scale_log2 = scale * LOG2E;
    float dq_acc[M_TILES][HS / 8][4] = {};
    for (int tile = 0; tile < num_tiles; tile++) {
        kv.wait(tile); // as in the forward: one barrier per tile
        __syncthreads();
        load_kv_tile(tile + STAGES - 1);
        const int c0 = tile * COLS;
        if (c0 <= group_last_row) {
            const floatX* k_tile = kv.a_tile(tile);
            const floatX* v_tile = kv.b_tile(tile);
            // S and dP one after the other (with fragments and 2 m-tiles, both in flight at once
            // spilled; with SHARED_A, dP's product run during P's exponentials was no faster).
            float p[M_TILES][COLS / 8][4];
            if constexpr (Mma::SHARED_A) Mma::template gemm_shared_a_bt<COLS>(p, q_group, k_tile); // S = Q K^T
            else Mma::template gemm_a_bt<M_TILES, COLS>(p, q_frag, k_tile);
            Mma::wait(p);
            if (c0 + COLS - 1 > r0)
                mask_scores<M_TILES, COLS>(p, [&](int row, int col) { return c0 + col > r0 + row; });
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        p[mt][nt][i] = fast_exp2(p[mt][nt][i] * scale_log2 - row_lse[mt][i / 2]);
            float ds[M_TILES][COLS / 8][4];
            if constexpr (Mma::SHARED_A) Mma::template gemm_shared_a_bt<COLS>(ds, do_group, v_tile); // dP = dO V^T
            else Mma::template gemm_a_bt<M_TILES, COLS>(ds, do_frag, v_tile);
            Mma::wait(ds);
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) ds[mt][nt][i] = p[mt][nt][i] * (ds[mt][nt][i] - row_d[mt][i / 2]);
            Mma::template gemm_c_b<M_TILES, COLS>(dq_acc, ds, k_tile); // dQ += dS K (scaled at the end)
            Mma::wait(dq_acc);
        }
    }
    float q_scale[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++) q_scale[mt][0] = q_scale[mt][1] = scale;
    const CausalBlock out = causal_block<ROWS, false>(tail, NH); // recomputed, not held across the loop
    const int out_r0 = out.row0 + warp * 16 * M_TILES;
    if (bias_partials) { // before the stores of dQ (slab_column_sums)
        constexpr int TILE_WARPS = BIAS_TILE_ROWS / 16 / M_TILES;
        static_assert(ROWS % BIAS_TILE_ROWS == 0 && BIAS_TILE_ROWS / 16 * HS * sizeof(float) <=
                          BIAS_TILE_ROWS * STRIDE * sizeof(floatX),
                      "the block's rows whole tiles, whose slab sums fit in the tile's rows of Q");
        const int tile = warp / TILE_WARPS, tiles = bias_tiles(T), t = out.row0 / BIAS_TILE_ROWS + tile;
        float* slab_sums = (float*)(q_tile + tile * BIAS_TILE_ROWS * STRIDE);
        tile_barrier<TILE_WARPS, WARPS>(tile); // the tile's warps are done with its rows of Q
        slab_column_sums<M_TILES, HS>(slab_sums, dq_acc, q_scale, warp % TILE_WARPS * M_TILES, out_r0, T);
        tile_barrier<TILE_WARPS, WARPS>(tile);
        store_tile_column_sums<1, HS, 32 * TILE_WARPS>(bias_partials + ((size_t)out.b * tiles + t) * stride + out.h * HS,
                                                       slab_sums, tiles - t, stride, threadIdx.x % (32 * TILE_WARPS));
    }
    store_rows<M_TILES, HS>(dqkv + (size_t)out.b * T * stride + out.h * HS, dq_acc, q_scale, out_r0, T, stride);
}

// dQ (the first third of each dqkv row) = scale * dq_accum (B, T, C), 8 elements per thread.
__global__ void flash_backward_dq_convert_kernel(floatX* dqkv, const float* dq_accum, size_t n, int C, float scale) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    const float4 lo = *(const float4*)(dq_accum + i), hi = *(const float4*)(dq_accum + i + 4);
    uint4 packed;
    packed.x = pack_floatX2(lo.x * scale, lo.y * scale);
    packed.y = pack_floatX2(lo.z * scale, lo.w * scale);
    packed.z = pack_floatX2(hi.x * scale, hi.y * scale);
    packed.w = pack_floatX2(hi.z * scale, hi.w * scale);
    *(uint4*)(dqkv + i / C * 3 * C + i % C) = packed;
}
