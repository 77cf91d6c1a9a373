// The forward kernel of the tensor-core (BF16, FP16) flash attention: each thread block owns a
// block of query rows of one (batch, head) and streams the K/V tiles at or below the diagonal through shared memory
// (TileStream: cp.async or TMA, double-buffered, one barrier per tile); an online softmax keeps
// the running max and sum in registers; it writes O and (m, l). With products that run while the
// warps go on (Wgmma), tile j - 1's O += P V is issued right after tile j's S = Q K^T, so the tensor
// cores run both back to back, and V comes one step after K (TileStream's B_LAG). (The wait for
// P V is written after tile j's softmax, FlashAttention-3's overlap within a warp group, but ptxas
// moves it up to the softmax's start, before the max: it interleaves O's rescale with the
// exponentials. Left so: the ways to a true overlap that were tried cost registers or shared
// memory, so blocks per SM, and were slower; docs/performance.md.) Its products and tile loads are in
// attention_flash_tc_mma.cuh; its tile shapes and launch in attention_flash.cu; the backward in
// attention_flash_tc_backward.cuh.
#pragma once
#include <math.h>

#include "kernels/cuda/attention_flash_tc_mma.cuh"
#include "kernels/constants.h"

#define LN2 0.6931471805599453f

// The max of n values as a balanced tree (depth log2 n), and as a chain from -inf (depth n).
template <int N> __device__ __forceinline__ float max_tree(const float* v) {
    if constexpr (N == 1) return v[0];
    else return fmaxf(max_tree<N / 2>(v), max_tree<N - N / 2>(v + N / 2));
}
template <int N> __device__ __forceinline__ float max_chain(const float* v) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; i++) m = fmaxf(m, v[i]);
    return m;
}

template <class Mma, int WARPS, int M_TILES, int COLS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32)
    flash_forward_kernel(floatX* out, float* m_out, float* l_out, const floatX* qkv,
                         const __grid_constant__ CUtensorMap qkv_map, int T, int NH, int tail) {
    constexpr int HS = Mma::HS, ROWS = 16 * WARPS * M_TILES, THREADS = 32 * WARPS, STRIDE = Mma::STRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint64_t landed[STAGES];
    floatX* q_tile = (floatX*)align_shared<Mma::ALIGN>(smem);
    floatX* k_tiles = q_tile + ROWS * STRIDE; // STAGES stages each
    floatX* v_tiles = k_tiles + STAGES * COLS * STRIDE;
    const int warp = warp_index(), lane = threadIdx.x % 32;
    const CausalBlock place = causal_block<ROWS, false>(tail, NH);
    const int C = NH * HS, b = place.b, h = place.h, q0 = place.row0;
    const int stride = 3 * C; // between rows of qkv; T * stride < 2^31 (checked at launch)
    const floatX* q_src = qkv + (size_t)b * T * stride + h * HS;
    const int num_tiles = (min(q0 + ROWS, T) + COLS - 1) / COLS; // tiles above the diagonal skipped
    // LAG 1: step j computes S and the softmax of tile j and multiplies P V of tile j - 1; one step
    // more than tiles. The O it accumulates goes through the same operations in the same order.
    constexpr int LAG = Mma::ASYNC ? 1 : 0;
    const TileStream<Mma, COLS, THREADS, STAGES, LAG> kv = {k_tiles, v_tiles, landed, 0, num_tiles, T,
                                                            q_src + C, q_src + 2 * C, stride, stride,
                                                            &qkv_map, &qkv_map, C + h * HS, 2 * C + h * HS, b};
    auto load_kv_tile = [&](int tile) { // one commit group per step (empty with TMA or past the last)
        kv.load(tile);
        cp_async_commit();
    };

    kv.init();
    load_tile_async<Mma, ROWS, THREADS>(q_tile, q_src, q0, T, stride); // in the first tile's group
    __syncthreads(); // the barriers initialised
    for (int tile = 0; tile < STAGES - 1; tile++) load_kv_tile(tile);
    cp_async_wait<STAGES - 2>();
    Mma::tiles_ready(); // Q, which wgmma reads with SHARED_A
    __syncthreads();
    const int r0 = q0 + warp * 16 * M_TILES; // this warp's first query row
    // The last row of the warps that multiply together (Mma::GROUP_WARPS), who take the same branches.
    constexpr int GROUP_ROWS = Mma::GROUP_WARPS * 16 * M_TILES;
    const int group_row = warp / Mma::GROUP_WARPS * GROUP_ROWS;
    const int group_last_row = q0 + group_row + GROUP_ROWS - 1;
    static_assert(!Mma::SHARED_A || M_TILES == 1, "A from shared memory: the group's rows one block of the tile");
    uint32_t q_frag[M_TILES][HS / 16][4]; // Q as fragments, or with SHARED_A the group's rows of the tile
    if constexpr (!Mma::SHARED_A) load_a_fragments<Mma, M_TILES>(q_frag, q_tile, warp * 16 * M_TILES);
    const floatX* q_group = q_tile + Mma::offset(group_row, 0);

    const float scale_log2 = ATTENTION_SCALE_FACTOR * LOG2E / sqrtf((float)HS); // scores in log2 units: exp2 is one instruction
    float o_acc[M_TILES][HS / 8][4] = {};
    float m_run[M_TILES][2], l_run[M_TILES][2]; // per thread: rows g and g + 8 of each m-tile
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            m_run[mt][half] = -INFINITY;
            l_run[mt][half] = 0.0f; // this thread's columns only; the quad's four add up at the end
        }

    auto issue_scores = [&](float s[M_TILES][COLS / 8][4], int tile) { // S = Q K^T
        if constexpr (Mma::SHARED_A) Mma::template gemm_shared_a_bt<COLS>(s, q_group, kv.a_tile(tile));
        else Mma::template gemm_a_bt<M_TILES, COLS>(s, q_frag, kv.a_tile(tile));
    };
    auto rescale_row = [&](int mt, int half, float correction) { // O's rows g + 8 half of m-tile mt
#pragma unroll
        for (int nt = 0; nt < HS / 8; nt++) {
            o_acc[mt][nt][2 * half] *= correction;
            o_acc[mt][nt][2 * half + 1] *= correction;
        }
    };
    // Online softmax of the scores of the tile from key c0: P into s, the running max and sum moved
    // to the new max; correction is what O must be multiplied by before this tile's P V is added.
    auto softmax = [&](float s[M_TILES][COLS / 8][4], float correction[M_TILES][2], int c0) {
        if (c0 + COLS - 1 > r0) mask_scores<M_TILES, COLS>(s, [&](int row, int col) { return c0 + col > r0 + row; });
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                // The row's max of the unscaled scores. With one m-tile as a tree, depth 4 where a
                // chain's is 16 (the max is exact in any order: the same bits): the wgmma forward 1-3%
                // faster. With two m-tiles a warp has four chains to interleave already, and the
                // A100 tiles (230 registers) were 2-4% slower with the tree at T 4096.
                float row[COLS / 4]; // the thread's scores of the row
#pragma unroll
                for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) row[2 * nt + e] = s[mt][nt][2 * half + e];
                float tile_max = M_TILES == 1 ? max_tree<COLS / 4>(row) : max_chain<COLS / 4>(row);
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
                const float m_new = fmaxf(m_run[mt][half], tile_max * scale_log2);
                correction[mt][half] = fast_exp2(m_run[mt][half] - m_new); // 0 on the first tile
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float p = fast_exp2(s[mt][nt][2 * half + e] * scale_log2 - m_new); // one FFMA
                        s[mt][nt][2 * half + e] = p;
                        sum += p;
                    }
                m_run[mt][half] = m_new;
                l_run[mt][half] = l_run[mt][half] * correction[mt][half] + sum;
                // No product is writing O: the row is rescaled here (LAG 1: after the wait, below).
                if constexpr (LAG == 0) rescale_row(mt, half, correction[mt][half]);
            }
    };
    auto rescale = [&](const float correction[M_TILES][2]) { // LAG 1: once the product of the step before is done
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) rescale_row(mt, half, correction[mt][half]);
    };

    // Tile 0 holds key 0, which every row sees, so every running max is finite after it (and a
    // later tile masked whole for a warp of a wgmma group leaves its rows as they were).
    if constexpr (LAG == 0) {
        for (int tile = 0; tile < num_tiles; tile++) {
            kv.wait(tile);   // this tile has arrived,
            __syncthreads(); // and every warp is done with the previous one, whose stage
            load_kv_tile(tile + STAGES - 1); // takes the tile STAGES - 1 ahead
            const int c0 = tile * COLS;
            if (c0 <= group_last_row) { // some key of the tile is visible to some row of the warp group
                float s[M_TILES][COLS / 8][4], correction[M_TILES][2];
                issue_scores(s, tile);
                Mma::wait(s);
                softmax(s, correction, c0);
                Mma::template gemm_c_b<M_TILES, COLS>(o_acc, s, kv.b_tile(tile)); // O += P V
                Mma::wait(o_acc);
            }
        }
    } else {
        // Every tile up to the block's last row is visible to its one warp group, and no product is
        // issued or waited for in a branch (ptxas serialises wgmma it cannot prove uniform).
        static_assert(LAG == 0 || WARPS == Mma::GROUP_WARPS, "LAG 1: the block is one warp group");
        auto begin_step = [&](int tile) { // as above, with steps for tiles
            kv.wait(tile);
            __syncthreads();
            load_kv_tile(tile + STAGES - 1);
        };
        uint32_t p_frag[M_TILES][COLS / 16][4]; // P of the step before, read by O += P V until its wait
        float s[M_TILES][COLS / 8][4], correction[M_TILES][2];
        begin_step(0);
        issue_scores(s, 0);
        Mma::wait(s);
        softmax(s, correction, 0);
        a_fragments_of<M_TILES, COLS>(p_frag, s); // O is 0: nothing to rescale
        for (int tile = 1; tile < num_tiles; tile++) {
            begin_step(tile);
            issue_scores(s, tile);
            Mma::template gemm_a_b<M_TILES, COLS>(o_acc, p_frag, kv.b_tile(tile - 1)); // behind S in the tensor cores
            Mma::template wait<1>(s); // S only (ptxas moves the wait for P V up near here: file header)
            softmax(s, correction, tile * COLS);
            Mma::wait(o_acc);
            rescale(correction);
            a_fragments_of<M_TILES, COLS>(p_frag, s);
        }
        begin_step(num_tiles); // V of the last tile
        Mma::template gemm_a_b<M_TILES, COLS>(o_acc, p_frag, kv.b_tile(num_tiles - 1));
        Mma::wait(o_acc);
    }

    float inv_l[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            float l = l_run[mt][half];
            l += __shfl_xor_sync(0xffffffff, l, 1);
            l += __shfl_xor_sync(0xffffffff, l, 2);
            inv_l[mt][half] = 1.0f / l;
            const int row = r0 + mt * 16 + lane / 4 + half * 8;
            if (lane % 4 == 0 && row < T) {
                const size_t i = ((size_t)b * NH + h) * T + row;
                m_out[i] = m_run[mt][half] * LN2;
                l_out[i] = l;
            }
        }
    store_rows<M_TILES, HS>(out + (size_t)b * T * C + h * HS, o_acc, inv_l, r0, T, C);
}
