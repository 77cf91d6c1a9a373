// The table of NVIDIA GPUs' peak rates behind gpu_peak_tflops (gpu_peaks.h).
//
// Three rates per GPU, in TFLOP/s, all without structured sparsity (NVIDIA's sheets mark the sparse
// figures with an asterisk: the dense rate is half of those):
//   bf16: BF16 tensor-core products with FP32 accumulation, what the BF16 build's products run.
//         GeForce cards run FP32 accumulation at half their FP16-accumulation rate, so their figure
//         is half the one the product pages quote for "FP16 tensor"; data-centre and workstation cards
//         run both at one rate.
//   fp16: FP16 tensor-core products with FP32 accumulation, what the FP16 build's products run: the
//         bf16 rate on every card from Ampere on (their tensor cores run both at one rate); Turing
//         has this one only (the T4's data sheet's "mixed precision (FP16/FP32)" figure; on the
//         GeForce RTX 20xx, as on later GeForce cards, half the FP16-accumulation rate).
//   fp32: FP32 on the CUDA cores, what the FP32 build runs (cuBLASLt with CUBLAS_COMPUTE_32F, never
//         TF32; the fp32 flash attention uses no tensor cores).
// 0 where the GPU has no such rate: Turing (T4, GeForce RTX 20xx) has no BF16. Left out, so that
// their MFU reads n/a rather than a wrong number: the Quadro RTX 6000 and 8000, sold active and
// passive at other clocks under one name (130.5 and 119.4 tensor TFLOP/s), and the TITAN RTX,
// whose page gives 130 tensor TFLOP/s without saying with which accumulation.
//
// Sources:
//   - A100: NVIDIA A100 Tensor Core GPU Architecture whitepaper and the A100 data sheet (one rate
//     for SXM4 and PCIe, 40 and 80 GB).
//   - A10, A30, A40, L4, L40, L40S, T4: NVIDIA's data sheet of each card.
//   - H100 SXM5 and PCIe: NVIDIA H100 Tensor Core GPU Architecture whitepaper. H100 NVL: the H100
//     data sheet. H200 and H200 NVL: the H200 data sheet (the H200 is the H100 SXM5's chip and
//     clocks with other memory). GH200: the GH200 Grace Hopper Superchip data sheet. B200: NVIDIA's
//     HGX B200 specifications, per GPU (4.5 PFLOP/s sparse BF16).
//   - RTX A6000 and GeForce RTX 3070, 3080, 3090: NVIDIA Ampere GA102 GPU Architecture whitepaper
//     (v2, with the RTX A6000 appendix). RTX 6000 Ada, GeForce RTX 4080 (16GB) and 4090: NVIDIA Ada
//     GPU Architecture whitepaper. GeForce RTX 5090: NVIDIA RTX Blackwell GPU Architecture
//     whitepaper.
//   - The other GeForce cards: the SM count (CUDA cores / 128) and boost clock of NVIDIA's product
//     pages times the per-SM rates of their architecture's whitepaper: 512 dense BF16 FLOP per clock
//     per SM with FP32 accumulation (1024 with FP16 accumulation) and 256 FP32 FLOP per clock per SM,
//     the same for Ampere GA10x, Ada and Blackwell GeForce. The whitepapers' own figures are this
//     product: RTX 4090, 128 SMs x 2.52 GHz x 512 = 165.2.
//   - GeForce RTX 20xx (Turing): likewise, with the CUDA cores / 64 SMs at the reference boost clock
//     (not the Founders Editions') and the NVIDIA Turing GPU Architecture whitepaper's rates, 512
//     dense FP16 FLOP per clock per SM with FP32 accumulation and 128 FP32 FLOP per clock per SM. Its
//     own figures for the RTX 2080 Ti are this product: 68 SMs x 1.545 GHz, 53.8 and 13.4.
// The RTX 3080 12GB has 70 SMs where the 10GB card has 68 but the same name: its peak reads 3% low.
#include "common/gpu_peaks.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>

typedef struct {
    const char* name; // the device name as CUDA reports it, without "NVIDIA "
    int suffixed;     // 1: also the name followed by a space or '-' and anything
    double bf16, fp16, fp32;
} GpuPeak;

static const GpuPeak peaks[] = {
    // data centre
    {"A100", 1, 312, 312, 19.5},
    {"A10", 0, 125, 125, 31.2},
    {"A30", 0, 165, 165, 10.3},
    {"A40", 0, 149.7, 149.7, 37.4},
    {"L4", 0, 121, 121, 30.3},
    {"L40", 0, 181.05, 181.05, 90.5},
    {"L40S", 0, 362.05, 362.05, 91.6},
    {"H100", 1, 989.4, 989.4, 66.9}, // SXM5 ("H100 80GB HBM3")
    {"H100 PCIe", 1, 756, 756, 51.2},
    {"H100 NVL", 1, 835.5, 835.5, 60},
    {"H200", 1, 989.4, 989.4, 67},   // SXM
    {"H200 NVL", 1, 835.5, 835.5, 60},
    {"GH200", 1, 989.4, 989.4, 67},
    {"B200", 0, 2250, 2250, 75},
    {"T4", 0, 0, 65, 8.1},    // Turing: FP16 tensor cores, no BF16
    // workstation
    {"RTX A6000", 0, 154.8, 154.8, 38.7},
    {"RTX 6000 Ada Generation", 0, 364.2, 364.2, 91.1},
    // GeForce RTX 20 (Turing: FP16 and FP32 only)
    {"GeForce RTX 2060", 0, 0, 25.8, 6.45},
    {"GeForce RTX 2060 SUPER", 0, 0, 28.7, 7.18},
    {"GeForce RTX 2070", 0, 0, 29.9, 7.46},
    {"GeForce RTX 2070 SUPER", 0, 0, 36.2, 9.06},
    {"GeForce RTX 2080", 0, 0, 40.3, 10.1},
    {"GeForce RTX 2080 SUPER", 0, 0, 44.6, 11.2},
    {"GeForce RTX 2080 Ti", 0, 0, 53.8, 13.4},
    // GeForce RTX 30 (Ampere)
    {"GeForce RTX 3060", 0, 25.5, 25.5, 12.7},
    {"GeForce RTX 3060 Ti", 0, 32.4, 32.4, 16.2},
    {"GeForce RTX 3070", 0, 40.6, 40.6, 20.3},
    {"GeForce RTX 3070 Ti", 0, 43.5, 43.5, 21.7},
    {"GeForce RTX 3080", 0, 59.5, 59.5, 29.8},
    {"GeForce RTX 3080 Ti", 0, 68.2, 68.2, 34.1},
    {"GeForce RTX 3090", 0, 71, 71, 35.6},
    {"GeForce RTX 3090 Ti", 0, 80.0, 80.0, 40.0},
    // GeForce RTX 40 (Ada)
    {"GeForce RTX 4060", 0, 30.2, 30.2, 15.1},
    {"GeForce RTX 4060 Ti", 0, 44.1, 44.1, 22.1},
    {"GeForce RTX 4070", 0, 58.3, 58.3, 29.1},
    {"GeForce RTX 4070 SUPER", 0, 71.0, 71.0, 35.5},
    {"GeForce RTX 4070 Ti", 0, 80.2, 80.2, 40.1},
    {"GeForce RTX 4070 Ti SUPER", 0, 88.2, 88.2, 44.1},
    {"GeForce RTX 4080", 0, 97.5, 97.5, 48.7},
    {"GeForce RTX 4080 SUPER", 0, 104.4, 104.4, 52.2},
    {"GeForce RTX 4090", 0, 165.2, 165.2, 82.6},
    // GeForce RTX 50 (Blackwell)
    {"GeForce RTX 5060", 0, 38.4, 38.4, 19.2},
    {"GeForce RTX 5060 Ti", 0, 47.4, 47.4, 23.7},
    {"GeForce RTX 5070", 0, 61.7, 61.7, 30.9},
    {"GeForce RTX 5070 Ti", 0, 87.9, 87.9, 43.9},
    {"GeForce RTX 5080", 0, 112.6, 112.6, 56.3},
    {"GeForce RTX 5090", 0, 209.5, 209.5, 104.8},
};

// name without a leading prefix (any case), or name itself.
static const char* skip_prefix(const char* name, const char* prefix) {
    size_t n = strlen(prefix);
    return strncasecmp(name, prefix, n) == 0 ? name + n : name;
}

// The length of p's name when p matches the device name, else 0.
static size_t match_length(const GpuPeak* p, const char* name) {
    size_t n = strlen(p->name);
    if (strncasecmp(p->name, name, n) != 0) return 0;
    char next = name[n];
    return next == '\0' || (p->suffixed && (next == ' ' || next == '-')) ? n : 0;
}

double gpu_peak_tflops(const char* device_name, PeakPrecision precision, const char** entry) {
    if (entry) *entry = NULL;
    if (!device_name) return 0.0;
    const char* name = skip_prefix(skip_prefix(device_name, "NVIDIA "), "Tesla ");
    const GpuPeak* best = NULL;
    size_t best_length = 0;
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++) {
        size_t length = match_length(&peaks[i], name);
        if (length > best_length) best = &peaks[i], best_length = length;
    }
    if (!best) return 0.0;
    double tflops = precision == PEAK_BF16   ? best->bf16
                    : precision == PEAK_FP16 ? best->fp16
                    : precision == PEAK_FP32 ? best->fp32
                                             : 0.0;
    if (tflops > 0.0 && entry) *entry = best->name;
    return tflops;
}
