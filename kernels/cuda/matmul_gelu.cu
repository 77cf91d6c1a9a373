// The fc layer's forward with its GELU (kernels.h, matmul_forward_gelu): pre = inp weight^T + bias,
// rounded once, and out = gelu(pre) with gelu_forward's bits.
//
// cuBLASLt has no epilogue that computes our GELU on the rounded product (its GELU_AUX works on the
// fp32 sums with a GELU of its own, so recompute, which rebuilds out from pre with gelu_forward,
// would change the numbers). So cuBLASLt writes pre and gelu_forward reads it back: 403 MB each way
// per GPT-2 124M layer at 64K tokens, 0.23 ms on an H200 beside the product's 0.44. On H100/H200
// (sm_90a, BF16) one kernel of ours does both: the product on wgmma from TMA tiles, and the GELU in
// an epilogue that runs beside the next tile's product. Elsewhere (and for shapes it does not take):
// matmul_forward, then gelu_forward.
//
// The kernel (matmul_gelu_kernel) is persistent, one block per SM, each block taking tiles of BM x
// BN outputs in turn (tile, tile + gridDim.x, ...; consecutive tiles share their rows of inp, and
// the blocks running at once read all of the weight, which stays in the L2). Its warpgroups:
//   - the producer (warp 0, one thread): loads the tiles' inp (BM x 64) and weight (BN x 64) blocks
//     by TMA into a ring of STAGES stages, each again as soon as all 8 multiplying warps' products
//     have read it;
//   - two multiplying groups (warps 4-11), each 64 rows of the tile: wgmma m64n256k16 from the
//     stages, fp32 accumulators in registers. When a tile's product is done they add the bias, round
//     to bf16 (pre), store it into the staged tile in shared memory (stmatrix) and go on;
//   - the epilogue (warps 1-3): stores the staged tile to pre by TMA, one store per 64-column panel;
//     as each panel's store has read it, turns that panel into gelu(pre) in place (a thread's
//     chunks of the panel all loaded first, for the latency) and stores it to out; once out's stores
//     have read the tile, frees it.
// So the GELU and the stores run beside the next tile's product, on warps of their own: where the
// multiplying warps did them between their products (2 warps per scheduler), they could not hide
// the GELU's latency and it added 0.2 ms to the 0.5 of the product (GPT-2 124M's fc, H200); where
// the epilogue's warps stored the outputs themselves (16 bytes a thread) it took longer still.
// The producer is a warp of its own so that a multiplying group never waits for the other to
// release a stage before its own next products (where the first multiplying thread loaded the
// stages, the kernel took 0.593 ms a call against 0.544: PERFORMANCE.md).
// With 12 warps, 3 on each of the SM's 4 schedulers, whose register file (16,384) then allows 168
// registers a thread: enough for the 128 accumulators of a wgmma m64n256.
// Every output's sum runs over k in the same order whatever its row, tile or N, so the results are
// batch-invariant (kernels.h) and bit-identical from run to run.
#include "kernels/cuda/gelu.cuh"
#if defined(PRECISION_BF16)
#include "kernels/cuda/attention_flash_bf16_ptx.cuh"
#endif

#if defined(PRECISION_BF16)
namespace {
constexpr int BM = 128, BN = 256, BK = 64, STAGES = 3, THREADS = 384, EPILOGUE_THREADS = 96;
constexpr int EPILOGUE_FIRST = 32; // the epilogue's first thread (warp 1's lane 0)
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int STAGED_BYTES = BM * BN * 2; // the staged tile of pre (bf16)
constexpr int BARRIERS = 2 * STAGES + 2;
// Dynamic shared memory is only 16-byte aligned; TMA's and wgmma's 128-byte swizzle want 1024.
constexpr size_t SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + STAGED_BYTES + BARRIERS * 8;
} // namespace

// The staged tile: BN / 64 panels of BM rows by 64 columns (128 bytes), each with the 128-byte
// swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)) of the TMA stores' boxes, so that both the
// accumulators' stores (8 rows of 16 bytes per warp) and the GELU's 16-byte chunks (a row of 512
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

// The epilogue (warps 1-3): stores the staged tile at (row0, col0) to pre, then gelu of it to out,
// panel by panel. Its thread 0's bulk groups are pre's BN / 64 panels, then out's in turn: before
// panel p's GELU, at most BN / 64 - 1 groups may still be reading (pre's later panels and out's
// earlier ones). The epilogue's three warps take longer than the product (a trace's samples: the
// multiplying warps' most waited-for barrier is staged_free), so its shared-memory chunks are
// addressed with a thread's two offsets and constants, by ld/st.shared (through a generic pointer,
// each chunk cost its address arithmetic and a generic load).
__device__ __forceinline__ void epilogue(unsigned char* staged, const CUtensorMap* pre_map, const CUtensorMap* out_map,
                                         int row0, int col0) {
    const int t = threadIdx.x - EPILOGUE_FIRST; // 0 .. EPILOGUE_THREADS - 1
    if (t == 0) {
        for (int p = 0; p < BN / 64; p++) {
            tma_store_3d<false>(pre_map, col0 + 64 * p, row0, 0, staged + p * (BM * 128));
            bulk_commit();
        }
    }
    const GeluForward gelu;
    // A panel's BM * 8 16-byte chunks, chunk i the thread's i % EPILOGUE_THREADS: 1024 chunks on 96
    // threads, 10 each and an eleventh for the first 64. The others load their first chunk again as
    // their eleventh and do not store it (a guard on the load and the GELU too spilled).
    constexpr int CHUNKS = BM * 8, PER = (CHUNKS + EPILOGUE_THREADS - 1) / EPILOGUE_THREADS;
    // The thread's chunk u, i = t + u EPILOGUE_THREADS, is chunk t % 8 of panel row r0 + 12 u (r0 = t /
    // 8), at staged_offset(r0 + 12 u, t % 8) = (r0 + 12 u) 128 + ((t % 8) ^ ((r0 + 12 u) % 8)) 16,
    // where (r0 + 12 u) % 8 is (r0 % 8) ^ (4 u % 8): u's even and odd differ in the chunk's bit 2.
    static_assert(EPILOGUE_THREADS / 8 % 8 == 4, "the chunk offsets below assume 12 rows a step");
    const int r0 = t / 8, even = staged_offset(r0, t % 8), odd = even ^ (4 * 16);
    auto chunk_offset = [&](int u) {
        return t + u * EPILOGUE_THREADS < CHUNKS ? (u % 2 ? odd : even) + u * (EPILOGUE_THREADS / 8) * 128 : even;
    };
    for (int panel = 0; panel < BN / 64; panel++) {
        if (t == 0) asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(BN / 64 - 1) : "memory");
        named_barrier_sync(1, EPILOGUE_THREADS);
        const uint32_t panel_address = smem_address(staged + panel * (BM * 128));
        uint4 v[PER]; // 8 bf16 each, in 4 words
#pragma unroll
        for (int u = 0; u < PER; u++) v[u] = load_shared_16(panel_address + chunk_offset(u));
#pragma unroll
        for (int u = 0; u < PER; u++) {
            uint32_t* w = &v[u].x;
#pragma unroll
            for (int k = 0; k < 4; k++) // a bf16's bits are the top half of its float's
                w[k] = pack_bf16(gelu(__uint_as_float(w[k] << 16), 0.0f), gelu(__uint_as_float(w[k] & 0xFFFF0000u), 0.0f));
        }
#pragma unroll
        for (int u = 0; u < PER; u++)
            if (t + u * EPILOGUE_THREADS < CHUNKS) store_shared_16(panel_address + chunk_offset(u), v[u]);
        fence_proxy_async();
        named_barrier_sync(1, EPILOGUE_THREADS);
        if (t == 0) {
            tma_store_3d<false>(out_map, col0 + 64 * panel, row0, 0, staged + panel * (BM * 128));
            bulk_commit();
        }
    }
    if (t == 0) bulk_wait_all<true>();
    named_barrier_sync(1, EPILOGUE_THREADS);
}

__global__ void __launch_bounds__(THREADS, 1)
    matmul_gelu_kernel(const floatX* bias, const __grid_constant__ CUtensorMap inp_map,
                       const __grid_constant__ CUtensorMap weight_map, const __grid_constant__ CUtensorMap pre_map,
                       const __grid_constant__ CUtensorMap out_map, int N, int C, int OC) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_unaligned[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_unaligned + 1023) & ~(uintptr_t)1023);
    unsigned char* staged = smem + STAGES * STAGE_BYTES;
    uint64_t* full = (uint64_t*)(staged + STAGED_BYTES); // stage s loaded (its TMA bytes arrived)
    uint64_t* empty = full + STAGES;                     // stage s read by the products of all 8 warps
    uint64_t* staged_full = empty + STAGES;              // the staged tile written (256 threads)
    uint64_t* staged_free = staged_full + 1;             // the staged tile stored twice (the epilogue's first thread)
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

    const int col_blocks = (OC + BN - 1) / BN, tiles = (N + BM - 1) / BM * col_blocks, k_blocks = (C + BK - 1) / BK;
    const int warp = warp_index(), lane = threadIdx.x % 32;
    // A barrier's i-th wait (the staged tile's, or stage s's i-th use) is for phase parity i % 2;
    // the "free" barriers are waited on with the other parity, which a fresh barrier counts as done.
    if (warp == 0) { // the producer
        // Step L is this block's L-th k-block over all its tiles, loaded into stage L % STAGES once
        // empty[s] has completed the phase of step L - STAGES's release.
        const int steps = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * k_blocks;
        if (lane == 0)
            for (int L = 0; L < steps; L++) {
                const int s = L % STAGES, tile = blockIdx.x + L / k_blocks * gridDim.x, kb = L % k_blocks;
                if (L >= STAGES) mbarrier_wait(&empty[s], (L / STAGES - 1) & 1);
                mbarrier_expect_bytes(&full[s], STAGE_BYTES);
                tma_load_3d((void*)stage_a(s), &inp_map, kb * BK, tile / col_blocks * BM, 0, &full[s]);
                tma_load_3d((void*)stage_b(s), &weight_map, kb * BK, tile % col_blocks * BN, 0, &full[s]);
            }
        return;
    }
    if (warp < 4) { // the epilogue
        int i = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, i++) {
            mbarrier_wait(staged_full, i & 1);
            epilogue(staged, &pre_map, &out_map, tile / col_blocks * BM, tile % col_blocks * BN);
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
    float acc[128];
    int step = 0, i = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, i++) {
        const int col0 = tile % col_blocks * BN;
        for (int kb = 0; kb < k_blocks; kb++, step++) {
            const int s = step % STAGES;
            mbarrier_wait(&full[s], step / STAGES & 1);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 16; k++)
                wgmma_m64n256k16_shared_a(acc, wgmma_descriptor(stage_a(s) + group * 64 * BK + k * 16),
                                          wgmma_descriptor(stage_b(s) + k * 16), kb > 0 || k > 0);
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
        unsigned char* row = staged + (group * 64 + warp % 4 * 16 + lane / 8 % 2 * 8 + lane % 8) * 128;
        const int y = (lane / 16) ^ (lane % 8);
#pragma unroll
        for (int j = 0; j < BN / 8; j += 2) {
            float b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (bias)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int col = (j + h) * 8 + 2 * q;
                    if (col0 + col < OC) {
                        const __nv_bfloat162 v = *(const __nv_bfloat162*)(bias + col0 + col);
                        b[2 * h] = __low2float(v), b[2 * h + 1] = __high2float(v);
                    }
                }
            const float* a = acc + 4 * j;
            stmatrix_x4(row + j / 8 * (BM * 128) + ((j % 8) ^ y) * 16, pack_bf16(a[0] + b[0], a[1] + b[1]),
                        pack_bf16(a[2] + b[0], a[3] + b[1]), pack_bf16(a[4] + b[2], a[5] + b[3]),
                        pack_bf16(a[6] + b[2], a[7] + b[3]));
        }
        fence_proxy_async(); // these stores, visible to the TMA store's reads
        mbarrier_arrive(staged_full);
    }
#else
    (void)bias, (void)inp_map, (void)weight_map, (void)pre_map, (void)out_map, (void)N, (void)C, (void)OC;
    __trap();
#endif
}

// Whether this GPU runs matmul_gelu_kernel (sm90a_code_runs), which then gets its shared memory.
static bool gemm_gelu_available(void) {
    static int available = -1;
    if (available < 0) {
        available = sm90a_code_runs((const void*)matmul_gelu_kernel);
        if (available)
            cudaCheck(cudaFuncSetAttribute(matmul_gelu_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)SMEM_BYTES));
    }
    return available;
}
#endif

void matmul_forward_gelu(floatX* pre, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                         int N, int C, int OC, int ld_inp, int group_rows) {
    check_row_groups("matmul_forward_gelu", N, group_rows);
#if defined(PRECISION_BF16)
    // TMA wants rows 16 bytes apart and 16-byte aligned bases; the bias is read in pairs.
    const bool aligned = ((uintptr_t)pre | (uintptr_t)out | (uintptr_t)inp | (uintptr_t)weight) % 16 == 0 &&
                         (uintptr_t)bias % 4 == 0 && OC % 8 == 0 && C % 8 == 0 && ld_inp % 8 == 0;
    if (N > 0 && aligned && gemm_gelu_available()) {
        check_linear_ld("matmul_forward_gelu", C, ld_inp);
        // one launch whatever group_rows: each output's sum does not depend on N (above)
        const CUtensorMap inp_map =
            tensor_map_3d(inp, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, N, C, ld_inp, BM);
        const CUtensorMap weight_map =
            tensor_map_3d(weight, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, OC, C, C, BN);
        const CUtensorMap pre_map =
            tensor_map_3d(pre, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, N, OC, OC, BM);
        const CUtensorMap out_map =
            tensor_map_3d(out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(floatX), 1, N, OC, OC, BM);
        const int tiles = ceil_div(N, BM) * ceil_div(OC, BN);
        matmul_gelu_kernel<<<tiles < device_sm_count ? tiles : device_sm_count, THREADS, SMEM_BYTES>>>(
            bias, inp_map, weight_map, pre_map, out_map, N, C, OC);
        launchCheck();
        return;
    }
#endif
    matmul_forward(pre, inp, weight, bias, NULL, N, C, OC, ld_inp, group_rows);
    gelu_forward(out, pre, (size_t)N * OC);
}
