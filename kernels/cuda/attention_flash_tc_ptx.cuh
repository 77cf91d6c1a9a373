// PTX wrappers of the tensor-core kernels of the BF16 and FP16 builds (their element type is
// floatX's): the flash attention (kernels/cuda/attention_flash.cu and the files it includes, listed
// there) and our wgmma product (kernels/cuda/matmul_wgmma.cuh, BF16 only, with the fc layer's GELU and the head's probabilities): ldmatrix and stmatrix, mma.sync m16n8k16 and its
// fragment layouts, wgmma (sm_90a) with its shared-memory descriptor, fences and register pins, TMA
// tile copies with the mbarriers they signal, and TMA stores and reduce-adds with their bulk
// async-groups (sm_90a); cp.async, which the layernorm uses too, is in common.cuh. Nothing here
// knows about attention, GELU or the head: the matrix-product policies built on these, and the tile
// loads and stores, are in attention_flash_tc_mma.cuh and matmul_wgmma.cuh.
#pragma once
#if defined(PRECISION_FP32)
#error "the tensor-core kernels' PTX (attention_flash_tc_ptx.cuh) is for the BF16 and FP16 builds"
#endif
#include <stdint.h>

#include "kernels/cuda/common.cuh"

// The warp's index in its block, taken from lane 0 so that ptxas knows every lane has it: what is
// computed from it (the warp group's tile addresses, the wgmma descriptors made from them) can then
// live in uniform registers instead of being made in every lane and moved over (R2UR) per product.
__device__ __forceinline__ int warp_index() { return __shfl_sync(0xffffffff, (int)threadIdx.x / 32, 0); }
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
// The inverse of ldmatrix_x4 (sm_90): lane l's r[i] is its fragment (row l / 4, columns 2 (l % 4)
// and the next) of matrix i, whose rows lanes 8 i .. 8 i + 7 give the addresses of, in turn.
__device__ __forceinline__ void stmatrix_x4(void* p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address(p)), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
#endif
}
// The PTX name of floatX in the mma and wgmma instructions.
#if defined(PRECISION_BF16)
#define MMA_TYPE "bf16"
#else
#define MMA_TYPE "f16"
#endif
// c (16 x 8, fp32) += a (16 x 16, floatX, row-major) b (16 x 8, floatX, column-major).
// sm_75 (Turing) has only the m16n8k8 shape, and only for f16 (the Makefile refuses BF16 there): the
// product over k = 16 is that of its first 8 columns of a and rows of b, then of its last 8, and the
// m16n8k16 fragments split exactly so (below: a[0..1] and b0 hold k 0..7, a[2..3] and b1 k 8..15, in
// the m16n8k8 layout), so the same fragments serve both. The two adds of fp32 partial products may
// round differently from the one m16n8k16 of newer cards.
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(PRECISION_FP16)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[2]), "r"(a[3]), "r"(b1));
#else
#error "bf16 tensor cores need sm_80 or newer (build BF16 without GPU_ARCH 75)"
#endif
}

// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 g + q. An accumulator c[4] of a 16 x 8 tile
// holds (row g, cols 2q, 2q+1) in c[0..1] and (row g + 8, same cols) in c[2..3]. An A fragment
// a[4] of a 16 x 16 tile holds (row g, cols 2q..2q+1), (row g+8, same), (row g, cols 2q+8..9),
// (row g+8, same). A B fragment (b0, b1) of a 16 x 8 tile holds (rows 2q..2q+1, col g) and
// (rows 2q+8..2q+9, col g).

// The A fragment (16 x 16, floatX) of columns 16 k .. 16 k + 15 of a warp's fp32 tile in the
// accumulator layout: P or dS as the left operand of the next product.
__device__ __forceinline__ void a_fragment_of(uint32_t a[4], const float (*c)[4], int k) {
    a[0] = pack_floatX2(c[2 * k][0], c[2 * k][1]);
    a[1] = pack_floatX2(c[2 * k][2], c[2 * k][3]);
    a[2] = pack_floatX2(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[3] = pack_floatX2(c[2 * k + 1][2], c[2 * k + 1][3]);
}

// wgmma (PTX ISA, "asynchronous warpgroup level matrix multiply"), compiled for sm_90a only; the
// host never launches a Wgmma kernel elsewhere (flash_config in attention_flash.cu), and these
// trap if it did.
// Shared-memory matrix descriptor: start address, 1024 bytes between groups of 8 rows (the
// "stride byte offset"), 128-byte swizzle. The leading byte offset is not used by these shapes:
// a 2-byte operand 64 wide is exactly one swizzle row (tried in BF16: any value works).
__device__ __forceinline__ uint64_t wgmma_descriptor(const floatX* tile) {
    return (uint64_t)((smem_address(tile) & 0x3FFFF) >> 4) | (uint64_t)(1024 >> 4) << 32 | 1ull << 62;
}
// The accumulator operands of a wgmma m64n64: d[8][4], %0 .. %31 of its asm.
#define WGMMA_D_REGISTERS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                          "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WGMMA_D_OPERANDS(d)                                                                                           \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),        \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),    \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),    \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),    \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
// d (this warp's 16 rows of a 64 x 64 accumulator) = (accumulate ? d : 0) + a (this warp's 16 x 16
// fragment) b, b (16 x 64) in shared memory: rows of 64 (TRANS_B 1, "MN-major") or, TRANS_B 0,
// the transpose of a (64 x 16) block of rows of 64 ("K-major").
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16(float d[8][4], const uint32_t a[4], uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." MMA_TYPE "." MMA_TYPE " " WGMMA_D_REGISTERS
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : WGMMA_D_OPERANDS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS_B), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)b, (void)accumulate;
    __trap();
#endif
}
// The same with a from shared memory too: TRANS_A 0, the K-major (64 x 16) block of a tile of rows
// of 64 that descriptor a starts at; TRANS_A 1, 16 rows of 64 ("MN-major"), a's transpose: the
// product of two tiles that share their rows, such as dQ = dS K from dS^T and K, both stored key by key.
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_shared_a(float d[8][4], uint64_t a, uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." MMA_TYPE "." MMA_TYPE " " WGMMA_D_REGISTERS
                 ", %32, %33, p, 1, 1, %34, %35;\n}\n"
                 : WGMMA_D_OPERANDS(d)
                 : "l"(a), "l"(b), "n"(TRANS_A), "n"(TRANS_B), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)b, (void)accumulate;
    __trap();
#endif
}
// d (this warp's 16 rows of a 64 x 256 accumulator, d[4 j + i] as d[j][i] of the m64n64 layout
// above, j = 0 .. 31) = (accumulate ? d : 0) + a b^T, a (64 x 16) and b (256 x 16) K-major blocks of
// shared-memory tiles of rows of 64: a whole row block of the fc product per warpgroup.
#define WGMMA_N256_D_0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_N256_D_1 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_N256_D_2 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WGMMA_N256_D_3 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
    "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WGMMA_D4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WGMMA_D32(d, i)                                                                                             \
    WGMMA_D4(d, i), WGMMA_D4(d, i + 4), WGMMA_D4(d, i + 8), WGMMA_D4(d, i + 12), WGMMA_D4(d, i + 16),              \
        WGMMA_D4(d, i + 20), WGMMA_D4(d, i + 24), WGMMA_D4(d, i + 28)
__device__ __forceinline__ void wgmma_m64n256k16_shared_a(float d[128], uint64_t a, uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." MMA_TYPE "." MMA_TYPE " {" WGMMA_N256_D_0 ", " WGMMA_N256_D_1
                 ", " WGMMA_N256_D_2 ", " WGMMA_N256_D_3 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D32(d, 0), WGMMA_D32(d, 32), WGMMA_D32(d, 64), WGMMA_D32(d, 96)
                 : "l"(a), "l"(b), "r"((int)accumulate));
#else
    (void)d, (void)a, (void)b, (void)accumulate;
    __trap();
#endif
}
// TMA (PTX ISA, "cp.async.bulk.tensor"), sm_90a only like wgmma: one thread copies a whole tile,
// described by a tensor map, into shared memory and the copy signals an mbarrier when its bytes have
// landed; the other threads wait on that barrier's phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the TMA unit
#else
    (void)bar, (void)count;
    __trap();
#endif
}
// Arrives on the barrier and tells it to wait for `bytes` more from the copies that signal it.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
    __trap();
#endif
}
// Arrives on the barrier (release: this thread's memory accesses before it are seen by those that
// wait for the phase it completes).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
#else
    (void)bar;
    __trap();
#endif
}
// Waits until the barrier's phase `parity` (0, 1, 0, ... for its 1st, 2nd, 3rd completion) is over.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, int parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred done;\nwait:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait;\n}\n" ::"r"(smem_address(bar)), "r"(parity)
                 : "memory");
#else
    (void)bar, (void)parity;
    __trap();
#endif
}
// The box at coordinates (x, y, z) of a 3-D tensor map into shared memory at dst, signalling bar;
// elements outside the tensor are zeros.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tensor_map, int x, int y, int z, uint64_t* bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
                 "[%5];\n" ::"r"(smem_address(dst)), "l"(tensor_map), "r"(x), "r"(y), "r"(z), "r"(smem_address(bar))
                 : "memory");
#else
    (void)dst, (void)tensor_map, (void)x, (void)y, (void)z, (void)bar;
    __trap();
#endif
}
// Stores the box at coordinates (x, y, z) of a 3-D tensor map from shared memory at src into global
// memory, or with ADD adds it there (element by element, atomically), in this thread's bulk
// async-group; elements outside the tensor are not written. The threads that wrote src must have
// fenced their stores into the async proxy (fence_proxy_async) and met this thread at a barrier.
template <bool ADD>
__device__ __forceinline__ void tma_store_3d(const void* tensor_map, int x, int y, int z, const void* src) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (ADD)
        asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::
                         "l"(tensor_map), "r"(x), "r"(y), "r"(z), "r"(smem_address(src))
                     : "memory");
    else
        asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(tensor_map),
                     "r"(x), "r"(y), "r"(z), "r"(smem_address(src))
                     : "memory");
#else
    (void)tensor_map, (void)x, (void)y, (void)z, (void)src;
    __trap();
#endif
}
// Closes this thread's bulk async-group; waits until its groups have read their shared memory
// (READ_ONLY: the source may be written again) or are complete.
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
template <bool READ_ONLY> __device__ __forceinline__ void bulk_wait_all() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (READ_ONLY) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// Makes this thread's shared-memory stores (generic proxy) visible to the tensor cores' and the
// TMA unit's reads (async proxy), once a barrier follows.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// A barrier of `threads` threads (whole warps) on hardware barrier `id` (0 is __syncthreads'):
// the warps of one part of a block wait for each other only.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Orders this thread's register accesses before the wgmmas that follow (wgmma.fence); closes a
// group of issued wgmmas; waits until at most `pending` groups, the newest, are still running.
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
template <int pending> __device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
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
