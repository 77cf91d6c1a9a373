// Flash attention on the GPU (ATTN=flash): the generic attention_* of kernels/kernels.h. The same
// algorithm as the CPU reference kernels/cpu/attention_flash.c, in fused kernels.
//
// Forward: each thread block owns a block of query rows of one (batch, head) and streams the K/V
// blocks at or below the diagonal through shared memory; an online softmax keeps the running max
// and sum in registers; only O and (m, l) per row are written.
// Backward: a small kernel computes D_i = rowsum(dO_i * O_i) and lse_i = log2 of sum_j exp(s_ij);
// then the dK/dV kernel (each block owns a block of key rows and loops over the query blocks at or
// below the diagonal, recomputing P from Q, K and lse) and the dQ kernel (each block owns a block
// of query rows and loops over the key blocks, recomputing P and dP). dQ from a kernel of its own
// costs two more tile products (S and dP recomputed: 7 instead of 5 per tile) but no atomics,
// so every result is bit-identical from run to run, and no extra memory beyond D and lse.
// Tried and measured slower on an H200: one kernel that sums the partial dQ of the key blocks in a
// fixed order (a counter per query tile, acquire/release, blocks ordered by a ticket so the waits
// always end): about 0.5 us of synchronisation per block and tile, forward + backward 2.23 ms
// instead of 2.04 at T = 1024 and 28.0 instead of 26.4 at T = 16384 (64K tokens, d12 heads; the
// two kernels as they were then, before the dQ kernel's 32-row warps).
// BF16 only, FLASH_ATTN_DETERMINISTIC=0: the dK/dV kernel also adds each tile's dQ = dS K into an
// fp32 buffer (B, T, C) with atomics, and a last kernel converts it: 5 tile products, 4 bytes per
// activation of scratch, and dQ's sums in a different order on every run. It runs on mma.sync
// tiles in every configuration. Measured on an H200 (d12 shapes, 64K tokens), forward + backward
// against the mma.sync default: 4% slower at T = 1024 (172.3 vs 179.8 TFLOP/s), 5% faster at
// T = 16384 (244.5 vs 233.2); against the wgmma default: 10% slower (171.2 vs 190.9) and 7%
// slower (244.3 vs 263.1).
//
// BF16 build: tensor cores, bf16 in, fp32 accumulate, through mma.sync m16n8k16 with ldmatrix
// from shared memory rows padded by 16 bytes, or on H100/H200 (sm_90a) with HS 64 through wgmma
// reading K, V, Q and dO straight from 128-byte-swizzled shared memory (see "Mma" below); cp.async
// double buffering with one barrier per streamed tile; Q, K, V are read straight from the qkv
// buffer. Head sizes 32, 64 and 128. Three configurations are picked at launch from the GPU: sm90
// (wgmma) for H100/H200, sm80 (mma.sync) for A100, sm86 for RTX 3090/4090 class GPUs with 100 KB
// of shared memory per SM (every block stays under 99 KB); FLASH_ATTN_CONFIG=sm80|sm86|sm90 forces
// one (sm90 only on an H100/H200).
// FP32 build: the same algorithm on CUDA cores in exact fp32 (expf), one warp per row, any HS
// up to 128.
//
// Built only with -DATTN_FLASH; kernels/cuda/attention_naive.cu is the ATTN=naive variant.
#if defined(ATTN_FLASH)
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "kernels/cuda/common.cuh"

#define LN2 0.6931471805599453f
#define DETERMINISTIC_DEFAULT true

size_t attention_saved_bytes(int B, int T, int NH) { return 2 * (size_t)B * NH * T * sizeof(float); }

#if defined(PRECISION_BF16)
// BF16: dQ comes from a kernel of its own, deterministic (FLASH_ATTN_DETERMINISTIC=1), or from the
// dK/dV kernel by float atomics (=0), which is faster but adds in a different order on every run.
static bool deterministic_dq(void) {
    const char* value = getenv("FLASH_ATTN_DETERMINISTIC");
    if (!value || !value[0]) return DETERMINISTIC_DEFAULT;
    if (strcmp(value, "1") == 0) return true;
    if (strcmp(value, "0") == 0) return false;
    fatal("FLASH_ATTN_DETERMINISTIC=%s: use 1 (dQ from its own kernel, identical on every run) or 0 (dQ by "
          "atomics, faster, not bit-identical from run to run)", value);
}
#endif

// D (B, NH, T) floats; the BF16 path also keeps lse in log2 units (B, NH, T) after it, and with
// atomic dQ a float accumulator (B, T, C) before both.
size_t attention_scratch_bytes(int B, int T, int C, int NH) {
#if defined(PRECISION_BF16)
    return 2 * (size_t)B * NH * T * sizeof(float) + (deterministic_dq() ? 0 : (size_t)B * T * C * sizeof(float));
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

// D_i = rowsum(dO_i * O_i) and, if lse2 is not NULL, lse2_i = m_i * log2(e) + log2(l_i). LANES
// threads per row, each loading 16 bytes at a time (load_x128; one element per lane was
// latency-bound at a fifth of the memory bandwidth). The rows are enumerated in the order of `out`
// (B, T, NH), so the lanes of a row read one contiguous head vector.
template <int LANES>
__global__ void flash_backward_prepare_kernel(float* D, float* lse2, const floatX* dout, const floatX* out,
                                              const float* m, const float* l, int B, int T, int NH, int HS) {
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t row = thread / LANES;
    const int part = (int)(thread % LANES);
    const bool valid = row < (size_t)B * T * NH; // every lane stays for the shuffles below
    const bool vector = HS % X128 == 0 && ((uintptr_t)dout | (uintptr_t)out) % 16 == 0;
    float sum = 0.0f;
    for (int d = part * X128; valid && d < HS; d += LANES * X128) {
        float o[X128], d_o[X128];
        load_x128(o, out + row * HS, d, HS, vector);
        load_x128(d_o, dout + row * HS, d, HS, vector);
#pragma unroll
        for (int k = 0; k < X128; k++) sum += d_o[k] * o[k];
    }
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
    if (valid && part == 0) {
        const int h = (int)(row % NH), t = (int)(row / NH % T), b = (int)(row / NH / T);
        const size_t i = ((size_t)b * NH + h) * T + t;
        D[i] = sum;
        if (lse2) lse2[i] = m[i] * LOG2E + log2f(l[i]);
    }
}

static void flash_backward_prepare(float* D, float* lse2, const floatX* dout, const floatX* out,
                                   const float* m, const float* l, int B, int T, int NH, int HS) {
    const size_t rows = (size_t)B * T * NH;
    const int chunks = ceil_div(HS, X128); // 16-byte pieces of a head vector
    const int lanes = chunks <= 4 ? 4 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
    auto kernel = lanes == 4    ? flash_backward_prepare_kernel<4>
                  : lanes == 8  ? flash_backward_prepare_kernel<8>
                  : lanes == 16 ? flash_backward_prepare_kernel<16>
                                : flash_backward_prepare_kernel<32>;
    kernel<<<ceil_div(rows * lanes, 256), 256>>>(D, lse2, dout, out, m, l, B, T, NH, HS);
    launchCheck();
}

#if defined(PRECISION_BF16)
// ================================ BF16: tensor cores =========================================

// ---- PTX wrappers --------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
// 16 bytes global -> shared without passing through registers; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
}
// c (16 x 8, fp32) += a (16 x 16, bf16, row-major) b (16 x 8, bf16, column-major).
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t*)&v;
}

// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 g + q. An accumulator c[4] of a 16 x 8 tile
// holds (row g, cols 2q, 2q+1) in c[0..1] and (row g + 8, same cols) in c[2..3]. An A fragment
// a[4] of a 16 x 16 tile holds (row g, cols 2q..2q+1), (row g+8, same), (row g, cols 2q+8..9),
// (row g+8, same). A B fragment (b0, b1) of a 16 x 8 tile holds (rows 2q..2q+1, col g) and
// (rows 2q+8..2q+9, col g).

// The A fragment (16 x 16, bf16) of columns 16 k .. 16 k + 15 of a warp's fp32 tile in the
// accumulator layout: P or dS as the left operand of the next product.
__device__ __forceinline__ void a_fragment_of(uint32_t a[4], const float (*c)[4], int k) {
    a[0] = pack_bf16(c[2 * k][0], c[2 * k][1]);
    a[1] = pack_bf16(c[2 * k][2], c[2 * k][3]);
    a[2] = pack_bf16(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[3] = pack_bf16(c[2 * k + 1][2], c[2 * k + 1][3]);
}

// ---- shared-memory layouts and warp matrix products -----------------------------------------
// Two policies, `Mma`, for the same kernels. Both keep the A operands (Q, dO, K, V, P, dS) in
// registers in mma.m16n8k16's fragment layout, which is also wgmma's register-A layout, and
// accumulate in the m16n8 accumulator layout, which is also what each warp holds of a wgmma m64
// accumulator (its 16 rows). They differ in where B comes from:
//   MmaSync<HS> (every GPU from sm_80): mma.sync per warp; B fragments by ldmatrix from tile rows
//     padded by 16 bytes (rows 16 bytes apart modulo 128, so the 8 row addresses of an ldmatrix
//     phase fall in 8 different bank groups).
//   Wgmma (sm_90a, that is H100 and H200; HS 64): wgmma per warpgroup of 4 warps; the tensor cores
//     read B straight from tiles of 128-byte rows stored with the 128-byte swizzle (16-byte chunk
//     c of row r at chunk c ^ (r % 8), conflict-free for cp.async and ldmatrix too). The 4 warps
//     of a group multiply together, so they must take the same branches (GROUP_WARPS).
// Tiles of either are addressed through Mma::offset(row, col), col a multiple of 8.
template <int HEAD_SIZE> struct MmaSync {
    static constexpr int HS = HEAD_SIZE, STRIDE = HS + 8, GROUP_WARPS = 1;
    static constexpr bool RELOAD_A = false; // see Wgmma
    static constexpr size_t ALIGN = 16;
    __device__ static int offset(int row, int col) { return row * STRIDE + col; }
    __device__ static void tiles_ready() {} // ldmatrix reads what cp.async wrote once the barrier is passed
    // The products below are complete when they return; Wgmma's are not until wait().
    template <class... Accumulators> __device__ static void wait(Accumulators&...) {}

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

    // acc (16 M_TILES x HS) += P (16 M_TILES x COLS, accumulator layout, rounded to bf16) B, B a
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

// wgmma (PTX ISA, "asynchronous warpgroup level matrix multiply"), compiled for sm_90a only; the
// host never launches a Wgmma kernel elsewhere (flash_config), and these trap if it did.
// Shared-memory matrix descriptor: start address, 1024 bytes between groups of 8 rows (the
// "stride byte offset"), 128-byte swizzle. The leading byte offset is not used by these shapes:
// a bf16 operand 64 wide is exactly one swizzle row (measured on an H200: any value works).
__device__ __forceinline__ uint64_t wgmma_descriptor(const floatX* tile) {
    return (uint64_t)((smem_address(tile) & 0x3FFFF) >> 4) | (uint64_t)(1024 >> 4) << 32 | 1ull << 62;
}
// d (this warp's 16 rows of a 64 x 64 accumulator) = (accumulate ? d : 0) + a (this warp's 16 x 16
// fragment) b, b (16 x 64) in shared memory: rows of 64 (TRANS_B 1, "MN-major") or, TRANS_B 0,
// the transpose of a (64 x 16) block of rows of 64 ("K-major").
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16(float d[8][4], const uint32_t a[4], uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
                   "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)b, (void)accumulate;
    __trap();
#endif
}
// Orders this thread's register accesses before the wgmmas that follow (wgmma.fence); closes a
// group of issued wgmmas; waits for every group issued.
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait_all() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// Pins accumulator registers at this point of the program, so the compiler cannot move their
// reads or writes across the wgmma fence or wait next to it (the asm outputs look ready at once).
template <int M_TILES, int N_TILES> __device__ __forceinline__ void wgmma_pin(float (*acc)[N_TILES][4]) {
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int nt = 0; nt < N_TILES; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) asm volatile("" : "+f"(acc[mt][nt][i])::"memory");
}

struct Wgmma {
    static constexpr int HS = 64, STRIDE = 64, GROUP_WARPS = 4;
    // The kernels load their A fragments (Q, dO, K, V) from shared memory again for every tile
    // instead of keeping them in registers for the whole loop. Measured with CUDA 13.0's ptxas:
    // with the fragments carried around the loop, it gave their registers to P after the first
    // tile (as if a wgmma's A operand died with it), and every later tile multiplied P by K.
    static constexpr bool RELOAD_A = true;
    static constexpr size_t ALIGN = 1024; // the swizzle pattern repeats from 1024-byte boundaries
    __device__ static int offset(int row, int col) { return row * STRIDE + ((col / 8) ^ (row % 8)) * 8 + col % 8; }
    // cp.async writes through the generic proxy, wgmma reads through the async proxy.
    __device__ static void tiles_ready() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
    }

    // As MmaSync's, issued only (see wait): acc = A B^T (one m64n64k16 per m-tile and 16 head
    // dimensions, B K-major).
    template <int M_TILES, int COLS>
    __device__ static void gemm_a_bt(float acc[M_TILES][COLS / 8][4], const uint32_t a[M_TILES][HS / 16][4],
                                     const floatX* b_tile) {
        static_assert(COLS == 64, "wgmma tiles are 64 wide");
        wgmma_fence();
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int k = 0; k < HS / 16; k++) wgmma_m64n64k16<0>(acc[mt], a[mt][k], wgmma_descriptor(b_tile + k * 16), k > 0);
        wgmma_commit();
    }

    // As MmaSync's, issued only: acc += P B (one m64n64k16 per m-tile and 16 rows of B, B MN-major).
    template <int M_TILES, int COLS>
    __device__ static void gemm_c_b(float acc[M_TILES][HS / 8][4], const float p[M_TILES][COLS / 8][4],
                                    const floatX* b_tile) {
        uint32_t a[M_TILES][COLS / 16][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int k = 0; k < COLS / 16; k++) a_fragment_of(a[mt][k], p[mt], k);
        wgmma_pin<M_TILES, HS / 8>(acc);
        wgmma_fence();
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
            for (int k = 0; k < COLS / 16; k++)
                wgmma_m64n64k16<1>(acc[mt], a[mt][k], wgmma_descriptor(b_tile + k * 16 * STRIDE), true);
        wgmma_commit();
    }

    // Waits for every product issued and pins their accumulators after the wait. Two products
    // issued before one wait run back to back in the tensor cores.
    template <int M_TILES, int N_TILES> __device__ static void pin(float (&acc)[M_TILES][N_TILES][4]) {
        wgmma_pin<M_TILES, N_TILES>(acc);
    }
    template <class... Accumulators> __device__ static void wait(Accumulators&... acc) {
        wgmma_wait_all();
        (pin(acc), ...);
    }
};

// A shared-memory pointer rounded up to a multiple of ALIGN bytes (the launch asks for ALIGN - 16
// bytes more than the tiles need).
template <size_t ALIGN> __device__ __forceinline__ unsigned char* align_shared(unsigned char* p) {
    return p + (ALIGN - smem_address(p) % ALIGN) % ALIGN;
}

// Copies rows row0 .. row0 + ROWS - 1 of a (T, HS) matrix whose rows are `stride` elements apart
// into a tile; rows at or past T are zeros.
template <class Mma, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_async(floatX* tile, const floatX* src, int row0, int T, size_t stride) {
    constexpr int CHUNKS = Mma::HS / 8; // 16-byte chunks per row
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool valid = row0 + r < T;
        cp_async_16(tile + Mma::offset(r, c * 8), src + (valid ? (size_t)(row0 + r) * stride + c * 8 : 0), valid);
    }
}

// COLS floats from src[col0 ..] (zeros at or past T).
template <int COLS, int THREADS>
__device__ __forceinline__ void load_vector_async(float* dst, const float* src, int col0, int T) {
    for (int i = threadIdx.x; i < COLS; i += THREADS) {
        const bool valid = col0 + i < T;
        cp_async_4(dst + i, src + (valid ? col0 + i : 0), valid);
    }
}

// K and V tile `tile` (COLS rows each) into its stage of the STAGES-deep buffers, as one cp.async
// commit group; past the last tile the group is empty, so there is always one group per tile.
template <class Mma, int COLS, int THREADS, int STAGES>
__device__ __forceinline__ void load_kv_stage(floatX* k_tiles, floatX* v_tiles, const floatX* k_src, const floatX* v_src,
                                              int tile, int num_tiles, int T, size_t stride) {
    if (tile < num_tiles) {
        const int stage = tile % STAGES;
        load_tile_async<Mma, COLS, THREADS>(k_tiles + stage * COLS * Mma::STRIDE, k_src, tile * COLS, T, stride);
        load_tile_async<Mma, COLS, THREADS>(v_tiles + stage * COLS * Mma::STRIDE, v_src, tile * COLS, T, stride);
    }
    cp_async_commit();
}

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

// Writes a warp's (16 M_TILES x HS) accumulator times `scale` as bf16 into rows row0.. (< T) of a
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
                *(__nv_bfloat162*)(dst + (size_t)row * stride + nt * 8 + lane % 4 * 2) = __floats2bfloat162_rn(
                    acc[mt][nt][2 * half] * scale[mt][half], acc[mt][nt][2 * half + 1] * scale[mt][half]);
            }
        }
}

// ---- tile configurations -------------------------------------------------------------------
// ROWS = 16 * WARPS * M_TILES rows per block; COLS columns per streamed tile, in STAGES buffers.
// Shared memory, HS 64 (rows of 144 bytes), 2 stages: forward (ROWS + 4 COLS) rows, dK/dV and dQ
// (2 ROWS + 4 COLS) rows; the atomic-dQ dK/dV kernel adds dS^T (ROWS x (COLS + 8) bf16), 93 KB at
// 8 warps. HS 128 halves COLS and uses 4 warps everywhere so every kernel stays under 99 KB and
// 255 registers per thread.
// Measured on an H200 (T 1024 to 16384): forward 4 warps x 32 rows beat 8 x 32 and 4 x 16 by 5 to
// 15%, and 64 columns beat 128 (which spills, 9 to 16% slower; 2% slower with Q reloaded from
// shared memory instead); dK/dV blocks of 4 warps beat 8 by 2 to 5% (two blocks per SM overlap
// each other's barriers), but with atomic dQ 8 warps win by 3% (half the atomics); dQ blocks of 8
// warps lost 5 to 8% to 4, and dQ warps of 32 rows (2 m-tiles, 74 KB) made the whole forward +
// backward 2.7 / 3.6 / 5% faster than 16 rows at T = 1024 / 4096 / 16384 (Q and dO fragments are
// read by twice the rows per shared-memory load; 24 bytes of registers spill, and 32-column
// tiles, which avoid that, gained only half as much); 3 stages were no faster than 2. The sm86
// dQ tiles take 2 m-tiles too: one block per SM either way there; not timed on an RTX card.
struct TilesSm80 { // A100, H100, H200: 228 KB of shared memory and 64K registers per SM
    static constexpr int FWD_WARPS = 4, FWD_M_TILES = 2, DKV_WARPS = 4, DQ_WARPS = 4, DQ_M_TILES = 2, ATOMIC_DKV_WARPS = 8;
    static constexpr int STAGES = 2;
    static constexpr bool WGMMA = false;
};
struct TilesSm86 { // RTX 3090/4090: 100 KB per SM; 16-row warps keep the forward at 46 KB, two blocks per SM
    static constexpr int FWD_WARPS = 4, FWD_M_TILES = 1, DKV_WARPS = 4, DQ_WARPS = 4, DQ_M_TILES = 2, ATOMIC_DKV_WARPS = 8;
    static constexpr int STAGES = 2;
    static constexpr bool WGMMA = false;
};
// H100, H200 with the sm_90a build: wgmma for HS 64 (atomic dQ stays on mma.sync). Measured on an
// H200 against the sm80 shapes on wgmma: forward 8 warps x 16 rows (two warpgroups, 109 registers)
// 5 to 8% faster than 4 x 32 (220 registers) and 4 x 16; dK/dV blocks of 8 warps make forward +
// backward up to 4% faster at T >= 4096; dQ stays 4 warps x 32 rows (8 x 16 lost 8%, 8 x 32 2%).
struct TilesSm90 : TilesSm80 {
    static constexpr bool WGMMA = true;
    static constexpr int FWD_WARPS = 8, FWD_M_TILES = 1, DKV_WARPS = 8;
};
template <int HS> constexpr int tile_cols() { return HS > 64 ? 32 : 64; }
template <int HS> constexpr int warps_for(int warps) { return HS > 64 ? 4 : warps; }
template <int HS> constexpr int m_tiles_for(int m_tiles) { return HS > 64 ? 1 : m_tiles; }

// ---- forward --------------------------------------------------------------------------------
template <class Mma, int WARPS, int M_TILES, int COLS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32)
    flash_forward_kernel(floatX* out, float* m_out, float* l_out, const floatX* qkv, int T, int NH) {
    constexpr int HS = Mma::HS, ROWS = 16 * WARPS * M_TILES, THREADS = 32 * WARPS, STRIDE = Mma::STRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    floatX* q_tile = (floatX*)align_shared<Mma::ALIGN>(smem);
    floatX* k_tiles = q_tile + ROWS * STRIDE; // STAGES stages each
    floatX* v_tiles = k_tiles + STAGES * COLS * STRIDE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS; // the longest rows start first
    const size_t stride = 3 * (size_t)C;
    const floatX* q_src = qkv + (size_t)b * T * stride + h * HS;
    const floatX* k_src = q_src + C;
    const floatX* v_src = q_src + 2 * C;
    const int num_tiles = (min(q0 + ROWS, T) + COLS - 1) / COLS; // tiles above the diagonal skipped
    auto load_kv_tile = [&](int tile) {
        load_kv_stage<Mma, COLS, THREADS, STAGES>(k_tiles, v_tiles, k_src, v_src, tile, num_tiles, T, stride);
    };

    load_tile_async<Mma, ROWS, THREADS>(q_tile, q_src, q0, T, stride); // in the first tile's group
    for (int tile = 0; tile < STAGES - 1; tile++) load_kv_tile(tile);
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int r0 = q0 + warp * 16 * M_TILES; // this warp's first query row
    // The last row of the warps that multiply together (Mma::GROUP_WARPS), who take the same branches.
    const int group_last_row = q0 + (warp / Mma::GROUP_WARPS + 1) * Mma::GROUP_WARPS * 16 * M_TILES - 1;
    uint32_t q_frag[M_TILES][HS / 16][4];
    load_a_fragments<Mma, M_TILES>(q_frag, q_tile, warp * 16 * M_TILES);

    const float scale_log2 = LOG2E / sqrtf((float)HS); // scores in log2 units: exp2 is one instruction
    float o_acc[M_TILES][HS / 8][4] = {};
    float m_run[M_TILES][2], l_run[M_TILES][2]; // per thread: rows g and g + 8 of each m-tile
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            m_run[mt][half] = -INFINITY;
            l_run[mt][half] = 0.0f; // this thread's columns only; the quad's four add up at the end
        }

    for (int tile = 0; tile < num_tiles; tile++) {
        cp_async_wait<STAGES - 2>(); // this tile has arrived,
        Mma::tiles_ready();
        __syncthreads();             // and every warp is done with the previous one, whose stage
        load_kv_tile(tile + STAGES - 1); // takes the tile STAGES - 1 ahead
        const int c0 = tile * COLS;
        // Tile 0 holds key 0, which every row sees, so every running max is finite after it (and
        // a later tile masked whole for a warp of a wgmma group leaves its rows as they were).
        if (c0 <= group_last_row) { // some key of the tile is visible to some row of the warp group
            if constexpr (Mma::RELOAD_A) load_a_fragments<Mma, M_TILES>(q_frag, q_tile, warp * 16 * M_TILES);
            const floatX* k_tile = k_tiles + tile % STAGES * COLS * STRIDE;
            const floatX* v_tile = v_tiles + tile % STAGES * COLS * STRIDE;
            float s[M_TILES][COLS / 8][4];
            Mma::template gemm_a_bt<M_TILES, COLS>(s, q_frag, k_tile);
            Mma::wait(s);
            if (c0 + COLS - 1 > r0) mask_scores<M_TILES, COLS>(s, [&](int row, int col) { return c0 + col > r0 + row; });
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    float tile_max = -INFINITY; // of the unscaled scores
#pragma unroll
                    for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) tile_max = fmaxf(tile_max, s[mt][nt][2 * half + e]);
                    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
                    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
                    // Online softmax: move the row to the new max and rescale what was summed.
                    const float m_new = fmaxf(m_run[mt][half], tile_max * scale_log2);
                    const float correction = fast_exp2(m_run[mt][half] - m_new); // 0 on the first tile
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
                    l_run[mt][half] = l_run[mt][half] * correction + sum;
#pragma unroll
                    for (int nt = 0; nt < HS / 8; nt++) {
                        o_acc[mt][nt][2 * half] *= correction;
                        o_acc[mt][nt][2 * half + 1] *= correction;
                    }
                }
            Mma::template gemm_c_b<M_TILES, COLS>(o_acc, s, v_tile);
            Mma::wait(o_acc);
        }
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

// ---- backward: dK and dV (and dQ by atomics) -----------------------------------------------
// Each block owns ROWS key rows (16 per warp) with K and V as A fragments in registers, streams
// (Q, dO, lse, D) tiles of COLS queries from its diagonal to the end, and accumulates
// dV = P^T dO and dK = scale dS^T Q in registers, working on the transposed scores S^T = K Q^T.
// ATOMIC_DQ: the block also writes dS^T to shared memory, and its warps add the tile's
// dQ = dS K (COLS x HS, unscaled) into the fp32 buffer dq_accum (B, T, C) with atomics.
template <class Mma, int WARPS, int COLS, int STAGES, bool ATOMIC_DQ>
__global__ void __launch_bounds__(WARPS * 32)
    flash_backward_dkv_kernel(floatX* dqkv, float* dq_accum, const floatX* dout, const floatX* qkv, const float* lse2,
                              const float* D, int T, int NH) {
    constexpr int HS = Mma::HS, ROWS = 16 * WARPS, THREADS = 32 * WARPS, STRIDE = Mma::STRIDE;
    // dQ tile work: each of the COLS / 16 query m-tiles is split over SPLIT warps by head dimension.
    constexpr int DQ_MTILES = COLS / 16, SPLIT = WARPS / DQ_MTILES, DQ_DIMS = HS / SPLIT, DS_STRIDE = COLS + 8;
    static_assert(!ATOMIC_DQ || (WARPS % DQ_MTILES == 0 && DQ_DIMS % 16 == 0), "dQ tile split");
    static_assert(!ATOMIC_DQ || Mma::GROUP_WARPS == 1, "atomic dQ multiplies with mma.sync");
    extern __shared__ __align__(16) unsigned char smem[];
    floatX* k_tile = (floatX*)align_shared<Mma::ALIGN>(smem);
    floatX* v_tile = k_tile + ROWS * STRIDE;
    floatX* q_tiles = v_tile + ROWS * STRIDE; // STAGES stages each
    floatX* do_tiles = q_tiles + STAGES * COLS * STRIDE;
    float* lse_tiles = (float*)(do_tiles + STAGES * COLS * STRIDE);
    float* d_tiles = lse_tiles + STAGES * COLS;
    floatX* ds_tile = (floatX*)(d_tiles + STAGES * COLS); // ATOMIC_DQ: dS^T, ROWS x COLS
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int k0 = blockIdx.x * ROWS; // the first key blocks see the most queries: they start first
    const size_t stride = 3 * (size_t)C;
    const floatX* q_src = qkv + (size_t)b * T * stride + h * HS;
    const floatX* k_src = q_src + C;
    const floatX* v_src = q_src + 2 * C;
    const floatX* do_src = dout + (size_t)b * T * C + h * HS;
    const float* lse_src = lse2 + ((size_t)b * NH + h) * T;
    const float* d_src = D + ((size_t)b * NH + h) * T;
    const int first_tile = k0 / COLS, num_tiles = (T + COLS - 1) / COLS; // tiles above the diagonal skipped

    auto load_query_tile = [&](int tile) { // one commit group per tile, empty past the last
        if (tile < num_tiles) {
            const int stage = tile % STAGES, c0 = tile * COLS;
            load_tile_async<Mma, COLS, THREADS>(q_tiles + stage * COLS * STRIDE, q_src, c0, T, stride);
            load_tile_async<Mma, COLS, THREADS>(do_tiles + stage * COLS * STRIDE, do_src, c0, T, C);
            load_vector_async<COLS, THREADS>(lse_tiles + stage * COLS, lse_src, c0, T);
            load_vector_async<COLS, THREADS>(d_tiles + stage * COLS, d_src, c0, T);
        }
        cp_async_commit();
    };

    load_tile_async<Mma, ROWS, THREADS>(k_tile, k_src, k0, T, stride); // in the first tile's group
    load_tile_async<Mma, ROWS, THREADS>(v_tile, v_src, k0, T, stride);
    for (int tile = first_tile; tile < first_tile + STAGES - 1; tile++) load_query_tile(tile);
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int r0 = k0 + warp * 16; // this warp's first key row
    const int group_first_row = k0 + warp / Mma::GROUP_WARPS * Mma::GROUP_WARPS * 16; // of the warps that multiply together
    uint32_t k_frag[1][HS / 16][4], v_frag[1][HS / 16][4];
    load_a_fragments<Mma, 1>(k_frag, k_tile, warp * 16);
    load_a_fragments<Mma, 1>(v_frag, v_tile, warp * 16);

    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = scale * LOG2E;
    float dk_acc[1][HS / 8][4] = {}, dv_acc[1][HS / 8][4] = {};
    for (int tile = first_tile; tile < num_tiles; tile++) {
        cp_async_wait<STAGES - 2>(); // as in the forward: one barrier per tile
        Mma::tiles_ready();
        __syncthreads();
        load_query_tile(tile + STAGES - 1);
        const int c0 = tile * COLS, stage = tile % STAGES;
        if (c0 + COLS - 1 >= group_first_row) { // some query of the tile sees some key of the warp group
            if constexpr (Mma::RELOAD_A) {
                load_a_fragments<Mma, 1>(k_frag, k_tile, warp * 16);
                load_a_fragments<Mma, 1>(v_frag, v_tile, warp * 16);
            }
            const floatX* q_tile = q_tiles + stage * COLS * STRIDE;
            const floatX* do_tile = do_tiles + stage * COLS * STRIDE;
            const float* lse_tile = lse_tiles + stage * COLS;
            const float* d_tile = d_tiles + stage * COLS;
            float p[1][COLS / 8][4], ds[1][COLS / 8][4];
            Mma::template gemm_a_bt<1, COLS>(p, k_frag, q_tile);   // S^T = K Q^T
            Mma::template gemm_a_bt<1, COLS>(ds, v_frag, do_tile); // dP^T = V dO^T
            Mma::wait(p, ds);
            // Masked: queries before the key (diagonal tiles) and queries at or past T (last tile).
            if (c0 < r0 + 15 || c0 + COLS > T)
                mask_scores<1, COLS>(p, [&](int key, int col) { return c0 + col < r0 + key || c0 + col >= T; });
#pragma unroll
            for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int col = nt * 8 + lane % 4 * 2 + i % 2;
                    p[0][nt][i] = fast_exp2(p[0][nt][i] * scale_log2 - lse_tile[col]);
                }
#pragma unroll
            for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) ds[0][nt][i] = p[0][nt][i] * (ds[0][nt][i] - d_tile[nt * 8 + lane % 4 * 2 + i % 2]);
            Mma::template gemm_c_b<1, COLS>(dv_acc, p, do_tile); // dV += P^T dO
            Mma::template gemm_c_b<1, COLS>(dk_acc, ds, q_tile); // dK += dS^T Q (scaled at the end)
            Mma::wait(dv_acc, dk_acc);
            if constexpr (ATOMIC_DQ) {
#pragma unroll
                for (int nt = 0; nt < COLS / 8; nt++)
#pragma unroll
                    for (int half = 0; half < 2; half++)
                        *(uint32_t*)(ds_tile + (warp * 16 + lane / 4 + half * 8) * DS_STRIDE + nt * 8 + lane % 4 * 2) =
                            pack_bf16(ds[0][nt][2 * half], ds[0][nt][2 * half + 1]);
            }
        }
        if constexpr (ATOMIC_DQ) {
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
    const float k_scale[1][2] = {{scale, scale}}, v_scale[1][2] = {{1.0f, 1.0f}};
    store_rows<1, HS>(dqkv + (size_t)b * T * stride + C + h * HS, dk_acc, k_scale, r0, T, stride);
    store_rows<1, HS>(dqkv + (size_t)b * T * stride + 2 * C + h * HS, dv_acc, v_scale, r0, T, stride);
}

// ---- backward: dQ --------------------------------------------------------------------------
// Each block owns ROWS query rows (16 M_TILES per warp) with Q and dO as A fragments, streams the
// K/V tiles at or below the diagonal, recomputes P and dP, and accumulates dQ = scale dS K.
template <class Mma, int WARPS, int M_TILES, int COLS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32)
    flash_backward_dq_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse2,
                             const float* D, int T, int NH) {
    constexpr int HS = Mma::HS, ROWS = 16 * WARPS * M_TILES, THREADS = 32 * WARPS, STRIDE = Mma::STRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    floatX* q_tile = (floatX*)align_shared<Mma::ALIGN>(smem);
    floatX* do_tile = q_tile + ROWS * STRIDE;
    floatX* k_tiles = do_tile + ROWS * STRIDE; // STAGES stages each
    floatX* v_tiles = k_tiles + STAGES * COLS * STRIDE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS; // the longest rows start first
    const size_t stride = 3 * (size_t)C;
    const floatX* q_src = qkv + (size_t)b * T * stride + h * HS;
    const floatX* k_src = q_src + C;
    const floatX* v_src = q_src + 2 * C;
    const int num_tiles = (min(q0 + ROWS, T) + COLS - 1) / COLS;
    auto load_kv_tile = [&](int tile) {
        load_kv_stage<Mma, COLS, THREADS, STAGES>(k_tiles, v_tiles, k_src, v_src, tile, num_tiles, T, stride);
    };

    load_tile_async<Mma, ROWS, THREADS>(q_tile, q_src, q0, T, stride); // in the first tile's group
    load_tile_async<Mma, ROWS, THREADS>(do_tile, dout + (size_t)b * T * C + h * HS, q0, T, C);
    for (int tile = 0; tile < STAGES - 1; tile++) load_kv_tile(tile);
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int r0 = q0 + warp * 16 * M_TILES; // this warp's first query row
    const int group_last_row = q0 + (warp / Mma::GROUP_WARPS + 1) * Mma::GROUP_WARPS * 16 * M_TILES - 1; // as in the forward
    uint32_t q_frag[M_TILES][HS / 16][4], do_frag[M_TILES][HS / 16][4];
    load_a_fragments<Mma, M_TILES>(q_frag, q_tile, warp * 16 * M_TILES);
    load_a_fragments<Mma, M_TILES>(do_frag, do_tile, warp * 16 * M_TILES);
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

    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = scale * LOG2E;
    float dq_acc[M_TILES][HS / 8][4] = {};
    for (int tile = 0; tile < num_tiles; tile++) {
        cp_async_wait<STAGES - 2>(); // as in the forward: one barrier per tile
        Mma::tiles_ready();
        __syncthreads();
        load_kv_tile(tile + STAGES - 1);
        const int c0 = tile * COLS;
        if (c0 <= group_last_row) {
            if constexpr (Mma::RELOAD_A) load_a_fragments<Mma, M_TILES>(q_frag, q_tile, warp * 16 * M_TILES);
            const floatX* k_tile = k_tiles + tile % STAGES * COLS * STRIDE;
            const floatX* v_tile = v_tiles + tile % STAGES * COLS * STRIDE;
            // S and dP one after the other: both in flight at once spill on sm_90 with 2 m-tiles.
            float p[M_TILES][COLS / 8][4];
            Mma::template gemm_a_bt<M_TILES, COLS>(p, q_frag, k_tile); // S = Q K^T
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
            if constexpr (Mma::RELOAD_A) load_a_fragments<Mma, M_TILES>(do_frag, do_tile, warp * 16 * M_TILES);
            float ds[M_TILES][COLS / 8][4];
            Mma::template gemm_a_bt<M_TILES, COLS>(ds, do_frag, v_tile); // dP = dO V^T
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
    store_rows<M_TILES, HS>(dqkv + (size_t)b * T * stride + h * HS, dq_acc, q_scale, r0, T, stride);
}

// dQ (the first third of each dqkv row) = scale * dq_accum (B, T, C), 8 elements per thread.
__global__ void flash_backward_dq_convert_kernel(floatX* dqkv, const float* dq_accum, size_t n, int C, float scale) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    const float4 lo = *(const float4*)(dq_accum + i), hi = *(const float4*)(dq_accum + i + 4);
    uint4 packed;
    packed.x = pack_bf16(lo.x * scale, lo.y * scale);
    packed.y = pack_bf16(lo.z * scale, lo.w * scale);
    packed.z = pack_bf16(hi.x * scale, hi.y * scale);
    packed.w = pack_bf16(hi.z * scale, hi.w * scale);
    *(uint4*)(dqkv + i / C * 3 * C + i % C) = packed;
}

// ---- launch ---------------------------------------------------------------------------------
template <class Kernel> static void allow_shared_memory(Kernel kernel, size_t bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int HS, class Tiles> struct FlashBf16 {
    using Mma = std::conditional_t<Tiles::WGMMA && HS == 64, Wgmma, MmaSync<HS>>;
    static constexpr int COLS = tile_cols<HS>(), STAGES = Tiles::STAGES;
    static constexpr int FWD_WARPS = warps_for<HS>(Tiles::FWD_WARPS), FWD_M_TILES = m_tiles_for<HS>(Tiles::FWD_M_TILES);
    static constexpr int DKV_WARPS = warps_for<HS>(Tiles::DKV_WARPS), DQ_WARPS = warps_for<HS>(Tiles::DQ_WARPS);
    static constexpr int DQ_M_TILES = m_tiles_for<HS>(Tiles::DQ_M_TILES);
    static constexpr int ATOMIC_DKV_WARPS = warps_for<HS>(Tiles::ATOMIC_DKV_WARPS);
    // Shared memory of a block: `rows` resident head vectors plus STAGES streamed tiles of two
    // matrices and `vectors` per-row floats, plus room to align the start to M::ALIGN.
    template <class M> static constexpr size_t smem_bytes(int rows, int vectors) {
        return (rows + 2 * STAGES * COLS) * M::STRIDE * sizeof(floatX) + (size_t)vectors * STAGES * COLS * sizeof(float) +
               M::ALIGN - 16;
    }

    static constexpr auto forward_kernel() { return flash_forward_kernel<Mma, FWD_WARPS, FWD_M_TILES, COLS, STAGES>; }

    static void forward(floatX* out, float* m, float* l, const floatX* qkv, int B, int T, int NH) {
        constexpr int ROWS = 16 * FWD_WARPS * FWD_M_TILES;
        const size_t smem = smem_bytes<Mma>(ROWS, 0);
        auto kernel = forward_kernel();
        allow_shared_memory(kernel, smem);
        kernel<<<dim3(ceil_div(T, ROWS), B * NH), FWD_WARPS * 32, smem>>>(out, m, l, qkv, T, NH);
        launchCheck();
    }

    // dq_accum NULL: dQ from its own kernel (deterministic); else by atomics into dq_accum (B, T, C).
    static void backward(floatX* dqkv, float* dq_accum, const float* lse2, const float* D, const floatX* dout,
                         const floatX* qkv, int B, int T, int NH) {
        if (dq_accum) {
            constexpr int ROWS = 16 * ATOMIC_DKV_WARPS;
            const size_t n = (size_t)B * T * NH * HS;
            const size_t smem = smem_bytes<MmaSync<HS>>(2 * ROWS, 2) + ROWS * (COLS + 8) * sizeof(floatX);
            cudaCheck(cudaMemsetAsync(dq_accum, 0, n * sizeof(float)));
            auto kernel = flash_backward_dkv_kernel<MmaSync<HS>, ATOMIC_DKV_WARPS, COLS, STAGES, true>;
            allow_shared_memory(kernel, smem);
            kernel<<<dim3(ceil_div(T, ROWS), B * NH), ATOMIC_DKV_WARPS * 32, smem>>>(dqkv, dq_accum, dout, qkv, lse2, D,
                                                                                    T, NH);
            launchCheck();
            flash_backward_dq_convert_kernel<<<ceil_div(n / 8, 256), 256>>>(dqkv, dq_accum, n, NH * HS,
                                                                           1.0f / sqrtf((float)HS));
            launchCheck();
            return;
        }
        constexpr int DKV_ROWS = 16 * DKV_WARPS, DQ_ROWS = 16 * DQ_WARPS * DQ_M_TILES;
        const size_t dkv_smem = smem_bytes<Mma>(2 * DKV_ROWS, 2), dq_smem = smem_bytes<Mma>(2 * DQ_ROWS, 0);
        auto dkv_kernel = flash_backward_dkv_kernel<Mma, DKV_WARPS, COLS, STAGES, false>;
        allow_shared_memory(dkv_kernel, dkv_smem);
        dkv_kernel<<<dim3(ceil_div(T, DKV_ROWS), B * NH), DKV_WARPS * 32, dkv_smem>>>(dqkv, NULL, dout, qkv, lse2, D, T, NH);
        launchCheck();
        auto dq_kernel = flash_backward_dq_kernel<Mma, DQ_WARPS, DQ_M_TILES, COLS, STAGES>;
        allow_shared_memory(dq_kernel, dq_smem);
        dq_kernel<<<dim3(ceil_div(T, DQ_ROWS), B * NH), DQ_WARPS * 32, dq_smem>>>(dqkv, dout, qkv, lse2, D, T, NH);
        launchCheck();
    }
};

enum FlashConfig { CONFIG_SM80, CONFIG_SM86, CONFIG_SM90 };

// sm90 (wgmma) on H100/H200 when this build holds sm_90a code for them (the Makefile builds
// GPU_ARCH 90 as sm_90a); sm86 on the sm_86/sm_87/sm_89 consumer parts; sm80 elsewhere.
// FLASH_ATTN_CONFIG=sm80|sm86|sm90 forces one, so tests run every configuration on one GPU.
static FlashConfig flash_config(void) {
    int device, major, minor;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cudaFuncAttributes wgmma_kernel;
    cudaCheck(cudaFuncGetAttributes(&wgmma_kernel, FlashBf16<64, TilesSm90>::forward_kernel()));
    const bool wgmma = major == 9 && minor == 0 && wgmma_kernel.binaryVersion == 90;
    const char* forced = getenv("FLASH_ATTN_CONFIG");
    if (forced && forced[0]) {
        if (strcmp(forced, "sm80") == 0) return CONFIG_SM80;
        if (strcmp(forced, "sm86") == 0) return CONFIG_SM86;
        if (strcmp(forced, "sm90") == 0 && wgmma) return CONFIG_SM90;
        if (strcmp(forced, "sm90") == 0) {
            fatal("FLASH_ATTN_CONFIG=sm90: the wgmma tiles need an H100/H200 (compute capability 9.0) and a build "
                  "with GPU_ARCH including 90; this GPU is %d.%d", major, minor);
        }
        fatal("FLASH_ATTN_CONFIG=%s: unknown tile configuration (use sm80 for A100 tiles, sm86 for RTX 3090/4090 "
              "tiles or sm90 for H100/H200 wgmma tiles)", forced);
    }
    if (wgmma) return CONFIG_SM90;
    return major == 8 && minor > 0 ? CONFIG_SM86 : CONFIG_SM80;
}

template <class Tiles> static void forward_bf16(floatX* out, float* m, float* l, const floatX* qkv, int B, int T, int NH, int HS) {
    switch (HS) {
    case 32: FlashBf16<32, Tiles>::forward(out, m, l, qkv, B, T, NH); break;
    case 64: FlashBf16<64, Tiles>::forward(out, m, l, qkv, B, T, NH); break;
    case 128: FlashBf16<128, Tiles>::forward(out, m, l, qkv, B, T, NH); break;
    }
}

template <class Tiles>
static void backward_bf16(floatX* dqkv, float* dq_accum, const float* lse2, const float* D, const floatX* dout, const floatX* qkv,
                          int B, int T, int NH, int HS) {
    switch (HS) {
    case 32: FlashBf16<32, Tiles>::backward(dqkv, dq_accum, lse2, D, dout, qkv, B, T, NH); break;
    case 64: FlashBf16<64, Tiles>::backward(dqkv, dq_accum, lse2, D, dout, qkv, B, T, NH); break;
    case 128: FlashBf16<128, Tiles>::backward(dqkv, dq_accum, lse2, D, dout, qkv, B, T, NH); break;
    }
}

// cp.async moves 16-byte chunks: head vectors must start on 16-byte boundaries.
static void check_bf16_inputs(const void* a, const void* b, int HS) {
    if (HS != 32 && HS != 64 && HS != 128) {
        fatal("flash attention (BF16): head size %d is not supported (32, 64 or 128; choose the number of heads "
              "so that channels / heads is one of these)", HS);
    }
    if (((uintptr_t)a | (uintptr_t)b) % 16 != 0) {
        fatal("flash attention (BF16): the qkv and output buffers must be 16-byte aligned");
    }
}

void attention_forward(floatX* out, void* saved, const floatX* qkv, int B, int T, int C, int NH) {
    check_shapes(B, T, C, NH);
    const int HS = C / NH;
    check_bf16_inputs(qkv, out, HS);
    float* m = (float*)saved;
    float* l = m + (size_t)B * NH * T;
    switch (flash_config()) {
    case CONFIG_SM90: forward_bf16<TilesSm90>(out, m, l, qkv, B, T, NH, HS); break;
    case CONFIG_SM86: forward_bf16<TilesSm86>(out, m, l, qkv, B, T, NH, HS); break;
    case CONFIG_SM80: forward_bf16<TilesSm80>(out, m, l, qkv, B, T, NH, HS); break;
    }
}

void attention_backward(floatX* dqkv, void* scratch, const floatX* dout, const floatX* qkv,
                        const floatX* out, const void* saved, int B, int T, int C, int NH) {
    check_shapes(B, T, C, NH);
    const int HS = C / NH;
    check_bf16_inputs(qkv, dqkv, HS);
    check_bf16_inputs(dout, out, HS);
    const float* m = (const float*)saved;
    const float* l = m + (size_t)B * NH * T;
    float* dq_accum = deterministic_dq() ? NULL : (float*)scratch; // first: 16-byte aligned for float4
    float* D = (float*)scratch + (dq_accum ? (size_t)B * T * C : 0);
    float* lse2 = D + (size_t)B * NH * T;
    flash_backward_prepare(D, lse2, dout, out, m, l, B, T, NH, HS);
    switch (flash_config()) {
    case CONFIG_SM90: backward_bf16<TilesSm90>(dqkv, dq_accum, lse2, D, dout, qkv, B, T, NH, HS); break;
    case CONFIG_SM86: backward_bf16<TilesSm86>(dqkv, dq_accum, lse2, D, dout, qkv, B, T, NH, HS); break;
    case CONFIG_SM80: backward_bf16<TilesSm80>(dqkv, dq_accum, lse2, D, dout, qkv, B, T, NH, HS); break;
    }
}

#else
// ================================ FP32: CUDA cores ===========================================
// One warp per row: the 32 lanes take the 32 columns (keys or queries) of a tile for the scores,
// then the head dimensions (lane, lane + 32, ...) for the products with V, K, Q or dO. Rows of a
// block share the column tiles in shared memory, padded to an odd stride (conflict-free reads of
// one column per lane). Exact expf and fp32 sums.
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

__device__ inline float dot_f32(const float* a, const float* b, int HS) {
    float sum = 0.0f;
    for (int d = 0; d < HS; d++) sum += a[d] * b[d];
    return sum;
}

template <int DIMS_PER_LANE>
__global__ void flash_forward_f32_kernel(float* out, float* m_out, float* l_out, const float* qkv, int T, int NH, int HS) {
    constexpr int STRIDE = f32_stride<DIMS_PER_LANE>();
    extern __shared__ float smem_f32[];
    float* q_rows = smem_f32;
    float* k_tile = q_rows + F32_ROWS * STRIDE;
    float* v_tile = k_tile + F32_COLS * STRIDE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * F32_ROWS;
    const size_t stride = 3 * (size_t)C;
    const float* q_src = qkv + (size_t)b * T * stride + h * HS;
    const float scale = 1.0f / sqrtf((float)HS);
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
        if (row >= T) continue;
        float* o = out + ((size_t)b * T + row) * C + h * HS;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; k++)
            if (lane + 32 * k < HS) o[lane + 32 * k] = acc[i][k] / l_run[i];
        if (lane == 0) {
            m_out[((size_t)b * NH + h) * T + row] = m_run[i];
            l_out[((size_t)b * NH + h) * T + row] = l_run[i];
        }
    }
}

// dQ: rows are queries; P = exp(s - m) / l and dP = dO V^T recomputed per key tile.
template <int DIMS_PER_LANE>
__global__ void flash_backward_dq_f32_kernel(float* dqkv, const float* dout, const float* qkv, const float* m,
                                             const float* l, const float* D, int T, int NH, int HS) {
    constexpr int STRIDE = f32_stride<DIMS_PER_LANE>();
    extern __shared__ float smem_f32[];
    float* q_rows = smem_f32;
    float* do_rows = q_rows + F32_ROWS * STRIDE;
    float* k_tile = do_rows + F32_ROWS * STRIDE;
    float* v_tile = k_tile + F32_COLS * STRIDE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * F32_ROWS;
    const size_t stride = 3 * (size_t)C, head_row0 = ((size_t)b * NH + h) * T;
    const float* q_src = qkv + (size_t)b * T * stride + h * HS;
    const float scale = 1.0f / sqrtf((float)HS);
    load_rows_f32<DIMS_PER_LANE>(q_rows, q_src, q0, F32_ROWS, T, HS, stride);
    load_rows_f32<DIMS_PER_LANE>(do_rows, dout + (size_t)b * T * C + h * HS, q0, F32_ROWS, T, HS, C);
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
#pragma unroll
    for (int i = 0; i < F32_ROWS_PER_WARP; i++) {
        const int row = q0 + warp * F32_ROWS_PER_WARP + i;
        if (row >= T) continue;
        float* dst = dqkv + ((size_t)b * T + row) * stride + h * HS;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; k++)
            if (lane + 32 * k < HS) dst[lane + 32 * k] = dq[i][k] * scale;
    }
}

// dK and dV: rows are keys, the tiles hold queries from the diagonal on.
template <int DIMS_PER_LANE>
__global__ void flash_backward_dkv_f32_kernel(float* dqkv, const float* dout, const float* qkv, const float* m,
                                              const float* l, const float* D, int T, int NH, int HS) {
    constexpr int STRIDE = f32_stride<DIMS_PER_LANE>();
    extern __shared__ float smem_f32[];
    float* k_rows = smem_f32;
    float* v_rows = k_rows + F32_ROWS * STRIDE;
    float* q_tile = v_rows + F32_ROWS * STRIDE;
    float* do_tile = q_tile + F32_COLS * STRIDE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS, b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int k0 = blockIdx.x * F32_ROWS;
    const size_t stride = 3 * (size_t)C, head_row0 = ((size_t)b * NH + h) * T;
    const float* q_src = qkv + (size_t)b * T * stride + h * HS;
    const float scale = 1.0f / sqrtf((float)HS);
    load_rows_f32<DIMS_PER_LANE>(k_rows, q_src + C, k0, F32_ROWS, T, HS, stride);
    load_rows_f32<DIMS_PER_LANE>(v_rows, q_src + 2 * C, k0, F32_ROWS, T, HS, stride);
    float dk[F32_ROWS_PER_WARP][DIMS_PER_LANE] = {}, dv[F32_ROWS_PER_WARP][DIMS_PER_LANE] = {};
    for (int c0 = k0 / F32_COLS * F32_COLS; c0 < T; c0 += F32_COLS) {
        __syncthreads();
        load_rows_f32<DIMS_PER_LANE>(q_tile, q_src, c0, F32_COLS, T, HS, stride);
        load_rows_f32<DIMS_PER_LANE>(do_tile, dout + (size_t)b * T * C + h * HS, c0, F32_COLS, T, HS, C);
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
#pragma unroll
    for (int i = 0; i < F32_ROWS_PER_WARP; i++) {
        const int key = k0 + warp * F32_ROWS_PER_WARP + i;
        if (key >= T) continue;
        float* dst = dqkv + ((size_t)b * T + key) * stride + h * HS;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; k++)
            if (lane + 32 * k < HS) {
                dst[C + lane + 32 * k] = dk[i][k] * scale;
                dst[2 * C + lane + 32 * k] = dv[i][k];
            }
    }
}

template <int DIMS_PER_LANE> struct FlashF32 {
    static constexpr size_t ROW_BYTES = f32_stride<DIMS_PER_LANE>() * sizeof(float);
    static void forward(float* out, float* m, float* l, const float* qkv, int B, int T, int NH, int HS) {
        const size_t smem = (F32_ROWS + 2 * F32_COLS) * ROW_BYTES;
        auto kernel = flash_forward_f32_kernel<DIMS_PER_LANE>;
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<dim3(ceil_div(T, F32_ROWS), B * NH), F32_WARPS * 32, smem>>>(out, m, l, qkv, T, NH, HS);
        launchCheck();
    }
    static void backward(float* dqkv, const float* dout, const float* qkv, const float* m, const float* l,
                         const float* D, int B, int T, int NH, int HS) {
        const size_t smem = (2 * F32_ROWS + 2 * F32_COLS) * ROW_BYTES;
        auto dkv_kernel = flash_backward_dkv_f32_kernel<DIMS_PER_LANE>;
        cudaCheck(cudaFuncSetAttribute(dkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        dkv_kernel<<<dim3(ceil_div(T, F32_ROWS), B * NH), F32_WARPS * 32, smem>>>(dqkv, dout, qkv, m, l, D, T, NH, HS);
        launchCheck();
        auto dq_kernel = flash_backward_dq_f32_kernel<DIMS_PER_LANE>;
        cudaCheck(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        dq_kernel<<<dim3(ceil_div(T, F32_ROWS), B * NH), F32_WARPS * 32, smem>>>(dqkv, dout, qkv, m, l, D, T, NH, HS);
        launchCheck();
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

void attention_backward(floatX* dqkv, void* scratch, const floatX* dout, const floatX* qkv,
                        const floatX* out, const void* saved, int B, int T, int C, int NH) {
    check_shapes(B, T, C, NH);
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
}
#endif // PRECISION_BF16
#endif // ATTN_FLASH
