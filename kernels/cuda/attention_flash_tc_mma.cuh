// The building blocks of the tensor-core flash kernels, BF16 and FP16 (attention_flash_tc_forward.cuh,
// attention_flash_tc_backward.cuh): the two matrix-product policies, MmaSync (mma.sync, every
// GPU from sm_80, and sm_75 in FP16) and Wgmma (wgmma, H100/H200), and the tile work both directions share: cp.async
// loads of tiles and vectors into shared memory, the streaming of tiles (TileStream: cp.async, or
// TMA with Wgmma), A fragments from a tile, the causal mask of a score fragment, and the floatX
// store of an accumulator. The PTX underneath is in
// attention_flash_tc_ptx.cuh; which policy and tile shapes run is chosen in attention_flash.cu.
#pragma once
#include <math.h>

#include "kernels/cuda/attention_flash_tc_ptx.cuh"

// A fragments (16 x 16 blocks, floatX) of a warp's (16 M_TILES x COLS) accumulator: P for O += P V.
template <int M_TILES, int COLS>
__device__ __forceinline__ void a_fragments_of(uint32_t a[M_TILES][COLS / 16][4], const float p[M_TILES][COLS / 8][4]) {
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int k = 0; k < COLS / 16; k++) a_fragment_of(a[mt][k], p[mt], k);
}

// ---- warp matrix products ------------------------------------------------------------------
// Two policies, `Mma`, for the same kernels. Both keep the A operands computed in the loop (P, dS)
// in registers in mma.m16n8k16's fragment layout, which is also wgmma's register-A layout, and
// accumulate in the m16n8 accumulator layout, which is also what each warp holds of a wgmma m64
// accumulator (its 16 rows). They differ in where B and the resident A operands (Q, dO, K, V)
// come from:
//   MmaSync<HS> (every GPU from sm_80): mma.sync per warp; A fragments in registers, B fragments
//     by ldmatrix from tile rows padded by 16 bytes (rows 16 bytes apart modulo 128, so the 8 row
//     addresses of an ldmatrix phase fall in 8 different bank groups).
//   Wgmma (sm_90a, that is H100 and H200; HS 64): wgmma per warpgroup of 4 warps; the tensor cores
//     read B and the resident A straight from tiles of 128-byte rows stored with the 128-byte
//     swizzle (16-byte chunk c of row r at chunk c ^ (r % 8), conflict-free for cp.async and
//     ldmatrix too). The 4 warps of a group multiply together, so they must take the same
//     branches (GROUP_WARPS).
// Tiles of either are addressed through Mma::offset(row, col), col a multiple of 8.
template <int HEAD_SIZE> struct MmaSync {
    static constexpr int HS = HEAD_SIZE, STRIDE = HS + 8, GROUP_WARPS = 1;
    static constexpr bool TMA = false;      // streamed tiles by cp.async (TileStream)
    static constexpr bool SHARED_A = false; // A operands (Q, dO, K, V) as fragments in registers
    static constexpr bool ASYNC = false;    // the products are complete when they return
    static constexpr size_t ALIGN = 16;
    __device__ static int offset(int row, int col) { return row * STRIDE + col; }
    __device__ static void tiles_ready() {} // ldmatrix reads what cp.async wrote once the barrier is passed
    // Wgmma's products are not complete until wait().
    template <int PENDING = 0, class... Accumulators> __device__ static void wait(Accumulators&...) {}

    // acc (16 M_TILES x COLS) = A (16 M_TILES x HS, fragments) B^T, B a (COLS x HS) tile: S = Q K^T.
    // The B fragments of two column groups come from one ldmatrix of four 8 x 8 blocks.
    template <int M_TILES, int COLS>
    __device__ static void gemm_a_bt(float acc[M_TILES][COLS / 8][4], const uint32_t a[M_TILES][HS / 16][4],
                                     const floatX* b_tile) {
        const int lane = threadIdx.x % 32;
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
#pragma unroll
        for (int k = 0; k < HS / 16; k++) {
#pragma unroll
            for (int np = 0; np < COLS / 16; np++) {
                uint32_t b[4]; // (cols 0-7, k 0-7), (cols 0-7, k 8-15), (cols 8-15, k 0-7), (cols 8-15, k 8-15)
                ldmatrix_x4(b, b_tile + offset(np * 16 + lane / 16 * 8 + lane % 8, k * 16 + lane / 8 % 2 * 8));
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++) {
                    mma_16816(acc[mt][2 * np], a[mt][k], b[0], b[1]);
                    mma_16816(acc[mt][2 * np + 1], a[mt][k], b[2], b[3]);
                }
            }
        }
    }

    // acc (16 M_TILES x NCOLS) += A (16 M_TILES x 16, fragments) times rows k0 .. k0 + 15, columns
    // n0 .. n0 + NCOLS - 1 of a row-major (rows x HS) tile; ldmatrix.trans turns the tile's rows into
    // column fragments.
    template <int M_TILES, int NCOLS>
    __device__ static void mma_a_tile_rows(float acc[M_TILES][NCOLS / 8][4], const uint32_t a[M_TILES][4],
                                           const floatX* b_tile, int k0, int n0) {
        const int lane = threadIdx.x % 32;
#pragma unroll
        for (int np = 0; np < NCOLS / 16; np++) {
            uint32_t b[4]; // (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15)
            ldmatrix_x4_trans(b, b_tile + offset(k0 + lane / 8 % 2 * 8 + lane % 8, n0 + np * 16 + lane / 16 * 8));
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++) {
                mma_16816(acc[mt][2 * np], a[mt], b[0], b[1]);
                mma_16816(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }

    // acc (16 M_TILES x HS) += P (16 M_TILES x COLS, accumulator layout, rounded to floatX) B, B a
    // (COLS x HS) row-major tile: O += P V.
    template <int M_TILES, int COLS>
    __device__ static void gemm_c_b(float acc[M_TILES][HS / 8][4], const float p[M_TILES][COLS / 8][4],
                                    const floatX* b_tile) {
#pragma unroll
        for (int k = 0; k < COLS / 16; k++) {
            uint32_t a[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++) a_fragment_of(a[mt], p[mt], k);
            mma_a_tile_rows<M_TILES, HS>(acc, a, b_tile, k * 16, 0);
        }
    }
};

struct Wgmma {
    static constexpr int HS = 64, STRIDE = 64, GROUP_WARPS = 4;
    static constexpr bool TMA = true; // streamed tiles by TMA (TileStream), which writes this same swizzle
    static constexpr int TMA_BOX_ROWS = 64; // rows per TMA copy of a streamed tile (the tensor maps' boxes)
    // The resident A operands (Q, dO, K, V) are read by the tensor cores from their tiles
    // (gemm_shared_a_bt), not held as fragments: their registers free, the kernels fit more
    // blocks per SM (dK/dV three instead of two: 2-7% faster; dQ and the forward then faster with
    // more, smaller blocks), and nothing to reload (CUDA 13.0's ptxas, given fragments carried
    // around the loop, gave their registers to P after the first tile, so they had to be loaded
    // again for every tile). A descriptor covers 64 contiguous rows: the warp group's rows must be
    // one block of the tile, so the kernels run one m-tile per warp.
    static constexpr bool SHARED_A = true;
    // The products are issued and run while the warps go on, until wait(): the forward issues one
    // tile's P V together with the next tile's S = Q K^T.
    static constexpr bool ASYNC = true;
    static constexpr size_t ALIGN = 1024; // the swizzle pattern repeats from 1024-byte boundaries
    __device__ static int offset(int row, int col) { return row * STRIDE + ((col / 8) ^ (row % 8)) * 8 + col % 8; }
    // cp.async writes through the generic proxy, wgmma reads through the async proxy.
    __device__ static void tiles_ready() { fence_proxy_async(); }

    // As MmaSync's gemm_a_bt, issued only (see wait), with A the warpgroup's 64 rows of a tile (from
    // a_rows) read from shared memory: acc = A B^T (one m64n64k16 per 16 head dimensions and 64 rows
    // of B, B K-major).
    template <int COLS>
    __device__ static void gemm_shared_a_bt(float acc[1][COLS / 8][4], const floatX* a_rows, const floatX* b_tile) {
        static_assert(COLS % 64 == 0, "wgmma tiles are a multiple of 64 wide");
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < HS / 16; k++)
#pragma unroll
            for (int n = 0; n < COLS / 64; n++)
                wgmma_m64n64k16_shared_a<0, 0>(acc[0] + 8 * n, wgmma_descriptor(a_rows + k * 16),
                                               wgmma_descriptor(b_tile + n * 64 * STRIDE + k * 16), k > 0);
        wgmma_commit();
    }

    // As MmaSync's, issued only: acc += P B (one m64n64k16 per m-tile and 16 rows of B, B MN-major).
    template <int M_TILES, int COLS>
    __device__ static void gemm_c_b(float acc[M_TILES][HS / 8][4], const float p[M_TILES][COLS / 8][4],
                                    const floatX* b_tile) {
        uint32_t a[M_TILES][COLS / 16][4];
        a_fragments_of<M_TILES, COLS>(a, p);
        gemm_a_b<M_TILES, COLS>(acc, a, b_tile);
    }
    // The same with P already as A fragments (a_fragments_of), which must stay as they are until
    // the wait: the tensor cores read them while the product runs.
    template <int M_TILES, int COLS>
    __device__ static void gemm_a_b(float acc[M_TILES][HS / 8][4], const uint32_t a[M_TILES][COLS / 16][4],
                                    const floatX* b_tile) {
        wgmma_pin<M_TILES, HS / 8>(acc);
        wgmma_fence();
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int k = 0; k < COLS / 16; k++)
                wgmma_m64n64k16<1>(acc[mt], a[mt][k], wgmma_descriptor(b_tile + k * 16 * STRIDE), true);
        wgmma_commit();
    }

    // Issued only: acc = A^T B, A and B two (64 x 64) tiles that share their rows (both MN-major):
    // dQ = dS K from dS^T and K, both stored key by key. Every warp of the group must have written
    // its rows of a_tile, fenced them (tiles_ready) and met the others at a barrier.
    __device__ static void gemm_at_b(float acc[1][HS / 8][4], const floatX* a_tile, const floatX* b_tile) {
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 64 / 16; k++)
            wgmma_m64n64k16_shared_a<1, 1>(acc[0], wgmma_descriptor(a_tile + k * 16 * STRIDE),
                                           wgmma_descriptor(b_tile + k * 16 * STRIDE), k > 0);
        wgmma_commit();
    }

    // Waits for the products issued, all but the newest PENDING groups (one group per call above),
    // and pins the accumulators of those waited for after the wait. Two products issued before one
    // wait run back to back in the tensor cores.
    template <int M_TILES, int N_TILES> __device__ static void pin(float (&acc)[M_TILES][N_TILES][4]) {
        wgmma_pin<M_TILES, N_TILES>(acc);
    }
    template <int PENDING = 0, class... Accumulators> __device__ static void wait(Accumulators&... acc) {
        wgmma_wait<PENDING>();
        (pin(acc), ...);
    }
};

// ---- tiles in shared memory, fragments in registers ----------------------------------------
// A shared-memory pointer rounded up to a multiple of ALIGN bytes (the launch asks for ALIGN - 16
// bytes more than the tiles need).
template <size_t ALIGN> __device__ __forceinline__ unsigned char* align_shared(unsigned char* p) {
    return p + (ALIGN - smem_address(p) % ALIGN) % ALIGN;
}

// Copies rows row0 .. row0 + ROWS - 1 of a (T, HS) matrix whose rows are `stride` elements apart
// into a tile; rows at or past T are zeros. Thread x copies chunk x % CHUNKS of rows x / CHUNKS,
// x / CHUNKS + THREADS / CHUNKS, ...: a trip count known at compile time, so the loop unrolls
// and each thread's column and swizzle are computed once (a loop from threadIdx.x to ROWS * CHUNKS
// compiled to a generic loop whose index arithmetic cost the dK/dV kernel about a fifth of its
// instructions). Offsets within the sequence are 32-bit (T * stride < 2^31, checked at launch):
// one multiply-add per chunk instead of 64-bit products and selects.
template <class Mma, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(floatX* tile, const floatX* src, int row0, int T, int stride) {
    constexpr int CHUNKS = Mma::HS / 8; // 16-byte chunks per row
    constexpr int ROWS_PER_PASS = THREADS / CHUNKS;
    static_assert(THREADS % CHUNKS == 0, "every pass copies whole rows");
    const int c = threadIdx.x % CHUNKS;
#pragma unroll
    for (int pass = 0; pass < (ROWS + ROWS_PER_PASS - 1) / ROWS_PER_PASS; pass++) {
        const int r = threadIdx.x / CHUNKS + pass * ROWS_PER_PASS;
        if (ROWS % ROWS_PER_PASS != 0 && r >= ROWS) break;
        const int row = min(row0 + r, T - 1); // past T: an address inside the matrix, nothing read
        cp_async_16(tile + Mma::offset(r, c * 8), src + (row * stride + c * 8), row0 + r < T);
    }
}

// COLS floats from src[col0 ..] (zeros at or past T); as load_tile_async, a trip count known at
// compile time.
template <int COLS, int THREADS>
__device__ __forceinline__ void load_vector_async(float* dst, const float* src, int col0, int T) {
#pragma unroll
    for (int pass = 0; pass < (COLS + THREADS - 1) / THREADS; pass++) {
        const int i = threadIdx.x + pass * THREADS;
        if (COLS % THREADS != 0 && i >= COLS) break;
        const bool valid = col0 + i < T;
        cp_async_4(dst + i, src + (valid ? col0 + i : 0), valid);
    }
}

// Two matrices' tiles of COLS rows, streamed through STAGES stages of shared memory: K and V in the
// forward and the dQ kernel, Q and dO in the dK/dV kernel, tiles first_tile, first_tile + 1, ...
// MmaSync: by cp.async from every thread (rows at or past T zeros), in the commit group the kernel
// closes for each tile. Wgmma: by TMA from thread 0 out of tensor maps of the two matrices
// (attention_flash.cu; rows past T are outside the tensor: zeros too), with one mbarrier per
// stage that the copies signal: the other threads spend no instructions on addresses (the cp.async
// loads' were about 45 per thread and tile in the forward, which got 5-11% faster without them).
// B_LAG 1: the second matrix's tiles come one step later, for a kernel that multiplies tile j - 1
// of it while it works on tile j of the first (the forward's V): step j loads a tile j and b tile
// j - 1, and there is one step more than tiles. Each stage's a and b slots are then free one step
// apart, so the streamed tiles need no more shared memory.
template <class Mma, int COLS, int THREADS, int STAGES, int B_LAG = 0> struct TileStream {
    floatX *a_tiles, *b_tiles; // STAGES stages each
    uint64_t* landed;          // STAGES mbarriers (TMA)
    int first_tile, num_tiles, T;
    const floatX *a_src, *b_src; // cp.async: row 0 of this (batch, head)'s matrices,
    int a_stride, b_stride;      // and their rows' distance in elements
    const CUtensorMap *a_map, *b_map; // TMA: the matrices as (B, T, width) tensors,
    int a_col, b_col, batch;          // and where this head's columns start

    __device__ int stage(int tile) const { return (tile - first_tile) % STAGES; }
    __device__ floatX* a_tile(int tile) const { return a_tiles + stage(tile) * COLS * Mma::STRIDE; }
    __device__ floatX* b_tile(int tile) const { return b_tiles + stage(tile) * COLS * Mma::STRIDE; }

    // Before the block's first barrier.
    __device__ void init() const {
        if constexpr (Mma::TMA) {
            if (threadIdx.x == 0)
                for (int i = 0; i < STAGES; i++) mbarrier_init(&landed[i], 1);
        }
    }
    // Starts step `tile`'s tiles (a tile `tile`, b tile `tile - B_LAG`, those that exist) into their
    // stages. The stages' previous tiles must be done with: the kernels call this after a barrier
    // that every warp reaches once they are.
    __device__ void load(int tile) const {
        const bool a = tile < num_tiles, b = B_LAG == 0 ? a : tile - B_LAG >= first_tile && tile - B_LAG < num_tiles;
        if (!a && !b) return;
        if constexpr (Mma::TMA) {
            if (threadIdx.x == 0) {
                uint64_t* bar = &landed[stage(tile)];
                mbarrier_expect_bytes(bar, (a + b) * COLS * Mma::HS * sizeof(floatX));
                constexpr int BOX = Mma::TMA_BOX_ROWS;
                static_assert(COLS % BOX == 0, "a streamed tile is whole TMA boxes");
#pragma unroll
                for (int part = 0; part < COLS / BOX; part++) {
                    if (a)
                        tma_load_3d(a_tile(tile) + part * BOX * Mma::STRIDE, a_map, a_col, tile * COLS + part * BOX,
                                    batch, bar);
                    if (b)
                        tma_load_3d(b_tile(tile - B_LAG) + part * BOX * Mma::STRIDE, b_map, b_col,
                                    (tile - B_LAG) * COLS + part * BOX, batch, bar);
                }
            }
        } else {
            if (a) load_tile_async<Mma, COLS, THREADS>(a_tile(tile), a_src, tile * COLS, T, a_stride);
            if (b) load_tile_async<Mma, COLS, THREADS>(b_tile(tile - B_LAG), b_src, (tile - B_LAG) * COLS, T, b_stride);
        }
    }
    // Waits until step `tile`'s tiles and the rest of its cp.async group (STAGES - 2 newer groups
    // may be in flight) are in shared memory, for the products; the kernels then hold a barrier.
    __device__ void wait(int tile) const {
        cp_async_wait<STAGES - 2>();
        if constexpr (Mma::TMA) mbarrier_wait(&landed[stage(tile)], (tile - first_tile) / STAGES % 2);
        else Mma::tiles_ready();
    }
};

// A fragments of the warp's 16 * M_TILES rows starting at tile row `row0`, all HS columns.
template <class Mma, int M_TILES>
__device__ __forceinline__ void load_a_fragments(uint32_t a[M_TILES][Mma::HS / 16][4], const floatX* tile, int row0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int k = 0; k < Mma::HS / 16; k++)
            ldmatrix_x4(a[mt][k], tile + Mma::offset(row0 + mt * 16 + lane % 16, k * 16 + lane / 16 * 8));
}

// Sets the elements of a warp's (16 M_TILES x COLS) score accumulator to -inf where hidden(row, col)
// (tile-relative), so exp2 makes them 0. Called only for the tiles that need a mask, which keeps the
// compare and select out of the other tiles' inner loops.
template <int M_TILES, int COLS, class Hidden>
__device__ __forceinline__ void mask_scores(float s[M_TILES][COLS / 8][4], Hidden hidden) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (hidden(mt * 16 + lane / 4 + i / 2 * 8, nt * 8 + lane % 4 * 2 + i % 2)) s[mt][nt][i] = -INFINITY;
}

// Writes a warp's (16 M_TILES x HS) accumulator times `scale` as floatX into rows row0.. (< T) of a
// matrix whose rows are `stride` elements apart.
template <int M_TILES, int HS>
__device__ __forceinline__ void store_rows(floatX* dst, const float acc[M_TILES][HS / 8][4], const float scale[M_TILES][2],
                                           int row0, int T, size_t stride) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = row0 + mt * 16 + lane / 4 + half * 8;
            if (row >= T) continue;
#pragma unroll
            for (int nt = 0; nt < HS / 8; nt++) {
                *(floatX2*)(dst + (size_t)row * stride + nt * 8 + lane % 4 * 2) = floatX2_from_floats(
                    acc[mt][nt][2 * half] * scale[mt][half], acc[mt][nt][2 * half + 1] * scale[mt][half]);
            }
        }
}

// ---- the qkv bias gradient's partial sums (attention_backward's dbias) ----------------------
// The column sums of what store_rows stores (the floatX values, rows below T), one row of partial
// sums per tile of BIAS_TILE_ROWS (64) rows of a sequence (attention_flash.cu, which adds them up),
// added in an order that depends on no tile configuration:
// a warp sums each of its 16-row slabs (a lane adds its rows g and g + 8, then the eight row
// groups combine pairwise between lanes 4, 8 and 16 apart), and a tile's partial is
// ((slab 0 + slab 1) + slab 2) + slab 3. So the kernels write the partials as they store dQ, dK
// and dV, where a column-sum pass would read dqkv (302 MB per d12 layer at B 64) again.

// The warp's slabs into slab_sums[(slab0 + mt) * HS ..] (shared memory). The kernels sum and store
// the partials before their store_rows: after it, the shuffles and shared-memory loads queued
// behind the warp's global stores, and the sums cost the wgmma dK/dV kernel several times as much
// time (ncu, d12 at B 64).
template <int M_TILES, int HS>
__device__ __forceinline__ void slab_column_sums(float* slab_sums, const float acc[M_TILES][HS / 8][4],
                                                 const float scale[M_TILES][2], int slab0, int row0, int T) {
    constexpr int N = HS / 4; // a lane's columns: 2 of every 8
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++) {
        float v[N]; // v[2 nt + e]: column 8 nt + 2 (lane % 4) + e, the lane's rows g and g + 8 added
#pragma unroll
        for (int nt = 0; nt < HS / 8; nt++) {
            v[2 * nt] = v[2 * nt + 1] = 0.0f;
#pragma unroll
            for (int half = 0; half < 2; half++)
                if (row0 + mt * 16 + lane / 4 + half * 8 < T) {
                    const float2 stored = floats_from_floatX2(floatX2_from_floats(
                        acc[mt][nt][2 * half] * scale[mt][half], acc[mt][nt][2 * half + 1] * scale[mt][half]));
                    v[2 * nt] += stored.x;
                    v[2 * nt + 1] += stored.y;
                }
        }
        // The eight row groups, halving the values at each step: of two partner lanes, the one
        // with the lane bit set keeps the upper half of its values and gets its partner's upper
        // half to add, the other the lower half (both add the same pair: the same bits). 14
        // shuffles at HS 64 where a full butterfly of every value would take 48.
#pragma unroll
        for (int bit = 4; bit < 32; bit *= 2) {
            const int keep_upper = lane & bit, half = N * 2 / bit;
#pragma unroll
            for (int i = 0; i < half; i++) {
                const float send = keep_upper ? v[i] : v[i + half];
                const float keep = keep_upper ? v[i + half] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffff, send, bit);
            }
        }
        // v[j] is now the sum of value (N / 8) seg + j, seg from the bits kept: 4, 2, 1 for lane bits 4, 8, 16.
        const int seg = (lane >> 2 & 1) * 4 + (lane >> 3 & 1) * 2 + (lane >> 4 & 1);
#pragma unroll
        for (int j = 0; j < N / 8; j++) {
            const int k = N / 8 * seg + j;
            slab_sums[(slab0 + mt) * HS + k / 2 * 8 + lane % 4 * 2 + k % 2] = v[j];
        }
    }
}

// The warps of 64-row tile `tile` of a block of WARPS warps, TILE_WARPS of them per tile, wait for
// each other: so the warps of one tile do not wait for another's (the dQ kernel's two warpgroups,
// one of which has one more tile to multiply at the diagonal).
template <int TILE_WARPS, int WARPS> __device__ __forceinline__ void tile_barrier(int tile) {
    if constexpr (TILE_WARPS == WARPS) __syncthreads();
    else named_barrier_sync(1 + tile, 32 * TILE_WARPS);
}

// After a barrier that follows its warps' slab_column_sums: a block's (or one tile's) TILES tiles,
// those before the sequence's end (`tiles_left` of them from its first), from their 4 slabs each
// into partials[t * tile_stride + column] (partials at the first tile and the head's columns), by
// thread `thread` of the THREADS that share the work.
template <int TILES, int HS, int THREADS>
__device__ __forceinline__ void store_tile_column_sums(float* partials, const float* slab_sums, int tiles_left,
                                                       size_t tile_stride, int thread) {
    static_assert(BIAS_TILE_ROWS == 4 * 16, "a tile's four slabs, added below");
#pragma unroll
    for (int i = thread; i < TILES * HS; i += THREADS) {
        const int t = i / HS, col = i % HS;
        const float* slab = slab_sums + 4 * t * HS + col;
        if (t < tiles_left) partials[t * tile_stride + col] = ((slab[0] + slab[HS]) + slab[2 * HS]) + slab[3 * HS];
    }
}
