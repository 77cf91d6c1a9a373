// Where the time of one training step goes, kernel call by kernel call (nsys is not always at hand).
// Makes every kernel-interface call of model/gpt2.c's gpt2_zero_grad, gpt2_forward (with targets and
// a backward to follow), gpt2_backward, gpt2_reduce_gradients and gpt2_update (recompute 0, one
// process), in the same order and with the same arguments and shapes, and times each call site on its
// own with CUDA events: WARMUP calls, then the median of --repeats calls. Only layer 0's activations
// exist: the per-layer calls run on layer 0 and count L times per step (every layer's ln1 as layer
// 0's, which reads the encoder's output). Parameters, gradients and AdamW state are whole, so the
// encoder, the head and the optimizer run at full size. The weights are train_gpt's from scratch
// (model/init.h: layernorm weights 1, biases 0, so the activations have a training run's magnitudes,
// which the products' energy depends on); token ids and targets uniform in [0, V), or from a token
// file with --tokens (text repeats its frequent tokens far more); every activation is written
// by an earlier call of the step before a later one reads it (the head's rows over every slice of
// the batch, so that its backward writes the whole of dbuf_c), so no other buffer needs filling.
// The weight gradients are written or added as in a step of one micro-step (GRAD_WRITE for the
// layers' and the head's first slice): over the repetitions, other values, the same work. In a
// GRADS=BF16 build the kernels write a whole fp32 gradient array (the model's scratch of two layers,
// here whole: the same calls), a row times the micro-step's folds of all of it into the bf16
// gradients, and the norm and AdamW read those.
//
// Each timed call is queued behind a spin kernel, so the events measure its GPU time as it runs
// inside a step, where the host enqueues ahead of the GPU: neither launch latency nor cuBLASLt's
// per-call host setup is counted. Calls that synchronise (uploads, downloads, encoder_backward's
// host bucketing, grad_norm_squared's result) include their host work, as in a step.
//
// Prints one row per call site: calls per step, ms per call, ms per step, share of the summed step,
// and TFLOP/s (matmuls, attention) or GB/s (the rest; bytes read and written by the call's contract
// in kernels/kernels.h, not its cache traffic). Then the summed step and the tokens/s it implies,
// to set beside train_gpt's measured step, and the step's calls timed once more back to back: were
// it much longer than the sum, the gaps between kernels would be worth a CUDA graph of the step
// (on an H100, d12 B 64, 2026-11-25, it was 1.5 ms shorter: there are none to speak of).
// With --at-cap, a second table times every row again at the card's sustained clock (print_at_cap):
// a step in training holds a card at its power cap, where the burst sum is 10-12% short of it; with
// the card's energy counter (NVML) also each row's joules a step, which set about the step's time
// there (docs/performance.md: training runs the whole step at about one clock, which a row alone does not).
// Built by `make BUILD=DIR DIR/profile_step` (kernels/cuda/cuda.mk); scripts/profile_step.sh runs it.
#include <dlfcn.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "data/tokenfile.h"
#include "kernels/cuda/common.cuh"
#include "model/config.h"
#include "model/init.h"

#define WARMUP 3
// Longer than the host needs to enqueue any one call (cuBLASLt's heuristic query included).
#define SPIN_NS 1000000ull

// Keeps the GPU busy for ns nanoseconds of its global timer.
__global__ void spin_kernel(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

typedef struct {
    const char* name;
    int calls;           // per step
    double ms;           // median per call
    double flops, bytes; // per call; 0 when the row shows the other rate
} Row;

#define MAX_ROWS 48
static Row rows[MAX_ROWS];
static int num_rows;
static int repeats = 20;
static double at_cap_seconds = 0; // --at-cap: each row's time at the sustained clock too (at_cap_ms)
// Every row's call, for replaying the whole step back to back (step_back_to_back_ms).
static std::vector<std::function<void()>> row_calls;
// Rows 0 .. to - 1 once more, each call as many times as a step makes it, in the step's order:
// neighbouring rows with the same count of calls (a layer's, or a head slice's) take turns, one call
// each, so that each call finds in the L2 what the call before it in the step left there. Row by row
// (each row's 12 calls back to back) the forward and backward took 2.5% longer and 2% more energy at
// the cap (H200, 2026-11-27: 90.7 ms and 62.1 J a step against 88.4-89.0 ms and 60.7-61.3 J).
static void replay_rows(int to) {
    for (int first = 0, end; first < to; first = end) {
        for (end = first + 1; end < to && rows[end].calls == rows[first].calls; end++) {}
        for (int c = 0; c < rows[first].calls; c++)
            for (int i = first; i < end; i++) row_calls[i]();
    }
}

static int compare_floats(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return (x > y) - (x < y);
}

template <class Call> static void time_call(const char* name, int calls, double flops, double bytes, Call call) {
    if (num_rows == MAX_ROWS) fatal("profile_step: more than %d rows", MAX_ROWS);
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < WARMUP; i++) call(); // first calls grow scratch buffers and warm cuBLASLt
    float* times = (float*)xmalloc((size_t)repeats * sizeof(float), "timings");
    for (int i = 0; i < repeats; i++) {
        spin_kernel<<<1, 1>>>(SPIN_NS);
        launchCheck();
        cudaCheck(cudaEventRecord(start));
        call();
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&times[i], start, stop));
    }
    qsort(times, repeats, sizeof(float), compare_floats);
    Row row = {name, calls, 0.5 * ((double)times[(repeats - 1) / 2] + times[repeats / 2]), flops, bytes};
    rows[num_rows++] = row;
    row_calls.push_back(call);
    free(times);
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
}

// The GPU time of the whole step with every row's call made `calls` times in row order, queued
// behind one spin kernel long enough for the host to get ahead (it waits only at the calls that
// synchronise, as in a step). Against the sum of rows, this adds the gaps between kernels (the
// GPU's latency from one kernel to the next, the host's waits) and takes away what each row's own
// timing adds to its call (the events and the kernel's start). A whole step is long enough for
// the GPU to lower its clock under its power cap now and then (one of four single runs on an H100
// took 2.2 ms longer), so the shortest of `tries`, each after a second's rest, is kept.
static double step_back_to_back_ms(int tries) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    float best = INFINITY;
    for (int t = 0; t < tries; t++) {
        sleep(1);
        spin_kernel<<<1, 1>>>(50 * SPIN_NS);
        launchCheck();
        cudaCheck(cudaEventRecord(start));
        replay_rows(num_rows);
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        best = fminf(best, ms);
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return best;
}

// The card's energy counter (NVML's total energy, millijoules since the driver loaded), for the
// at-cap table's joules per call: under a power cap a call's energy, not its burst time, is what it
// costs the trained step. NVML is opened at run time, so that the build needs no NVML library and a
// card without the counter (it needs Volta or later) only loses those columns.
typedef int (*NvmlEnergyFn)(void* device, unsigned long long* millijoules);
static NvmlEnergyFn nvml_energy;
static void* nvml_device;
static void open_energy_counter(void) {
    void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) return;
    auto init = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
    auto by_bus_id = (int (*)(const char*, void**))dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2");
    auto energy = (NvmlEnergyFn)dlsym(nvml, "nvmlDeviceGetTotalEnergyConsumption");
    int device;
    char bus_id[32];
    unsigned long long mj;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device));
    if (init && by_bus_id && energy && init() == 0 && by_bus_id(bus_id, &nvml_device) == 0 &&
        energy(nvml_device, &mj) == 0)
        nvml_energy = energy;
}
// The counter now in millijoules, or -1 without one.
static double energy_mj(void) {
    unsigned long long mj;
    return nvml_energy && nvml_energy(nvml_device, &mj) == 0 ? (double)mj : -1.0;
}

// NVML's counter does not move continuously: the driver adds to it in steps (about every 100 ms on an
// H200, 2026-11-27), so a window read at arbitrary moments is off by up to a step at each end, 10% of
// a one-second window. An EnergyWindow polls the counter on a thread of its own while the calls run
// (the host may be blocked inside a call that synchronises) and keeps the first and the latest
// moment it moved: between two such moments both the energy and the host's clock are exact, and
// their ratio is the card's mean power over them.
struct EnergyWindow {
    std::atomic<int> moves{0};
    std::atomic<bool> done{false};
    double first_mj = 0.0, first_ms = 0.0, latest_mj = 0.0, latest_ms = 0.0; // the poller's, read after finish
    std::thread poller;
    void start(void) {
        if (!nvml_energy) return;
        poller = std::thread([this] {
            double last_mj = energy_mj();
            while (!done.load()) {
                usleep(100);
                const double mj = energy_mj();
                if (mj < 0.0 || mj == last_mj) continue;
                const double ms = 1e3 * wall_seconds();
                if (moves.load() == 0) first_mj = mj, first_ms = ms;
                latest_mj = mj, latest_ms = ms;
                last_mj = mj;
                moves++;
            }
        });
    }
    void finish(void) {
        done = true;
        if (poller.joinable()) poller.join();
    }
    double watts(void) const { return moves >= 2 ? (latest_mj - first_mj) / (latest_ms - first_ms) : -1.0; }
    double step_ms(void) const { return moves >= 2 ? (latest_ms - first_ms) / (moves - 1) : -1.0; }
};

// Runs `call` back to back until target_ms of GPU time have passed and, with a `window`, until its
// counter has moved once more after that (or a second later, should it have stopped). Batches of
// calls are queued one ahead of the batch the host waits for, so that the card never waits for the
// host. Returns the GPU time, and the calls made in *calls.
static double back_to_back_ms(const std::function<void()>& call, double target_ms, const EnergyWindow* window,
                              long* calls) {
    cudaEvent_t start, done[2];
    cudaCheck(cudaEventCreate(&start));
    for (cudaEvent_t& event : done) cudaCheck(cudaEventCreate(&event));
    int batch = 1, moves_at_target = -1;
    *calls = 0;
    auto queue = [&](cudaEvent_t event) {
        for (int i = 0; i < batch; i++) call();
        *calls += batch;
        cudaCheck(cudaEventRecord(event));
        batch = batch < 64 ? 2 * batch : 64;
    };
    cudaCheck(cudaEventRecord(start));
    queue(done[0]);
    for (int k = 1;; k ^= 1) {
        queue(done[k]);
        cudaCheck(cudaEventSynchronize(done[k ^ 1]));
        float elapsed;
        cudaCheck(cudaEventElapsedTime(&elapsed, start, done[k ^ 1]));
        if (elapsed < target_ms) continue;
        if (!window || !nvml_energy) break;
        if (moves_at_target < 0) moves_at_target = window->moves;
        if (window->moves > moves_at_target || elapsed > target_ms + 1e3) break;
    }
    cudaCheck(cudaDeviceSynchronize());
    float ms = 0.0f;
    for (cudaEvent_t& event : done) { // the later of the two batches' ends
        float elapsed;
        cudaCheck(cudaEventElapsedTime(&elapsed, start, event));
        ms = fmaxf(ms, elapsed);
    }
    cudaCheck(cudaEventDestroy(start));
    for (cudaEvent_t& event : done) cudaCheck(cudaEventDestroy(event));
    return ms;
}

// The GPU time of one call of `call` made back to back for `seconds` (after a tenth as long untimed,
// for the clock to settle to this call's own power), with the GPU already hot: the card's time for
// the call at its sustained clock. Under a power cap that clock is lower for a call that draws more
// power, so the time is then proportional to the call's energy. *mj_per_call: the card's energy a
// call, the mean power of an EnergyWindow over the timed calls times the call's time, or -1 without
// the counter; *counter_step_ms, if given: how often the counter moved (-1 without it).
static double at_cap_ms(const std::function<void()>& call, double seconds, double* mj_per_call,
                        double* counter_step_ms = NULL) {
    long calls;
    back_to_back_ms(call, 100 * seconds, NULL, &calls);
    EnergyWindow window;
    window.start();
    const double ms = back_to_back_ms(call, 1e3 * seconds, &window, &calls) / calls;
    window.finish();
    *mj_per_call = window.watts() >= 0.0 ? window.watts() * ms : -1.0;
    if (counter_step_ms) *counter_step_ms = window.step_ms();
    return ms;
}

// Every row again at the sustained clock (at_cap_ms), after the step's forward and backward rows
// (the first `heat_rows`: the forward's and the backward's) have run back to back
// for 10 x `seconds` to heat the card. Where training holds the card at its power cap (an H200 at
// 700 W; nvidia-smi's clocks_throttle_reasons.active 0x4), this sum, not the burst one, is what to set
// beside train_gpt's step, and a row's at-cap / burst ratio is what the cap costs it: about 1.0 for a
// row held by memory bandwidth, more for one that draws the most power per unit of work. With the
// card's energy counter, each row's joules a step and mean watts too: at the cap, the step's time is
// about its joules over the cap's watts, so the rows' joules say roughly what a change would give
// back in training. The joules total is printed only where every row has its joules.
static void print_at_cap(double seconds, int heat_rows, double burst_step_ms) {
    open_energy_counter();
    double heat_mj, counter_step_ms;
    const double heat_ms =
        at_cap_ms([heat_rows] { replay_rows(heat_rows); }, 10 * seconds, &heat_mj, &counter_step_ms);
    printf("\neach row again at the sustained clock: its call back to back for %.2f s on a hot card", seconds);
    if (counter_step_ms >= 0.0) printf(" (the energy counter moved every %.0f ms)", counter_step_ms);
    printf("\n");
    printf("%-31s %5s %9s %9s %9s %6s %9s %6s\n", "call", "calls", "burst ms", "at cap ms", "ms/step", "ratio",
           "J/step", "W");
    double step_ms = 0.0, heat_rows_ms = 0.0, step_mj = 0.0;
    bool every_row_mj = nvml_energy != NULL; // a counter that stopped leaves a row without joules
    for (int i = 0; i < num_rows; i++) {
        double mj;
        const double ms = at_cap_ms(row_calls[i], seconds, &mj);
        step_ms += rows[i].calls * ms;
        step_mj += rows[i].calls * mj;
        every_row_mj = every_row_mj && mj >= 0.0;
        if (i < heat_rows) heat_rows_ms += rows[i].calls * ms;
        printf("%-31s %5d %9.4f %9.4f %9.3f %6.3f", rows[i].name, rows[i].calls, rows[i].ms, ms, rows[i].calls * ms,
               ms / rows[i].ms);
        if (mj >= 0.0) printf(" %9.3f %6.0f", rows[i].calls * mj / 1e3, mj / ms);
        printf("\n");
    }
    printf("step at the sustained clock (sum of rows) %.2f ms, %.3f x the burst sum", step_ms, step_ms / burst_step_ms);
    if (every_row_mj) printf("; %.2f J, %.0f W on average", step_mj / 1e3, step_mj / step_ms);
    printf("\n");
    // The rows' calls in a step's mix, as a card runs them in training: were this much longer than
    // their sum above, the card would spend more on the mix than on each call alone.
    printf("zero_grad to the last backward row back to back at the sustained clock (the heating): %.2f ms "
           "a step, the sum of their rows above %.2f ms", heat_ms, heat_rows_ms);
    if (heat_mj >= 0.0) printf("; %.2f J a step, %.0f W", heat_mj / 1e3, heat_mj / heat_ms);
    printf("\n");
}

static double rows_ms(int from, int to) {
    double ms = 0.0;
    for (int i = from; i < to; i++) ms += rows[i].calls * rows[i].ms;
    return ms;
}

static void usage(void) {
    printf("usage: profile_step [-b B] [-t T] [--layers L] [--channels C] [--heads NH] [--repeats R]\n"
           "                    [--batch-invariant G] [--head-slice-tokens N] [--at-cap MS] [--tokens FILE]\n"
           "Times every kernel call of one training step (forward, backward, AdamW) on GPU 0.\n"
           "  -b N            micro-batch (default 64)\n"
           "  -t N            sequence length (default 1024)\n"
           "  --layers N      layers L (default 12)\n"
           "  --channels N    channels C (default 768)\n"
           "  --heads N       attention heads NH (default 12)\n"
           "  --repeats N     timed calls per row, the median is shown (default 20)\n"
           "  --batch-invariant G  as train_gpt's option: products and parameter gradient sums\n"
           "                  over groups of G sequences (a divisor of B; default 0: off)\n"
           "  --head-slice-tokens N  the head's slices, about N tokens of whole sequences (8192, 16384\n"
           "                  or 32768, the widest train_gpt takes where the memory allows: the default,\n"
           "                  as on an H100 or H200 at B 64; model/config.h)\n"
           "  --at-cap MS     then time every row at the card's sustained clock too: MS milliseconds of\n"
           "                  back-to-back calls each, on a card heated by 10 x MS of forward and\n"
           "                  backward (default 0: not; 500 is enough for an H200), with each row's\n"
           "                  joules a step and watts where NVML has the card's energy counter\n"
           "  --tokens FILE   the step's token ids and targets from the start of a token file (e.g.\n"
           "                  data/tinyshakespeare/tiny_shakespeare_train.bin) instead of uniform random\n"
           "                  ids: the encoder backward lasts as long as its most frequent token's chain\n");
}

int main(int argc, char** argv) {
    int B = 64, T = 1024, L = 12, C = 768, NH = 12, group_sequences = 0;
    int head_slice_tokens = GPT2_HEAD_WIDEST_SLICE_TOKENS;
    const char* token_path = NULL;
    enum { OPT_LAYERS = 1000, OPT_CHANNELS, OPT_HEADS, OPT_REPEATS, OPT_BATCH_INVARIANT, OPT_HEAD_SLICE, OPT_AT_CAP,
           OPT_TOKENS };
    static const struct option longs[] = {
        {"batch", 1, 0, 'b'}, {"seq-len", 1, 0, 't'}, {"layers", 1, 0, OPT_LAYERS},
        {"channels", 1, 0, OPT_CHANNELS}, {"heads", 1, 0, OPT_HEADS}, {"repeats", 1, 0, OPT_REPEATS},
        {"batch-invariant", 1, 0, OPT_BATCH_INVARIANT}, {"head-slice-tokens", 1, 0, OPT_HEAD_SLICE},
        {"at-cap", 1, 0, OPT_AT_CAP}, {"tokens", 1, 0, OPT_TOKENS},
        {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    opterr = 0;
    int c, index;
    while ((c = getopt_long(argc, argv, ":b:t:h", longs, &index)) != -1) {
        char name[64];
        if (c >= OPT_LAYERS) snprintf(name, sizeof name, "--%s", longs[index].name);
        else snprintf(name, sizeof name, "-%c", c);
        switch (c) {
        case 'b': B = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case 't': T = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case OPT_LAYERS: L = (int)parse_int_option(optarg, name, 1, 1024); break;
        case OPT_CHANNELS: C = (int)parse_int_option(optarg, name, 1, 65536); break;
        case OPT_HEADS: NH = (int)parse_int_option(optarg, name, 1, 65536); break;
        case OPT_REPEATS: repeats = (int)parse_int_option(optarg, name, 1, 10000); break;
        case OPT_BATCH_INVARIANT: group_sequences = (int)parse_int_option(optarg, name, 0, 1 << 20); break;
        case OPT_HEAD_SLICE: head_slice_tokens = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case OPT_AT_CAP: at_cap_seconds = parse_int_option(optarg, name, 0, 10000) / 1e3; break;
        case OPT_TOKENS: token_path = optarg; break;
        case 'h': usage(); return 0;
        case ':': fatal("option %s needs a value (see --help)", argv[optind - 1]);
        default: fatal("unknown option %s (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc) fatal("unexpected argument '%s' (see --help)", argv[optind]);
    if ((long long)B * T > (1 << 30)) fatal("-b %d x -t %d is more tokens than one step can hold", B, T);
    if (group_sequences && B % group_sequences != 0)
        fatal("--batch-invariant %d does not divide -b %d", group_sequences, B);
    // As train_gpt builds a model from scratch: wpe has 1024 rows unless T needs more.
    GPT2Config cfg = {T > 1024 ? T : 1024, GPT2_VOCAB_SIZE, gpt2_padded_vocab(GPT2_VOCAB_SIZE), L, NH, C};
    const char* problem = gpt2_config_problem(&cfg);
    if (problem) fatal("impossible model size (--layers %d --channels %d --heads %d): %s", L, C, NH, problem);
    const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size, N = B * T, HS = C / NH;
    backend_init(0);

    // ---- parameters, gradients, AdamW state: the whole model, as gpt2_build allocates them
    size_t sizes[NUM_PARAMETER_TENSORS];
    const size_t n = gpt2_parameter_sizes(&cfg, sizes);
    floatX* params = (floatX*)dev_malloc(n * sizeof(floatX), "parameters");
    float* grads = (float*)dev_malloc(n * sizeof(float), "gradients");
#if defined(GRADS_BF16)
    gradX* grads_x = (gradX*)dev_malloc(n * sizeof(gradX), "bf16 gradients");
    dev_memset_zero(grads_x, n * sizeof(gradX)); // the folds add into it: finite values for the norm and AdamW
#else
    gradX* grads_x = grads;
#endif
    float* master = sizeof(floatX) != sizeof(float) ? (float*)dev_malloc(n * sizeof(float), "master weights") : NULL;
    float* adam_m = (float*)dev_malloc(n * sizeof(float), "AdamW first moment");
    float* adam_v = (float*)dev_malloc(n * sizeof(float), "AdamW second moment");
    dev_memset_zero(adam_m, n * sizeof(float));
    dev_memset_zero(adam_v, n * sizeof(float));
    float* fp32_weights = master ? master : (float*)(void*)params;
    gpt2_initial_weights(fp32_weights, &cfg, 1337); // train_gpt -e's weights at its default seed
    if (master) floatX_from_float(params, master, n);
    // Tensor i of the parameters (p) and gradients (g); a per-layer tensor's start is layer 0's.
    floatX* p[NUM_PARAMETER_TENSORS];
    float* g[NUM_PARAMETER_TENSORS];
    for (size_t i = 0, offset = 0; i < NUM_PARAMETER_TENSORS; offset += sizes[i++]) {
        p[i] = params + offset;
        g[i] = grads + offset;
    }

    // With --batch-invariant the encoder adds into a wte gradient of its own (gpt2_backward).
    float* dwte_encoder = group_sequences ? (float*)dev_malloc(sizes[P_WTE] * sizeof(float), "wte encoder grad") : g[P_WTE];

    // ---- activations of one layer plus the head, as carve_activations lays them out for layer 0
    const size_t NC = (size_t)N * C, X = sizeof(floatX);
    floatX* encoded = (floatX*)dev_malloc(NC * X, "encoded");
    floatX* ln1 = (floatX*)dev_malloc(NC * X, "ln1");
    float* ln1_mean = (float*)dev_malloc((size_t)N * sizeof(float), "ln1 mean");
    float* ln1_rstd = (float*)dev_malloc((size_t)N * sizeof(float), "ln1 rstd");
    floatX* qkv = (floatX*)dev_malloc(3 * NC * X, "qkv");
    floatX* atty = (floatX*)dev_malloc(NC * X, "atty");
    void* att_saved = dev_malloc(attention_saved_bytes(B, T, NH), "attention saved state");
    floatX* residual2 = (floatX*)dev_malloc(NC * X, "residual2");
    const int ld_ln2 = linear_bias_ld(C); // fc's input with its bias columns, as the model has it
    floatX* ln2 = (floatX*)dev_malloc((size_t)N * ld_ln2 * X, "ln2");
    float* ln2_mean = (float*)dev_malloc((size_t)N * sizeof(float), "ln2 mean");
    float* ln2_rstd = (float*)dev_malloc((size_t)N * sizeof(float), "ln2 rstd");
    floatX* fch = (floatX*)dev_malloc(4 * NC * X, "fch");
    floatX* fch_gelu = (floatX*)dev_malloc(4 * NC * X, "fch_gelu");
    floatX* residual3 = (floatX*)dev_malloc(NC * X, "residual3");
    floatX* lnf = (floatX*)dev_malloc(NC * X, "lnf");
    float* lnf_mean = (float*)dev_malloc((size_t)N * sizeof(float), "lnf mean");
    float* lnf_rstd = (float*)dev_malloc((size_t)N * sizeof(float), "lnf rstd");
    // The head runs over slices of `slice` sequences (HN rows), as in gpt2_forward: head_classifier's
    // scratch holds one slice, and the head's row takes the slices in turn (a last, shorter slice as
    // a full one that ends at the batch's end).
    const int slice = gpt2_head_slice_sequences(B, T, group_sequences, head_slice_tokens), slices = ceil_div(B, slice);
    const int HN = slice * T;
    const int head_group_rows = group_sequences ? gpt2_head_group_sequences(slice, group_sequences) * T : HN;
    void* head_scratch = dev_malloc(head_scratch_bytes(HN, C, Vp), "the head's scratch");
    float* losses = (float*)dev_malloc((size_t)N * sizeof(float), "losses");
    floatX* dresidual = (floatX*)dev_malloc(NC * X, "dresidual");
    floatX* dbuf_c = (floatX*)dev_malloc(NC * X, "dbuf_c");
    floatX* dbuf_3c = (floatX*)dev_malloc(3 * NC * X, "dbuf_3c");
    floatX* dbuf_4c = (floatX*)dev_malloc(4 * NC * X, "dbuf_4c");
    void* att_scratch = dev_malloc(attention_scratch_bytes(B, T, C, NH), "attention scratch");
    int* inputs = (int*)dev_malloc((size_t)N * sizeof(int), "inputs");
    int* targets = (int*)dev_malloc((size_t)N * sizeof(int), "targets");

    // Token ids and targets from xorshift64, or the first N + 1 tokens of --tokens (targets one
    // further on, as the data loader has them). The distinct ids set encoder_backward's dwte traffic,
    // the most frequent one's count its length.
    int* host_inputs = (int*)xmalloc((size_t)N * sizeof(int), "inputs");
    int* host_targets = (int*)xmalloc((size_t)N * sizeof(int), "targets");
    float* host_losses = (float*)xmalloc((size_t)N * sizeof(float), "losses");
    if (token_path) {
        size_t count;
        uint16_t* file_tokens = tokenfile_read(token_path, V, &count);
        if (count < (size_t)N + 1)
            fatal("%s holds %zu tokens; -b %d x -t %d needs %d", token_path, count, B, T, N + 1);
        for (int i = 0; i < N; i++) host_inputs[i] = file_tokens[i], host_targets[i] = file_tokens[i + 1];
        free(file_tokens);
    } else {
        unsigned long long rng = 0x9E3779B97F4A7C15ull;
        for (int i = 0; i < 2 * N; i++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            int id = (int)(rng % (unsigned long long)V);
            if (i < N) host_inputs[i] = id;
            else host_targets[i - N] = id;
        }
    }
    int* occurrences = (int*)xcalloc((size_t)V, sizeof(int), "token id counts");
    size_t distinct = 0;
    int most = 0;
    for (int i = 0; i < N; i++) {
        distinct += occurrences[host_inputs[i]]++ == 0;
        if (occurrences[host_inputs[i]] > most) most = occurrences[host_inputs[i]];
    }
    free(occurrences);

    printf("profile_step: GPT-2 L %d, C %d, NH %d (HS %d), V %d, Vp %d, %zu parameters; B %d, T %d "
           "(%d tokens per step), recompute 0, the head in %d slices of %d tokens%s\n",
           L, C, NH, HS, V, Vp, n, B, T, N, slices, HN,
           group_sequences ? ", products and gradient sums per group of sequences (--batch-invariant)" : "");
    printf("%s | %s attention | precision %s\n", backend_describe(), attention_name(), PRECISION_NAME);
    printf("token ids: %s, %zu distinct, the most frequent %d times\n", token_path ? token_path : "uniform random",
           distinct, most);
    printf("each row: GPU time of one call, median of %d after %d warm-up calls, queued behind a spin "
           "kernel (launch latency hidden as in a step)\n\n", repeats, WARMUP);
    fflush(stdout);

    // Bytes of the memory-bound calls, from their contracts.
    const double ln_fwd_bytes = (2.0 * NC + 2.0 * C) * X + 2.0 * N * sizeof(float);
    // reads dout, inp, weight, mean, rstd and dinp, dweight, dbias (float); writes the last three
    const double ln_bwd_bytes = (4.0 * NC + C) * X + 4.0 * C * sizeof(float) + 2.0 * N * sizeof(float);
    const double mm = 2.0 * N * C; // FLOPs of a forward matmul per output channel of C inputs
    const double att_fwd_flops = 4.0 * B * NH * (double)T * T * HS / 2;

    // ---- gpt2_zero_grad
    size_t zero_start[NUM_PARAMETER_TENSORS], zero_count[NUM_PARAMETER_TENSORS], zeroed = 0;
    const int zero_runs = gpt2_zeroed_gradient_runs(sizes, zero_start, zero_count);
    for (int i = 0; i < zero_runs; i++) zeroed += zero_count[i];
    if (group_sequences) zeroed += sizes[P_WTE];
    time_call("zero_grad (memset)", 1, 0, zeroed * 4.0, [&] {
        for (int i = 0; i < zero_runs; i++) dev_memset_zero(grads + zero_start[i], zero_count[i] * sizeof(float));
        if (group_sequences) dev_memset_zero(dwte_encoder, sizes[P_WTE] * sizeof(float));
    });

    // ---- gpt2_forward
    const int forward_start = num_rows;
    // With --batch-invariant the products' rows and the gradient sums in groups of G sequences.
    const int group_rows = group_sequences ? group_sequences * T : N;
    time_call("upload inputs", 1, 0, N * sizeof(int), [&] { dev_upload(inputs, host_inputs, (size_t)N * sizeof(int)); });
    time_call("upload targets", 1, 0, N * sizeof(int), [&] { dev_upload(targets, host_targets, (size_t)N * sizeof(int)); });
    time_call("encoder_forward", 1, 0, 2.0 * NC * X + (double)T * C * X + N * sizeof(int),
              [&] { encoder_forward(encoded, inputs, p[P_WTE], p[P_WPE], B, T, C); });
    // Layer 0's ln1 reads the encoder's output, the others the previous layer's residual3: the same call.
    time_call("layernorm_forward ln1", L, 0, ln_fwd_bytes,
              [&] { layernorm_forward(ln1, ln1_mean, ln1_rstd, encoded, p[P_LN1W], p[P_LN1B], N, C, C); });
    time_call("matmul_forward qkv", L, mm * 3 * C, 0,
              [&] { matmul_forward(qkv, ln1, p[P_QKVW], p[P_QKVB], NULL, N, C, 3 * C, C, group_rows); });
    time_call("attention_forward", L, att_fwd_flops, 0,
              [&] { attention_forward(atty, att_saved, qkv, B, T, C, NH); });
    time_call("matmul_forward attproj + residual", L, mm * C, 0, [&] {
        matmul_forward(residual2, atty, p[P_ATTPROJW], p[P_ATTPROJB], encoded, N, C, C, C, group_rows);
    });
    time_call("layernorm_forward ln2", L, 0, ln_fwd_bytes,
              [&] { layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p[P_LN2W], p[P_LN2B], N, C, ld_ln2); });
    time_call("matmul_forward_gelu fc", L, mm * 4 * C, 0,
              [&] { matmul_forward_gelu(fch, fch_gelu, ln2, p[P_FCW], p[P_FCB], N, C, 4 * C, ld_ln2, group_rows); });
    time_call("matmul_forward fcproj + residual", L, mm * 4 * C, 0, [&] {
        matmul_forward(residual3, fch_gelu, p[P_FCPROJW], p[P_FCPROJB], residual2, N, 4 * C, C, 4 * C, group_rows);
    });
    time_call("layernorm_forward lnf", 1, 0, ln_fwd_bytes,
              [&] { layernorm_forward(lnf, lnf_mean, lnf_rstd, residual3, p[P_LNFW], p[P_LNFB], N, C, C); });
    const double head_mm = 2.0 * HN * C;
    // The slice the head's row works on, the next one at each call. Each step must write
    // every row of dbuf_c, where the layers' backward starts: with the first slice's rows alone, the
    // other rows kept what the last backward had left there (layer 0's dL/dln1, not the head's
    // gradient), and the backward's products drew less power on those values (H200, 2026-11-28: the
    // rows' sum at the cap 65.4 J a step, with every slice 71.4, training 71.0 on the same card).
    int head_slice = 0;
    auto head_row = [&] { // the slice's first row
        const size_t row = (size_t)head_slice * HN;
        return row + HN <= (size_t)N ? row : (size_t)N - HN;
    };
    // the head's product, the classifier and the head's backward (the logits' bytes where the backend
    // stores them are not counted)
    time_call("head_classifier lm head", slices, 3 * head_mm * Vp, 0, [&] {
        head_classifier(losses + head_row(), dbuf_c + head_row() * C, g[P_WTE], head_scratch, targets + head_row(),
                        1.0f / (float)N, lnf + head_row() * C, p[P_WTE], HN, C, V, Vp, head_group_rows,
                        head_slice == 0 ? GRAD_WRITE : GRAD_ADD);
        head_slice = (head_slice + 1) % slices;
    });
    time_call("download losses", 1, 0, N * sizeof(float),
              [&] { dev_download(host_losses, losses, (size_t)N * sizeof(float)); });

    // ---- gpt2_backward
    const int backward_start = num_rows;
    // The final layernorm's backward writes dresidual (GRAD_WRITE), as in the model: it reads no dinp.
    time_call("layernorm_backward lnf", 1, 0, ln_bwd_bytes - NC * X, [&] {
        layernorm_backward(dresidual, g[P_LNFW], g[P_LNFB], g[P_FCPROJB], dbuf_c, residual3, p[P_LNFW], lnf_mean,
                           lnf_rstd, N, C, group_rows, GRAD_WRITE);
    });
    time_call("matmul_backward_gelu fcproj", L, 2 * mm * 4 * C, 0, [&] {
        matmul_backward_gelu(dbuf_4c, g[P_FCPROJW], NULL, dresidual, fch_gelu, p[P_FCPROJW], fch, N, 4 * C, C,
                             group_rows, GRAD_WRITE);
    });
    time_call("matmul_backward fc", L, 2 * mm * 4 * C, 0,
              [&] { matmul_backward(dbuf_c, g[P_FCW], g[P_FCB], dbuf_4c, ln2, p[P_FCW], N, C, 4 * C, ld_ln2,
                                    group_rows, GRAD_WRITE); });
    time_call("layernorm_backward ln2", L, 0, ln_bwd_bytes, [&] {
        layernorm_backward(dresidual, g[P_LN2W], g[P_LN2B], g[P_ATTPROJB], dbuf_c, residual2, p[P_LN2W], ln2_mean,
                           ln2_rstd, N, C, group_rows, GRAD_ADD);
    });
    time_call("matmul_backward attproj", L, 2 * mm * C, 0, [&] {
        matmul_backward(dbuf_c, g[P_ATTPROJW], NULL, dresidual, atty, p[P_ATTPROJW], N, C, C, C, group_rows,
                        GRAD_WRITE);
    });
    time_call("attention_backward", L, 2.5 * att_fwd_flops, 0, [&] {
        attention_backward(dbuf_3c, g[P_QKVB], att_scratch, dbuf_c, qkv, atty, att_saved, B, T, C, NH, group_rows);
    });
    time_call("matmul_backward qkv", L, 2 * mm * 3 * C, 0,
              [&] { matmul_backward(dbuf_c, g[P_QKVW], NULL, dbuf_3c, ln1, p[P_QKVW], N, C, 3 * C, C, group_rows,
                                    GRAD_WRITE); });
    // (layer 0's ln1 has no fcproj below it: the model sums the bias gradient of fcproj in L - 1 of these)
    time_call("layernorm_backward ln1", L, 0, ln_bwd_bytes, [&] {
        layernorm_backward(dresidual, g[P_LN1W], g[P_LN1B], g[P_FCPROJB], dbuf_c, encoded, p[P_LN1W], ln1_mean,
                           ln1_rstd, N, C, group_rows, GRAD_ADD);
    });
    // reads dout and the ids, adds into the dwte rows of the distinct ids and into dwpe's T rows (with
    // --batch-invariant the model adds into a wte gradient of its own, then adds that to grads in
    // gpt2_reduce_gradients)
    time_call("encoder_backward", 1, 0, NC * X + N * sizeof(int) + 2.0 * (distinct + T) * C * X,
              [&] { encoder_backward(dwte_encoder, g[P_WPE], dresidual, inputs, B, T, C); });

    // ---- gpt2_reduce_gradients (one process: the norm) and gpt2_update (clip 1.0, weight decay 0.1 on
    // the 2-D weights, step 1)
    const int update_start = num_rows;
    float norm = 0.0f;
    if (group_sequences)
        time_call("float_accumulate wte", 1, 0, 3.0 * sizes[P_WTE] * sizeof(float),
                  [&] { float_accumulate(g[P_WTE], dwte_encoder, sizes[P_WTE]); });
#if defined(GRADS_BF16)
    // the model folds layer by layer (12 calls a layer, 4 for the rest); one call moves the same bytes
    time_call("gradX_fold (all, GRAD_ADD)", 1, 0, n * (4.0 + 2.0 * sizeof(gradX)),
              [&] { gradX_fold(grads_x, grads, n, GRAD_ADD); });
#endif
    time_call("grad_norm_squared", 1, 0, n * (double)sizeof(gradX),
              [&] { norm = sqrtf(grad_norm_squared(grads_x, n)); });
    const float grad_scale = norm > 1.0f ? 1.0f / norm : 1.0f;
    // reads grad, m, v and the fp32 weights; writes m, v, the parameters and the master weights. At
    // learning rate 0: the same loads, arithmetic and stores, with the weights left as the forward's
    // rows have them. At a real one each call moves every weight the same way (m and v of the same
    // gradient at step 1), and after the row's twenty-odd calls the replays below would find head rows
    // whose largest logit lies more than 60 nats above their target's, which head.cu makes again with
    // two more products: not the trained step's head.
    time_call("adamw_update (16 tensors)", 1, 0, n * (sizeof(gradX) + 8.0 + (master ? 4 : X) + 8.0 + X + (master ? 4 : 0)), [&] {
        size_t offset = 0;
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            adamw_update(p[i], master ? master + offset : NULL, grads_x + offset, adam_m + offset, adam_v + offset,
                         sizes[i], 0, 0.0f, 0.9f, 0.95f, 1e-8f, gpt2_is_weight_matrix(i) ? 0.1f : 0.0f, grad_scale, 1,
                         gpt2_tensor_seed(1337, i));
            offset += sizes[i];
        }
    });

    const double step_ms = rows_ms(0, num_rows);
    printf("%-31s %5s %9s %9s %6s %8s %8s\n", "call", "calls", "ms/call", "ms/step", "%step", "TFLOP/s", "GB/s");
    for (int i = 0; i < num_rows; i++) {
        const Row* r = &rows[i];
        char rate[32] = "";
        if (r->flops > 0) snprintf(rate, sizeof rate, "%8.1f %8s", r->flops / r->ms / 1e9, "");
        else snprintf(rate, sizeof rate, "%8s %8.0f", "", r->bytes / r->ms / 1e6);
        printf("%-31s %5d %9.4f %9.3f %5.1f%% %s\n", r->name, r->calls, r->ms, r->calls * r->ms,
               100.0 * r->calls * r->ms / step_ms, rate);
    }
    printf("\nzero_grad %.2f ms, forward %.2f ms, backward %.2f ms, update %.2f ms\n",
           rows_ms(0, forward_start), rows_ms(forward_start, backward_start),
           rows_ms(backward_start, update_start), rows_ms(update_start, num_rows));
    printf("step (sum of rows) %.2f ms, %.0f tokens/s\n", step_ms, N / (step_ms / 1e3));
    const double whole_ms = step_back_to_back_ms(5);
    printf("step (the rows back to back, shortest of 5) %.2f ms, %+.2f ms against the sum of rows\n", whole_ms,
           whole_ms - step_ms);
    if (at_cap_seconds > 0) print_at_cap(at_cap_seconds, update_start, step_ms);
    return 0;
}
