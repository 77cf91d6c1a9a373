// Tests of the peak table behind the MFU (common/gpu_peaks.c), by the device names CUDA reports:
//  - data-centre and workstation cards against their data sheets' figures, written out here as the
//    sheets print them (sparse ones halved), within the sheets' rounding;
//  - GeForce and workstation cards against their SM count and boost clock times the per-SM rates of
//    the architecture whitepapers (dense BF16 with FP32 accumulation: 512 FLOP per clock per SM on
//    GeForce, 1024 on the workstation cards; FP32: 256);
//  - Turing's GeForce cards likewise, with FP16 in place of BF16 (Turing has none) and its own rates;
//  - the matching: the most specific name wins, case does not matter, laptop and cut-down parts
//    and names the table lacks give 0, BF16, FP16 and FP32 are told apart (the T4 has no BF16).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/gpu_peaks.h"
#include "tests/lib/testutil.h"

// The peak of device for precision is want within rtol (relative), and it names a table entry.
static void expect_peak(const char* device, PeakPrecision precision, double want, double rtol) {
    const char* entry = NULL;
    double got = gpu_peak_tflops(device, precision, &entry);
    char name[160];
    snprintf(name, sizeof name, "%s %s", device,
             precision == PEAK_BF16 ? "BF16" : precision == PEAK_FP16 ? "FP16" : "FP32");
    test_check(fabs(got - want) <= rtol * want && entry != NULL, name, "%g TFLOP/s (want %g within %g%%), entry %s",
               got, want, 100 * rtol, entry ? entry : "(none)");
}

// device matches the table entry want_entry, with the BF16 peak want_bf16 exactly.
static void expect_entry(const char* device, const char* want_entry, double want_bf16) {
    const char* entry = NULL;
    double got = gpu_peak_tflops(device, PEAK_BF16, &entry);
    char name[160];
    snprintf(name, sizeof name, "'%s' is %s", device, want_entry);
    test_check(entry && strcmp(entry, want_entry) == 0 && got == want_bf16, name, "entry %s, %g TFLOP/s (want %g)",
               entry ? entry : "(none)", got, want_bf16);
}

// device's peaks are its SM count x boost clock (MHz) x its architecture's dense FLOP per clock per
// SM: tensor_per_clock for `tensor` (BF16, or FP16 on Turing), fp32_per_clock for FP32. The table
// gives one decimal (the RTX 3090's whitepaper figure, 71, none).
static void expect_derived(const char* device, int sms, int mhz, PeakPrecision tensor, int tensor_per_clock,
                           int fp32_per_clock) {
    const double sm_ghz = sms * (mhz / 1000.0);
    expect_peak(device, tensor, sm_ghz * tensor_per_clock / 1000.0, 0.005);
    expect_peak(device, PEAK_FP32, sm_ghz * fp32_per_clock / 1000.0, 0.005);
}

// device (Turing) has no BF16 peak, and no entry is named for it.
static void expect_no_bf16(const char* device) {
    const char* entry = "unset";
    double bf16 = gpu_peak_tflops(device, PEAK_BF16, &entry);
    char name[160];
    snprintf(name, sizeof name, "%s has no BF16 peak", device);
    test_check(bf16 == 0.0 && entry == NULL, name, "%g, entry %s", bf16, entry ? entry : "(none)");
}

// device is unknown: 0 for both precisions and no entry.
static void expect_unknown(const char* device) {
    const char* entry_bf16 = "unset", *entry_fp32 = "unset";
    double bf16 = gpu_peak_tflops(device, PEAK_BF16, &entry_bf16);
    double fp32 = gpu_peak_tflops(device, PEAK_FP32, &entry_fp32);
    char name[160];
    snprintf(name, sizeof name, "'%s' is unknown", device ? device : "(null)");
    test_check(bf16 == 0.0 && fp32 == 0.0 && !entry_bf16 && !entry_fp32, name, "BF16 %g (%s), FP32 %g (%s)", bf16,
               entry_bf16 ? entry_bf16 : "no entry", fp32, entry_fp32 ? entry_fp32 : "no entry");
}

int main(void) {
    // Data sheets: BF16 tensor with FP32 accumulation (dense) and FP32, TFLOP/s as printed.
    const struct { const char* device; double bf16, fp32; } sheets[] = {
        {"NVIDIA A100-SXM4-80GB", 312, 19.5},
        {"NVIDIA A100-SXM4-40GB", 312, 19.5},
        {"NVIDIA A100-PCIE-40GB", 312, 19.5},
        {"NVIDIA A100 80GB PCIe", 312, 19.5},
        {"NVIDIA A10", 125, 31.2},
        {"NVIDIA A30", 165, 10.3},
        {"NVIDIA A40", 149.7, 37.4},
        {"NVIDIA L4", 242 / 2.0, 30.3},
        {"NVIDIA L40", 181.05, 90.5},
        {"NVIDIA L40S", 362.05, 91.6},
        {"NVIDIA H100 80GB HBM3", 1979 / 2.0, 67},
        {"NVIDIA H100 PCIe", 1513 / 2.0, 51},
        {"NVIDIA H100 NVL", 1671 / 2.0, 60},
        {"NVIDIA H200", 1979 / 2.0, 67},
        {"NVIDIA H200 NVL", 1671 / 2.0, 60},
        {"NVIDIA GH200 480GB", 1979 / 2.0, 67},
        {"NVIDIA B200", 4500 / 2.0, 75},
        {"NVIDIA RTX A6000", 309.7 / 2, 38.7},
        {"NVIDIA RTX 6000 Ada Generation", 1457.0 / 4, 91.1}, // the sheet gives FP8, sparse
    };
    // The sheets round to 3 or 4 digits (the H100 PCIe's FP32 to 51, its whitepaper says 51.2).
    for (size_t i = 0; i < sizeof sheets / sizeof sheets[0]; i++) {
        expect_peak(sheets[i].device, PEAK_BF16, sheets[i].bf16, 0.002);
        expect_peak(sheets[i].device, PEAK_FP16, sheets[i].bf16, 0.002); // one rate for both since Ampere
        expect_peak(sheets[i].device, PEAK_FP32, sheets[i].fp32, 0.004);
    }
    expect_peak("Tesla T4", PEAK_FP32, 8.1, 0.001);
    expect_peak("Tesla T4", PEAK_FP16, 65, 0.001); // the data sheet's mixed precision (FP16/FP32)

    // SMs x boost clock x the architecture's rate per SM and clock.
    const struct { const char* device; int sms, mhz, bf16_per_clock; } derived[] = {
        {"NVIDIA GeForce RTX 3060", 28, 1777, 512},
        {"NVIDIA GeForce RTX 3060 Ti", 38, 1665, 512},
        {"NVIDIA GeForce RTX 3070", 46, 1725, 512},
        {"NVIDIA GeForce RTX 3070 Ti", 48, 1770, 512},
        {"NVIDIA GeForce RTX 3080", 68, 1710, 512},
        {"NVIDIA GeForce RTX 3080 Ti", 80, 1665, 512},
        {"NVIDIA GeForce RTX 3090", 82, 1695, 512},
        {"NVIDIA GeForce RTX 3090 Ti", 84, 1860, 512},
        {"NVIDIA GeForce RTX 4060", 24, 2460, 512},
        {"NVIDIA GeForce RTX 4060 Ti", 34, 2535, 512},
        {"NVIDIA GeForce RTX 4070", 46, 2475, 512},
        {"NVIDIA GeForce RTX 4070 SUPER", 56, 2475, 512},
        {"NVIDIA GeForce RTX 4070 Ti", 60, 2610, 512},
        {"NVIDIA GeForce RTX 4070 Ti SUPER", 66, 2610, 512},
        {"NVIDIA GeForce RTX 4080", 76, 2505, 512},
        {"NVIDIA GeForce RTX 4080 SUPER", 80, 2550, 512},
        {"NVIDIA GeForce RTX 4090", 128, 2520, 512},
        {"NVIDIA GeForce RTX 5060", 30, 2497, 512},
        {"NVIDIA GeForce RTX 5060 Ti", 36, 2572, 512},
        {"NVIDIA GeForce RTX 5070", 48, 2512, 512},
        {"NVIDIA GeForce RTX 5070 Ti", 70, 2452, 512},
        {"NVIDIA GeForce RTX 5080", 84, 2617, 512},
        {"NVIDIA GeForce RTX 5090", 170, 2407, 512},
        {"NVIDIA RTX A6000", 84, 1800, 1024},
        {"NVIDIA RTX 6000 Ada Generation", 142, 2505, 1024},
    };
    for (size_t i = 0; i < sizeof derived / sizeof derived[0]; i++)
        expect_derived(derived[i].device, derived[i].sms, derived[i].mhz, PEAK_BF16, derived[i].bf16_per_clock, 256);
    // Turing GeForce: FP16 (no BF16) with FP32 accumulation at 512 FLOP per clock per SM, FP32 at 128
    // (64 CUDA cores an SM), at the reference boost clock.
    const struct { const char* device; int sms, mhz; } turing[] = {
        {"NVIDIA GeForce RTX 2060", 30, 1680},       {"NVIDIA GeForce RTX 2060 SUPER", 34, 1650},
        {"NVIDIA GeForce RTX 2070", 36, 1620},       {"NVIDIA GeForce RTX 2070 SUPER", 40, 1770},
        {"NVIDIA GeForce RTX 2080", 46, 1710},       {"NVIDIA GeForce RTX 2080 SUPER", 48, 1815},
        {"NVIDIA GeForce RTX 2080 Ti", 68, 1545},
    };
    for (size_t i = 0; i < sizeof turing / sizeof turing[0]; i++) {
        expect_derived(turing[i].device, turing[i].sms, turing[i].mhz, PEAK_FP16, 512, 128);
        expect_no_bf16(turing[i].device);
    }
    expect_peak("NVIDIA GeForce RTX 2080 Ti", PEAK_FP16, 53.8, 0); // the Turing whitepaper's figures
    expect_peak("NVIDIA GeForce RTX 2080 Ti", PEAK_FP32, 13.4, 0);

    // The most specific name wins, in any case.
    expect_entry("NVIDIA GeForce RTX 4070 Ti SUPER", "GeForce RTX 4070 Ti SUPER", 88.2);
    expect_entry("NVIDIA GeForce RTX 4070 Ti", "GeForce RTX 4070 Ti", 80.2);
    expect_entry("NVIDIA GeForce RTX 4070 SUPER", "GeForce RTX 4070 SUPER", 71.0);
    expect_entry("NVIDIA GeForce RTX 4070", "GeForce RTX 4070", 58.3);
    expect_entry("NVIDIA GeForce RTX 4070 Ti Super", "GeForce RTX 4070 Ti SUPER", 88.2);
    expect_entry("nvidia geforce rtx 4080 super", "GeForce RTX 4080 SUPER", 104.4);
    expect_entry("NVIDIA H100 PCIe", "H100 PCIe", 756);
    expect_entry("NVIDIA H100 NVL", "H100 NVL", 835.5);
    expect_entry("NVIDIA H100 80GB HBM3", "H100", 989.4);
    expect_entry("NVIDIA H200 NVL", "H200 NVL", 835.5);
    expect_entry("NVIDIA H200", "H200", 989.4);
    expect_entry("NVIDIA GH200 480GB", "GH200", 989.4);
    expect_entry("NVIDIA L40S", "L40S", 362.05);
    expect_entry("NVIDIA L40", "L40", 181.05);
    expect_entry("NVIDIA L4", "L4", 121);
    expect_entry("NVIDIA A100-SXM4-80GB", "A100", 312);
    expect_entry("NVIDIA A10", "A10", 125);
    // older drivers' names, without "NVIDIA "
    expect_entry("GeForce RTX 3090", "GeForce RTX 3090", 71);
    expect_entry("A100-SXM4-40GB", "A100", 312);

    // Unknown: names the table lacks, laptop and cut-down parts, names that only start like an entry.
    const char* unknown[] = {
        "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 3080 Ti Laptop GPU", "NVIDIA GeForce RTX 4090 D",
        "NVIDIA A10G", "NVIDIA H20", "NVIDIA H800", "NVIDIA H1000", "Quadro RTX 6000", "NVIDIA GeForce GTX 1080 Ti",
        "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 3050", "NVIDIA TITAN RTX", "Quadro RTX 8000",
        "NVIDIA GeForce RTX 2080 with Max-Q Design", "NVIDIA GeForce GTX 1660 Ti", "NVIDIA", "", "CPU", NULL,
    };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) expect_unknown(unknown[i]);

    // The precisions apart: the T4 has FP32 but no BF16.
    expect_no_bf16("Tesla T4");
    double bf16 = gpu_peak_tflops("NVIDIA GeForce RTX 4090", PEAK_BF16, NULL);
    double fp32 = gpu_peak_tflops("NVIDIA GeForce RTX 4090", PEAK_FP32, NULL);
    test_check(bf16 == 165.2 && fp32 == 82.6, "RTX 4090 BF16 and FP32 peaks apart (entry NULL allowed)", "%g and %g",
               bf16, fp32);
    return test_summary("gpu_peaks");
}
