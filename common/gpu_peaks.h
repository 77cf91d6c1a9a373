// NVIDIA GPUs' peak arithmetic rates by device name, for the MFU (model FLOPs utilisation) that
// train_gpt prints: a pure lookup, no CUDA, so that the CPU build compiles and tests it too.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PEAK_BF16, // dense BF16 tensor-core products with FP32 accumulation (the BF16 build's products)
    PEAK_FP16, // dense FP16 tensor-core products with FP32 accumulation (the FP16 build's products)
    PEAK_FP32, // FP32 without tensor cores, no TF32 (the FP32 build's products)
} PeakPrecision;

// The dense peak in TFLOP/s of the GPU that CUDA names device_name (cudaDeviceProp.name, e.g.
// "NVIDIA GeForce RTX 4070 Ti SUPER", "NVIDIA H100 80GB HBM3"), for precision; 0 when the table does
// not know the GPU or the GPU lacks the precision (BF16 on a T4). *entry, when entry is not NULL,
// is the table's name for the GPU ("GeForce RTX 4070 Ti SUPER", "H100"), or NULL when unknown.
//
// Matching: a leading "NVIDIA " (and "Tesla ") is ignored and case does not matter. Most entries
// match the whole remaining name, so that a laptop part ("... RTX 4090 Laptop GPU") or a cut-down
// variant ("... RTX 4090 D") is unknown rather than given the desktop card's rate. A few data-centre
// entries also match the name followed by a space or '-' and anything (memory size, form factor:
// "A100-SXM4-80GB", "H100 80GB HBM3"). Where several entries match, the longest wins ("H100 PCIe"
// over "H100").
double gpu_peak_tflops(const char* device_name, PeakPrecision precision, const char** entry);

#ifdef __cplusplus
}
#endif
