// train_gpt / train_gpt_cpu: trains a GPT-2 on token files. The same program for both backends;
// all layer math lives behind kernels/kernels.h and the model orchestration in model/gpt2.c.
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoints/checkpoint.h"
#include "common/atomic_file.h"
#include "common/config_file.h"
#include "common/dist.h"
#include "common/rendezvous.h"
#include "common/util.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "eval/evaluate.h"
#include "model/fit.h"
#include "model/generate.h"
#include "model/gpt2.h"

// ---- options -----------------------------------------------------------------------------

#define MAX_STEPS (1 << 30) // the most -x allows: a training state beyond it is damaged

// --loss-scale's default: fp16's gradients (FP16 build) underflow below 2^-24 without a scale; bf16
// and fp32 have float's range and need none.
#if defined(PRECISION_FP16)
#define LOSS_SCALE_DEFAULT "dynamic"
#else
#define LOSS_SCALE_DEFAULT "0"
#endif

typedef struct {
    const char* train_pattern;  // -i
    const char* val_pattern;    // -j
    const char* model;          // -e: d12 | d24 | d36 | d48 | a model file
    const char* out_dir;        // -o
    const char* vocab_dir;      // --vocab
    int B, T;                   // -b (0: auto), -t
    long long total_batch;      // -d, tokens per optimizer step (-1: B*T*world, 4*T*world with -b auto)
    double memory_limit;        // --memory-limit, GiB (0: the free memory)
    const char* offload;        // --offload: auto | 0 | 1
    double host_memory_limit;   // --host-memory-limit, GiB (0: MemAvailable)
    float peak_tflops;          // --peak-tflops, a GPU's peak for the MFU (0: the built-in table's)
    int dry_run;                // --dry-run: print the plan and the fit, then exit
    int max_steps;              // -x (-1: one epoch)
    float lr;                   // -l
    int warmup;                 // -u
    float final_lr_frac;        // -q
    const char* schedule;       // -k: cosine | linear | constant
    float weight_decay;         // -c
    float grad_clip;            // --grad-clip
    float beta1, beta2;         // --beta1, --beta2: AdamW's moment decays
    float max_loss;             // --max-loss (0: no bound; < 0: twice an untrained model's loss)
    float skip_loss_z, skip_norm_z; // --skip-loss-z, --skip-norm-z (0: off)
    int max_skips;              // --max-skips (0: never stop)
    const char* loss_scale;     // --loss-scale: 0 (off) | dynamic
    int loss_scale_growth;      // --loss-scale-growth: applied steps without overflow before doubling
    const char* inject_nan_loss; // --inject-nan-loss, --inject-nan-grad: step lists (tests only)
    const char* inject_nan_grad;
    int val_every, val_batches; // -v, -m
    const char* hellaswag;      // --hellaswag: llm.c's evaluation file (NULL: none)
    int hellaswag_limit;        // --hellaswag-limit (0: every example)
    const char* hellaswag_dump; // --hellaswag-dump: every ending's score to this file
    int sample_every, gen_tokens; // -s, -g
    float temperature;          // --temperature (0: greedy)
    int top_k;                  // --top-k
    float top_p;                // --top-p
    const char* prompt;         // --prompt: generate from this text instead of training
    const char* prompt_file;    // --prompt-file
    int checkpoint_every;       // -n
    int resume;                 // -y
    const char* allow_change;   // --allow-change: options a resume may change (NULL: none)
    int keep;                   // --keep
    int overwrite;              // --overwrite: delete an earlier run in -o first
    int recompute;              // -r (-1: the lowest that fits with -b auto, else 0)
    int group_sequences;        // --batch-invariant: sequences per gradient sum (0: off)
    int zero_stage;             // -z
    const char* nccl_dir;       // --nccl-dir (NULL: the output directory)
    double nccl_timeout;        // --nccl-timeout, seconds
    int shuffle;                // --shuffle
    unsigned long long seed;    // --seed
    int layers, channels, heads, max_seq; // custom sizes (0: not given)
} Options;

static Options default_options(void) {
    Options o = {
        .train_pattern = "data/tinyshakespeare/tiny_shakespeare_train.bin",
        .val_pattern = "data/tinyshakespeare/tiny_shakespeare_val.bin",
        .model = "d12", .out_dir = "out", .vocab_dir = "data/gpt2",
        .B = 0, .T = 1024, .total_batch = -1, .max_steps = -1,
        .lr = 3e-4f, .warmup = 0, .final_lr_frac = 1.0f, .schedule = "cosine",
        .weight_decay = 0.0f, .grad_clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f,
        .max_loss = -1.0f, .skip_loss_z = 0.0f, .skip_norm_z = 0.0f, .max_skips = 8,
        .loss_scale = LOSS_SCALE_DEFAULT, .loss_scale_growth = 2000,
        .val_every = 20, .val_batches = 20, .sample_every = 20, .gen_tokens = 64,
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
        .checkpoint_every = 0, .resume = 0, .keep = 0, .recompute = -1, .zero_stage = 0, .offload = "auto",
        .shuffle = 0, .seed = 1337, .nccl_dir = NULL, .nccl_timeout = 300.0,
    };
    return o;
}

// prog: the name the program was started with (train_gpt or train_gpt_cpu), without its directory.
static void print_usage(const char* prog) {
    Options d = default_options();
    printf("usage: %s [options]\n"
           "  -f, --config FILE         options from FILE, one 'name value' per line (long names without\n"
           "                            dashes, # comments); options after -f override the file's\n"
           "data\n"
           "  -i, --train FILE|GLOB     training tokens (default %s)\n"
           "  -j, --val FILE|GLOB       validation tokens (default %s)\n"
           "      --shuffle 0|1         seeded shuffle of the training batches (default %d)\n"
           "      --vocab DIR           encoder.json + vocab.bpe to decode samples (default %s)\n"
           "model\n"
           "  -e, --model d12|d24|d36|d48|FILE  size to train from scratch, or a model file (default %s)\n"
           "      --layers N --channels N --heads N --max-seq N  any size from scratch\n"
           "      --seed N              initialisation seed (default %llu)\n"
           "batch and schedule\n"
           "  -b, --batch N|auto        micro-batch size; auto: the largest that divides the per-GPU\n"
           "                            batch -d/(T*GPUs) and fits the memory (default auto)\n"
           "  -t, --seq-len N           sequence length (default %d)\n"
           "  -d, --total-batch N       tokens per optimizer step; gradient accumulation makes up the\n"
           "                            difference (default B*T*GPUs; 4*T*GPUs with -b auto)\n"
           "  -x, --steps N             optimizer steps (default -1: one epoch)\n"
           "  -l, --lr F                peak learning rate (default %g)\n"
           "  -u, --warmup N            linear warmup steps (default %d)\n"
           "  -k, --schedule NAME       cosine | linear | constant after warmup (default %s)\n"
           "  -q, --final-lr-frac F     final learning rate as a fraction of the peak (default %g)\n"
           "  -c, --weight-decay F      AdamW weight decay of 2-D weights (default %g)\n"
           "      --grad-clip F         global gradient norm clip, 0 = off (default %g)\n"
           "      --beta1 F, --beta2 F  AdamW's decay of the gradient's mean and of its square\n"
           "                            (default %g, %g; eps 1e-8)\n"
           "divergence guard (a skipped step changes no weight or optimizer state; the data move on;\n"
           "a step whose loss or gradient norm is NaN or infinite is always skipped)\n"
           "      --max-loss F          skip a step whose loss is above F nats, 0 = no bound (default\n"
           "                            2 ln V = %.2f: twice the loss of an untrained model)\n"
           "      --skip-loss-z Z       skip a step whose loss is more than Z standard deviations above\n"
           "                            the mean loss of the last %d applied steps, 0 = off (default %g)\n"
           "      --skip-norm-z Z       the same for the gradient norm (default %g)\n"
           "      --max-skips N         stop with exit status 1 after N skipped steps in a row (overflow\n"
           "                            skips of --loss-scale aside), saving nothing, 0 = never\n"
           "                            (default %d)\n"
           "      --loss-scale 0|dynamic  dynamic: multiply the loss by a power of two (from 2^16, at most\n"
           "                            2^24) before the backward and divide the gradients by it in the\n"
           "                            update, which keeps small gradients from underflowing in low\n"
           "                            precision; a step whose gradient overflows (norm not finite, loss\n"
           "                            finite) is skipped, halves the scale and does not count toward\n"
           "                            --max-skips unless the scale has collapsed (an overflow at scale\n"
           "                            1). FP32 trains the same bits as without it (default %s)\n"
           "      --loss-scale-growth N double the loss scale after N applied steps in a row without\n"
           "                            overflow (default %d)\n"
           "evaluation and sampling\n"
           "  -v, --val-every N         validation loss every N steps, 0 = never (default %d)\n"
           "  -m, --val-batches N       validation batches of -d/(T*GPUs) sequences per GPU, at most\n"
           "                            the whole validation file (default %d)\n"
           "      --hellaswag FILE      HellaSwag accuracy (llm.c's acc_norm) at the start, every -v steps\n"
           "                            and after the last step, from llm.c's evaluation file (prepare_data\n"
           "                            --hellaswag); an example longer than -t is refused, as llm.c does\n"
           "      --hellaswag-limit N   evaluate the first N examples only, 0 = all (default 0)\n"
           "      --hellaswag-dump FILE write every evaluated ending's score (its mean loss) to FILE as\n"
           "                            CSV (step,example,label,prediction,loss0..loss3); with several\n"
           "                            GPUs each rank writes its examples to FILE.rankN\n"
           "  -s, --sample-every N      sample every N steps, 0 = never (default %d)\n"
           "  -g, --gen-tokens N        tokens to sample (default %d)\n"
           "      --temperature F       sampling temperature, 0 = greedy (default %g)\n"
           "      --top-k N             sample among the N most likely tokens, 0 = all (default %d)\n"
           "      --top-p F             sample among the fewest most likely tokens whose\n"
           "                            probabilities add up to F (nucleus), 1 = all (default %g)\n"
           "generating text (no training, nothing written)\n"
           "      --prompt TEXT         with -x 0: continue TEXT with the model of -e FILE (or the\n"
           "                            latest checkpoint in -o DIR), -g tokens, streamed to stdout\n"
           "      --prompt-file FILE    the prompt from a file\n"
           "output and checkpoints\n"
           "  -o, --out DIR             log.csv, model files and training state (default %s)\n"
           "  -n, --checkpoint-every N  save model and training state every N steps, 0 = only at\n"
           "                            the end and on SIGINT/SIGTERM (default %d)\n"
           "                            Ctrl-C (or SIGTERM) stops after the current step and saves;\n"
           "                            a second Ctrl-C quits at once without saving\n"
           "  -y, --resume 0|1          resume from the latest training state in DIR (default %d), with\n"
           "                            the options recorded in DIR/run.conf: -y 1 -o DIR is enough.\n"
           "                            Options that change the run (data, model, batch, schedule,\n"
           "                            optimizer, seed) differing from the recorded ones are refused\n"
           "      --allow-change LIST   ... unless LIST names them (e.g. steps,lr): the run goes on\n"
           "                            with the new values from the resumed step (a new -x rescales\n"
           "                            the learning-rate decay from there on)\n"
           "      --keep K              keep the K newest checkpoints, 0 = all (default %d)\n"
           "      --overwrite           delete the earlier run's log.csv and checkpoints in DIR first;\n"
           "                            without it (or -y 1) a DIR holding them is refused\n"
           "memory\n"
           "  -r, --recompute 0|1|2     recompute GELU (1) and also layernorms (2) in the backward\n"
           "                            instead of storing them (default: the lowest that fits with\n"
           "                            -b auto, else 0)\n"
           "      --memory-limit GIB    plan -b auto for a card of GIB GiB (default: the free memory;\n"
           "                            on the CPU the host's available memory), less a %.1f GiB margin\n"
           "      --offload auto|0|1    keep AdamW m, v and the master weights in pinned host memory,\n"
           "                            streamed through the GPU at each update (the same bits); auto:\n"
           "                            only when the run does not fit the GPU otherwise (default %s)\n"
           "      --host-memory-limit GIB  the host memory offloading may plan with (default: MemAvailable;\n"
           "                            with --dry-run, the host memory of the machine planned for)\n"
           "      --dry-run             print the memory plan and what -b auto chooses for --memory-limit,\n"
           "                            then exit, touching no GPU (runs where there is none)\n"
           "      --batch-invariant G   sum the parameter gradients over groups of G sequences, so that\n"
           "                            every -b that is a multiple of G trains the same bits on one GPU\n"
           "                            model (-b auto picks such a B); 0 = off. Costs smaller products and\n"
           "                            fp32 adds of the groups' gradients: G 1 slows an H100 d12 step by\n"
           "                            ~20%%, G 8 by ~1%% (docs/options.md); not with GRADS=BF16's bf16\n"
           "                            gradients (default %d)\n"
           "speed\n"
           "      --peak-tflops F       the peak TFLOP/s of one GPU that the MFU (model FLOPs utilisation)\n"
           "                            of the step lines and log.csv is a fraction of; 0: the built-in\n"
           "                            table's dense BF16 (FP16, FP32 in those builds) peak of the GPU,\n"
           "                            'MFU n/a' for a GPU not in it; on the CPU there is no MFU without\n"
           "                            it\n"
           "                            (default 0)\n"
           "several GPUs (one process per GPU; rank from RANK/WORLD_SIZE/LOCAL_RANK, mpirun or srun;\n"
           "the ranks meet over TCP at MASTER_ADDR:MASTER_PORT when both are set, else through a file)\n"
           "  -z, --zero 0|1            ZeRO stage: 1 shards AdamW state and master weights (default %d)\n"
           "      --nccl-dir DIR        meet through a file in DIR, which all ranks see, even when\n"
           "                            MASTER_ADDR is set (default without MASTER_ADDR: -o)\n"
           "      --nccl-timeout S      give up when the ranks do not meet within S seconds (default %g)\n"
           "testing (fault injection for the tests of the divergence guard, never needed to train)\n"
           "      --inject-nan-loss STEPS  make the loss of these steps (e.g. 5,9-12) NaN on the last rank\n"
           "      --inject-nan-grad STEPS  make a gradient value of these steps NaN on the last rank\n"
           "  -h, --help                this help\n",
           prog, d.train_pattern, d.val_pattern, d.shuffle, d.vocab_dir, d.model, d.seed, d.T,
           (double)d.lr, d.warmup, d.schedule, (double)d.final_lr_frac, (double)d.weight_decay,
           (double)d.grad_clip, (double)d.beta1, (double)d.beta2, 2.0 * log(GPT2_VOCAB_SIZE), STEP_HISTORY,
           (double)d.skip_loss_z,
           (double)d.skip_norm_z, d.max_skips, d.loss_scale, d.loss_scale_growth, d.val_every, d.val_batches,
           d.sample_every, d.gen_tokens,
           (double)d.temperature, d.top_k, (double)d.top_p, d.out_dir, d.checkpoint_every, d.resume, d.keep,
           FIT_MARGIN_BYTES / 1073741824.0, d.offload, d.group_sequences, d.zero_stage, d.nccl_timeout);
}

static float parse_float(const char* s, const char* option, double lo, double hi) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v)) fatal("option %s: '%s' is not a number", option, s);
    if (v < lo || v > hi) fatal("option %s: %g is outside %g..%g", option, v, lo, hi);
    return (float)v;
}

enum { OPT_LAYERS = 1000, OPT_CHANNELS, OPT_HEADS, OPT_MAX_SEQ, OPT_SEED, OPT_VOCAB, OPT_KEEP,
       OPT_TEMPERATURE, OPT_TOP_K, OPT_TOP_P, OPT_PROMPT, OPT_PROMPT_FILE, OPT_SHUFFLE, OPT_GRAD_CLIP,
       OPT_BETA1, OPT_BETA2, OPT_NCCL_DIR, OPT_NCCL_TIMEOUT, OPT_MAX_LOSS, OPT_SKIP_LOSS_Z, OPT_SKIP_NORM_Z, OPT_MAX_SKIPS,
       OPT_INJECT_NAN_LOSS, OPT_INJECT_NAN_GRAD, OPT_MEMORY_LIMIT, OPT_HELLASWAG, OPT_HELLASWAG_LIMIT,
       OPT_HELLASWAG_DUMP, OPT_BATCH_INVARIANT, OPT_OVERWRITE, OPT_ALLOW_CHANGE,
       OPT_OFFLOAD, OPT_HOST_MEMORY_LIMIT, OPT_DRY_RUN, OPT_PEAK_TFLOPS, OPT_LOSS_SCALE, OPT_LOSS_SCALE_GROWTH };

// Whether step is in a list of steps and ranges such as "5,9-12"; exits naming the option when the
// list is malformed (parse_options checks each list once, with step 0).
static int step_listed(const char* list, const char* option, long long step) {
    for (const char* p = list;;) {
        char* end;
        errno = 0;
        long long first = strtoll(p, &end, 10), last = first;
        int ok = !errno && end != p && first >= 1;
        if (ok && *end == '-') {
            p = end + 1;
            last = strtoll(p, &end, 10);
            ok = !errno && end != p && last >= first;
        }
        if (!ok || (*end != ',' && *end != '\0'))
            fatal("option %s: '%s' is not a list of steps such as 5,9-12", option, list);
        if (step >= first && step <= last) return 1;
        if (*end == '\0') return 0;
        p = end + 1;
    }
}

static Options parse_options(int argc, char** argv) {
    Options o = default_options();
    static const struct option longs[] = {
        {"train", 1, 0, 'i'}, {"val", 1, 0, 'j'}, {"model", 1, 0, 'e'}, {"out", 1, 0, 'o'},
        {"batch", 1, 0, 'b'}, {"seq-len", 1, 0, 't'}, {"total-batch", 1, 0, 'd'},
        {"steps", 1, 0, 'x'}, {"lr", 1, 0, 'l'}, {"warmup", 1, 0, 'u'},
        {"final-lr-frac", 1, 0, 'q'}, {"schedule", 1, 0, 'k'}, {"weight-decay", 1, 0, 'c'},
        {"val-every", 1, 0, 'v'}, {"val-batches", 1, 0, 'm'}, {"sample-every", 1, 0, 's'},
        {"gen-tokens", 1, 0, 'g'}, {"checkpoint-every", 1, 0, 'n'}, {"resume", 1, 0, 'y'},
        {"recompute", 1, 0, 'r'}, {"zero", 1, 0, 'z'}, {"help", 0, 0, 'h'}, {"config", 1, 0, 'f'},
        {"memory-limit", 1, 0, OPT_MEMORY_LIMIT}, {"batch-invariant", 1, 0, OPT_BATCH_INVARIANT},
        {"layers", 1, 0, OPT_LAYERS}, {"channels", 1, 0, OPT_CHANNELS}, {"heads", 1, 0, OPT_HEADS},
        {"max-seq", 1, 0, OPT_MAX_SEQ}, {"seed", 1, 0, OPT_SEED}, {"vocab", 1, 0, OPT_VOCAB},
        {"keep", 1, 0, OPT_KEEP}, {"temperature", 1, 0, OPT_TEMPERATURE}, {"top-k", 1, 0, OPT_TOP_K},
        {"top-p", 1, 0, OPT_TOP_P}, {"prompt", 1, 0, OPT_PROMPT}, {"prompt-file", 1, 0, OPT_PROMPT_FILE},
        {"shuffle", 1, 0, OPT_SHUFFLE}, {"grad-clip", 1, 0, OPT_GRAD_CLIP},
        {"beta1", 1, 0, OPT_BETA1}, {"beta2", 1, 0, OPT_BETA2},
        {"nccl-dir", 1, 0, OPT_NCCL_DIR}, {"nccl-timeout", 1, 0, OPT_NCCL_TIMEOUT},
        {"max-loss", 1, 0, OPT_MAX_LOSS}, {"skip-loss-z", 1, 0, OPT_SKIP_LOSS_Z},
        {"skip-norm-z", 1, 0, OPT_SKIP_NORM_Z}, {"max-skips", 1, 0, OPT_MAX_SKIPS},
        {"loss-scale", 1, 0, OPT_LOSS_SCALE}, {"loss-scale-growth", 1, 0, OPT_LOSS_SCALE_GROWTH},
        {"inject-nan-loss", 1, 0, OPT_INJECT_NAN_LOSS}, {"inject-nan-grad", 1, 0, OPT_INJECT_NAN_GRAD},
        {"hellaswag", 1, 0, OPT_HELLASWAG}, {"hellaswag-limit", 1, 0, OPT_HELLASWAG_LIMIT},
        {"hellaswag-dump", 1, 0, OPT_HELLASWAG_DUMP}, {"overwrite", 0, 0, OPT_OVERWRITE},
        {"offload", 1, 0, OPT_OFFLOAD}, {"host-memory-limit", 1, 0, OPT_HOST_MEMORY_LIMIT},
        {"dry-run", 0, 0, OPT_DRY_RUN}, {"peak-tflops", 1, 0, OPT_PEAK_TFLOPS},
        {"allow-change", 1, 0, OPT_ALLOW_CHANGE},
        {0, 0, 0, 0}};
    const long long BIG = 1LL << 40;
    static const char shorts[] = ":i:j:e:o:b:t:d:x:l:u:q:k:c:v:m:s:g:n:y:r:z:hf:";
    argv = config_expand_argv(&argc, argv, longs, shorts); // -f FILE: the file's options in its place
    opterr = 0; // we print our own message
    optind = 0; // a fresh scan: a resume parses the recorded options and then the command line again
    int c, index;
    while ((c = getopt_long(argc, argv, shorts, longs, &index)) != -1) {
        char name[4400]; // the option as the messages name it: -b, --lr, or "lr in FILE line N"
        const char* origin = optarg ? config_origin(optarg) : NULL;
        if (origin) snprintf(name, sizeof name, "%s in %s", longs[index].name, origin);
        else if (c >= OPT_LAYERS) snprintf(name, sizeof name, "--%s", longs[index].name);
        else snprintf(name, sizeof name, "-%c", c);
        switch (c) {
        case 'i': o.train_pattern = optarg; break;
        case 'j': o.val_pattern = optarg; break;
        case 'e': o.model = optarg; break;
        case 'o': o.out_dir = optarg; break;
        case 'b': o.B = strcmp(optarg, "auto") == 0 ? 0 : (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case 't': o.T = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case 'd': o.total_batch = parse_int_option(optarg, name, -1, BIG); break;
        case 'x': o.max_steps = (int)parse_int_option(optarg, name, -1, MAX_STEPS); break;
        case 'l': o.lr = parse_float(optarg, name, 0.0, 10.0); break;
        case 'u': o.warmup = (int)parse_int_option(optarg, name, 0, 1 << 30); break;
        case 'q': o.final_lr_frac = parse_float(optarg, name, 0.0, 1.0); break;
        case 'k':
            o.schedule = optarg;
            if (strcmp(o.schedule, "cosine") && strcmp(o.schedule, "linear") && strcmp(o.schedule, "constant"))
                fatal("option %s: unknown schedule '%s' (cosine, linear or constant)", name, o.schedule);
            break;
        case 'c': o.weight_decay = parse_float(optarg, name, 0.0, 10.0); break;
        case 'v': o.val_every = (int)parse_int_option(optarg, name, 0, 1 << 30); break;
        case 'm': o.val_batches = (int)parse_int_option(optarg, name, 1, 1 << 30); break;
        case 's': o.sample_every = (int)parse_int_option(optarg, name, 0, 1 << 30); break;
        case 'g': o.gen_tokens = (int)parse_int_option(optarg, name, 0, 1 << 20); break;
        case 'n': o.checkpoint_every = (int)parse_int_option(optarg, name, 0, 1 << 30); break;
        case 'y': o.resume = (int)parse_int_option(optarg, name, 0, 1); break;
        case 'r': o.recompute = (int)parse_int_option(optarg, name, 0, 2); break;
        case 'z': o.zero_stage = (int)parse_int_option(optarg, name, 0, 1); break;
        case OPT_LAYERS: o.layers = (int)parse_int_option(optarg, name, 1, 1024); break;
        case OPT_CHANNELS: o.channels = (int)parse_int_option(optarg, name, 1, 65536); break;
        case OPT_HEADS: o.heads = (int)parse_int_option(optarg, name, 1, 65536); break;
        case OPT_MAX_SEQ: o.max_seq = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case OPT_SEED: o.seed = (unsigned long long)parse_int_option(optarg, name, 0, BIG); break;
        case OPT_VOCAB: o.vocab_dir = optarg; break;
        case OPT_KEEP: o.keep = (int)parse_int_option(optarg, name, 0, 1 << 30); break;
        case OPT_OVERWRITE: o.overwrite = 1; break;
        case OPT_TEMPERATURE: o.temperature = parse_float(optarg, name, 0.0, 100.0); break;
        case OPT_TOP_K: o.top_k = (int)parse_int_option(optarg, name, 0, 1 << 20); break;
        case OPT_TOP_P: o.top_p = parse_float(optarg, name, 1e-6, 1.0); break;
        case OPT_PROMPT: o.prompt = optarg; break;
        case OPT_PROMPT_FILE: o.prompt_file = optarg; break;
        case OPT_SHUFFLE: o.shuffle = (int)parse_int_option(optarg, name, 0, 1); break;
        case OPT_GRAD_CLIP: o.grad_clip = parse_float(optarg, name, 0.0, 1e9); break;
        case OPT_BETA1: o.beta1 = parse_float(optarg, name, 0.0, 0.999999); break;
        case OPT_BETA2: o.beta2 = parse_float(optarg, name, 0.0, 0.999999); break;
        case OPT_MAX_LOSS: o.max_loss = parse_float(optarg, name, 0.0, 1e30); break;
        case OPT_SKIP_LOSS_Z: o.skip_loss_z = parse_float(optarg, name, 0.0, 1e9); break;
        case OPT_SKIP_NORM_Z: o.skip_norm_z = parse_float(optarg, name, 0.0, 1e9); break;
        case OPT_MAX_SKIPS: o.max_skips = (int)parse_int_option(optarg, name, 0, 1 << 30); break;
        case OPT_LOSS_SCALE:
            if (strcmp(optarg, "0") != 0 && strcmp(optarg, "dynamic") != 0)
                fatal("option %s: '%s' is neither 0 (off) nor dynamic", name, optarg);
            o.loss_scale = optarg;
            break;
        case OPT_LOSS_SCALE_GROWTH: o.loss_scale_growth = (int)parse_int_option(optarg, name, 1, 1 << 30); break;
        case OPT_INJECT_NAN_LOSS: step_listed(o.inject_nan_loss = optarg, name, 0); break;
        case OPT_INJECT_NAN_GRAD: step_listed(o.inject_nan_grad = optarg, name, 0); break;
        case OPT_NCCL_DIR: o.nccl_dir = optarg; break;
        case OPT_NCCL_TIMEOUT: o.nccl_timeout = parse_float(optarg, name, 1.0, 1e6); break;
        case OPT_MEMORY_LIMIT: o.memory_limit = parse_float(optarg, name, 0.01, 1e6); break;
        case OPT_OFFLOAD:
            if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0)
                fatal("--offload %s: use auto, 0 or 1", optarg);
            o.offload = optarg;
            break;
        case OPT_HOST_MEMORY_LIMIT: o.host_memory_limit = parse_float(optarg, name, 0.01, 1e6); break;
        case OPT_DRY_RUN: o.dry_run = 1; break;
        case OPT_PEAK_TFLOPS: o.peak_tflops = parse_float(optarg, name, 0.0, 1e6); break;
        case OPT_BATCH_INVARIANT: o.group_sequences = (int)parse_int_option(optarg, name, 0, 1 << 20); break;
        case OPT_HELLASWAG: o.hellaswag = optarg; break;
        case OPT_HELLASWAG_LIMIT: o.hellaswag_limit = (int)parse_int_option(optarg, name, 0, HELLASWAG_MAX_EXAMPLES); break;
        case OPT_HELLASWAG_DUMP: o.hellaswag_dump = optarg; break;
        case OPT_ALLOW_CHANGE: o.allow_change = optarg; break;
        case 'h': {
            const char* slash = strrchr(argv[0], '/');
            print_usage(slash ? slash + 1 : argv[0]);
            exit(0);
        }
        case ':': fatal("option %s needs a value (see --help)", argv[optind - 1]);
        default: fatal("unknown option %s (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc) fatal("unexpected argument '%s' (see --help)", argv[optind]);
    return o;
}

// ---- the run's options, recorded in its output directory ------------------------------------
// A run writes its options to DIR/run.conf (the -f format), so that -y 1 -o DIR resumes with them.
// On resume the options are the recorded ones with the command line's on top; those that change
// the run are refused when they differ from the recorded value, unless --allow-change names them.

typedef enum { V_TEXT, V_INT, V_LONG, V_SEED, V_FLOAT, V_DOUBLE, V_BATCH } ValueKind;

enum { FREE, CHANGES_RUN, CHANGES_RUN_UNLESS_INVARIANT };
static const struct {
    const char* name; // the long option
    char letter;      // its one-letter name, or 0
    ValueKind kind;
    size_t offset;    // in Options
    // FREE: never changes the trained bits or the log's losses (evaluation cadence, sampling,
    // checkpoints, memory, the MFU's peak); CHANGES_RUN: data, model, batch, schedule, optimizer,
    // seed, the guard's thresholds, the validation batches; CHANGES_RUN_UNLESS_INVARIANT: -b, whose
    // micro-batches sum the gradients in another order unless --batch-invariant fixes it.
    int changes;
} recorded_options[] = {
    {"train", 'i', V_TEXT, offsetof(Options, train_pattern), CHANGES_RUN},
    {"val", 'j', V_TEXT, offsetof(Options, val_pattern), CHANGES_RUN},
    {"shuffle", 0, V_INT, offsetof(Options, shuffle), CHANGES_RUN},
    {"vocab", 0, V_TEXT, offsetof(Options, vocab_dir), FREE},
    {"model", 'e', V_TEXT, offsetof(Options, model), CHANGES_RUN},
    {"layers", 0, V_INT, offsetof(Options, layers), CHANGES_RUN},
    {"channels", 0, V_INT, offsetof(Options, channels), CHANGES_RUN},
    {"heads", 0, V_INT, offsetof(Options, heads), CHANGES_RUN},
    {"max-seq", 0, V_INT, offsetof(Options, max_seq), CHANGES_RUN},
    {"seed", 0, V_SEED, offsetof(Options, seed), CHANGES_RUN},
    {"batch", 'b', V_BATCH, offsetof(Options, B), CHANGES_RUN_UNLESS_INVARIANT},
    {"seq-len", 't', V_INT, offsetof(Options, T), CHANGES_RUN},
    {"total-batch", 'd', V_LONG, offsetof(Options, total_batch), CHANGES_RUN},
    {"steps", 'x', V_INT, offsetof(Options, max_steps), CHANGES_RUN},
    {"lr", 'l', V_FLOAT, offsetof(Options, lr), CHANGES_RUN},
    {"warmup", 'u', V_INT, offsetof(Options, warmup), CHANGES_RUN},
    {"schedule", 'k', V_TEXT, offsetof(Options, schedule), CHANGES_RUN},
    {"final-lr-frac", 'q', V_FLOAT, offsetof(Options, final_lr_frac), CHANGES_RUN},
    {"weight-decay", 'c', V_FLOAT, offsetof(Options, weight_decay), CHANGES_RUN},
    {"grad-clip", 0, V_FLOAT, offsetof(Options, grad_clip), CHANGES_RUN},
    {"beta1", 0, V_FLOAT, offsetof(Options, beta1), CHANGES_RUN},
    {"beta2", 0, V_FLOAT, offsetof(Options, beta2), CHANGES_RUN},
    {"batch-invariant", 0, V_INT, offsetof(Options, group_sequences), CHANGES_RUN},
    {"zero", 'z', V_INT, offsetof(Options, zero_stage), CHANGES_RUN},
    {"max-loss", 0, V_FLOAT, offsetof(Options, max_loss), CHANGES_RUN},
    {"skip-loss-z", 0, V_FLOAT, offsetof(Options, skip_loss_z), CHANGES_RUN},
    {"skip-norm-z", 0, V_FLOAT, offsetof(Options, skip_norm_z), CHANGES_RUN},
    {"max-skips", 0, V_INT, offsetof(Options, max_skips), FREE},
    {"loss-scale", 0, V_TEXT, offsetof(Options, loss_scale), CHANGES_RUN},
    {"loss-scale-growth", 0, V_INT, offsetof(Options, loss_scale_growth), CHANGES_RUN},
    {"val-batches", 'm', V_INT, offsetof(Options, val_batches), CHANGES_RUN},
    {"val-every", 'v', V_INT, offsetof(Options, val_every), FREE},
    {"hellaswag", 0, V_TEXT, offsetof(Options, hellaswag), FREE},
    {"hellaswag-limit", 0, V_INT, offsetof(Options, hellaswag_limit), FREE},
    {"hellaswag-dump", 0, V_TEXT, offsetof(Options, hellaswag_dump), FREE},
    {"sample-every", 's', V_INT, offsetof(Options, sample_every), FREE},
    {"gen-tokens", 'g', V_INT, offsetof(Options, gen_tokens), FREE},
    {"temperature", 0, V_FLOAT, offsetof(Options, temperature), FREE},
    {"top-k", 0, V_INT, offsetof(Options, top_k), FREE},
    {"top-p", 0, V_FLOAT, offsetof(Options, top_p), FREE},
    {"checkpoint-every", 'n', V_INT, offsetof(Options, checkpoint_every), FREE},
    {"keep", 0, V_INT, offsetof(Options, keep), FREE},
    {"recompute", 'r', V_INT, offsetof(Options, recompute), FREE},
    {"memory-limit", 0, V_DOUBLE, offsetof(Options, memory_limit), FREE},
    {"offload", 0, V_TEXT, offsetof(Options, offload), FREE},
    {"host-memory-limit", 0, V_DOUBLE, offsetof(Options, host_memory_limit), FREE},
    {"peak-tflops", 0, V_FLOAT, offsetof(Options, peak_tflops), FREE},
};
enum { N_RECORDED = sizeof recorded_options / sizeof recorded_options[0] };

// Recorded option i of o as text, as parse_options reads it back to the same value; "" for a file
// not given.
static const char* recorded_value(const Options* o, int i, char* buf, size_t n) {
    const char* field = (const char*)o + recorded_options[i].offset;
    switch (recorded_options[i].kind) {
    case V_TEXT: snprintf(buf, n, "%s", *(const char* const*)field ? *(const char* const*)field : ""); break;
    case V_INT: snprintf(buf, n, "%d", *(const int*)field); break;
    case V_LONG: snprintf(buf, n, "%lld", *(const long long*)field); break;
    case V_SEED: snprintf(buf, n, "%llu", *(const unsigned long long*)field); break;
    case V_FLOAT: // the fewest digits that read back to the same float: 0.001, not 0.00100000005
        for (int digits = 6; digits <= 9; digits++) {
            snprintf(buf, n, "%.*g", digits, (double)*(const float*)field);
            if ((float)strtod(buf, NULL) == *(const float*)field) break;
        }
        break;
    case V_DOUBLE: snprintf(buf, n, "%.17g", *(const double*)field); break;
    case V_BATCH:
        if (*(const int*)field) snprintf(buf, n, "%d", *(const int*)field);
        else snprintf(buf, n, "auto");
        break;
    }
    return buf;
}

// An option as the messages name it: -x, or --lr where it has no letter.
static const char* recorded_flag(int i, char* buf, size_t n) {
    if (recorded_options[i].letter) snprintf(buf, n, "-%c", recorded_options[i].letter);
    else snprintf(buf, n, "--%s", recorded_options[i].name);
    return buf;
}

static void run_conf_path(char* buf, size_t n, const char* dir) { snprintf(buf, n, "%s/run.conf", dir); }

// Writes DIR/run.conf (atomically): every recorded option whose value is not the default,
// so the file reads like a config the user wrote (default values are left out; they are what the
// program gives back when it reads the file).
static void write_run_conf(const Options* o) {
    char path[4096], value[4200], line[4400], fallback[4200];
    run_conf_path(path, sizeof path, o->out_dir);
    Options d = default_options();
    AtomicFile f;
    atomic_open(&f, path);
    const char* header = "# The options of the run in this directory, as -f reads them. -y 1 -o DIR resumes with\n"
                         "# them; an option that changes the run is refused unless --allow-change names it.\n"
                         "# precision " PRECISION_NAME GRADS_NOTE ": the build that trained it (scripts/compare_curves.py "
                         "reads this line)\n";
    atomic_write(&f, header, strlen(header));
    for (int i = 0; i < N_RECORDED; i++) {
        if (strcmp(recorded_value(o, i, value, sizeof value), recorded_value(&d, i, fallback, sizeof fallback)) == 0)
            continue;
        int len = snprintf(line, sizeof line, "%s %s\n", recorded_options[i].name, value);
        atomic_write(&f, line, (size_t)len);
    }
    atomic_commit(&f);
}

// Whether --allow-change's list names recorded option i (by its long name or letter, with or
// without dashes); exits naming an entry that is no recorded option.
static int change_allowed(const char* list, int i) {
    if (!list) return 0;
    int allowed = 0;
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", list);
    char* rest = copy;
    for (char* entry; (entry = strsep(&rest, ","));) {
        while (*entry == '-') entry++;
        int found = -1;
        for (int k = 0; k < N_RECORDED; k++)
            if (strcmp(entry, recorded_options[k].name) == 0 ||
                (recorded_options[k].letter && entry[0] == recorded_options[k].letter && !entry[1]))
                found = k;
        if (found < 0) fatal("option --allow-change: '%s' is not an option a run records (see --help)", entry);
        if (found == i) allowed = 1;
    }
    return allowed;
}

// -y 1: the options recorded in DIR/run.conf with the command line's on top (the command line alone
// when the directory has no run.conf). Exits naming the command line's options that change the run
// when their values differ from the recorded ones and --allow-change does not name them.
static Options options_for_resume(const Options* given, int argc, char** argv) {
    static char path[4096]; // the expanded argv keeps pointers into its arguments
    change_allowed(given->allow_change, -1); // a misspelt name is refused even when nothing differs
    run_conf_path(path, sizeof path, given->out_dir);
    if (access(path, F_OK) != 0) return *given;
    char* recorded_argv[] = {argv[0], "--config", path, NULL};
    Options recorded = parse_options(3, recorded_argv);
    char** both = xmalloc((size_t)(argc + 3) * sizeof(char*), "options");
    both[0] = argv[0];
    both[1] = "--config";
    both[2] = path;
    memcpy(both + 3, argv + 1, (size_t)argc * sizeof(char*)); // with argv's closing NULL
    Options o = parse_options(argc + 2, both);
    free(both);
    char refused[4096] = "", names[1024] = "", was[4200], now[4200], flag[64];
    for (int i = 0; i < N_RECORDED; i++) {
        int changes = recorded_options[i].changes == CHANGES_RUN ||
                      (recorded_options[i].changes == CHANGES_RUN_UNLESS_INVARIANT && !recorded.group_sequences);
        recorded_value(&recorded, i, was, sizeof was);
        if (!changes || strcmp(was, recorded_value(&o, i, now, sizeof now)) == 0) continue;
        recorded_flag(i, flag, sizeof flag);
        if (change_allowed(o.allow_change, i)) {
            char letter = recorded_options[i].letter;
            int schedule = letter && strchr("xluqk", letter); // -x, -l, -u, -q, -k
            printf("--allow-change: %s is %s from the resumed step on (%s in %s)%s\n", flag, now, was, path,
                   schedule ? "; the learning-rate schedule is recomputed with it, so the rate moves to the new "
                              "schedule's value at the resumed step" : "");
            continue;
        }
        size_t at = strlen(refused);
        snprintf(refused + at, sizeof refused - at, "%s%s %.500s (recorded: %.500s)", at ? ", " : "", flag, now, was);
        at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s", at ? "," : "", recorded_options[i].name);
    }
    if (*refused)
        fatal("resuming %s: the command line changes options recorded in %s: %s. They change the run's bits or "
              "its schedule. Leave them out to resume as recorded (-y 1 -o %s is enough), or add --allow-change "
              "%s to go on with the new values from the resumed step", given->out_dir, path, refused,
              given->out_dir, names);
    printf("resuming with the options recorded in %s\n", path);
    return o;
}

// ---- model configuration -----------------------------------------------------------------

// Checks an option given on the command line against the model file's value; on a mismatch frees
// the file's weights (LeakSanitizer checks at the exit) and exits.
static void check_matches(float* weights, const char* path, const char* what, int file_value, int option_value) {
    if (option_value && option_value != file_value) {
        free(weights);
        fatal("model file %s has %s = %d, but the options ask for %d", path, what, file_value, option_value);
    }
}

// Builds the model from a preset, custom sizes or a model file; returns the file's weights (or NULL).
static float* resolve_model(const Options* o, GPT2Config* cfg) {
    int custom = o->layers || o->channels || o->heads;
    memset(cfg, 0, sizeof *cfg);
    if (gpt2_preset(o->model, cfg)) { // from scratch: a preset, or custom sizes
        if (custom) {
            if (!(o->layers && o->channels && o->heads))
                fatal("a custom size needs all of --layers, --channels and --heads");
            cfg->num_layers = o->layers;
            cfg->channels = o->channels;
            cfg->num_heads = o->heads;
        }
        cfg->max_seq_len = o->max_seq ? o->max_seq : 1024;
        cfg->vocab_size = GPT2_VOCAB_SIZE;
        cfg->padded_vocab_size = gpt2_padded_vocab(GPT2_VOCAB_SIZE);
        const char* problem = gpt2_config_problem(cfg);
        if (problem) fatal("impossible model size (--layers %d --channels %d --heads %d --max-seq %d): %s",
                           cfg->num_layers, cfg->channels, cfg->num_heads, cfg->max_seq_len, problem);
        return NULL;
    }
    size_t n;
    float* weights = model_file_read(o->model, cfg, &n);
    check_matches(weights, o->model, "layers", cfg->num_layers, o->layers);
    check_matches(weights, o->model, "channels", cfg->channels, o->channels);
    check_matches(weights, o->model, "heads", cfg->num_heads, o->heads);
    check_matches(weights, o->model, "max sequence length", cfg->max_seq_len, o->max_seq);
    return weights;
}

// After gpt2_set_weights took a model file's weights (fp32 or bf16) into the FP16 build's fp16
// parameters, having checked that each is within fp16's range.
static void print_weights_converted(const char* path) {
#if defined(FLOATX_MAX)
    printf("model file %s: weights converted to fp16 (each within fp16's range, magnitudes up to %g)\n",
           path, FLOATX_MAX);
#else
    (void)path;
#endif
}

// ---- schedule, sampling ------------------------------------------------------------------

static float learning_rate(const Options* o, int step, int max_steps) {
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    float lr_min = o->lr * o->final_lr_frac;
    if (strcmp(o->schedule, "constant") == 0 || max_steps <= o->warmup) return o->lr;
    float progress = (float)(step - o->warmup) / (float)(max_steps - o->warmup);
    if (strcmp(o->schedule, "linear") == 0) return o->lr - (o->lr - lr_min) * progress;
    return lr_min + 0.5f * (o->lr - lr_min) * (1.0f + cosf((float)M_PI * progress));
}

static SamplerOptions sampler_options(const Options* o) {
    return (SamplerOptions){.temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p};
}

// Prints a token's bytes as they come (a character may span tokens: the terminal joins them).
static int print_token(int token, void* tokenizer) {
    size_t len;
    const char* bytes = tokenizer ? tokenizer_token_bytes(tokenizer, token, &len) : NULL;
    if (bytes) fwrite(bytes, 1, len, stdout);
    else printf("<%d>", token);
    fflush(stdout);
    return 0;
}

// In a continuation, <|endoftext|> ends the document: it stops the generation, unprinted.
static int print_until_end(int token, void* tokenizer) {
    return token == GPT2_EOT || print_token(token, tokenizer);
}

// A sample during training: -g tokens from <|endoftext|>, with the sampler's RNG carried in *rng.
static void print_sample(GPT2* model, const Options* o, const Tokenizer* tok, uint64_t* rng) {
    Sampler s;
    sampler_init(&s, model->config.vocab_size, sampler_options(o), *rng);
    int* tokens = xmalloc((size_t)(o->gen_tokens + 1) * sizeof(int), "sample");
    tokens[0] = GPT2_EOT;
    printf("generating:\n---\n");
    gpt2_generate(model, &s, tokens, 1, o->gen_tokens, print_token, (void*)tok);
    printf("\n---\n");
    *rng = s.rng;
    free(tokens);
    sampler_free(&s);
}

// ---- fitting the run to the memory ----------------------------------------------------------

// The memory a run plans with: the free memory or --memory-limit, the least over the ranks so that
// all choose alike; *source says which.
static double planning_memory(const Options* o, size_t free_bytes, const char** source) {
    const double GiB = 1073741824.0;
    double memory = (double)free_bytes;
    *source = o->memory_limit > 0 ? "free (less than --memory-limit)" : "free";
    if (o->memory_limit > 0 && o->memory_limit * GiB < memory) {
        memory = o->memory_limit * GiB;
        *source = "--memory-limit";
    }
    comm_allreduce_host(&memory, 1, COMM_MIN);
    return memory;
}

// -b auto: the micro-batch (and, unless -r is given, the recompute level) of spec from the memory
// plan and the planning memory. Exits saying what would fit when nothing does.
static void fit_micro_batch(GPT2BuildSpec* spec, int seqs, double memory, const char* source) {
    const double GiB = 1073741824.0;
    int lo = spec->recompute < 0 ? 0 : spec->recompute, hi = spec->recompute < 0 ? 2 : spec->recompute;
    int group = spec->group_sequences;
    Fit fit;
    if (!gpt2_fit(spec, seqs, lo, hi, (size_t)memory, &fit)) {
        GPT2BuildSpec ungrouped = *spec;
        ungrouped.group_sequences = 0;
        if (group > 1 && gpt2_fit(&ungrouped, seqs, lo, hi, (size_t)memory, &fit))
            fatal("-b auto: no multiple of --batch-invariant %d fits (B %d, -r %d would): a smaller group "
                  "(--batch-invariant 1, slower) allows it, or 0 (no same bits across -b)", group, fit.spec.B,
                  fit.spec.recompute);
        char advice[1024];
        gpt2_fit_advice(advice, sizeof advice, spec, hi, (size_t)memory);
        GPT2BuildSpec least = *spec;
        least.B = 1;
        least.recompute = hi;
        least.head_slice_tokens = gpt2_fit_narrowest_head_slice_tokens(spec);
        fatal("-b auto: the run does not fit: even B 1 with -r %d plans %.2f GiB, and %.2f GiB %s less a "
              "%.2f GiB margin leave %.2f GiB; what would fit: %s", hi, gpt2_memory_plan(&least).total / GiB,
              memory / GiB, source, FIT_MARGIN_BYTES / GiB, (memory - (double)FIT_MARGIN_BYTES) / GiB, advice);
    }
    // The head's slices are widened after this where the memory allows (gpt2_fit_head_slice_tokens):
    // the built plan says which.
    printf("-b auto: B %d, -r %d%s for %d sequences per GPU per step: plan %.2f GiB (with the head's %d-token "
           "slices) of %.2f GiB %s less a %.2f GiB margin\n", fit.spec.B, fit.spec.recompute,
           fit.spec.offload ? ", AdamW's state offloaded to host memory" : "", seqs, fit.plan.total / GiB,
           fit.spec.head_slice_tokens, memory / GiB, source, FIT_MARGIN_BYTES / GiB);
    spec->B = fit.spec.B;
    spec->recompute = fit.spec.recompute;
    spec->offload = fit.spec.offload;
}

// The build of a run of o (model cfg, world ranks, seqs sequences per GPU per step) for `memory`
// bytes of GPU (from `source`): -b auto (fit_micro_batch), or the given B with -r 0 unless -r is
// given; offloading as --offload says (auto: as GPT2_OFFLOAD_AUTO in model/fit.h says, where the
// host can hold the state; never on the CPU, whose memory is the host's); the head's slices. Exits when the
// offloaded state needs more host memory than there is (or --host-memory-limit allows; in a dry run,
// which plans for another machine, --host-memory-limit is that machine's host memory).
static GPT2BuildSpec choose_build(const Options* o, const GPT2Config* cfg, int world, int seqs, double memory,
                                  const char* source, int on_gpu, int dry_run) {
    const double GiB = 1073741824.0;
    GPT2BuildSpec spec = {.config = *cfg, .B = o->B, .T = o->T, .recompute = o->recompute,
                          .zero_stage = o->zero_stage, .world = world, .group_sequences = o->group_sequences,
                          .head_slice_tokens = GPT2_HEAD_SLICE_TOKENS};
    spec.offload = strcmp(o->offload, "auto") == 0 ? (on_gpu ? GPT2_OFFLOAD_AUTO : 0) : atoi(o->offload);
    size_t available, total;
    host_memory(&available, &total);
    double host = (double)available;
    const char* host_source = "available (MemAvailable)";
    if (o->host_memory_limit > 0 && (dry_run || o->host_memory_limit * GiB < host)) {
        host = o->host_memory_limit * GiB;
        host_source = "--host-memory-limit";
    }
    if (spec.offload == GPT2_OFFLOAD_AUTO) {
        // Offloading for a larger B only where the host can hold the state (its size does not depend
        // on B); where nothing fits without it, it is still chosen and refused below, saying what it needs.
        GPT2BuildSpec offloaded = spec;
        offloaded.offload = 1;
        if ((double)gpt2_memory_plan(&offloaded).host_optimizer > host) spec.offload = GPT2_OFFLOAD_NEEDED;
    }
    if (spec.B == 0) {
        fit_micro_batch(&spec, seqs, memory, source);
    } else {
        if (spec.recompute < 0) spec.recompute = 0;
        spec.offload = gpt2_fit_offload(&spec, (size_t)memory);
    }
    spec.head_slice_tokens = gpt2_fit_head_slice_tokens(&spec, (size_t)memory);
    if (spec.offload) {
        double need = (double)gpt2_memory_plan(&spec).host_optimizer;
        if (need > host)
            fatal("--offload: AdamW's state needs %.2f GiB of pinned host memory, and %.2f GiB are %s; free "
                  "host memory, or fit the run to the GPU (a smaller -b, -r 2, a smaller model or -t)",
                  need / GiB, host / GiB, host_source);
        printf("offload: AdamW's m, v%s in pinned host memory, %.2f GiB of %.2f GiB %s\n",
               sizeof(floatX) != sizeof(float) ? " and the master weights" : "", need / GiB, host / GiB,
               host_source);
    }
    return spec;
}

// What the run holds on the GPU now against its plan: the free memory before the build less the free
// memory now, so that the scratch buffers the kernels grew count too (and, on a shared GPU, whatever
// other processes did meanwhile). The staging copy of the weights is freed by now. Not on the CPU,
// where the host's other processes move the free memory more than the run does.
static void report_memory_use(const GPT2* model, size_t free_before) {
    size_t free_now, total;
    if (!backend_memory(&free_now, &total)) return;
    const double MiB = 1048576.0;
    double used = ((double)free_before - (double)free_now) / MiB;
    double planned = (double)(model->plan.total - model->plan.staging) / MiB;
    printf("memory: %.1f MiB in use at the end (free before the build less free now); the plan without "
           "its staging: %.1f MiB (%+.1f MiB)\n", used, planned, used - planned);
}

// ---- divergence guard --------------------------------------------------------------------
// Before each update the guard decides, from the loss and gradient norm of the step (the same
// values on every rank: both are all-reduced), whether to apply it. A skipped step changes no
// weight and no optimizer state; the step counter, the learning-rate schedule and the data move on.
// AdamW's t and the stochastic rounding's seed follow the updates applied, so that a skipped step
// is, for the optimizer, a step that never happened.

typedef struct {
    long long updates;      // updates applied: AdamW's t of the last one
    long long last_applied; // the step whose update was applied last (0: none yet)
    StepHistory history;    // loss and norm of the last applied steps, the z-scores' window
    // --loss-scale dynamic (all 0 when off): the scale the next step's loss is multiplied by; the
    // applied steps since it last changed; the overflow skips since last_applied, which --max-skips
    // does not count
    double loss_scale;
    long long scale_clean_steps;
    long long overflow_skips;
} Guard;

// Dynamic loss scaling as PyTorch's GradScaler does it: start at 2^16, halve on an overflow, double
// after --loss-scale-growth applied steps in a row without one, never above 2^24. Powers of two only,
// so that scaling and unscaling change no bit of a gradient that does not overflow.
#define LOSS_SCALE_INIT 65536.0
#define LOSS_SCALE_MAX 16777216.0

// The z-score of x against the window, NAN until the window is full: a few values give no spread
// worth comparing with (llm.c's detector waits for its window too). Recomputed over the window in
// one order, so that a resumed run gets the same bits. A window of equal values (which real losses
// never give) has no spread to measure against: 0.
static double z_score(const float* window, int count, double x) {
    if (count < STEP_HISTORY) return NAN;
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < count; i++) mean += window[i];
    mean /= count;
    for (int i = 0; i < count; i++) var += (window[i] - mean) * (window[i] - mean);
    var /= count;
    return var > 0.0 ? (x - mean) / sqrt(var) : 0.0;
}

static void history_push(StepHistory* h, float loss, float norm) {
    if (h->count == STEP_HISTORY) { // drop the oldest
        memmove(h->loss, h->loss + 1, (STEP_HISTORY - 1) * sizeof(float));
        memmove(h->norm, h->norm + 1, (STEP_HISTORY - 1) * sizeof(float));
        h->count--;
    }
    h->loss[h->count] = loss;
    h->norm[h->count] = norm;
    h->count++;
}

// Whether to skip the update of a step; if so, why (in why).
static int skip_step(const Options* o, float max_loss, float loss, float norm, double z_loss, double z_norm,
                     char* why, size_t n) {
    if (!isfinite(loss)) snprintf(why, n, "the loss is %g", loss);
    else if (!isfinite(norm)) snprintf(why, n, "the gradient norm is %g", norm);
    else if (max_loss > 0.0f && loss > max_loss) snprintf(why, n, "the loss is above --max-loss %g", max_loss);
    else if (o->skip_loss_z > 0.0f && z_loss > o->skip_loss_z)
        snprintf(why, n, "the loss z-score %.2f is above --skip-loss-z %g", z_loss, o->skip_loss_z);
    else if (o->skip_norm_z > 0.0f && z_norm > o->skip_norm_z)
        snprintf(why, n, "the gradient norm z-score %.2f is above --skip-norm-z %g", z_norm, o->skip_norm_z);
    else return 0;
    return 1;
}

// --max-skips steps in a row were skipped: the weights that the last applied step left keep giving
// bad steps, so they are not good, and neither is a checkpoint of them. Those checkpoints are set
// aside (renamed *.diverged, not deleted) so that -y 1 resumes from the newest good one; nothing
// new is written. Every rank gets here at the same step. last_why: why the last step was skipped.
static void __attribute__((noreturn)) stop_diverged(const Options* o, const Guard* g, long long step, int rank,
                                                    const char* last_why) {
    int aside = checkpoint_set_aside(o->out_dir, rank, g->last_applied);
    long long good = checkpoint_latest_step(o->out_dir, rank);
    if (rank != 0) exit(1);
    char resume[4200];
    if (good >= 0) snprintf(resume, sizeof resume, "-y 1 resumes from step %lld, the newest good checkpoint in %s", good, o->out_dir);
    else snprintf(resume, sizeof resume, "%s holds no good checkpoint", o->out_dir);
    char scaling[256] = ""; // with loss scaling: the scale, and the overflow skips --max-skips did not count
    if (g->loss_scale > 0.0)
        snprintf(scaling, sizeof scaling, "; the loss scale is %.0f after step %lld%s, and %lld of the skips were "
                 "overflows that --max-skips does not count", g->loss_scale, step,
                 g->loss_scale == 1.0 ? " (its floor)" : "", g->overflow_skips);
    fatal("training diverged: steps %lld..%lld were all skipped (--max-skips %d), so the weights after step %lld "
          "are not good (step %lld: %s%s). Stopped without saving%s; %s (lower -l with --allow-change lr, keep "
          "--grad-clip on)", g->last_applied + 1, step, o->max_skips, g->last_applied, step, last_why, scaling,
          aside ? "; their checkpoints were renamed to *.diverged" : "", resume);
}

// ---- checkpoints, log, signals -----------------------------------------------------------

static volatile sig_atomic_t stop_signal = 0;
// Says at once what will happen, since a slow step may take long to end. write(2), not printf: a
// signal handler may only call async-signal-safe functions. stdout, so that only rank 0 says it.
static void on_stop_signal(int sig) {
    static const char on_int[] =
        "\nCtrl-C: stopping after this step and saving; press Ctrl-C again to quit without saving\n";
    static const char on_term[] = "\nSIGTERM: stopping after this step and saving\n";
    stop_signal = sig;
    signal(sig, SIG_DFL); // a second Ctrl-C stops at once; the checkpoint files stay consistent
    ssize_t written = sig == SIGINT ? write(STDOUT_FILENO, on_int, sizeof on_int - 1)
                                    : write(STDOUT_FILENO, on_term, sizeof on_term - 1);
    (void)written; // nothing to do when it fails
}

// Names the first non-finite value of this rank's optimizer state in `where` and returns 1, or returns 0.
static int find_nonfinite(const GPT2* model, const TrainState* st, char* where, size_t n) {
    const float* arrays[3] = {st->master, st->m, st->v};
    const char* names[3] = {"weight", "AdamW m", "AdamW v"};
    for (int a = 0; a < 3; a++) {
        int tensor;
        size_t index;
        if (gpt2_find_nonfinite(&model->config, arrays[a], st->opt_offset, st->opt_count, &tensor, &index)) {
            snprintf(where, n, "%s %s[%zu]", names[a], parameter_tensor_names[tensor], index);
            return 1;
        }
    }
    return 0;
}

// Every rank calls it: rank 0 writes the model file, each rank its own training state (with ZeRO,
// its shard of the optimizer). Nothing is written unless every value of every rank is finite.
static void save_checkpoint(GPT2* model, const DataLoader* train, long long step, uint64_t rng,
                            const Guard* guard, const Options* o, int rank, int world) {
    const double started = wall_seconds();
    size_t n = model->num_parameters, count = model->opt_count;
    TrainState st = {0};
    st.config = model->config;
    st.step = step;
    st.updates = guard->updates;
    st.last_applied = guard->last_applied;
    st.history = guard->history;
    st.loss_scale = guard->loss_scale;
    st.scale_clean_steps = guard->scale_clean_steps;
    st.overflow_skips = guard->overflow_skips;
    st.sample_rng = rng;
    st.rank = rank;
    st.world = world;
    st.loader = dataloader_get_state(train);
    st.nparams = n;
    st.opt_offset = model->opt_offset;
    st.opt_count = count;
    st.master = xmalloc(count * sizeof(float) + 1, "checkpoint");
    st.m = xmalloc(count * sizeof(float) + 1, "checkpoint");
    st.v = xmalloc(count * sizeof(float) + 1, "checkpoint");
    gpt2_get_optimizer_state(model, st.master, st.m, st.v);
    // This rank's master weights (the model file's values), m and v; the ranks decide together, so
    // that no rank writes a checkpoint that another one refuses.
    char where[256];
    int mine = find_nonfinite(model, &st, where, sizeof where);
    double bad = mine;
    comm_allreduce_host(&bad, 1, COMM_MAX);
    if (bad) {
        char newest[4200];
        long long good = checkpoint_latest_step(o->out_dir, rank);
        if (good >= 0) snprintf(newest, sizeof newest, "the newest checkpoint in %s stays step %lld", o->out_dir, good);
        else snprintf(newest, sizeof newest, "%s holds no checkpoint", o->out_dir);
        if (mine)
            fatal("not saving the checkpoint of step %lld: %s is not finite (rank %d of %d); %s", step, where,
                  rank, world, newest);
        fatal("rank %d of %d: not saving the checkpoint of step %lld: another rank holds a non-finite value", rank,
              world, step);
    }
    char path[4096];
    // The model file needs all the weights. Without sharding this rank's optimizer state already
    // holds them; with ZeRO on several GPUs they are gathered, and every rank takes part.
    int sharded = model->zero_stage == 1 && world > 1;
    float* gathered = sharded ? xmalloc(n * sizeof(float), "checkpoint") : NULL;
    if (sharded) gpt2_get_weights(model, gathered);
    if (rank == 0) {
        checkpoint_model_path(path, sizeof path, o->out_dir, step);
        model_file_write(path, &model->config, sharded ? gathered : st.master);
    }
    free(gathered);
    checkpoint_state_path(path, sizeof path, o->out_dir, step, rank);
    train_state_write(path, &st);
    checkpoint_prune(o->out_dir, rank, o->keep, guard->last_applied);
    printf("saved checkpoint of step %lld to %s in %.1f s\n", step, path, wall_seconds() - started);
    free(st.master);
    free(st.m);
    free(st.v);
}

static void ensure_dir(const char* dir) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) fatal("output directory name is too long");
    for (char* p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                fatal("cannot create output directory %s: %s", buf, strerror(errno));
            *p = saved;
            if (saved == '\0') break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) fatal("output path %s is not a directory", dir);
    if (access(dir, W_OK) != 0) fatal("output directory %s is not writable: %s", dir, strerror(errno));
}

// The fields of a line of log.csv (no field holds a comma).
static int csv_fields(const char* line) {
    int fields = 1;
    for (const char* c = line; *c; c++) fields += *c == ',';
    return fields;
}

// Opens log.csv: fresh, or on resume keeping the rows up to the resumed step.
static FILE* open_log(const char* dir, long long resume_step) {
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/log.csv", dir);
    const char* header = "step,train_loss,val_loss,lr,grad_norm,ms,tok_per_s,skipped,hellaswag,mfu\n";
    int columns = csv_fields(header);
    char* kept = NULL;
    size_t kept_len = 0;
    if (resume_step >= 0) {
        FILE* old = fopen(path, "r");
        FILE* mem = open_memstream(&kept, &kept_len);
        if (old) {
            while (fgets(line, sizeof line, old)) {
                char* end;
                long long s = strtoll(line, &end, 10);
                if (end == line || *end != ',' || s > resume_step) continue;
                // A row of a log from before the later columns gets them empty, so that every row
                // has the header's columns.
                line[strcspn(line, "\n")] = '\0';
                int fields = csv_fields(line);
                fputs(line, mem);
                for (; fields < columns; fields++) fputc(',', mem);
                fputc('\n', mem);
            }
            fclose(old);
        }
        fclose(mem);
    }
    FILE* f = fopen(path, "w");
    if (!f) fatal("cannot write %s: %s", path, strerror(errno));
    xfwrite(header, 1, strlen(header), f, path);
    if (kept) xfwrite(kept, 1, kept_len, f, path);
    free(kept);
    fflush(f);
    return f;
}

static void format_eta(char* buf, size_t n, double seconds) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, n, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
}

// ---- generation from a prompt --------------------------------------------------------------

// The prompt's bytes, from --prompt or --prompt-file; refuses an empty one.
static char* read_prompt(const Options* o, size_t* len) {
    char* text;
    if (o->prompt_file) {
        text = read_whole_file(o->prompt_file, len);
        if (*len == 0) fatal("prompt file %s is empty", o->prompt_file);
    } else {
        *len = strlen(o->prompt);
        text = xmalloc(*len + 1, "prompt");
        memcpy(text, o->prompt, *len + 1);
        if (*len == 0) fatal("option --prompt: the prompt is empty");
    }
    return text;
}

// "flash attention (sm86 tiles)", or "naive attention": the start-up line's attention variant, and
// which of its kernels this device runs where the variant has several (attention_kernels).
static const char* attention_description(void) {
    static char text[64];
    const char* kernels = attention_kernels();
    if (kernels[0]) snprintf(text, sizeof text, "%s attention (%s)", attention_name(), kernels);
    else snprintf(text, sizeof text, "%s attention", attention_name());
    return text;
}

// -x 0 with --prompt or --prompt-file: continues the prompt with the model of -e FILE or the newest
// model file in -o DIR and streams the text to stdout (the prompt first). Everything else goes to
// stderr, so stdout holds just the text. Nothing is trained or written.
static int generate_from_prompt(const Options* o, const DistEnv* env) {
    if (o->prompt && o->prompt_file) fatal("give either --prompt or --prompt-file, not both");
    if (o->max_steps > 0) fatal("--prompt generates text without training: use -x 0");
    if (env->world > 1)
        fatal("--prompt runs in one process: start it without a launcher (WORLD_SIZE is %d)", env->world);
    size_t text_len;
    char* text = read_prompt(o, &text_len);

    Options from_file = *o;
    char path[4096];
    GPT2Config probe;
    if (gpt2_preset(o->model, &probe)) { // no model file given: the newest one in -o
        long long step = checkpoint_latest_step(o->out_dir, -1);
        if (step < 0)
            fatal("--prompt needs a trained model: give -e FILE, or -o DIR holding a model file (%s has none)",
                  o->out_dir);
        checkpoint_model_path(path, sizeof path, o->out_dir, step);
        from_file.model = path;
    }
    GPT2Config cfg;
    float* weights = resolve_model(&from_file, &cfg);

    Tokenizer* tok = tokenizer_load(o->vocab_dir);
    size_t n_text;
    int* encoded = tokenizer_encode(tok, text, text_len, &n_text);
    // A document starts with <|endoftext|> in GPT-2's training data (and in prepare_data's files).
    int n_prompt = (int)n_text + 1;
    if (n_text >= (size_t)cfg.max_seq_len) {
        free(encoded); // fatal() exits; LeakSanitizer would report it
        fatal("the prompt is %zu tokens (with the leading <|endoftext|>), more than the model's maximum "
              "sequence length of %d", n_text + 1, cfg.max_seq_len);
    }
    int* tokens = xmalloc(((size_t)n_prompt + (size_t)o->gen_tokens) * sizeof(int), "generation");
    tokens[0] = GPT2_EOT;
    memcpy(tokens + 1, encoded, n_text * sizeof(int));
    free(encoded);

    // Setup messages (memory plan, backend) go to stderr.
    fflush(stdout);
    int saved_stdout = dup(STDOUT_FILENO);
    if (saved_stdout < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
        fatal("cannot redirect stdout: %s", strerror(errno));
    backend_init(env->local_rank);
    comm_init(0, 1, NULL, o->nccl_timeout);
    GPT2 model;
    int T = n_prompt + o->gen_tokens < cfg.max_seq_len ? n_prompt + o->gen_tokens : cfg.max_seq_len;
    gpt2_build_forward_only(&model, &cfg, 1, T);
    gpt2_set_weights(&model, weights);
    print_weights_converted(from_file.model);
    free(weights);
    printf("%s | %s | model %s: L %d, C %d, NH %d, max T %d | prompt %d tokens\n",
           backend_describe(), attention_description(), from_file.model, cfg.num_layers, cfg.channels,
           cfg.num_heads, cfg.max_seq_len, n_prompt);
    fflush(stdout);
    if (dup2(saved_stdout, STDOUT_FILENO) < 0) fatal("cannot restore stdout: %s", strerror(errno));
    close(saved_stdout);

    Sampler sampler;
    sampler_init(&sampler, cfg.vocab_size, sampler_options(o), sampler_seed(o->seed));
    fwrite(text, 1, text_len, stdout);
    fflush(stdout);
    double t0 = wall_seconds();
    int n = gpt2_generate(&model, &sampler, tokens, n_prompt, o->gen_tokens, print_until_end, tok);
    dev_synchronize();
    double seconds = wall_seconds() - t0;
    printf("\n");
    fprintf(stderr, "generated %d tokens in %.3f s: %.2f ms per token\n", n, seconds, n ? 1e3 * seconds / n : 0.0);
    sampler_free(&sampler);
    free(tokens);
    free(text);
    tokenizer_free(tok);
    gpt2_free(&model);
    comm_free();
    return 0;
}

// ---- the phases of a training run ----------------------------------------------------------

// The time a kind of work has taken so far, for the ETA.
typedef struct {
    double seconds;
    int count;
} Cost;

static double mean_cost(const Cost* c) { return c->count ? c->seconds / c->count : 0.0; }

// What a training run holds, set up phase by phase in main.
typedef struct {
    const Options* o;
    int rank, world;
    GPT2Config cfg;
    float* file_weights;    // the model file's weights until the model holds them, or NULL
    long long total_batch;  // tokens per optimizer step, all GPUs together
    int seqs;               // sequences per GPU per step
    int B, accum;           // the micro-batch, and micro-batches per step
    long long train_tokens; // in the training files
    int max_steps;
    DataLoader train, val;
    int do_val;             // -v > 0: the validation loader is open
    long long val_seqs;     // validation sequences per GPU
    HellaSwagRun hellaswag;
    HellaSwagRun* hs;       // &hellaswag with --hellaswag, else NULL
    GPT2 model;
    size_t free_before;     // the device's free memory before the build
    long long start_step, step;
    Guard guard;
    uint64_t rng;           // the sampler's
    FILE* log;              // log.csv on rank 0, else NULL
    char log_path[4096];
    Tokenizer* tok;         // for the samples, or NULL (token ids)
    float max_loss;         // --max-loss, resolved
    int on_gpu;             // a GPU build: the MFU is "n/a" where no peak is known
    double peak_flops;      // one GPU's peak, FLOP/s (0: unknown, no MFU)
    double flops_per_token; // the training FLOPs of a token, 6N + 6LCT
    double train_seconds;   // the timed steps' time: all but a run's first step
    double steps_seconds;   // every step's time, for the closing summary's tokens per second
    double started;         // wall_seconds() when training started
    int timed_steps;
    Cost evals, samples, saves; // the evaluations, samples and checkpoints done so far
    int stop;               // the largest signal any rank has received; all ranks stop after the same step
} Run;

// The sequences of a step: a step reads `seqs` sequences of T tokens on each GPU. The loader hands
// them out whole and the micro-batches are B of its rows, so the data of a step (and the shuffle, and
// where an epoch ends) depend on -d alone, never on B: with -b auto every card sees the same batches.
static void plan_step_batch(Run* r) {
    const Options* o = r->o;
    if (o->T > r->cfg.max_seq_len)
        fatal("sequence length -t %d is above the model's maximum of %d (--max-seq)", o->T, r->cfg.max_seq_len);
    long long tokens_per_seq_row = (long long)o->T * r->world; // one sequence on every GPU
    long long total_batch = o->total_batch >= 0 ? o->total_batch : (o->B ? o->B : 4) * tokens_per_seq_row;
    if (total_batch == 0 || total_batch % tokens_per_seq_row != 0 || total_batch / tokens_per_seq_row > (1 << 20))
        fatal("total batch -d %lld is not a multiple of T*GPUs = %d*%d (from 1 to 1048576 times)", total_batch, o->T,
              r->world);
    int seqs = (int)(total_batch / tokens_per_seq_row);
    if (o->B && seqs % o->B != 0)
        fatal("total batch -d %lld is not a multiple of B*T*GPUs = %d*%d*%d = %lld", total_batch, o->B, o->T,
              r->world, (long long)o->B * tokens_per_seq_row);
    if (o->group_sequences && seqs % o->group_sequences != 0)
        fatal("--batch-invariant %d does not divide the %d sequences per GPU of a step (-d %lld)", o->group_sequences,
              seqs, total_batch);
    if (o->B && o->group_sequences && o->B % o->group_sequences != 0)
        fatal("-b %d is not a multiple of --batch-invariant %d", o->B, o->group_sequences);
    // bf16 gradients (GRADS=BF16) round each micro-batch's sum into the step's: the bits depend on B.
    if (o->group_sequences && sizeof(gradX) < sizeof(float))
        fatal("--batch-invariant %d promises the same bits at every -b, which this train_gpt cannot keep: its "
              "gradients are bf16 (built with GRADS=BF16), rounded once per micro-batch; give --batch-invariant 0 "
              "(also after a recipe's -f) or use a build with GRADS=FP32", o->group_sequences);
    r->total_batch = total_batch;
    r->seqs = seqs;
}

// n with a comma between thousands, as the start-up and closing lines print counts of tokens.
static const char* with_commas(char* buf, size_t size, long long n) {
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%lld", n), out = 0;
    for (int i = 0; i < len && out + 2 < (int)size; i++) {
        if (i > 0 && digits[i - 1] != '-' && (len - i) % 3 == 0) buf[out++] = ',';
        buf[out++] = digits[i];
    }
    buf[out] = '\0';
    return buf;
}

// The start-up line of a loader: its file, or its glob and how many shards matched, and its tokens;
// returns the tokens.
static long long print_data_line(const char* what, const char* pattern, const DataLoader* dl) {
    long long tokens = 0;
    for (int i = 0; i < dl->nshards; i++) tokens += dl->shard_tokens[i];
    char count[32];
    if (strcmp(pattern, dl->shard_paths[0]) == 0) printf("%s: %s, %s tokens\n", what, pattern,
                                                          with_commas(count, sizeof count, tokens));
    else printf("%s: %s (%d shard%s), %s tokens\n", what, pattern, dl->nshards, dl->nshards == 1 ? "" : "s",
                with_commas(count, sizeof count, tokens));
    return tokens;
}

// The training and validation loaders, the HellaSwag examples, the steps (-x, or one epoch) and the
// output directory.
static void open_data(Run* r) {
    const Options* o = r->o;
    dataloader_init(&r->train, o->train_pattern, r->seqs, o->T, r->rank, r->world, o->shuffle, o->seed,
                    r->cfg.vocab_size);
    r->train_tokens = print_data_line("train", o->train_pattern, &r->train);
    r->do_val = o->val_every > 0;
    if (r->do_val) dataloader_init(&r->val, o->val_pattern, 1, o->T, r->rank, r->world, 0, 0, r->cfg.vocab_size);
    r->val_seqs = (long long)o->val_batches * r->seqs;
    if (r->do_val && r->val_seqs > dataloader_batches_per_epoch(&r->val))
        r->val_seqs = dataloader_batches_per_epoch(&r->val);
    if (r->do_val) {
        print_data_line("val", o->val_pattern, &r->val);
        // Compared by value: the user's own data with the default validation file is most likely a
        // forgotten -j, and its validation loss would say nothing about the user's text.
        Options d = default_options();
        if (strcmp(o->train_pattern, d.train_pattern) != 0 && strcmp(o->val_pattern, d.val_pattern) == 0)
            printf("warning: -i is given but -j is not: the validation loss is measured on the default %s "
                   "(give -j FILE, or -v 0 for none)\n", d.val_pattern);
    } else {
        printf("val: none (-v 0)\n");
    }
    if (o->hellaswag_dump && !o->hellaswag) fatal("--hellaswag-dump needs --hellaswag FILE");
    if (o->hellaswag) {
        hellaswag_run_open(&r->hellaswag, o->hellaswag, o->hellaswag_limit, o->hellaswag_dump, o->T,
                           r->cfg.vocab_size, r->rank, r->world);
        r->hs = &r->hellaswag;
    }
    r->max_steps = o->max_steps >= 0 ? o->max_steps : (int)dataloader_batches_per_epoch(&r->train);
    ensure_dir(o->out_dir);
    checkpoint_dir_claim(o->out_dir, r->rank, o->resume, o->overwrite);
}

// --dry-run: what a run of these options would build on a card of --memory-limit GiB (with the host's
// memory for offloading) and its memory plan, without touching a GPU.
static int dry_run(const Run* r) {
    const Options* o = r->o;
    if (o->memory_limit <= 0) fatal("--dry-run needs --memory-limit GIB: the memory of the card to plan for");
    const double GiB = 1073741824.0;
    double memory = o->memory_limit * GiB;
    GPT2BuildSpec spec = choose_build(o, &r->cfg, r->world, r->seqs, memory, "--memory-limit", 1, 1);
    MemoryPlan plan = gpt2_memory_plan(&spec);
    gpt2_print_memory_plan(&spec, &plan, 1);
    printf("dry run: B %d, -r %d, offload %s, head slices of %d tokens: %.2f GiB of %.2f GiB --memory-limit less a "
           "%.2f GiB margin%s\n", spec.B, spec.recompute, spec.offload ? "on" : "off", spec.head_slice_tokens,
           plan.total / GiB, memory / GiB, FIT_MARGIN_BYTES / GiB,
           plan.total + FIT_MARGIN_BYTES > memory ? " (does not fit: the run would fail to allocate)" : "");
    return 0;
}

// The FLOPs of a token and the peak that the MFU is a fraction of, and the start-up line that says
// which peak it is and where it comes from: --peak-tflops, the built-in table, or none (on the CPU
// without --peak-tflops, no line and no MFU).
static void setup_mfu(Run* r) {
    const Options* o = r->o;
    // Training FLOPs per token: 6 per parameter (forward + backward) plus causal attention's
    // 6 * L * C * T (half of the 12 L C T of full attention), the usual estimate (PaLM, appendix B).
    r->flops_per_token =
        6.0 * (double)r->model.num_parameters + 6.0 * r->cfg.num_layers * r->cfg.channels * (double)o->T;
    r->peak_flops = o->peak_tflops > 0.0f ? o->peak_tflops * 1e12 : backend_peak_flops();
    char flops[32];
    with_commas(flops, sizeof flops, llround(r->flops_per_token));
    if (o->peak_tflops > 0.0f)
        printf("MFU: %s FLOPs per token (6N + 6LCT) against %g TFLOP/s (--peak-tflops)\n", flops,
               (double)o->peak_tflops);
    else if (r->peak_flops > 0.0)
        printf("MFU: %s FLOPs per token (6N + 6LCT) against %g TFLOP/s, %s\n", flops, r->peak_flops / 1e12,
               backend_peak_source());
    else if (r->on_gpu)
        printf("MFU n/a: %s; pass --peak-tflops\n", backend_peak_source());
}

// GRAD_SUMS_BESIDE_BACKWARD (read once): 1 sums each layer's gradients over the ranks beside the
// backward of the layers below (gpt2_backward); 0, the default, sums them all after the backward,
// in one collective. The same bits on 2 ranks (docs/several-gpus.md says what has run of it).
static int sums_beside_backward(void) {
    static int beside = -1;
    if (beside < 0)
        beside = env_switch("GRAD_SUMS_BESIDE_BACKWARD", 0,
                            "each layer's gradients summed over the ranks beside the backward of the layers below",
                            "all of them after the backward");
    return beside;
}

// The device and the ranks, then the model: its micro-batch (-b, or -b auto from the memory plan),
// the build, and its weights from the model file or the seed.
static void build_model(Run* r, const DistEnv* env) {
    const Options* o = r->o;
    backend_init(env->local_rank);
    Rendezvous rdv = {0};
    if (r->world > 1) { // printed before the wait, so that a wrong choice shows at once
        rdv = rendezvous_choose(o->nccl_dir, o->out_dir);
        char how[512];
        printf("rendezvous: %s\n", rendezvous_describe(&rdv, how, sizeof how));
    }
    comm_init(r->rank, r->world, &rdv, o->nccl_timeout);
    size_t total_memory;
    int on_gpu = backend_memory(&r->free_before, &total_memory);
    const char* memory_source;
    double memory = planning_memory(o, r->free_before, &memory_source);
    GPT2BuildSpec spec = choose_build(o, &r->cfg, r->world, r->seqs, memory, memory_source, on_gpu, 0);
    r->B = spec.B;
    r->accum = r->seqs / spec.B;
    gpt2_build(&r->model, &spec);
    const GPT2Config* cfg = &r->cfg;
    printf("%s | %s\n", backend_describe(), attention_description());
    if (r->world > 1)
        printf("%d ranks (%s, %s), ZeRO stage %d%s\n", r->world, env->source, comm_name(), o->zero_stage,
               sums_beside_backward() ? ", gradients summed beside the backward" : "");
    printf("model: L %d, C %d, NH %d, max T %d, V %d (padded %d), %zu parameters%s%s\n",
           cfg->num_layers, cfg->channels, cfg->num_heads, cfg->max_seq_len, cfg->vocab_size,
           cfg->padded_vocab_size, r->model.num_parameters, r->file_weights ? " from " : "",
           r->file_weights ? o->model : "");
    printf("batch: B %d x T %d x %d %s x %d accumulation = %lld tokens per step, %d steps%s\n",
           r->B, o->T, r->world, on_gpu ? "GPU(s)" : "rank(s)", r->accum, r->total_batch, r->max_steps,
           o->group_sequences ? ", gradients summed per group of sequences (--batch-invariant)" : "");
    char tokens[32];
    printf("schedule: %s tokens (%.3g epochs), lr %g, warmup %d, then %s to %g at step %d; weight decay %g, "
           "grad clip %g, seed %llu\n", with_commas(tokens, sizeof tokens, r->total_batch * r->max_steps),
           (double)r->total_batch * r->max_steps / (double)r->train_tokens, (double)o->lr, o->warmup, o->schedule,
           (double)(strcmp(o->schedule, "constant") == 0 ? o->lr : o->lr * o->final_lr_frac), r->max_steps,
           (double)o->weight_decay, (double)o->grad_clip, o->seed);
    r->on_gpu = on_gpu;
    setup_mfu(r);
    if (r->file_weights) {
        gpt2_set_weights(&r->model, r->file_weights);
        print_weights_converted(o->model);
        free(r->file_weights);
        r->file_weights = NULL;
    } else {
        gpt2_init_random(&r->model, o->seed);
    }
}

// Exits unless the training state st (read from path) was saved by a run of this model, rank and
// world and keeps the optimizer state of the parameters this rank keeps.
static void check_resumable(const Run* r, const TrainState* st, const char* path) {
    const GPT2* model = &r->model;
    if (memcmp(&st->config, &r->cfg, sizeof r->cfg) != 0)
        fatal("training state %s is of another model (L %d, C %d, NH %d, max T %d) than the options ask for",
              path, st->config.num_layers, st->config.channels, st->config.num_heads, st->config.max_seq_len);
    if (st->world != r->world || st->rank != r->rank)
        fatal("training state %s was saved by rank %d of %d GPUs; resume with the same number of GPUs (now %d)",
              path, st->rank, st->world, r->world);
    if (st->nparams != model->num_parameters || st->opt_offset != model->opt_offset ||
        st->opt_count != model->opt_count)
        fatal("training state %s holds optimizer state of parameters [%zu, %zu) of %zu; this rank keeps "
              "[%zu, %zu) of %zu (saved with another -z?)", path, st->opt_offset, st->opt_offset + st->opt_count,
              st->nparams, model->opt_offset, model->opt_offset + model->opt_count, model->num_parameters);
}

// The training state of the newest step that every rank has saved (a kill during a save can leave
// some ranks a step ahead) and reads back intact (checksums, finite values) into st and path;
// returns 0 when the directory holds none. A damaged checkpoint is named, set aside on every rank
// as *.corrupt (kept, not deleted) and the next older one tried; none intact is an error.
static int load_newest_good_state(const Run* r, TrainState* st, char* path, size_t path_size) {
    const char* dir = r->o->out_dir;
    for (int set_aside = 0;; set_aside++) {
        double latest[2] = {(double)checkpoint_latest_step(dir, r->rank), 0};
        latest[1] = -latest[0];
        comm_allreduce_host(latest, 2, COMM_MIN);
        long long step = (long long)latest[0], newest = (long long)-latest[1];
        if (newest < 0 && set_aside)
            fatal("%s holds no intact checkpoint: the damaged ones were renamed to *.corrupt", dir);
        if (newest < 0) return 0;
        if (step < 0)
            fatal("rank %d: %s holds training states of some ranks but not of others; resume with "
                  "the number of GPUs that saved them", r->rank, dir);
        checkpoint_state_path(path, path_size, dir, step, r->rank);
        double have = access(path, R_OK) == 0;
        comm_allreduce_host(&have, 1, COMM_MIN);
        if (!have) fatal("rank %d: not every rank has a training state of step %lld in %s", r->rank, step, dir);
        char err[512];
        int mine = train_state_load(path, st, err, sizeof err) == 0;
        double good = mine;
        if (!good) fprintf(stderr, "warning: rank %d: %s: %s\n", r->rank, path, err);
        comm_allreduce_host(&good, 1, COMM_MIN);
        if (good) return 1;
        if (mine) train_state_free(st); // this rank's was intact, another rank's was not
        checkpoint_set_aside_as(dir, r->rank, step, "corrupt");
        printf("the checkpoint of step %lld cannot be resumed (renamed to *.corrupt): falling back to the "
               "newest older one\n", step);
    }
}

// -y 1: the weights, optimizer, guard, data position and sampler of the newest good checkpoint; from
// scratch when there is none. A checkpoint beyond -x is refused; one at -x is a finished run.
static void resume_from_checkpoint(Run* r) {
    const Options* o = r->o;
    r->rng = sampler_seed(o->seed);
    int scaling = strcmp(o->loss_scale, "dynamic") == 0;
    r->guard.loss_scale = scaling ? LOSS_SCALE_INIT : 0.0;
#if defined(PRECISION_FP16)
    if (!scaling && r->rank == 0)
        printf("warning: --loss-scale 0 in the FP16 build: gradients below fp16's smallest value (6e-8) become 0 "
               "and large ones may overflow; --loss-scale dynamic (the default) avoids both\n");
#endif
    if (!o->resume) return;
    char path[4096];
    TrainState st;
    if (!load_newest_good_state(r, &st, path, sizeof path)) {
        printf("no checkpoint in %s: starting from scratch\n", o->out_dir);
        return;
    }
    check_resumable(r, &st, path);
    if (st.step > MAX_STEPS)
        fatal("training state %s holds the impossible step %lld (-x allows at most %d): the file is damaged", path,
              (long long)st.step, MAX_STEPS);
    if (st.step > r->max_steps)
        fatal("training state %s is at step %lld, beyond the run's %d steps (-x): give -x %lld or more to "
              "train on from it", path, (long long)st.step, r->max_steps, (long long)st.step);
    if (st.step == r->max_steps)
        printf("the run in %s is already complete: its checkpoint is at step %lld of %d (-x); nothing to train\n",
               o->out_dir, (long long)st.step, r->max_steps);
    // the weights as the last update (t = st.updates, seed as in the loop) left them
    gpt2_set_optimizer_state(&r->model, st.master, st.m, st.v, (int)st.updates,
                             o->seed + (unsigned long long)st.updates - 1);
    r->guard = (Guard){.updates = st.updates, .last_applied = st.last_applied, .history = st.history};
    // The scale goes on where it was; a state saved without scaling (or before version 4) starts it
    // afresh when --allow-change turns it on, and turning it off drops it.
    if (scaling && st.loss_scale > 0.0) {
        r->guard.loss_scale = st.loss_scale;
        r->guard.scale_clean_steps = st.scale_clean_steps;
        r->guard.overflow_skips = st.overflow_skips;
    } else if (scaling) {
        r->guard.loss_scale = LOSS_SCALE_INIT;
    }
    dataloader_set_state(&r->train, &st.loader);
    r->rng = st.sample_rng;
    r->start_step = st.step;
    train_state_free(&st);
    printf("resumed from %s at step %lld\n", path, r->start_step);
}

// log.csv (rank 0), the vocabulary for the samples, the signal handlers, and what the step lines
// compute with; then the evaluations before the first step of a fresh run.
static void start_training(Run* r) {
    const Options* o = r->o;
    r->log = r->rank == 0 ? open_log(o->out_dir, o->resume ? r->start_step : -1) : NULL;
    write_run_conf(o); // by every rank: with several machines each may have its own -o
    snprintf(r->log_path, sizeof r->log_path, "%s/log.csv", o->out_dir);
    if (r->rank == 0 && o->sample_every > 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/encoder.json", o->vocab_dir);
        if (access(path, R_OK) == 0) r->tok = tokenizer_load(o->vocab_dir);
        else printf("warning: no vocabulary in %s (--vocab): samples are printed as token ids\n", o->vocab_dir);
    }
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    r->max_loss = o->max_loss < 0.0f ? 2.0f * logf((float)r->cfg.vocab_size) : o->max_loss;
    r->step = r->start_step;
    r->started = wall_seconds();
    if (r->start_step == 0 && (r->do_val || r->hs)) {
        char val_field[32] = "", hs_field[32] = "";
        double t0 = wall_seconds();
        evaluate(&r->model, r->do_val ? &r->val : NULL, (int)r->val_seqs, r->B, r->hs, 0, val_field, hs_field,
                 sizeof val_field);
        r->evals.seconds += wall_seconds() - t0;
        r->evals.count++;
        if (r->log) fprintf(r->log, "0,,%s,,,,,,%s,\n", val_field, hs_field), fflush(r->log);
    }
}

// The step's forward and backward over its micro-batches, then the gradients reduced over the ranks:
// returns the global gradient norm, and the step's mean loss over all ranks in *loss.
static float compute_gradients(Run* r, float* loss) {
    const Options* o = r->o;
    // With loss scaling the backward starts from the loss times the scale: the rounded 1/total_batch
    // times a power of two keeps its bits, so every gradient is the scale times the unscaled one.
    const float scale = r->guard.loss_scale > 0.0 ? (float)r->guard.loss_scale : 1.0f;
    gpt2_zero_grad(&r->model);
    // Fault injection for the tests, on the last rank: the others learn of it only through the
    // decision that all ranks take together.
    long long step = r->step + 1;
    if (r->rank == r->world - 1 && o->inject_nan_grad && step_listed(o->inject_nan_grad, "--inject-nan-grad", step))
        gpt2_inject_nan_gradient(&r->model);
    dataloader_next_batch(&r->train); // this rank's part of the step, micro-batches of B rows
    for (int micro = 0; micro < r->accum; micro++) {
        size_t row = (size_t)micro * r->B * o->T;
        gpt2_forward(&r->model, r->train.inputs + row, r->train.targets + row, r->B, o->T,
                     (1.0f / (float)r->total_batch) * scale);
        gpt2_backward(&r->model, micro == r->accum - 1 && sums_beside_backward());
    }
    // The losses, and their mean over all the step's positions, while the GPU runs the last
    // backward (gpt2_losses waits for the forward's downloads only), so that the GPU is not left
    // idle while the host sums them. The gradient reduction below waits for the rest.
    size_t count;
    const float* losses = gpt2_losses(&r->model, &count);
    double mean_loss = gpt2_loss_sum(losses, count) / (double)count;
    if (r->rank == r->world - 1 && o->inject_nan_loss && step_listed(o->inject_nan_loss, "--inject-nan-loss", step))
        mean_loss = NAN;
    float norm = gpt2_reduce_gradients(&r->model, &mean_loss);
    *loss = (float)mean_loss;
    // the true norm (exact: a power of two), which the guard, the step line and log.csv see
    return norm / scale;
}

// What the divergence guard decided for a step, and the z-scores it decided with.
typedef struct {
    int window;           // the applied steps the z-scores compare with
    double z_loss, z_norm;
    int skipped;
    char why[128];        // why it was skipped
    double loss_scale;    // the loss scale the step ran with (0: off)
} GuardDecision;

// The divergence guard: applies the step's update (AdamW) unless the loss or the norm says to skip it.
static GuardDecision update_unless_diverging(Run* r, float loss, float norm, float lr) {
    const Options* o = r->o;
    Guard* g = &r->guard;
    GuardDecision d = {.window = g->history.count};
    d.z_loss = z_score(g->history.loss, d.window, loss);
    d.z_norm = z_score(g->history.norm, d.window, norm);
    d.loss_scale = g->loss_scale;
    // With loss scaling a gradient that is not finite while the loss is means the scale was too large
    // for it (an overflow), not that training went wrong: the step is skipped and the scale halved,
    // and --max-skips does not count the skip. At the floor, scale 1, an overflow is real: the scale
    // has collapsed, and the skip counts like any other.
    if (g->loss_scale > 0.0 && isfinite(loss) && !isfinite(norm)) {
        d.skipped = 1;
        g->scale_clean_steps = 0;
        if (g->loss_scale > 1.0) {
            g->loss_scale /= 2.0;
            g->overflow_skips++;
            snprintf(d.why, sizeof d.why, "gradient overflow at loss scale %.0f: scale halved to %.0f",
                     d.loss_scale, g->loss_scale);
        } else {
            snprintf(d.why, sizeof d.why, "gradient overflow at loss scale 1: the loss scale has collapsed, "
                     "so the skip counts toward --max-skips");
        }
        return d;
    }
    d.skipped = skip_step(o, r->max_loss, loss, norm, d.z_loss, d.z_norm, d.why, sizeof d.why);
    if (!d.skipped) {
        const float eps = 1e-8f;
        const float inv_scale = g->loss_scale > 0.0 ? (float)(1.0 / g->loss_scale) : 1.0f;
        g->updates++;
        gpt2_update(&r->model, norm, lr, o->beta1, o->beta2, eps, o->weight_decay, o->grad_clip, inv_scale,
                    (int)g->updates, o->seed + (unsigned long long)g->updates - 1);
        g->last_applied = r->step + 1;
        history_push(&g->history, loss, norm);
        g->overflow_skips = 0;
        if (g->loss_scale > 0.0 && ++g->scale_clean_steps >= o->loss_scale_growth) {
            g->loss_scale = fmin(2.0 * g->loss_scale, LOSS_SCALE_MAX);
            g->scale_clean_steps = 0;
        }
    }
    return d;
}

// How many of the steps from..to do a kind of work that comes every `every` steps (never when 0) and
// after the last step, `to`.
static long long due_between(long long from, long long to, int every) {
    if (from > to) return 0;
    long long multiples = every > 0 ? to / every - (from - 1) / every : 0;
    return multiples + (every <= 0 || to % every != 0);
}

// The time left: the steps, and the evaluations, samples and checkpoints still due from this step
// on (this step's own are still to come), each at the mean of its kind so far. A kind not yet done
// counts nothing until it is (a fresh run measures its validation at step 0).
static double seconds_left(const Run* r, double mean_step) {
    const Options* o = r->o;
    long long s = r->step, last = r->max_steps;
    int sampling = o->sample_every > 0 && o->gen_tokens > 0; // on rank 0; the others wait for it
    return mean_step * (double)(last - s) + mean_cost(&r->evals) * (double)due_between(s, last, o->val_every) +
           (sampling ? mean_cost(&r->samples) * (double)due_between(s, last, o->sample_every) : 0.0) +
           mean_cost(&r->saves) * (double)due_between(s, last, o->checkpoint_every);
}

// The model FLOPs utilisation of a step of `seconds`: its training FLOPs over what one GPU's peak
// does in that time, per GPU (0 when the peak is unknown).
static double step_mfu(const Run* r, double seconds) {
    if (r->peak_flops <= 0.0) return 0.0;
    return r->flops_per_token * (double)r->total_batch / r->world / seconds / r->peak_flops;
}

// The step's line: loss, norm, learning rate, time, throughput, MFU, ETA, the z-scores, a skip.
static void print_step(Run* r, float loss, float norm, float lr, double seconds, const GuardDecision* d) {
    const Options* o = r->o;
    if (r->step > r->start_step + 1 || r->max_steps - r->start_step == 1) {
        r->train_seconds += seconds;
        r->timed_steps++;
    }
    double mean_step = r->timed_steps ? r->train_seconds / r->timed_steps : seconds;
    char eta[32];
    format_eta(eta, sizeof eta, seconds_left(r, mean_step));
    char mfu[32] = "";
    if (r->peak_flops > 0.0) snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100.0 * step_mfu(r, seconds));
    else if (r->on_gpu) snprintf(mfu, sizeof mfu, " | MFU n/a");
    char zs[64] = "";
    if (o->skip_loss_z > 0.0f || o->skip_norm_z > 0.0f) {
        if (d->window < STEP_HISTORY) snprintf(zs, sizeof zs, " | z window %d/%d", d->window, STEP_HISTORY);
        else snprintf(zs, sizeof zs, " | z loss %.2f norm %.2f", d->z_loss, d->z_norm);
    }
    char scale[32] = "";
    if (d->loss_scale > 0.0) snprintf(scale, sizeof scale, " | scale %.0f", d->loss_scale);
    printf("step %5lld/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s%s | eta %s%s%s%s%s\n",
           r->step, r->max_steps, loss, norm, lr, 1e3 * seconds, r->total_batch / seconds, mfu, eta, zs,
           scale, d->skipped ? " | SKIPPED: " : "", d->skipped ? d->why : "");
}

// The evaluations due after the step (every -v steps and after the last), then its row of log.csv.
static void evaluate_and_log(Run* r, float loss, float norm, float lr, double seconds, int skipped) {
    const Options* o = r->o;
    char val_field[32] = "", hs_field[32] = "";
    if (r->step == r->max_steps || (o->val_every > 0 && r->step % o->val_every == 0)) {
        double t0 = wall_seconds();
        evaluate(&r->model, r->do_val ? &r->val : NULL, (int)r->val_seqs, r->B, r->hs, r->step, val_field,
                 hs_field, sizeof val_field);
        r->evals.seconds += wall_seconds() - t0;
        r->evals.count++;
    }
    if (r->log) {
        char mfu_field[32] = ""; // a fraction, empty where the peak is unknown
        if (r->peak_flops > 0.0) snprintf(mfu_field, sizeof mfu_field, "%.4g", step_mfu(r, seconds));
        fprintf(r->log, "%lld,%.9g,%s,%.7g,%.7g,%.3f,%.1f,%d,%s,%s\n", r->step, loss, val_field, lr, norm,
                1e3 * seconds, r->total_batch / seconds, skipped, hs_field, mfu_field);
        if (fflush(r->log) != 0) fatal("cannot write %s: %s", r->log_path, strerror(errno));
    }
}

// Whether any rank has been asked to stop (SIGINT, SIGTERM): all ranks then stop after this step.
static int stop_requested(void) {
    double signal_seen = stop_signal;
    comm_allreduce_host(&signal_seen, 1, COMM_MAX);
    return (int)signal_seen;
}

// One optimizer step: gradients, the guard's update, the step's line, evaluations and log, then the
// divergence stop, the sample and the checkpoint that are due.
static void train_step(Run* r) {
    const Options* o = r->o;
    double t0 = wall_seconds();
    float lr = learning_rate(o, (int)r->step, r->max_steps);
    float loss, norm = compute_gradients(r, &loss);
    GuardDecision d = update_unless_diverging(r, loss, norm, lr);
    // No wait for the update: the host prints, logs and queues the next step (its gradients'
    // zeroing, tokens and forward) while the GPU runs AdamW. The step's time is the loop's: the host
    // waits for the GPU within every step (its losses, its gradient norm), so in a steady run the
    // loop keeps its pace.
    double seconds = wall_seconds() - t0;
    r->steps_seconds += seconds;
    r->step++;
    r->stop = stop_requested();
    print_step(r, loss, norm, lr, seconds, &d);
    evaluate_and_log(r, loss, norm, lr, seconds, d.skipped);
    // the skips in a row since the last applied step, the loss scale's overflows aside
    if (o->max_skips > 0 && r->step - r->guard.last_applied - r->guard.overflow_skips >= o->max_skips)
        stop_diverged(o, &r->guard, r->step, r->rank, d.why);
    if (r->rank == 0 && o->sample_every > 0 && o->gen_tokens > 0 &&
        (r->step % o->sample_every == 0 || r->step == r->max_steps)) {
        double t0 = wall_seconds();
        print_sample(&r->model, o, r->tok, &r->rng);
        r->samples.seconds += wall_seconds() - t0;
        r->samples.count++;
    }
    if (r->step == r->max_steps || r->stop || (o->checkpoint_every > 0 && r->step % o->checkpoint_every == 0)) {
        double t0 = wall_seconds();
        save_checkpoint(&r->model, &r->train, r->step, r->rng, &r->guard, o, r->rank, r->world);
        r->saves.seconds += wall_seconds() - t0;
        r->saves.count++;
    }
}

// The evaluations of a whole run as log.csv holds them (a resumed run's earlier rows too), each as
// its field's text: the last validation loss, the best one, the last HellaSwag accuracy.
typedef struct {
    char last_val[32], best_val[32], hellaswag[32];
    long long last_val_step, best_val_step, hellaswag_step; // -1: none
} Evaluations;

static Evaluations read_evaluations(const char* log_path) {
    Evaluations e = {.last_val_step = -1, .best_val_step = -1, .hellaswag_step = -1};
    FILE* f = fopen(log_path, "r");
    if (!f) return e;
    char line[1024];
    double best = INFINITY;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *fields[9], *rest = line; // step,train_loss,val_loss,lr,grad_norm,ms,tok_per_s,skipped,hellaswag
        int n = 0;
        while (n < 9 && rest) fields[n++] = strsep(&rest, ",");
        char* end;
        long long step = strtoll(fields[0], &end, 10);
        if (n < 9 || end == fields[0]) continue; // the header
        if (*fields[2]) {
            snprintf(e.last_val, sizeof e.last_val, "%s", fields[2]);
            e.last_val_step = step;
            if (strtod(fields[2], NULL) < best) {
                best = strtod(fields[2], NULL);
                snprintf(e.best_val, sizeof e.best_val, "%s", fields[2]);
                e.best_val_step = step;
            }
        }
        if (*fields[8]) {
            snprintf(e.hellaswag, sizeof e.hellaswag, "%s", fields[8]);
            e.hellaswag_step = step;
        }
    }
    fclose(f);
    return e;
}

// The closing summary on rank 0: what this run did and how fast, the evaluations of the whole run,
// and the files to take away.
static void print_summary(const Run* r) {
    const Options* o = r->o;
    long long steps = r->step - r->start_step, skipped = r->step - r->guard.updates;
    char tokens[32], wall[32], rate[32];
    format_eta(wall, sizeof wall, wall_seconds() - r->started);
    with_commas(rate, sizeof rate, r->steps_seconds > 0.0 ? llround(steps * r->total_batch / r->steps_seconds) : 0);
    printf("summary: %lld steps (%lld to %lld), %s tokens in %s: %s tokens/s over the steps' %.1f s\n", steps,
           r->start_step, r->step, with_commas(tokens, sizeof tokens, steps * r->total_batch), wall, rate,
           r->steps_seconds);
    Evaluations e = read_evaluations(r->log_path);
    if (e.last_val_step >= 0)
        printf("validation loss: %s at step %lld, the best %s at step %lld\n", e.last_val, e.last_val_step,
               e.best_val, e.best_val_step);
    if (e.hellaswag_step >= 0) printf("hellaswag: %s at step %lld\n", e.hellaswag, e.hellaswag_step);
    printf("skipped steps: %lld of %lld\n", skipped, r->step);
    if (r->guard.loss_scale > 0.0) printf("loss scale: %.0f\n", r->guard.loss_scale);
    long long saved = checkpoint_latest_step(o->out_dir, r->rank);
    if (saved >= 0) {
        char path[4096];
        checkpoint_model_path(path, sizeof path, o->out_dir, saved);
        printf("model file: %s\n", path);
        checkpoint_state_path(path, sizeof path, o->out_dir, saved, r->rank);
        printf("training state: %s%s\n", path, r->world > 1 ? " (and one per rank)" : "");
    }
    printf("log: %s\n", r->log_path);
}

// After the loop: the checkpoint of a run that had no step to take, the memory report, the summary,
// and everything closed. Returns the exit status: 128 + the signal that stopped the run, else 0.
static int finish_training(Run* r) {
    const Options* o = r->o;
    if (r->max_steps == r->start_step)
        save_checkpoint(&r->model, &r->train, r->step, r->rng, &r->guard, o, r->rank, r->world);
    report_memory_use(&r->model, r->free_before);
    if (r->log) fclose(r->log);
    if (r->stop) printf("stopped by signal %d after step %lld; resume with -y 1\n", r->stop, r->step);
    if (r->rank == 0) print_summary(r);
    if (r->tok) tokenizer_free(r->tok);
    if (r->do_val) dataloader_free(&r->val);
    if (r->hs) hellaswag_run_close(r->hs);
    dataloader_free(&r->train);
    gpt2_free(&r->model);
    comm_free();
    return r->stop ? 128 + r->stop : 0;
}

// ---- main --------------------------------------------------------------------------------

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Options o = parse_options(argc, argv);
    DistEnv env = dist_env_detect();
    if (o.prompt || o.prompt_file) return generate_from_prompt(&o, &env);
    // Only rank 0 prints; errors go to stderr from every rank.
    if (env.rank != 0 && !freopen("/dev/null", "w", stdout)) fatal("rank %d: cannot silence stdout", env.rank);
    if (o.resume) o = options_for_resume(&o, argc, argv);

    Run run = {.o = &o, .rank = env.rank, .world = env.world};
    run.file_weights = resolve_model(&o, &run.cfg); // a preset, custom sizes or a model file
    plan_step_batch(&run);
    if (o.dry_run) return dry_run(&run);
    open_data(&run);
    build_model(&run, &env);
    resume_from_checkpoint(&run);
    start_training(&run);
    while (run.step < run.max_steps && !run.stop) train_step(&run);
    return finish_training(&run);
}
