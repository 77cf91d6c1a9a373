// Our matrix product on H100/H200 (sm_90a, BF16) for the epilogues cuBLASLt does not have: the
// sums of inp (N, C) @ weight (OC, C)^T, in fp32, rounded into a tile staged in shared memory, which
// an epilogue of the caller's stores (matmul_gelu.cu: fc's pre and gelu(pre); head.cu: the
// head's probabilities). Each output's sum runs over k in the same order whatever its row, tile or
// N, so the results are batch-invariant (kernels.h) and bit-identical from run to run; they equal
// cuBLASLt's own product at GPT-2's fc and head shapes (compared bit for bit).
//
// The kernel (wgmma_product_kernel) is persistent, one block per SM, each block taking tiles of BM
// x BN outputs in turn (tile, tile + gridDim.x, ..., placed by tile_place). Its warps:
//   - the producer (warp 0, one thread): loads the tiles' inp (BM x 64) and weight (BN x 64) blocks
//     by TMA into a ring of STAGES stages, each again as soon as all 8 multiplying warps' products
//     have read it;
//   - two multiplying groups (warps 4-11), each 64 rows of the tile: wgmma m64n256k16 from the
//     stages, fp32 accumulators in registers. When a tile's product is done they add the bias (if
//     any) and take away the row's shift (if the epilogue has one), round the sums with the
//     epilogue's pack (bf16 or fp16), store them into the staged tile in shared memory (stmatrix)
//     and go on;
//   - the epilogue (warps 1-3): the Epilogue's store, which stores the staged tile by TMA (and what
//     else it makes of it) beside the next tile's product; once its stores have read the tile, the
//     tile is freed.
// So the epilogue's work and the stores run beside the next tile's product, on warps of their own:
// where the multiplying warps did them between their products (2 warps per scheduler), they could
// not hide the GELU's latency and it added some 40% to the product's time (GPT-2 124M's fc);
// where the epilogue's warps stored the outputs themselves (16 bytes a thread) it took longer still.
// The producer is a warp of its own so that a multiplying group never waits for the other to
// release a stage before its own next products (where the first multiplying thread loaded the
// stages, the kernel took about 9% longer).
// With 12 warps, 3 on each of the SM's 4 schedulers, whose register file (16,384) then allows 168
// registers a thread: enough for the 128 accumulators of a wgmma m64n256.
//
// A launch may take only some row blocks' tiles (row_blocks_taken: head.cu's rows computed again):
// every role skips the same tiles, and a launch that takes none ends after one load.
//
// An Epilogue is a struct with:
//   Params: the kernel's argument besides the input maps, with `const floatX* bias` (OC, or NULL)
//     among its members where HAS_BIAS, and `const float* shift` (N) where SHIFT_ROWS;
//   HAS_BIAS: whether the sums may have a bias added (an epilogue without one stages no zeros);
//   SHIFT_ROWS: whether each sum is staged less its row's shift;
//   ROW_GROUP: 0 to take a row block's tiles in turn, R to take R row blocks' tiles a column at a
//     time (tile_place);
//   pack(lo, hi): two sums as the staged tile's 32 bits;
//   store(params, staged, row0, col_block, N, OC): the epilogue warps' work for the staged tile of
//     rows row0 .. row0 + BM and columns col_block BN ..; its first thread (EPILOGUE_FIRST) issues
//     the TMA stores, and it returns once they have read the tile.
#pragma once
#if !defined(PRECISION_BF16)
#error "our wgmma product (matmul_wgmma.cuh) is for the BF16 build"
#endif
#include "kernels/cuda/attention_flash_tc_ptx.cuh"

namespace wgmma_product {
constexpr int BM = 128, BN = 256, BK = 64, STAGES = 3, THREADS = 384, EPILOGUE_THREADS = 96;
constexpr int EPILOGUE_FIRST = 32; // the epilogue's first thread (warp 1's lane 0)
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int STAGED_BYTES = BM * BN * 2; // the staged tile (16 bits a sum)
constexpr int BARRIERS = 2 * STAGES + 2;
// Dynamic shared memory is only 16-byte aligned; TMA's and wgmma's 128-byte swizzle want 1024.
constexpr size_t SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + STAGED_BYTES + BARRIERS * 8;

// The staged tile: BN / 64 panels of BM rows by 64 columns (128 bytes), each with the 128-byte
// swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)) of the TMA stores' boxes, so that both the
// accumulators' stores (8 rows of 16 bytes per warp) and the epilogues' 16-byte chunks (a row of 512
// bytes per warp) are conflict-free.
__device__ __forceinline__ int staged_offset(int row, int chunk) {
    return chunk / 8 * (BM * 128) + row * 128 + ((chunk % 8) ^ (row % 8)) * 16;
}

// 16 bytes of shared memory at `address` (a shared-window address, smem_address), in program order.
__device__ __forceinline__ uint4 load_shared_16(uint32_t address) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(address));
    return v;
}
__device__ __forceinline__ void store_shared_16(uint32_t address, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// An epilogue's share of a panel of the staged tile (BM rows of 64 columns: BM * 8 16-byte chunks):
// chunk i is thread i % EPILOGUE_THREADS's, 1024 chunks on 96 threads, 10 each and an eleventh for
// the first 64; the others load their first chunk again as their eleventh and do not store it (a
// guard on the load and the epilogue's arithmetic too spilled). Thread t's chunk u, i = t + u
// EPILOGUE_THREADS, is chunk t % 8 of panel row t / 8 + 12 u, at staged_offset(t / 8 + 12 u, t % 8)
// = (t / 8 + 12 u) 128 + ((t % 8) ^ ((t / 8 + 12 u) % 8)) 16, where (t / 8 + 12 u) % 8 is (t / 8 % 8)
// ^ (4 u % 8): u's even and odd differ in the chunk's bit 2, so each chunk is at one of the thread's
// two offsets plus a constant (the epilogue's three warps take longer than the product, and chunks
// addressed from their index through a generic pointer cost it their arithmetic).
constexpr int PANEL_CHUNKS = BM * 8, CHUNKS_PER_THREAD = (PANEL_CHUNKS + EPILOGUE_THREADS - 1) / EPILOGUE_THREADS;
static_assert(EPILOGUE_THREADS / 8 % 8 == 4, "the chunk offsets assume 12 rows a step");
// Thread t's chunk offsets in a panel: chunk_offset(u) is chunk u's.
struct PanelChunkOffsets {
    int t, even, odd;
    __device__ __forceinline__ explicit PanelChunkOffsets(int thread)
        : t(thread), even(staged_offset(thread / 8, thread % 8)), odd(even ^ (4 * 16)) {}
    __device__ __forceinline__ int operator()(int u) const {
        return t + u * EPILOGUE_THREADS < PANEL_CHUNKS ? (u % 2 ? odd : even) + u * (EPILOGUE_THREADS / 8) * 128 : even;
    }
};

// The thread's chunks v back into the panel; once all three warps' are in, the first thread stores
// the panel by TMA to map's box at (x, y), in its bulk group.
__device__ __forceinline__ void store_panel(const uint4 (&v)[CHUNKS_PER_THREAD], const unsigned char* panel,
                                            const PanelChunkOffsets& chunk_offset, const CUtensorMap* map, int x,
                                            int y) {
    const int t = chunk_offset.t;
    const uint32_t panel_address = smem_address(panel);
#pragma unroll
    for (int u = 0; u < CHUNKS_PER_THREAD; u++)
        if (t + u * EPILOGUE_THREADS < PANEL_CHUNKS) store_shared_16(panel_address + chunk_offset(u), v[u]);
    fence_proxy_async();
    named_barrier_sync(1, EPILOGUE_THREADS);
    if (t == 0) {
        tma_store_3d<false>(map, x, y, 0, panel);
        bulk_commit();
    }
}

// Where tile `tile` of a block's turn lies. With ROW_GROUP 0, row block tile / col_blocks and its
// columns in turn: consecutive tiles share their rows of inp, and the blocks running at once read
// all of a weight the L2 holds (fc's, 4.7 MB). A weight larger than the L2 (the head's, 77 MB) would
// be read again from memory for every row block (a third longer a call at the power cap): there
// the tiles go ROW_GROUP row blocks at a time, a column of them after the
// other, so that the blocks running at once share a few columns of the weight.
struct TilePlace {
    int row_block, col_block;
};
template <int ROW_GROUP> __device__ __forceinline__ TilePlace tile_place(int tile, int row_blocks, int col_blocks) {
    if constexpr (ROW_GROUP == 0) return TilePlace{tile / col_blocks, tile % col_blocks};
    const int group = tile / (ROW_GROUP * col_blocks), first = group * ROW_GROUP;
    const int rows = min(ROW_GROUP, row_blocks - first), in_group = tile - group * ROW_GROUP * col_blocks;
    return TilePlace{first + in_group % rows, in_group / rows};
}

template <class Epilogue>
__global__ void __launch_bounds__(THREADS, 1)
    wgmma_product_kernel(const __grid_constant__ typename Epilogue::Params params, const __grid_constant__ CUtensorMap inp_map,
                         const __grid_constant__ CUtensorMap weight_map, int N, int C, int OC,
                         const int* row_blocks_taken) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int col_blocks = (OC + BN - 1) / BN, row_blocks = (N + BM - 1) / BM, tiles = row_blocks * col_blocks;
    if (row_blocks_taken && !row_blocks_taken[row_blocks]) return;
    // Whether this launch takes the tiles of row block rb: the same answer in every role.
    auto takes = [&](int rb) { return !row_blocks_taken || row_blocks_taken[rb]; };
    extern __shared__ unsigned char smem_unaligned[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_unaligned + 1023) & ~(uintptr_t)1023);
    unsigned char* staged = smem + STAGES * STAGE_BYTES;
    uint64_t* full = (uint64_t*)(staged + STAGED_BYTES); // stage s loaded (its TMA bytes arrived)
    uint64_t* empty = full + STAGES;                     // stage s read by the products of all 8 warps
    uint64_t* staged_full = empty + STAGES;              // the staged tile written (256 threads)
    uint64_t* staged_free = staged_full + 1;             // the staged tile stored (the epilogue's first thread)
    auto stage_a = [&](int s) { return (const floatX*)(smem + s * STAGE_BYTES); };
    auto stage_b = [&](int s) { return (const floatX*)(smem + s * STAGE_BYTES + A_BYTES); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 8);
        }
        mbarrier_init(staged_full, 256);
        mbarrier_init(staged_free, 1);
    }
    __syncthreads();

    const int k_blocks = (C + BK - 1) / BK;
    const int warp = warp_index(), lane = threadIdx.x % 32;
    // A barrier's i-th wait (the staged tile's, or stage s's i-th use) is for phase parity i % 2;
    // the "free" barriers are waited on with the other parity, which a fresh barrier counts as done.
    if (warp == 0) { // the producer
        // Step L is this block's L-th k-block over all the tiles it takes, loaded into stage L % STAGES
        // once empty[s] has completed the phase of step L - STAGES's release.
        if (lane == 0)
            for (int tile = blockIdx.x, L = 0; tile < tiles; tile += gridDim.x) {
                const TilePlace place = tile_place<Epilogue::ROW_GROUP>(tile, row_blocks, col_blocks);
                if (!takes(place.row_block)) continue;
                for (int kb = 0; kb < k_blocks; kb++, L++) {
                    const int s = L % STAGES;
                    if (L >= STAGES) mbarrier_wait(&empty[s], (L / STAGES - 1) & 1);
                    mbarrier_expect_bytes(&full[s], STAGE_BYTES);
                    tma_load_3d((void*)stage_a(s), &inp_map, kb * BK, place.row_block * BM, 0, &full[s]);
                    tma_load_3d((void*)stage_b(s), &weight_map, kb * BK, place.col_block * BN, 0, &full[s]);
                }
            }
        return;
    }
    if (warp < 4) { // the epilogue
        int i = 0; // the tiles taken so far
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const TilePlace place = tile_place<Epilogue::ROW_GROUP>(tile, row_blocks, col_blocks);
            if (!takes(place.row_block)) continue;
            mbarrier_wait(staged_full, i++ & 1);
            Epilogue::store(params, staged, place.row_block * BM, place.col_block, N, OC);
            if (threadIdx.x == EPILOGUE_FIRST) mbarrier_arrive(staged_free);
        }
        if (threadIdx.x == EPILOGUE_FIRST) bulk_wait_all<false>(); // the shared memory the stores read lives until they are done
        return;
    }

    // Step L's products are done in this warp: its stage may be loaded again.
    auto release = [&](int L) {
        if (lane == 0) mbarrier_arrive(&empty[L % STAGES]);
    };

    // This thread's accumulators: rows group * 64 + warp % 4 * 16 + lane / 4 and 8 below, columns 2 q
    // and 2 q + 1 of each 8-column group (wgmma's fragment layout, as mma.sync's).
    const int group = warp / 4 - 1, q = lane % 4;
    // In a register: read from params, it is loaded again after every stmatrix.
    const floatX* bias = nullptr;
    if constexpr (Epilogue::HAS_BIAS) bias = params.bias;
    // Stage 0's wgmma descriptors, made once: built from each stage's address after its wait, they
    // put 14 instructions between the wait and the k-block's first wgmma (ncu). A
    // descriptor holds the address in units of 16 bytes, below 256 KB, so stage s's is stage 0's
    // plus s STAGE_BYTES / 16, and 16 columns (32 bytes) on is + 2.
    const uint64_t a_descriptor = wgmma_descriptor(stage_a(0) + group * 64 * BK);
    const uint64_t b_descriptor = wgmma_descriptor(stage_b(0));
    float acc[128];
    int step = 0, i = 0; // i: the tiles taken so far
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TilePlace place = tile_place<Epilogue::ROW_GROUP>(tile, row_blocks, col_blocks);
        if (!takes(place.row_block)) continue;
        const int col0 = place.col_block * BN;
        // The shifts of this thread's two rows, where the epilogue stages each sum less its row's.
        const int row = place.row_block * BM + group * 64 + warp % 4 * 16 + lane / 4;
        float shift_top = 0.0f, shift_bottom = 0.0f;
        if constexpr (Epilogue::SHIFT_ROWS) {
            shift_top = row < N ? params.shift[row] : 0.0f;
            shift_bottom = row + 8 < N ? params.shift[row + 8] : 0.0f;
        }
        auto pack = [&](float sum0, float sum1, float bias0, float bias1, float shift) {
            if constexpr (Epilogue::HAS_BIAS) sum0 += bias0, sum1 += bias1;
            if constexpr (Epilogue::SHIFT_ROWS) sum0 -= shift, sum1 -= shift;
            return Epilogue::pack(sum0, sum1);
        };
        for (int kb = 0; kb < k_blocks; kb++, step++) {
            const int s = step % STAGES;
            const uint64_t stage_offset = (uint64_t)s * (STAGE_BYTES / 16);
            mbarrier_wait(&full[s], step / STAGES & 1);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 16; k++)
                wgmma_m64n256k16_shared_a(acc, a_descriptor + stage_offset + 2 * k, b_descriptor + stage_offset + 2 * k,
                                          kb > 0 || k > 0);
            wgmma_commit();
            wgmma_wait<1>(); // the previous k-block's products are done
            if (kb > 0) release(step - 1);
        }
        wgmma_wait<0>();
        // The accumulators are read below, after the wait, not before it (wgmma_pin's reason).
#pragma unroll
        for (int j = 0; j < 128; j++) asm volatile("" : "+f"(acc[j])::"memory");
        release(step - 1);

        mbarrier_wait(staged_free, (i & 1) ^ 1);
        // Two 8-column groups at a time, by stmatrix: the warp's 16 rows by 16 columns as four 8 x 8
        // matrices, top and bottom of group j, then of group j + 1. Lane l gives the address of row
        // l % 8 of matrix l / 8: the warp's row 8 (l / 8 % 2) + l % 8, chunk j + l / 16 of the staged
        // tile, at staged_offset's place: chunk ((j % 8) ^ y) of its panel row, y = (l / 16) ^ (l % 8)
        // (j is even, so j % 8 + l / 16 is (j % 8) | (l / 16), and the row's l % 8 is its row % 8).
        unsigned char* staged_row = staged + (group * 64 + warp % 4 * 16 + lane / 8 % 2 * 8 + lane % 8) * 128;
        const int y = (lane / 16) ^ (lane % 8);
        // bias_pair(col): the bias of this tile's columns col and col + 1, as floats.
        auto stage = [&](auto bias_pair) {
#pragma unroll
            for (int j = 0; j < BN / 8; j += 2) {
                const float2 b0 = bias_pair(j * 8 + 2 * q), b1 = bias_pair((j + 1) * 8 + 2 * q);
                const float* a = acc + 4 * j;
                stmatrix_x4(staged_row + j / 8 * (BM * 128) + ((j % 8) ^ y) * 16, pack(a[0], a[1], b0.x, b0.y, shift_top),
                            pack(a[2], a[3], b0.x, b0.y, shift_bottom), pack(a[4], a[5], b1.x, b1.y, shift_top),
                            pack(a[6], a[7], b1.x, b1.y, shift_bottom));
            }
        };
        auto bias_at = [&](int col) {
            const __nv_bfloat162 v = *(const __nv_bfloat162*)(bias + col0 + col);
            return make_float2(__low2float(v), __high2float(v));
        };
        // A tile whose columns all lie inside OC loads its bias unguarded: loads that no branch
        // separates can be issued ahead of the sums that wait for them.
        if (Epilogue::HAS_BIAS && bias && col0 + BN <= OC)
            stage(bias_at);
        else
            stage([&](int col) {
                return Epilogue::HAS_BIAS && bias && col0 + col < OC ? bias_at(col) : make_float2(0.0f, 0.0f);
            });
        fence_proxy_async(); // these stores, visible to the TMA store's reads
        mbarrier_arrive(staged_full);
        i++;
    }
#else
    (void)params, (void)inp_map, (void)weight_map, (void)N, (void)C, (void)OC, (void)row_blocks_taken;
    __trap();
#endif
}

// Whether this GPU runs the kernel for Epilogue (sm90a_code_runs), which then gets its shared memory.
template <class Epilogue> bool kernel_runs() {
    const bool runs = sm90a_code_runs((const void*)wgmma_product_kernel<Epilogue>);
    if (runs)
        cudaCheck(cudaFuncSetAttribute(wgmma_product_kernel<Epilogue>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)SMEM_BYTES));
    return runs;
}

// inp (N rows, ld_inp elements apart) @ weight (OC, C)^T through Epilogue, on at most one block an SM.
// row_blocks_taken (device, ceil(N / BM) + 1 ints), or NULL for every tile: the tiles of the row
// blocks rb whose row_blocks_taken[rb] is not 0, and none unless row_blocks_taken[ceil(N / BM)] is not.
template <class Epilogue>
void launch(const typename Epilogue::Params& params, const floatX* inp, const floatX* weight, int N, int C, int OC,
            int ld_inp, const int* row_blocks_taken = nullptr) {
    const CUtensorMap inp_map = tensor_map_3d(inp, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, N, C, ld_inp, BM);
    const CUtensorMap weight_map = tensor_map_3d(weight, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, OC, C, C, BN);
    const int tiles = ceil_div(N, BM) * ceil_div(OC, BN);
    wgmma_product_kernel<Epilogue><<<tiles < device_sm_count ? tiles : device_sm_count, THREADS, SMEM_BYTES>>>(
        params, inp_map, weight_map, N, C, OC, row_blocks_taken);
    launchCheck();
}
} // namespace wgmma_product
