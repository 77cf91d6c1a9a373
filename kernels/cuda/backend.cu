// The CUDA backend's device, memory, conversions and weight initialisation.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gpu_peaks.h"
#include "kernels/cuda/common.cuh"

cublasHandle_t cublas_handle;
cublasLtHandle_t cublaslt_handle;
void* cublaslt_workspace;
size_t cublaslt_workspace_bytes = 32u << 20; // what cuBLASLt's fastest algorithms ask for on Hopper
int device_sm_count;
size_t device_shared_per_sm;
static char description[512];
static double peak_flops;
static char peak_source[512];

// Writes the __CUDA_ARCH__ of the code the GPU runs: the build's code for its architecture, or
// another's compiled by the driver from PTX (an sm_75 or sm_80 build on a newer card).
__global__ void code_arch_kernel(int* arch) {
#ifdef __CUDA_ARCH__
    *arch = __CUDA_ARCH__;
#endif
}

// Asked once, of the current GPU. A build without code for it (no SASS of its architecture nor PTX
// of an older one) is refused with what to build instead.
int device_code_arch(void) {
    static int arch = 0;
    if (arch) return arch;
    int device, major, minor;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    int* dev = (int*)dev_malloc(sizeof(int), "code architecture");
    code_arch_kernel<<<1, 1>>>(dev);
    const cudaError_t err = cudaGetLastError();
    if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorUnsupportedPtxVersion)
        fatal("this program holds no code that GPU %d (sm_%d%d) can run (%s): build it with GPU_ARCH=%d%d", device,
              major, minor, cudaGetErrorString(err), major, minor);
    cudaCheck(err);
    dev_download(&arch, dev, sizeof(int));
    dev_free(dev);
    return arch;
}

void backend_init(int device_index) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0)
        fatal("no usable CUDA GPU (cudaGetDeviceCount: %s); train_gpt needs an NVIDIA GPU and its "
              "driver, use train_gpt_cpu to train on the CPU",
              err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    // A launcher that gives each process one GPU (CUDA_VISIBLE_DEVICES per task, as some Slurm
    // set-ups do) leaves one visible device whatever the local rank.
    if (count == 1) device_index = 0;
    if (device_index < 0 || device_index >= count)
        fatal("GPU index %d does not exist: %d GPU(s) visible (CUDA_VISIBLE_DEVICES picks which)",
              device_index, count);
    cudaCheck(cudaSetDevice(device_index));
    cudaDeviceProp props;
    cudaCheck(cudaGetDeviceProperties(&props, device_index));
    device_sm_count = props.multiProcessorCount;
    device_shared_per_sm = props.sharedMemPerMultiprocessor;
    cublasCheck(cublasCreate(&cublas_handle));
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cublaslt_workspace = dev_malloc(cublaslt_workspace_bytes, "cuBLASLt workspace");
#if defined(PRECISION_BF16)
    if (props.major < 8)
        fatal("%s (sm_%d%d) has no bf16 tensor cores, which the BF16 build needs (sm_80 or newer): build with "
              "PRECISION=FP16 GPU_ARCH=%d%d", props.name, props.major, props.minor, props.major, props.minor);
#endif
    const int code_arch = device_code_arch();
    const char* precision = PRECISION_NAME;
#if defined(PRECISION_BF16)
    const PeakPrecision peak_precision = PEAK_BF16;
    const char* peak_kind = "dense BF16 tensor peak";
#elif defined(PRECISION_FP16)
    const PeakPrecision peak_precision = PEAK_FP16;
    const char* peak_kind = "dense FP16 tensor peak (FP32 accumulation)";
#else
    const PeakPrecision peak_precision = PEAK_FP32;
    const char* peak_kind = "FP32 peak without tensor cores";
#endif
    const char* entry;
    peak_flops = gpu_peak_tflops(props.name, peak_precision, &entry) * 1e12;
    if (entry) snprintf(peak_source, sizeof peak_source, "the %s of the %s (built-in table)", peak_kind, entry);
    else snprintf(peak_source, sizeof peak_source, "no %s peak known for %.256s", precision, props.name);
    const int path = forced_kernel_path();
    char path_note[128] = "";
    if (path) snprintf(path_note, sizeof path_note, ", the kernels of sm_%d (KERNEL_PATH)", path);
    else if (code_arch / 100 < props.major) // SASS runs only on its own major architecture: this code is PTX's
        snprintf(path_note, sizeof path_note, ", the sm_%d kernels (compiled from PTX by the driver)", code_arch / 10);
    snprintf(description, sizeof description, "%.256s (GPU %d, sm_%d%d, %.1f GiB), %s%s%s", props.name,
             device_index, props.major, props.minor, props.totalGlobalMem / 1073741824.0, precision, GRADS_NOTE,
             path_note);
}

const char* backend_describe(void) { return description; }
double backend_peak_flops(void) { return peak_flops; }
const char* backend_peak_source(void) { return peak_source; }
int backend_memory(size_t* free_bytes, size_t* total_bytes) {
    cudaCheck(cudaMemGetInfo(free_bytes, total_bytes));
    return 1;
}

void* dev_malloc(size_t bytes, const char* what) {
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError(); // clear the (non-sticky) allocation error before asking for the free size
        size_t free_bytes = 0, total_bytes = 0;
        cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
#if defined(ATTN_NAIVE)
        const char* attention_hint = ", or build with ATTN=flash (attention memory O(T), not O(T^2))";
#else
        const char* attention_hint = "";
#endif
        fatal("out of GPU memory: %s needs %zu bytes (%.2f GiB), %zu bytes (%.2f GiB) are free of "
              "%.2f GiB; lower -b (micro-batch) or -t, use -r 1 or 2 (recompute), -z 1 on several "
              "GPUs%s", what, bytes, bytes / 1073741824.0, free_bytes, free_bytes / 1073741824.0,
              total_bytes / 1073741824.0, attention_hint);
    }
    cudaCheck(err);
    return p;
}

void dev_free(void* p) { cudaCheck(cudaFree(p)); }
void dev_memset_zero(void* p, size_t bytes) { cudaCheck(cudaMemset(p, 0, bytes)); }
void dev_upload(void* dst_dev, const void* src_host, size_t bytes) {
    cudaCheck(cudaMemcpy(dst_dev, src_host, bytes, cudaMemcpyHostToDevice));
}
void dev_download(void* dst_host, const void* src_dev, size_t bytes) {
    cudaCheck(cudaMemcpy(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost));
}
void dev_copy(void* dst_dev, const void* src_dev, size_t bytes) {
    cudaCheck(cudaMemcpy(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice));
}
void dev_synchronize(void) { cudaCheck(cudaDeviceSynchronize()); }
void* dev_malloc_host(size_t bytes, const char* what) {
    void* p = NULL;
    cudaError_t err = cudaMallocHost(&p, bytes);
    if (err != cudaSuccess)
        fatal("cannot allocate %zu bytes of pinned host memory for %s: %s", bytes, what, cudaGetErrorString(err));
    return p;
}
void dev_free_host(void* p) { cudaCheck(cudaFreeHost(p)); }
void dev_upload_async(void* dst_dev, const void* src_host, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, 0));
}
// The event recorded after the last dev_download_async, for dev_wait_downloads.
static cudaEvent_t downloads_landed;
void dev_download_async(void* dst_host, const void* src_dev, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, 0));
    if (!downloads_landed) cudaCheck(cudaEventCreateWithFlags(&downloads_landed, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(downloads_landed, 0));
}
void dev_wait_downloads(void) {
    if (downloads_landed) cudaCheck(cudaEventSynchronize(downloads_landed));
}

// The copy streams of the slots (non-blocking: the legacy stream's kernels do not wait for them,
// nor they for the kernels, except through these events) and each slot's events: uploaded (on the
// upload stream), written (after the kernels that used the slot) and downloaded.
static cudaStream_t upload_stream, download_stream;
static cudaEvent_t slot_uploaded[DEV_SLOTS], slot_written[DEV_SLOTS], slot_downloaded[DEV_SLOTS];
static void slots_init(void) {
    if (upload_stream) return;
    cudaCheck(cudaStreamCreateWithFlags(&upload_stream, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&download_stream, cudaStreamNonBlocking));
    for (int i = 0; i < DEV_SLOTS; i++) {
        cudaCheck(cudaEventCreateWithFlags(&slot_uploaded[i], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&slot_written[i], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&slot_downloaded[i], cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(slot_downloaded[i], download_stream)); // free at the start
    }
}
void dev_slot_upload(int slot, void* dst_dev, const void* src_host, size_t bytes) {
    slots_init();
    cudaCheck(cudaStreamWaitEvent(upload_stream, slot_downloaded[slot], 0));
    cudaCheck(cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, upload_stream));
}
void dev_slot_ready(int slot) {
    slots_init();
    cudaCheck(cudaEventRecord(slot_uploaded[slot], upload_stream));
    cudaCheck(cudaStreamWaitEvent(0, slot_uploaded[slot], 0));
}
void dev_slot_download(int slot, void* dst_host, const void* src_dev, size_t bytes) {
    slots_init();
    cudaCheck(cudaEventRecord(slot_written[slot], 0));
    cudaCheck(cudaStreamWaitEvent(download_stream, slot_written[slot], 0));
    cudaCheck(cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, download_stream));
    cudaCheck(cudaEventRecord(slot_downloaded[slot], download_stream));
}

void* grow_scratch(void** buffer, size_t* capacity, size_t bytes, const char* what) {
    if (bytes > *capacity) {
        if (*buffer) dev_free(*buffer);
        *buffer = dev_malloc(bytes, what);
        *capacity = bytes;
    }
    return *buffer;
}

// cuTensorMapEncodeTiled is a driver function: reached through the runtime, so that nothing links
// libcuda.
CUtensorMap tensor_map_3d(const void* base, CUtensorMapDataType type, size_t element_bytes, int depth, int rows,
                          int width, int row_stride, int box_rows) {
    static decltype(&cuTensorMapEncodeTiled) encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault,
                                                   &found));
        if (found != cudaDriverEntryPointSuccess || !encode)
            fatal("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12)");
    }
    const cuuint64_t dims[3] = {(cuuint64_t)width, (cuuint64_t)rows, (cuuint64_t)depth};
    const cuuint64_t strides[2] = {(cuuint64_t)row_stride * element_bytes,
                                   (cuuint64_t)rows * row_stride * element_bytes};
    const cuuint32_t box[3] = {(cuuint32_t)(128 / element_bytes), (cuuint32_t)box_rows, 1}, element_strides[3] = {1, 1, 1};
    CUtensorMap map;
    const CUresult result = encode(&map, type, 3, (void*)base, dims, strides, box,
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS)
        fatal("cuTensorMapEncodeTiled failed (error %d) for a (%d, %d, %d) matrix with rows %d elements apart, in "
              "boxes of %d rows", (int)result, depth, rows, width, row_stride, box_rows);
    return map;
}

// KERNEL_PATH=sm75|sm80|sm86 (read once): an H100/H200 then runs the kernels of a card without
// sm_90a code, so it stands in for that card's arithmetic (sm75: the tiles of a T4, FP16 only; its
// m16n8k8 products need the sm_75 code, which an sm_75 build runs through the driver's JIT).
// Returns 75, 80, 86, or 0 when unset.
int forced_kernel_path(void) {
    static int path = -1;
    if (path < 0) {
        const char* value = getenv("KERNEL_PATH");
        if (!value || !value[0]) path = 0;
        else if (strcmp(value, "sm80") == 0) path = 80;
        else if (strcmp(value, "sm86") == 0) path = 86;
#if defined(PRECISION_FP16)
        else if (strcmp(value, "sm75") == 0) path = 75;
#endif
        else fatal("KERNEL_PATH=%s: use sm86 (the kernels of an RTX 30xx/40xx/50xx: cuBLASLt's products, the sm86 "
                   "attention tiles), sm80 (those of an A100: the sm80 tiles) or, in the FP16 "
                   "build, sm75 (those of a T4 or RTX 20xx: the sm75 tiles)", value);
    }
    return path;
}

bool sm90a_code_runs(const void* kernel) {
    if (forced_kernel_path()) return false;
    int device, major, minor;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cudaFuncAttributes attributes;
    cudaCheck(cudaFuncGetAttributes(&attributes, kernel));
    // binaryVersion is 90 also for sm_75 or sm_80 PTX that the driver compiled for this GPU:
    // device_code_arch tells that code, which holds no wgmma, apart.
    return major == 9 && minor == 0 && attributes.binaryVersion == 90 && device_code_arch() == 900;
}

template <class Dst, class Src> __global__ void convert_kernel(Dst* dst, const Src* src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = (Dst)(float)src[i];
}
template <class Dst, class Src> static void convert(Dst* dst, const Src* src, size_t n) {
    if (n == 0) return;
    convert_kernel<<<ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536, 256>>>(dst, src, n);
    launchCheck();
}
void floatX_from_float(floatX* dst, const float* src, size_t n) { convert(dst, src, n); }
void float_from_floatX(float* dst, const floatX* src, size_t n) { convert(dst, src, n); }

__global__ void float_accumulate_kernel(float* dst, const float* src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}
void float_accumulate(float* dst, const float* src, size_t n) {
    if (n == 0) return;
    float_accumulate_kernel<<<ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536, 256>>>(dst, src, n);
    launchCheck();
}

// The normals come from cuRAND's HOST generator, then are uploaded: its device generator gives the
// same Philox bits but its Box-Muller uses the GPU's logf/sincosf, so the values differ from the
// host generator's by a few ulp (seen with CUDA 13.0), and the two backends must start
// from identical weights (checked bit for bit by tests/test_kernels_gpu). As on the CPU, normals
// come in pairs, so an odd n takes its last value from a pair generated at offset + n - 1.
// Generated in chunks of an even size so that host memory stays small for any n.
void init_normal(float* dst, size_t n, float mean, float std, unsigned long long seed,
                 unsigned long long offset) {
    const size_t chunk = (size_t)1 << 22;
    float* host = (float*)xmalloc((n < chunk ? n + 1 : chunk) * sizeof(float), "init_normal buffer");
    curandGenerator_t gen;
    curandCheck(curandCreateGeneratorHost(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    curandCheck(curandSetPseudoRandomGeneratorSeed(gen, seed));
    for (size_t start = 0; start < n; start += chunk) {
        size_t count = n - start < chunk ? n - start : chunk;
        size_t even = count & ~(size_t)1;
        if (even > 0) {
            curandCheck(curandSetGeneratorOffset(gen, offset + start));
            curandCheck(curandGenerateNormal(gen, host, even, mean, std));
        }
        if (count != even) { // only in the last chunk: the pair's first value
            curandCheck(curandSetGeneratorOffset(gen, offset + start + even));
            curandCheck(curandGenerateNormal(gen, host + even, 2, mean, std));
        }
        dev_upload(dst + start, host, count * sizeof(float));
    }
    curandCheck(curandDestroyGenerator(gen));
    free(host);
}

// Second pass of column_sums_accumulate (common.cuh): each group's partial sums added in row
// order, then into the target group after group; blockIdx.y is the sum. A block's 32 columns'
// partials come from L2 into shared memory PARTIALS_CHUNK at a time, loaded by all its row lanes
// together, and lane 0 adds them in order (the same adds in the same order as one thread per
// column). With one thread per column loading its own partials (16 in flight), the layernorm
// backward's 3 sums of 768 columns, 256 partials each, ran in only 9 blocks, a latency-bound tail;
// this way they run in 72 blocks and take about 40% less time.
#define PARTIALS_CHUNK 256
__global__ void add_column_partials_kernel(ColumnSumTargets targets, const float* partials, int groups, int parts,
                                           int C) {
    __shared__ float chunk[PARTIALS_CHUNK][33]; // [partial][column]: conflict-free
    const int col = blockIdx.x * 32 + threadIdx.x;
    float* dst = blockIdx.y == 0 ? targets.dst[0] : blockIdx.y == 1 ? targets.dst[1] : targets.dst[2]; // no local copy
    partials += (size_t)blockIdx.y * groups * parts * C;
    float total = threadIdx.y == 0 && col < C ? dst[col] : 0.0f;
    for (int g = 0; g < groups; g++) {
        float sum = 0.0f;
        for (int k0 = 0; k0 < parts; k0 += PARTIALS_CHUNK) {
            const int n = min(PARTIALS_CHUNK, parts - k0);
#pragma unroll 16
            for (int k = threadIdx.y; k < n; k += COLSUM_LANES)
                chunk[k][threadIdx.x] = col < C ? partials[((size_t)g * parts + k0 + k) * C + col] : 0.0f;
            __syncthreads();
            if (threadIdx.y == 0)
#pragma unroll 16
                for (int k = 0; k < n; k++) sum += chunk[k][threadIdx.x];
            __syncthreads();
        }
        total += sum;
    }
    if (threadIdx.y == 0 && col < C) dst[col] = total;
}

void add_column_partials(ColumnSumTargets targets, int sums, const float* partials, int groups, int parts, int C) {
    add_column_partials_kernel<<<dim3(ceil_div(C, 32), sums), dim3(32, COLSUM_LANES)>>>(targets, partials, groups,
                                                                                         parts, C);
    launchCheck();
}

float* column_partials_buffer(size_t count) {
    static void* buffer;
    static size_t capacity;
    return (float*)grow_scratch(&buffer, &capacity, count * sizeof(float), "column-sum partials");
}
