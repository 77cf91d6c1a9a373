// Flash attention on the GPU (ATTN=flash): the generic attention_* of kernels/kernels.h. The same
// algorithm as the CPU reference kernels/cpu/attention_flash.c, in fused kernels.
//
// Forward: each thread block owns a block of query rows of one (batch, head) and streams the K/V
// blocks at or below the diagonal through shared memory; an online softmax keeps the running max
// and sum in registers; only O and (m, l) per row are written.
// Backward: a small kernel computes D_i = rowsum(dO_i * O_i) and lse_i = log2 of sum_j exp(s_ij);
// then the dK/dV kernel (each block owns a block of key rows and loops over the query blocks at or
// below the diagonal, recomputing P from Q, K and lse) and the dQ kernel (each block owns a block
// of query rows and loops over the key blocks, recomputing P and dP); in the BF16 and FP16 builds both also
// sum the columns of each 64-row tile of dqkv they store, and one pass adds those partial sums
// into the qkv bias gradient (less than half the time of the column-sum pass over dqkv that they
// replace, which read dqkv again; FP32, naive and atomic dQ sum dqkv after it is written). dQ from a kernel of its own
// costs two more tile products (S and dP recomputed: 7 instead of 5 per tile) but no atomics,
// so every result is bit-identical from run to run, and no extra memory beyond D, lse and the bias
// partials.
// BF16 and FP16 only, FLASH_ATTN_DETERMINISTIC=0 (not on sm_75, whose 64 KB of shared memory the
// atomic dQ's blocks exceed): dQ added into an fp32 buffer by the dK/dV kernel instead
// (float atomics, or TMA adds on H100/H200), in another order on every run: 5 products, but the
// adds keep the L2 busy: alone it is slower than the deterministic kernels at every length, and no
// faster in training under the power cap (attention_flash_tc_backward.cuh).
//
// BF16 and FP16 builds: tensor cores, floatX (bf16 or fp16) in, fp32 accumulate, through mma.sync
// m16n8k16 (on sm_75, FP16 only, two m16n8k8: attention_flash_tc_ptx.cuh) with ldmatrix
// from shared memory rows padded by 16 bytes, or on H100/H200 (sm_90a) with HS 64 through wgmma
// reading K, V, Q and dO straight from 128-byte-swizzled shared memory (see "Mma" in
// attention_flash_tc_mma.cuh); double buffering of the streamed tiles, by cp.async or on
// H100/H200 by TMA (one thread copies a tile, an mbarrier says when it has landed), with one
// barrier per streamed tile;
// Q, K, V are read straight from the qkv buffer. Head sizes 32, 64 and 128 (on sm_75 32 and 64).
// Four configurations are picked at launch from the GPU: sm90 (wgmma) for H100/H200, sm80
// (mma.sync) for A100, sm86 for the consumer GPUs with 100 KB of shared memory per SM (RTX 30xx,
// 40xx, 50xx; every block stays under 99 KB), sm75 for T4 / RTX 20xx (64 KB per SM: every block
// under 57 KB at HS 64), also wherever the code running is sm_75's (an sm_75 binary on a newer card,
// through the driver's JIT); FLASH_ATTN_CONFIG=sm75|sm80|sm86|sm90 forces one (sm90 only on an
// H100/H200).
// FP32 build: the same algorithm on CUDA cores in exact fp32 (expf), one warp per row, any HS
// up to 128.
//
// The files: this one is the only one compiled (the Makefile's attention_$(ATTN).cu); it holds the
// host code and includes the others, which hold the kernels.
//   attention_flash.cu                 the attention_* functions of kernels/kernels.h, the scratch
//                                      layout, the D/lse kernel of both builds, the order in which
//                                      the causal kernels' blocks start, the tensor-core tile
//                                      configurations and their choice (FLASH_ATTN_CONFIG), the TMA
//                                      tensor maps, and every launch
//   attention_flash_tc_ptx.cuh         PTX wrappers: ldmatrix, mma.sync, wgmma, TMA copies,
//                                      reduce-adds and mbarriers (cp.async is in common.cuh)
//   attention_flash_tc_mma.cuh         the MmaSync and Wgmma policies and the tile loads, streams
//                                      and stores, and the stores' column sums (qkv's bias gradient)
//   attention_flash_tc_forward.cuh     the tensor-core (BF16, FP16) forward kernel
//   attention_flash_tc_backward.cuh    the tensor-core dK/dV and dQ kernels, and the atomic dQ's
//   attention_flash_fp32.cuh           the FP32 build's kernels
//
// Built only with -DATTN_FLASH; kernels/cuda/attention_naive.cu is the ATTN=naive variant.
#if defined(ATTN_FLASH)
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/constants.h"

#define DETERMINISTIC_DEFAULT true

size_t attention_saved_bytes(int B, int T, int NH) { return 2 * (size_t)B * NH * T * sizeof(float); }

#if !defined(PRECISION_FP32)
// BF16, FP16: dQ comes from a kernel of its own, deterministic (FLASH_ATTN_DETERMINISTIC=1), or is added
// up by the dK/dV kernel (=0), in a different order on every run (the speed of each, measured:
// attention_flash_tc_backward.cuh).
static bool deterministic_dq(void) {
    return env_switch("FLASH_ATTN_DETERMINISTIC", DETERMINISTIC_DEFAULT,
                      "dQ from its own kernel, identical on every run",
                      "dQ by atomics, not bit-identical from run to run, and on an H100 no faster in training");
}
#endif

// D (B, NH, T) floats; the tensor-core path also keeps lse in log2 units (B, NH, T) after it, and before
// both the partial sums of the qkv bias gradient (B, bias_tiles(T), 3C) or, with atomic dQ, a float
// accumulator (B, T, C).
#if !defined(PRECISION_FP32)
// The qkv bias gradient's partial sums: one row of 3C floats per BIAS_TILE_ROWS rows of a sequence
// (the backward kernels' epilogues, attention_flash_tc_mma.cuh: four warp slabs of 16 rows).
constexpr int BIAS_TILE_ROWS = 64;
__host__ __device__ inline int bias_tiles(int T) { return (T + BIAS_TILE_ROWS - 1) / BIAS_TILE_ROWS; }
static size_t bias_tile_rows(int B, int T) { return (size_t)B * bias_tiles(T); }
#endif
size_t attention_scratch_bytes(int B, int T, int C, int NH) {
#if !defined(PRECISION_FP32)
    const size_t first = deterministic_dq() ? bias_tile_rows(B, T) * 3 * C : (size_t)B * T * C;
    return (2 * (size_t)B * NH * T + first) * sizeof(float);
#else
    (void)C;
    return (size_t)B * NH * T * sizeof(float);
#endif
}

const char* attention_name(void) { return "flash"; }

static void check_shapes(int B, int T, int C, int NH) {
    if (B < 1 || T < 1 || NH < 1 || C % NH != 0) {
        fatal("flash attention: bad shape B %d, T %d, C %d, NH %d (need B, T, NH >= 1 and NH dividing C)",
              B, T, C, NH);
    }
}

template <class Kernel> static void allow_shared_memory(Kernel kernel, size_t bytes) {
    int device, most;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > (size_t)most)
        fatal("flash attention: a block of these tiles needs %zu bytes of shared memory, this GPU gives a block at "
              "most %d (on sm_75: head size 128 and FLASH_ATTN_DETERMINISTIC=0 do not fit; FLASH_ATTN_CONFIG "
              "forces tiles)", bytes, most);
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// D_i = rowsum(dO_i * O_i) and, if lse2 is not NULL, lse2_i = m_i * log2(e) + log2(l_i), for the
// rows i of (B, NH, T). A block takes PREPARE_POSITIONS positions of one sequence, every head: LANES
// threads per head vector, each loading 16 bytes at a time (load_x128; one element per lane was
// latency-bound at a fifth of the memory bandwidth), its rows in the order of `out` (B, T, NH), so
// that a warp reads contiguous memory. The sums go through shared memory, so that D and lse2 are
// written, and m and l read, in runs of positions: a row at a time, each of those 4-byte accesses
// took a 32-byte sector of its own, half again the bytes of the head vectors at HS 64.
constexpr int PREPARE_POSITIONS = 32, PREPARE_THREADS = 256;
template <int LANES>
__global__ void __launch_bounds__(PREPARE_THREADS)
    flash_backward_prepare_kernel(float* D, float* lse2, const floatX* dout, const floatX* out, const float* m,
                                  const float* l, int T, int NH, int HS) {
    extern __shared__ float row_sums[]; // [NH][PREPARE_POSITIONS]
    const int b = blockIdx.y, t0 = blockIdx.x * PREPARE_POSITIONS;
    const int positions = T - t0 < PREPARE_POSITIONS ? T - t0 : PREPARE_POSITIONS, rows = positions * NH;
    const int part = threadIdx.x % LANES;
    const bool vector = HS % X128 == 0 && aligned16(dout, out);
    const floatX* out_rows = out + ((size_t)b * T + t0) * NH * HS;
    const floatX* dout_rows = dout + ((size_t)b * T + t0) * NH * HS;
    for (int r0 = 0; r0 < rows; r0 += PREPARE_THREADS / LANES) { // the same trip count in every lane
        const int r = r0 + threadIdx.x / LANES;
        float sum = 0.0f;
        for (int d = part * X128; r < rows && d < HS; d += LANES * X128) {
            float o[X128], d_o[X128];
            load_x128(o, out_rows + (size_t)r * HS, d, HS, vector);
            load_x128(d_o, dout_rows + (size_t)r * HS, d, HS, vector);
#pragma unroll
            for (int k = 0; k < X128; k++) sum += d_o[k] * o[k];
        }
#pragma unroll
        for (int offset = LANES / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
        if (r < rows && part == 0) row_sums[r % NH * PREPARE_POSITIONS + r / NH] = sum;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NH * PREPARE_POSITIONS; i += PREPARE_THREADS) {
        const int h = i / PREPARE_POSITIONS, t = i % PREPARE_POSITIONS;
        if (t < positions) {
            const size_t row = ((size_t)b * NH + h) * T + t0 + t;
            D[row] = row_sums[i];
            if (lse2) lse2[row] = m[row] * LOG2E + log2f(l[row]);
        }
    }
}

static void flash_backward_prepare(float* D, float* lse2, const floatX* dout, const floatX* out,
                                   const float* m, const float* l, int B, int T, int NH, int HS) {
    const int chunks = ceil_div(HS, X128); // 16-byte pieces of a head vector
    const int lanes = chunks <= 4 ? 4 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
    auto kernel = lanes == 4    ? flash_backward_prepare_kernel<4>
                  : lanes == 8  ? flash_backward_prepare_kernel<8>
                  : lanes == 16 ? flash_backward_prepare_kernel<16>
                                : flash_backward_prepare_kernel<32>;
    const size_t shared = (size_t)NH * PREPARE_POSITIONS * sizeof(float);
    if (shared > 48 * 1024) allow_shared_memory(kernel, shared);
    kernel<<<dim3(ceil_div(T, PREPARE_POSITIONS), B), PREPARE_THREADS, shared>>>(D, lse2, dout, out, m, l, T, NH, HS);
    launchCheck();
}

// ---- the order in which a causal kernel's blocks start ------------------------------------------
// Every kernel below runs a grid of (n, B * NH) blocks, n blocks per (batch, head), whose lengths
// differ: in the causal triangle the rank-r block (rank 0 the longest) works through n - r tiles
// (the tiles are of its own size; the dK/dV and dQ kernels' differ by a constant factor). The GPU
// starts blocks in the order of blockIdx.x, then blockIdx.y. Taken as they come, (b, h) after
// (b, h) and the longest first within each, the blocks in flight belong to few (b, h), whose K/V
// (or Q/dO) stay in L2; but the longest blocks of the last (b, h) then start near the end of the
// grid and run on alone while the SMs empty: a tail of up to one block's length (2-5% of each
// wgmma kernel in a simulation of 132 SMs at its occupancy). So the last `tail` (b, h) start
// longest first across all of them (causal_tail below chooses enough of them to keep every block
// slot busy for a longest block's length): the tail becomes their shortest blocks. Measured at d12's
// heads, 64K tokens: the wgmma forward 2-5% faster at T 1024 to 16384, forward + backward 0-4%
// (within the noise in a second call).
// The kernels take their place from causal_block. The tensor-core dK/dV and dQ kernels call it again for
// their epilogue: blockIdx is read through volatile asm so that each call recomputes the place (a
// few instructions once per block) instead of the compiler holding it in registers across the tile
// loop, which took the wgmma dK/dV kernel from 168 to 184 registers (two blocks per SM instead of
// three: its backward 9% slower) and made the mma.sync dQ kernel spill.
struct BlockPlace {
    int bh, rank; // the (batch * NH + head) and the length rank within it: rank 0 has the most tiles
};
__device__ __forceinline__ BlockPlace causal_block_place(int tail) {
    int x, y;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(y));
    const int first = (int)gridDim.y - tail; // the first (b, h) of the tail
    if (y < first) return {y, x};
    const int i = (y - first) * (int)gridDim.x + x; // < tail * n
    return {first + i % tail, i / tail};
}

// A block's batch, head and first row. Rank 0, the longest block, owns the first ROWS rows
// (FIRST_ROWS_LONGEST: the dK/dV kernels, whose first keys see the most queries) or the last ones
// (the forward and dQ kernels, whose last queries see the most keys).
struct CausalBlock {
    int b, h, row0;
};
template <int ROWS, bool FIRST_ROWS_LONGEST> __device__ __forceinline__ CausalBlock causal_block(int tail, int NH) {
    const BlockPlace place = causal_block_place(tail);
    const int rank = FIRST_ROWS_LONGEST ? place.rank : (int)gridDim.x - 1 - place.rank;
    return {place.bh / NH, place.bh % NH, rank * ROWS};
}

// How many (b, h) of a grid of n x BH blocks of `kernel` start longest first together: each (b, h)
// holds n (n + 1) / 2 tiles of work; the tail needs n tiles for each of the GPU's block slots.
template <class Kernel> static int causal_tail(Kernel kernel, int threads, size_t smem, int n, int BH) {
    int device, sms, per_sm;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    const long long slots = (long long)sms * (per_sm > 0 ? per_sm : 1);
    const long long tail = (2 * slots + n) / (n + 1); // ceil(2 * slots / (n + 1)), at least 1
    return (int)(tail < BH ? tail : BH);
}

// Launches a causal kernel on its (n, BH) grid with the tail that suits it.
template <class Kernel, class... Args>
static void launch_causal(Kernel kernel, int n, int BH, int threads, size_t smem, Args... args) {
    allow_shared_memory(kernel, smem);
    const int tail = causal_tail(kernel, threads, smem, n, BH);
    kernel<<<dim3(n, BH), threads, smem>>>(args..., tail);
    launchCheck();
}

#if !defined(PRECISION_FP32)
// ============================ BF16, FP16: tensor cores ======================================
#include "kernels/cuda/attention_flash_tc_forward.cuh"
#include "kernels/cuda/attention_flash_tc_backward.cuh"

// ---- tile configurations -------------------------------------------------------------------
// ROWS = 16 * WARPS * M_TILES rows per block; COLS columns per streamed tile, in STAGES buffers.
// Shared memory, HS 64 (rows of 144 bytes), 2 stages: forward (ROWS + 4 COLS) rows, dK/dV and dQ
// (2 ROWS + 4 COLS) rows; the atomic-dQ dK/dV kernel adds dS^T (ROWS x (COLS + 8) floatX), 93 KB at 8
// warps (on wgmma, 4 warps: dS^T (ROWS x COLS) and a 16 x 64 fp32 dQ tile per warp, 74 KB, three
// blocks per SM at 161 registers; 8 warps summing dQ over 128 keys, half the TMA adds, ran one
// block per SM at 177 registers and were 3-13% slower). HS 128 halves
// COLS and uses 4 warps everywhere so every kernel stays under 99 KB and 255 registers per thread.
// Measured at T 1024 to 16384: forward 4 warps x 32 rows beat 8 x 32 and 4 x 16 by 5 to
// 15%, and 64 columns beat 128 (which spills, 9 to 16% slower; 2% slower with Q reloaded from
// shared memory instead; the wgmma forward takes 128 from T 4096, below); dK/dV blocks of 4 warps
// beat 8 by 2 to 5% (two blocks per SM overlap each other's barriers), but with atomic dQ 8 warps
// win by 3% (half the atomics); dQ blocks of 8 warps lost 5 to 8% to 4, and dQ warps of 32 rows
// (2 m-tiles, 74 KB) made the whole forward + backward 2.7 / 3.6 / 5% faster than 16 rows at T =
// 1024 / 4096 / 16384 (Q and dO fragments are read by twice the rows per shared-memory load; 24
// bytes of registers spill, and 32-column tiles, which avoid that, gained only half as much); 3
// stages were no faster than 2. The sm86 dQ tiles take 2 m-tiles too: one block per SM either way
// there; not timed on an RTX card.
struct TilesSm80 { // A100 (164 KB of shared memory and 64K registers per SM), H100, H200 (228 KB)
    static constexpr int FWD_WARPS = 4, FWD_M_TILES = 2, DKV_WARPS = 4, DQ_WARPS = 4, DQ_M_TILES = 2, ATOMIC_DKV_WARPS = 8;
    static constexpr int STAGES = 2, LONG_T = 0, LONG_FWD_COLS = 64; // one forward tile width at every T
    static constexpr bool WGMMA = false;
};
struct TilesSm86 { // RTX 30xx/40xx/50xx: 100 KB per SM; 16-row warps keep the forward at 46 KB, two blocks per SM
    static constexpr int FWD_WARPS = 4, FWD_M_TILES = 1, DKV_WARPS = 4, DQ_WARPS = 4, DQ_M_TILES = 2, ATOMIC_DKV_WARPS = 8;
    static constexpr int STAGES = 2, LONG_T = 0, LONG_FWD_COLS = 64; // one forward tile width at every T
    static constexpr bool WGMMA = false;
};
// T4, RTX 20xx (sm_75, FP16 only): 64 KB of shared memory per SM and per block, so every block at HS
// 64 keeps 4 warps of 16 rows: forward 46 KB, dK/dV and dQ 56 KB (one block per SM). HS 128 (69 KB
// for dK/dV) and the atomic dQ do not fit; allow_shared_memory refuses them. Not timed on a T4.
#if defined(PRECISION_FP16)
struct TilesSm75 {
    static constexpr int FWD_WARPS = 4, FWD_M_TILES = 1, DKV_WARPS = 4, DQ_WARPS = 4, DQ_M_TILES = 1, ATOMIC_DKV_WARPS = 4;
    static constexpr int STAGES = 2, LONG_T = 0, LONG_FWD_COLS = 64; // one forward tile width at every T
    static constexpr bool WGMMA = false;
};
constexpr bool SM75_TILES = true;
#else
// BF16 never takes the sm75 tiles (flash_config): named here so that the launches compile, without
// building kernels of a fourth configuration that would never run (and cost CI's compile time).
using TilesSm75 = TilesSm80;
constexpr bool SM75_TILES = false;
#endif
// H100, H200 with the sm_90a build: wgmma for HS 64 (the atomic dQ's dK/dV blocks too), with the resident
// A operands read from shared memory (Wgmma::SHARED_A), which takes one m-tile per warp. Measured at T
// 1024 to 16384, with TMA: dK/dV 4 warps, 168 registers (165 since warp_index; three blocks per SM; with
// fragments 187 and two blocks, 2-7% slower; 8 warps lost 2-5%; query tiles of 32, 122 registers and four
// blocks per SM, lost 4%, and each overlap of its products with its exponentials tried cost the third
// block and lost 3-7%); dQ 8 warps x 16 rows, 122 registers, 0-4% faster than 4 x 16 and than 4 x 32 with
// fragments (252 registers); forward 4 warps x 16 rows, 90 registers, forward 3-8% faster than 8 x 16 at T
// <= 8192 and level at 16384 (with fragments 8 x 16 had been best, 5-8% ahead of 4 x 32 and 4 x 16); since
// one tile's P V is issued with the next tile's S, 106 registers (108 with the tree max, 106 again with
// warp_index), four blocks per SM instead of five, and 5-12% faster (held to five blocks it spills and
// runs at 0.6x; 8 x 16 issuing so, both warp groups through every tile, lost 1-8% at T <= 8192, won 2% at
// 16384). 3 stages were no faster. Blocks of several warp groups that share the K/V tiles without a block
// barrier (a producer warp group with setmaxnreg, or a producer thread) lost 2-30% (docs/performance.md).
// From T 4096 the forward takes key tiles of 128 (LONG_FWD_COLS: half the tile steps, so half the per-tile
// max shuffles, O rescales, barriers and waits; 154 registers, three blocks per SM): 2-5% faster at T 4096
// to 16384, but 3-7% slower at 1024, where the diagonal's tile is half masked out for half the blocks.
struct TilesSm90 : TilesSm80 {
    static constexpr bool WGMMA = true;
    static constexpr int FWD_WARPS = 4, FWD_M_TILES = 1, DQ_WARPS = 8, DQ_M_TILES = 1;
    static constexpr int LONG_T = 4096, LONG_FWD_COLS = 128;
};
template <int HS> constexpr int tile_cols() { return HS > 64 ? 32 : 64; }
template <int HS> constexpr int warps_for(int warps) { return HS > 64 ? 4 : warps; }
template <int HS> constexpr int m_tiles_for(int m_tiles) { return HS > 64 ? 1 : m_tiles; }

// ---- TMA --------------------------------------------------------------------------------------
// The tensor maps of the Wgmma kernels (tensor_map_3d, common.cuh): the streamed tiles come through
// maps of floatX (qkv, width 3C, or dout, width C) in boxes of 64 rows by one 64-element head vector
// (TileStream), and rows at or past T (outside the tensor) arrive as zeros, as cp.async makes them;
// the atomic dQ is added through a map of its fp32 accumulator (B, T, C) in boxes of 16 rows by 32
// columns, and rows at or past T are not written.

// ---- launch ---------------------------------------------------------------------------------
template <int HS, class Tiles> struct FlashTc {
    using Mma = std::conditional_t<Tiles::WGMMA && HS == 64, Wgmma, MmaSync<HS>>;
    static constexpr int COLS = tile_cols<HS>(), STAGES = Tiles::STAGES;
    // The forward's key tiles from T = Tiles::LONG_T on (TilesSm90).
    static constexpr int LONG_FWD_COLS = HS == 64 ? Tiles::LONG_FWD_COLS : COLS;
    static constexpr int FWD_WARPS = warps_for<HS>(Tiles::FWD_WARPS), FWD_M_TILES = m_tiles_for<HS>(Tiles::FWD_M_TILES);
    static constexpr int DKV_WARPS = warps_for<HS>(Tiles::DKV_WARPS), DQ_WARPS = warps_for<HS>(Tiles::DQ_WARPS);
    static constexpr int DQ_M_TILES = m_tiles_for<HS>(Tiles::DQ_M_TILES);
    static constexpr int ATOMIC_DKV_WARPS = warps_for<HS>(Tiles::ATOMIC_DKV_WARPS);
    static constexpr int FWD_ROWS = 16 * FWD_WARPS * FWD_M_TILES; // query rows of a forward block
    // Shared memory of a block: `rows` resident head vectors plus STAGES streamed tiles of two
    // matrices and `vectors` per-row floats, plus room to align the start to M::ALIGN.
    template <class M> static constexpr size_t smem_bytes(int rows, int vectors, int cols = COLS) {
        return (rows + 2 * STAGES * cols) * M::STRIDE * sizeof(floatX) + (size_t)vectors * STAGES * cols * sizeof(float) +
               M::ALIGN - 16;
    }

    // Shared memory of a forward block with key tiles `cols` wide.
    static constexpr size_t forward_smem(int cols = COLS) { return smem_bytes<Mma>(FWD_ROWS, 0, cols); }

    template <int FWD_COLS = COLS> static constexpr auto forward_kernel() {
        return flash_forward_kernel<Mma, FWD_WARPS, FWD_M_TILES, FWD_COLS, STAGES>;
    }

    // The tensor map of a (B, T, width) matrix where the kernels load by TMA; the other kernels
    // ignore the (empty) map they get.
    static CUtensorMap tile_map(const floatX* base, int B, int T, int width) {
        CUtensorMap map = {};
        if constexpr (Mma::TMA)
            map = tensor_map_3d(base, TENSOR_MAP_FLOATX, sizeof(floatX), B, T, width, width,
                                Mma::TMA_BOX_ROWS);
        return map;
    }

    template <int FWD_COLS> static void forward_with(floatX* out, float* m, float* l, const floatX* qkv, int B, int T, int NH) {
        const size_t smem = forward_smem(FWD_COLS);
        const CUtensorMap qkv_map = tile_map(qkv, B, T, 3 * NH * HS);
        launch_causal(forward_kernel<FWD_COLS>(), ceil_div(T, FWD_ROWS), B * NH, FWD_WARPS * 32, smem, out, m, l, qkv, qkv_map,
                      T, NH);
    }
    static void forward(floatX* out, float* m, float* l, const floatX* qkv, int B, int T, int NH) {
        if constexpr (LONG_FWD_COLS != COLS)
            if (T >= Tiles::LONG_T) return forward_with<LONG_FWD_COLS>(out, m, l, qkv, B, T, NH);
        forward_with<COLS>(out, m, l, qkv, B, T, NH);
    }

    // dq_accum NULL: dQ from its own kernel (deterministic), and the column sums of dqkv's 64-row
    // tiles into bias_partials if it is not NULL; else dQ by atomics into dq_accum (B, T, C).
    static void backward(floatX* dqkv, float* dq_accum, float* bias_partials, const float* lse2, const float* D,
                         const floatX* dout, const floatX* qkv, int B, int T, int NH) {
        constexpr int DKV_ROWS = 16 * DKV_WARPS, DQ_ROWS = 16 * DQ_WARPS * DQ_M_TILES;
        const CUtensorMap qkv_map = tile_map(qkv, B, T, 3 * NH * HS), dout_map = tile_map(dout, B, T, NH * HS);
        const CUtensorMap none = {};
        if (dq_accum) {
            const size_t n = (size_t)B * T * NH * HS;
            cudaCheck(cudaMemsetAsync(dq_accum, 0, n * sizeof(float)));
            if constexpr (Mma::TMA) { // the dK/dV kernel's blocks, with dS^T and a dQ tile per warp
                const size_t smem = smem_bytes<Mma>(2 * DKV_ROWS, 2) + DKV_ROWS * COLS * sizeof(floatX) +
                                    DKV_ROWS * HS * sizeof(float);
                const CUtensorMap dq_map = tensor_map_3d(dq_accum, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, sizeof(float), B, T,
                                                         NH * HS, NH * HS, 16);
                launch_causal(flash_backward_dkv_kernel<Mma, DKV_WARPS, COLS, STAGES, true>, ceil_div(T, DKV_ROWS),
                              B * NH, DKV_WARPS * 32, smem, dqkv, dq_accum, (float*)NULL, dout, qkv, qkv_map, dout_map,
                              dq_map, lse2, D, T, NH);
            } else {
                constexpr int ROWS = 16 * ATOMIC_DKV_WARPS;
                const size_t smem = smem_bytes<Mma>(2 * ROWS, 2) + ROWS * (COLS + 8) * sizeof(floatX);
                launch_causal(flash_backward_dkv_kernel<Mma, ATOMIC_DKV_WARPS, COLS, STAGES, true>, ceil_div(T, ROWS),
                              B * NH, ATOMIC_DKV_WARPS * 32, smem, dqkv, dq_accum, (float*)NULL, dout, qkv, none, none,
                              none, lse2, D, T, NH);
            }
            flash_backward_dq_convert_kernel<<<ceil_div(n / 8, 256), 256>>>(dqkv, dq_accum, n, NH * HS,
                                                                           ATTENTION_SCALE(HS));
            launchCheck();
            return;
        }
        const size_t dkv_smem = smem_bytes<Mma>(2 * DKV_ROWS, 2), dq_smem = smem_bytes<Mma>(2 * DQ_ROWS, 0);
        launch_causal(flash_backward_dkv_kernel<Mma, DKV_WARPS, COLS, STAGES, false>, ceil_div(T, DKV_ROWS), B * NH,
                      DKV_WARPS * 32, dkv_smem, dqkv, (float*)NULL, bias_partials, dout, qkv, qkv_map, dout_map, none,
                      lse2, D, T, NH);
        launch_causal(flash_backward_dq_kernel<Mma, DQ_WARPS, DQ_M_TILES, COLS, STAGES>, ceil_div(T, DQ_ROWS), B * NH,
                      DQ_WARPS * 32, dq_smem, dqkv, bias_partials, dout, qkv, qkv_map, lse2, D, T, NH);
    }
};

enum FlashConfig { CONFIG_SM75, CONFIG_SM80, CONFIG_SM86, CONFIG_SM90 };

// Whether an SM of this GPU holds two blocks of the sm80 tiles' forward at head size 64 (asked
// once: the GPU does not change). The sm86 tiles exist for the SMs where it holds one: their forward
// blocks of 64 query rows instead of 128 keep two an SM where the shared memory is 100 KB (sm_86 and
// sm_89; sm_120 too: an RTX 5090 reports 102,400 bytes an SM and, by NVIDIA's Blackwell tuning
// guide, gives a block at most 99 KB), where the A100's and Orin's 164 KB hold two of the sm80 tiles'.
static bool sm80_forward_two_an_sm(void) {
    static int two = -1;
    if (two < 0) {
        using Forward = FlashTc<64, TilesSm80>;
        const size_t smem = Forward::forward_smem();
        int per_sm;
        allow_shared_memory(Forward::forward_kernel(), smem);
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Forward::forward_kernel(),
                                                                Forward::FWD_WARPS * 32, smem));
        two = per_sm >= 2;
    }
    return two;
}

// sm90 (wgmma) on H100/H200 when this build holds sm_90a code for them (the Makefile builds
// GPU_ARCH 90 as sm_90a); sm75 on Turing and wherever the GPU runs an sm_75 build's code (its
// shared memory need not be Turing's, but its products are, and so are then its tiles); else sm80
// where an SM holds two of its forward blocks, sm86 where it does not (the consumer parts from
// sm_86 on). KERNEL_PATH=sm75|sm80|sm86 picks that card's tiles; FLASH_ATTN_CONFIG=sm75|sm80|sm86|sm90
// forces the tiles alone (over KERNEL_PATH), so tests run every configuration on one GPU.
static FlashConfig flash_config(void) {
    int device, major, minor;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    const bool wgmma = sm90a_code_runs((const void*)FlashTc<64, TilesSm90>::forward_kernel());
    const char* forced = getenv("FLASH_ATTN_CONFIG");
    if (forced && forced[0]) {
        if (strcmp(forced, "sm75") == 0) {
            if (!SM75_TILES) fatal("FLASH_ATTN_CONFIG=sm75: the T4's tiles are for the FP16 build");
            return CONFIG_SM75;
        }
        if (strcmp(forced, "sm80") == 0) return CONFIG_SM80;
        if (strcmp(forced, "sm86") == 0) return CONFIG_SM86;
        if (strcmp(forced, "sm90") == 0 && wgmma) return CONFIG_SM90;
        if (strcmp(forced, "sm90") == 0 && forced_kernel_path()) {
            fatal("FLASH_ATTN_CONFIG=sm90 with KERNEL_PATH=sm%d: that path has no wgmma tiles",
                  forced_kernel_path());
        }
        if (strcmp(forced, "sm90") == 0) {
            fatal("FLASH_ATTN_CONFIG=sm90: the wgmma tiles need an H100/H200 (compute capability 9.0) and a build "
                  "with GPU_ARCH including 90; this GPU is %d.%d", major, minor);
        }
        fatal("FLASH_ATTN_CONFIG=%s: unknown tile configuration (use sm75 for T4 tiles, sm80 for A100 tiles, sm86 "
              "for RTX 30xx/40xx/50xx tiles or sm90 for H100/H200 wgmma tiles)", forced);
    }
    if (wgmma) return CONFIG_SM90;
    const int path = forced_kernel_path();
    if (path) return path == 75 ? CONFIG_SM75 : path == 86 ? CONFIG_SM86 : CONFIG_SM80;
    if (major < 8 || device_code_arch() < 800) return CONFIG_SM75;
    return sm80_forward_two_an_sm() ? CONFIG_SM80 : CONFIG_SM86;
}

template <class Tiles> static void forward_tc(floatX* out, float* m, float* l, const floatX* qkv, int B, int T, int NH, int HS) {
    switch (HS) {
    case 32: FlashTc<32, Tiles>::forward(out, m, l, qkv, B, T, NH); break;
    case 64: FlashTc<64, Tiles>::forward(out, m, l, qkv, B, T, NH); break;
    case 128: FlashTc<128, Tiles>::forward(out, m, l, qkv, B, T, NH); break;
    }
}

template <class Tiles>
static void backward_tc(floatX* dqkv, float* dq_accum, float* bias_partials, const float* lse2, const float* D,
                          const floatX* dout, const floatX* qkv, int B, int T, int NH, int HS) {
    switch (HS) {
    case 32: FlashTc<32, Tiles>::backward(dqkv, dq_accum, bias_partials, lse2, D, dout, qkv, B, T, NH); break;
    case 64: FlashTc<64, Tiles>::backward(dqkv, dq_accum, bias_partials, lse2, D, dout, qkv, B, T, NH); break;
    case 128: FlashTc<128, Tiles>::backward(dqkv, dq_accum, bias_partials, lse2, D, dout, qkv, B, T, NH); break;
    }
}

// The partial sums of the qkv bias gradient as a matrix for column_sums_accumulate: row r of
// (rows, C) floats, 16-byte aligned rows (C, a multiple of 32 with these head sizes).
struct FloatMatrixColumns {
    static constexpr int SUMS = 1;
    const float* x;
    int C;
    __device__ void add(int r, int c, float sums[1][X128]) const {
        for (int k = 0; k < X128; k += 4) {
            const float4 v = *(const float4*)(x + (size_t)r * C + c + k);
            sums[0][k] += v.x, sums[0][k + 1] += v.y, sums[0][k + 2] += v.z, sums[0][k + 3] += v.w;
        }
    }
};

// The head sizes the tensor-core tiles exist for; the tile loads address a sequence's rows with
// 32-bit offsets.
static void check_tc_shape(int T, int C, int HS) {
    if (HS != 32 && HS != 64 && HS != 128) {
        fatal("flash attention (" PRECISION_NAME "): head size %d is not supported (32, 64 or 128; choose the number of heads "
              "so that channels / heads is one of these)", HS);
    }
    if ((size_t)T * 3 * C > INT_MAX) {
        fatal("flash attention (" PRECISION_NAME "): a sequence of T %d x 3C %d elements is above 2^31 - 1 (use a shorter -t)", T,
              3 * C);
    }
}

// cp.async moves 16-byte chunks: head vectors must start on 16-byte boundaries.
static void check_tc_alignment(const void* a, const void* b) {
    if (((uintptr_t)a | (uintptr_t)b) % 16 != 0) {
        fatal("flash attention (" PRECISION_NAME "): the qkv and output buffers must be 16-byte aligned");
    }
}

void attention_forward(floatX* out, void* saved, const floatX* qkv, int B, int T, int C, int NH) {
    check_shapes(B, T, C, NH);
    const int HS = C / NH;
    check_tc_shape(T, C, HS);
    check_tc_alignment(qkv, out);
    float* m = (float*)saved;
    float* l = m + (size_t)B * NH * T;
    switch (flash_config()) {
    case CONFIG_SM90: forward_tc<TilesSm90>(out, m, l, qkv, B, T, NH, HS); break;
    case CONFIG_SM86: forward_tc<TilesSm86>(out, m, l, qkv, B, T, NH, HS); break;
    case CONFIG_SM75: forward_tc<TilesSm75>(out, m, l, qkv, B, T, NH, HS); break;
    case CONFIG_SM80: forward_tc<TilesSm80>(out, m, l, qkv, B, T, NH, HS); break;
    }
}

void attention_backward(floatX* dqkv, float* dbias, void* scratch, const floatX* dout, const floatX* qkv,
                        const floatX* out, const void* saved, int B, int T, int C, int NH, int group_rows) {
    check_shapes(B, T, C, NH);
    if (dbias) check_sequence_groups("attention_backward", B, T, group_rows);
    const int HS = C / NH;
    check_tc_shape(T, C, HS);
    check_tc_alignment(qkv, dqkv);
    check_tc_alignment(dout, out);
    const float* m = (const float*)saved;
    const float* l = m + (size_t)B * NH * T;
    // First in the scratch, 16-byte aligned for float4: dQ's accumulator or the bias partials.
    const bool deterministic = deterministic_dq();
    float* dq_accum = deterministic ? NULL : (float*)scratch;
    float* bias_partials = deterministic && dbias ? (float*)scratch : NULL;
    float* D = (float*)scratch + (deterministic ? bias_tile_rows(B, T) * 3 * C : (size_t)B * T * C);
    float* lse2 = D + (size_t)B * NH * T;
    flash_backward_prepare(D, lse2, dout, out, m, l, B, T, NH, HS);
    switch (flash_config()) {
    case CONFIG_SM90: backward_tc<TilesSm90>(dqkv, dq_accum, bias_partials, lse2, D, dout, qkv, B, T, NH, HS); break;
    case CONFIG_SM86: backward_tc<TilesSm86>(dqkv, dq_accum, bias_partials, lse2, D, dout, qkv, B, T, NH, HS); break;
    case CONFIG_SM75: backward_tc<TilesSm75>(dqkv, dq_accum, bias_partials, lse2, D, dout, qkv, B, T, NH, HS); break;
    case CONFIG_SM80: backward_tc<TilesSm80>(dqkv, dq_accum, bias_partials, lse2, D, dout, qkv, B, T, NH, HS); break;
    }
    if (bias_partials) {
        column_sums_accumulate(dbias, (int)bias_tile_rows(B, T), 3 * C, group_rows / T * bias_tiles(T),
                               FloatMatrixColumns{bias_partials, 3 * C});
    } else if (dbias) {
        column_sums_accumulate(dbias, B * T, 3 * C, group_rows, MatrixColumns{dqkv, 3 * C});
    }
}

const char* attention_kernels(void) {
    switch (flash_config()) {
    case CONFIG_SM90: return "sm90 tiles";
    case CONFIG_SM86: return "sm86 tiles";
    case CONFIG_SM75: return "sm75 tiles";
    case CONFIG_SM80: return "sm80 tiles";
    }
    return "";
}

#else
// ================================ FP32: CUDA cores ===========================================
#include "kernels/cuda/attention_flash_fp32.cuh"

template <int DIMS_PER_LANE> struct FlashF32 {
    static constexpr size_t ROW_BYTES = f32_stride<DIMS_PER_LANE>() * sizeof(float);
    static void forward(float* out, float* m, float* l, const float* qkv, int B, int T, int NH, int HS) {
        const size_t smem = (F32_ROWS + 2 * F32_COLS) * ROW_BYTES;
        launch_causal(flash_forward_f32_kernel<DIMS_PER_LANE>, ceil_div(T, F32_ROWS), B * NH, F32_WARPS * 32, smem, out, m,
                      l, qkv, T, NH, HS);
    }
    static void backward(float* dqkv, const float* dout, const float* qkv, const float* m, const float* l,
                         const float* D, int B, int T, int NH, int HS) {
        const size_t smem = (2 * F32_ROWS + 2 * F32_COLS) * ROW_BYTES;
        launch_causal(flash_backward_dkv_f32_kernel<DIMS_PER_LANE>, ceil_div(T, F32_ROWS), B * NH, F32_WARPS * 32, smem,
                      dqkv, dout, qkv, m, l, D, T, NH, HS);
        launch_causal(flash_backward_dq_f32_kernel<DIMS_PER_LANE>, ceil_div(T, F32_ROWS), B * NH, F32_WARPS * 32, smem,
                      dqkv, dout, qkv, m, l, D, T, NH, HS);
    }
};

static void check_f32_head_size(int HS) {
    if (HS > 128) fatal("flash attention (FP32): head size %d is not supported (at most 128)", HS);
}

void attention_forward(floatX* out, void* saved, const floatX* qkv, int B, int T, int C, int NH) {
    check_shapes(B, T, C, NH);
    const int HS = C / NH;
    check_f32_head_size(HS);
    float* m = (float*)saved;
    float* l = m + (size_t)B * NH * T;
    switch ((HS + 31) / 32) {
    case 1: FlashF32<1>::forward(out, m, l, qkv, B, T, NH, HS); break;
    case 2: FlashF32<2>::forward(out, m, l, qkv, B, T, NH, HS); break;
    case 3: FlashF32<3>::forward(out, m, l, qkv, B, T, NH, HS); break;
    case 4: FlashF32<4>::forward(out, m, l, qkv, B, T, NH, HS); break;
    }
}

void attention_backward(floatX* dqkv, float* dbias, void* scratch, const floatX* dout, const floatX* qkv,
                        const floatX* out, const void* saved, int B, int T, int C, int NH, int group_rows) {
    check_shapes(B, T, C, NH);
    if (dbias) check_sequence_groups("attention_backward", B, T, group_rows);
    const int HS = C / NH;
    check_f32_head_size(HS);
    const float* m = (const float*)saved;
    const float* l = m + (size_t)B * NH * T;
    float* D = (float*)scratch;
    flash_backward_prepare(D, NULL, dout, out, m, l, B, T, NH, HS);
    switch ((HS + 31) / 32) {
    case 1: FlashF32<1>::backward(dqkv, dout, qkv, m, l, D, B, T, NH, HS); break;
    case 2: FlashF32<2>::backward(dqkv, dout, qkv, m, l, D, B, T, NH, HS); break;
    case 3: FlashF32<3>::backward(dqkv, dout, qkv, m, l, D, B, T, NH, HS); break;
    case 4: FlashF32<4>::backward(dqkv, dout, qkv, m, l, D, B, T, NH, HS); break;
    }
    if (dbias) column_sums_accumulate(dbias, B * T, 3 * C, group_rows, MatrixColumns{dqkv, 3 * C});
}

const char* attention_kernels(void) { return ""; }
#endif // !PRECISION_FP32
#endif // ATTN_FLASH
