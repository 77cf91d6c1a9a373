// dump_grads: the loss and every parameter gradient of one forward + backward of a GPT-2 on the
// first batch of a token file, written as fp32 to a file; and the comparison of two such files.
// Built against either backend exactly like the trainers (tests/dump_grads_cpu like train_gpt_cpu,
// tests/dump_grads like train_gpt), so tests/gpu/test_gpu_grads.sh can check the whole model's loss and
// gradients of every CUDA build against the CPU reference, tensor by tensor.
//
//   dump_grads TOKENS [--layers L --channels C --heads NH --max-seq N -b B -t T --seed S] -o OUT
//   dump_grads --compare REF TEST [--precision FP32|BF16|FP16] [--rtol X] [--etol X]
//
// The comparison takes the loss as a tensor of one element. A tensor passes when
//   ||test - ref||_2 / ||ref||_2 <= rtol   and   max |test - ref| <= etol * max |ref|
// and no value of either file is NaN or infinite. Defaults by --precision of the TEST build:
//   FP32: rtol 1e-5, etol 1e-4. Both sides compute in fp32 (cuBLAS without TF32) and differ only in
//         the order of sums: about sqrt(K) * 2^-24 = 1e-6 relative for a sum of K = 4C terms, grown
//         a little through the layers of the forward and the backward.
//   BF16: rtol 3e-2, etol 1e-1. Weights, activations and activation gradients are stored in bf16 (unit
//         roundoff 2^-8 = 3.9e-3) and each layer rounds a few times forward and backward: a few
//         roundings per layer of 2^-8 give errors of 1e-2 relative; elements that are sums with
//         cancellation lose more relative to themselves, hence etol against the largest element.
//         A GRADS=BF16 build rounds each parameter gradient to bf16 once more, within the same limits.
//   FP16: rtol 4e-3, etol 1.25e-2: the same with fp16's unit roundoff, 2^-11 = 4.9e-4, 8 times
//         smaller than bf16's (the dump scales the loss by 2^16 so that no gradient underflows).
// An element that the backward never writes keeps its zero (gpt2_zero_grad's, or the model's at build
// for the products' weight gradients, which the backward writes whole) and fails unless the
// reference's is (nearly) zero too.
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/dataloader.h"
#include "model/gpt2.h"

#define GRADS_MAGIC 20261121
#define GRADS_VERSION 1
#define DESCRIPTION_BYTES 128

// File layout: this header, then the loss (float), then the 16 gradient tensors as fp32 in
// model-file order.
typedef struct {
    int32_t magic, version, tensors;
    int32_t max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels, B, T;
    int32_t zero;        // keeps sizes 8-byte aligned
    int64_t sizes[NUM_PARAMETER_TENSORS];
    char description[DESCRIPTION_BYTES]; // backend and attention that computed it
} GradsHeader;

typedef struct {
    const char* tokens;
    const char* out;
    int layers, channels, heads, max_seq, B, T;
    unsigned long long seed;
    int compare;
    const char* precision;
    double rtol, etol; // < 0: the precision's default
} Options;

static void usage(FILE* f) {
    fprintf(f,
            "usage: dump_grads TOKENS [options] -o OUT      the loss and gradients of the first batch\n"
            "       dump_grads --compare REF TEST [--precision FP32|BF16|FP16] [--rtol X] [--etol X]\n"
            "  --layers N --channels N --heads N --max-seq N  model size (default 2, 64, 4, T)\n"
            "  -b N, -t N                 batch and sequence length (default 4, 64)\n"
            "  --seed N                   initialisation seed (default 1337)\n"
            "  -o FILE                    where to write the loss and the gradients\n"
            "  --compare REF TEST         compare TEST against REF, tensor by tensor\n"
            "  --precision FP32|BF16|FP16 default tolerances of TEST's build (default FP32)\n"
            "  --rtol X                   limit of ||test - ref|| / ||ref|| per tensor\n"
            "  --etol X                   limit of max |test - ref| / max |ref| per tensor\n");
}

static double parse_tolerance(const char* s, const char* option) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !(v >= 0.0 && v < 1.0))
        fatal("option %s: '%s' is not a tolerance in [0, 1)", option, s);
    return v;
}

enum { OPT_LAYERS = 1000, OPT_CHANNELS, OPT_HEADS, OPT_MAX_SEQ, OPT_SEED, OPT_COMPARE, OPT_PRECISION,
       OPT_RTOL, OPT_ETOL };

static Options parse_options(int argc, char** argv) {
    Options o = {.layers = 2, .channels = 64, .heads = 4, .B = 4, .T = 64, .seed = 1337,
                 .precision = "FP32", .rtol = -1.0, .etol = -1.0};
    static const struct option longs[] = {
        {"layers", 1, 0, OPT_LAYERS}, {"channels", 1, 0, OPT_CHANNELS}, {"heads", 1, 0, OPT_HEADS},
        {"max-seq", 1, 0, OPT_MAX_SEQ}, {"seed", 1, 0, OPT_SEED}, {"compare", 0, 0, OPT_COMPARE},
        {"precision", 1, 0, OPT_PRECISION}, {"rtol", 1, 0, OPT_RTOL}, {"etol", 1, 0, OPT_ETOL},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    opterr = 0;
    int c, index;
    while ((c = getopt_long(argc, argv, ":b:t:o:h", longs, &index)) != -1) {
        char name[64];
        if (c >= OPT_LAYERS) snprintf(name, sizeof name, "--%s", longs[index].name);
        else snprintf(name, sizeof name, "-%c", c);
        switch (c) {
        case 'b': o.B = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case 't': o.T = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case 'o': o.out = optarg; break;
        case OPT_LAYERS: o.layers = (int)parse_int_option(optarg, name, 1, 1024); break;
        case OPT_CHANNELS: o.channels = (int)parse_int_option(optarg, name, 1, 65536); break;
        case OPT_HEADS: o.heads = (int)parse_int_option(optarg, name, 1, 65536); break;
        case OPT_MAX_SEQ: o.max_seq = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case OPT_SEED: o.seed = (unsigned long long)parse_int_option(optarg, name, 0, 1LL << 40); break;
        case OPT_COMPARE: o.compare = 1; break;
        case OPT_PRECISION:
            if (strcmp(optarg, "FP32") && strcmp(optarg, "BF16") && strcmp(optarg, "FP16"))
                fatal("option --precision: '%s' is not FP32, BF16 or FP16", optarg);
            o.precision = optarg;
            break;
        case OPT_RTOL: o.rtol = parse_tolerance(optarg, name); break;
        case OPT_ETOL: o.etol = parse_tolerance(optarg, name); break;
        case 'h': usage(stdout); exit(0);
        case ':': fatal("option %s needs a value (see --help)", argv[optind - 1]);
        default: fatal("unknown option %s (see --help)", argv[optind - 1]);
        }
    }
    int positional = argc - optind;
    if (o.compare) {
        if (positional != 2) fatal("--compare needs two files, REF and TEST (see --help)");
    } else {
        if (positional != 1) fatal("give one token file (see --help)");
        if (!o.out) fatal("give the output file with -o (see --help)");
        o.tokens = argv[optind];
    }
    if (!o.max_seq) o.max_seq = o.T;
    return o;
}

// ---- dump --------------------------------------------------------------------------------

#if defined(PRECISION_FP16)
#define LOSS_SCALE 65536.0f
#else
#define LOSS_SCALE 1.0f
#endif

static int dump(const Options* o) {
    GPT2Config cfg = {.max_seq_len = o->max_seq, .vocab_size = GPT2_VOCAB_SIZE,
                      .padded_vocab_size = gpt2_padded_vocab(GPT2_VOCAB_SIZE),
                      .num_layers = o->layers, .num_heads = o->heads, .channels = o->channels};
    const char* problem = gpt2_config_problem(&cfg);
    if (problem) fatal("impossible model size: %s", problem);
    DataLoader loader;
    dataloader_init(&loader, o->tokens, o->B, o->T, 0, 1, 0, 0, cfg.vocab_size);
    dataloader_next_batch(&loader); // tokens 0 .. B*T of the file

    backend_init(0);
    GPT2 model;
    // no recompute, no ZeRO, no --batch-invariant groups: one process
    GPT2BuildSpec spec = {.config = cfg, .B = o->B, .T = o->T, .world = 1, .head_slice_tokens = GPT2_HEAD_SLICE_TOKENS};
    gpt2_build(&model, &spec);
    gpt2_init_random(&model, o->seed);
    gpt2_zero_grad(&model);
    // The FP16 build's gradients underflow fp16 without a loss scale, as its training scales them
    // (train.c's --loss-scale, from 2^16): the loss times LOSS_SCALE, the gradients divided by it
    // after (exactly: a power of two).
    gpt2_forward(&model, loader.inputs, loader.targets, o->B, o->T, LOSS_SCALE / (float)(o->B * o->T));
    size_t count;
    const float* losses = gpt2_losses(&model, &count);
    float loss = (float)(gpt2_loss_sum(losses, count) / (double)count);
    gpt2_backward(&model, 0);

    size_t n = model.num_parameters;
    float* host = xmalloc(n * sizeof(float), "gradients");
    gpt2_get_gradients(&model, host); // fp32, or a GRADS=BF16 build's bf16 as floats
    for (size_t i = 0; i < n; i++) host[i] /= LOSS_SCALE;

    GradsHeader h;
    memset(&h, 0, sizeof h);
    h.magic = GRADS_MAGIC;
    h.version = GRADS_VERSION;
    h.tensors = NUM_PARAMETER_TENSORS;
    h.max_seq_len = cfg.max_seq_len;
    h.vocab_size = cfg.vocab_size;
    h.padded_vocab_size = cfg.padded_vocab_size;
    h.num_layers = cfg.num_layers;
    h.num_heads = cfg.num_heads;
    h.channels = cfg.channels;
    h.B = o->B;
    h.T = o->T;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) h.sizes[i] = (int64_t)model.param_sizes[i];
    snprintf(h.description, sizeof h.description, "%s, %s attention", backend_describe(), attention_name());
    FILE* f = xfopen(o->out, "wb");
    xfwrite(&h, sizeof h, 1, f, o->out);
    xfwrite(&loss, sizeof loss, 1, f, o->out);
    xfwrite(host, sizeof(float), n, f, o->out);
    if (fclose(f) != 0) fatal("cannot write %s: %s", o->out, strerror(errno));
    printf("%s: loss %.7f, %zu gradients of L %d, C %d, NH %d, B %d, T %d written to %s\n", h.description,
           loss, n, cfg.num_layers, cfg.channels, cfg.num_heads, o->B, o->T, o->out);

    free(host);
    gpt2_free(&model);
    dataloader_free(&loader);
    return 0;
}

// ---- compare -----------------------------------------------------------------------------

typedef struct {
    GradsHeader h;
    float* values; // the loss, then every gradient
    size_t count;
} Grads;

static void grads_read(const char* path, Grads* g) {
    long long bytes = file_size(path);
    if (bytes < (long long)sizeof g->h) fatal("%s: %lld bytes, too short for a gradient dump", path, bytes);
    FILE* f = xfopen(path, "rb");
    xfread(&g->h, sizeof g->h, 1, f, path);
    if (g->h.magic != GRADS_MAGIC || g->h.version != GRADS_VERSION || g->h.tensors != NUM_PARAMETER_TENSORS)
        fatal("%s: not a gradient dump of dump_grads (magic %d, version %d, %d tensors)", path,
              g->h.magic, g->h.version, g->h.tensors);
    g->h.description[DESCRIPTION_BYTES - 1] = '\0';
    g->count = 1;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (g->h.sizes[i] < 1 || g->h.sizes[i] > (1LL << 40)) fatal("%s: impossible tensor size %lld", path, (long long)g->h.sizes[i]);
        g->count += (size_t)g->h.sizes[i];
    }
    long long want = (long long)sizeof g->h + (long long)(g->count * sizeof(float));
    if (bytes != want) fatal("%s: %lld bytes, the header announces %lld", path, bytes, want);
    g->values = xmalloc(g->count * sizeof(float), path);
    xfread(g->values, sizeof(float), g->count, f, path);
    fclose(f);
}

// Checks one tensor (or the loss) and prints its line; returns 1 when it passes.
static int compare_tensor(const char* name, const float* ref, const float* test, size_t n, double rtol,
                          double etol) {
    double max_diff = 0.0, max_ref = 0.0, sq_diff = 0.0, sq_ref = 0.0;
    size_t nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(ref[i]) || !isfinite(test[i])) { nonfinite++; continue; }
        double d = fabs((double)test[i] - (double)ref[i]), r = fabs((double)ref[i]);
        if (d > max_diff) max_diff = d;
        if (r > max_ref) max_ref = r;
        sq_diff += d * d;
        sq_ref += r * r;
    }
    double rel = sq_ref > 0.0 ? sqrt(sq_diff / sq_ref) : (sq_diff > 0.0 ? INFINITY : 0.0);
    int ok = nonfinite == 0 && rel <= rtol && max_diff <= etol * max_ref;
    char extra[64] = "";
    if (nonfinite) snprintf(extra, sizeof extra, " (%zu NaN or inf)", nonfinite);
    printf("%-4s %-8s %9zu elements  max|diff| %.3e (limit %.3e)  max|ref| %.3e  ||diff||/||ref|| %.3e (limit %.0e)%s\n",
           ok ? "PASS" : "FAIL", name, n, max_diff, etol * max_ref, max_ref, rel, rtol, extra);
    return ok;
}

static int compare(const Options* o, const char* ref_path, const char* test_path) {
    int bf16 = strcmp(o->precision, "BF16") == 0, fp16 = strcmp(o->precision, "FP16") == 0;
    double rtol = o->rtol >= 0.0 ? o->rtol : bf16 ? 3e-2 : fp16 ? 4e-3 : 1e-5;
    double etol = o->etol >= 0.0 ? o->etol : bf16 ? 1e-1 : fp16 ? 1.25e-2 : 1e-4;
    Grads ref, test;
    grads_read(ref_path, &ref);
    grads_read(test_path, &test);
    if (memcmp(&ref.h, &test.h, offsetof(GradsHeader, description)) != 0)
        fatal("%s and %s are of different models or batches (L, C, NH, max T, V, B, T or sizes differ)",
              ref_path, test_path);
    printf("reference: %s (%s)\ntest:      %s (%s)\n", ref_path, ref.h.description, test_path, test.h.description);
    printf("L %d, C %d, NH %d, max T %d, B %d, T %d; %s tolerance per tensor: ||test - ref|| / ||ref|| <= %.0e "
           "and max |test - ref| <= %.0e max |ref|, no NaN or inf\n", ref.h.num_layers, ref.h.channels,
           ref.h.num_heads, ref.h.max_seq_len, ref.h.B, ref.h.T, o->precision, rtol, etol);
    int failed = !compare_tensor("loss", ref.values, test.values, 1, rtol, etol);
    size_t offset = 1;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = (size_t)ref.h.sizes[i];
        failed += !compare_tensor(parameter_tensor_names[i], ref.values + offset, test.values + offset, n, rtol, etol);
        offset += n;
    }
    printf("%s: %d of %d (loss and %d gradient tensors) outside the %s tolerance\n", failed ? "FAIL" : "PASS",
           failed, 1 + NUM_PARAMETER_TENSORS, NUM_PARAMETER_TENSORS, o->precision);
    free(ref.values);
    free(test.values);
    return failed ? 1 : 0;
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Options o = parse_options(argc, argv);
    return o.compare ? compare(&o, argv[optind], argv[optind + 1]) : dump(&o);
}
