// train_gpt / train_gpt_cpu: trains a GPT-2 on token files. The same program for both backends;
// all layer math lives behind kernels/kernels.h and the model orchestration in model/gpt2.c.
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoints/checkpoint.h"
#include "common/dist.h"
#include "common/util.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "model/gpt2.h"

// ---- options -----------------------------------------------------------------------------

typedef struct {
    const char* train_pattern;  // -i
    const char* val_pattern;    // -j
    const char* model;          // -e: d12 | d24 | d36 | d48 | a model file
    const char* out_dir;        // -o
    const char* vocab_dir;      // --vocab
    int B, T;                   // -b, -t
    long long total_batch;      // -d, tokens per optimizer step (-1: B*T*world)
    int max_steps;              // -x (-1: one epoch)
    float lr;                   // -l
    int warmup;                 // -u
    float final_lr_frac;        // -q
    const char* schedule;       // -k: cosine | linear | constant
    float weight_decay;         // -c
    float grad_clip;            // --grad-clip
    int val_every, val_batches; // -v, -m
    int sample_every, gen_tokens; // -s, -g
    float temperature;          // --temperature
    int top_k;                  // --top-k
    int checkpoint_every;       // -n
    int resume;                 // -y
    int keep;                   // --keep
    int recompute;              // -r
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
        .B = 4, .T = 1024, .total_batch = -1, .max_steps = -1,
        .lr = 3e-4f, .warmup = 0, .final_lr_frac = 1.0f, .schedule = "cosine",
        .weight_decay = 0.0f, .grad_clip = 1.0f,
        .val_every = 20, .val_batches = 20, .sample_every = 20, .gen_tokens = 64,
        .temperature = 1.0f, .top_k = 0,
        .checkpoint_every = 0, .resume = 0, .keep = 0, .recompute = 0, .zero_stage = 0,
        .shuffle = 0, .seed = 1337, .nccl_dir = NULL, .nccl_timeout = 300.0,
    };
    return o;
}

static void print_usage(void) {
    Options d = default_options();
    printf("usage: train_gpt [options]\n"
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
           "  -b, --batch N             micro-batch size (default %d)\n"
           "  -t, --seq-len N           sequence length (default %d)\n"
           "  -d, --total-batch N       tokens per optimizer step; gradient accumulation makes up the\n"
           "                            difference (default B*T)\n"
           "  -x, --steps N             optimizer steps (default -1: one epoch)\n"
           "  -l, --lr F                peak learning rate (default %g)\n"
           "  -u, --warmup N            linear warmup steps (default %d)\n"
           "  -k, --schedule NAME       cosine | linear | constant after warmup (default %s)\n"
           "  -q, --final-lr-frac F     final learning rate as a fraction of the peak (default %g)\n"
           "  -c, --weight-decay F      AdamW weight decay of 2-D weights (default %g)\n"
           "      --grad-clip F         global gradient norm clip, 0 = off (default %g)\n"
           "evaluation and sampling\n"
           "  -v, --val-every N         validation loss every N steps, 0 = never (default %d)\n"
           "  -m, --val-batches N       validation batches (default %d)\n"
           "  -s, --sample-every N      sample every N steps, 0 = never (default %d)\n"
           "  -g, --gen-tokens N        tokens to sample (default %d)\n"
           "      --temperature F       sampling temperature (default %g)\n"
           "      --top-k N             sample among the N most likely tokens, 0 = all (default %d)\n"
           "output and checkpoints\n"
           "  -o, --out DIR             log.csv, model files and training state (default %s)\n"
           "  -n, --checkpoint-every N  save model and training state every N steps, 0 = only at\n"
           "                            the end and on SIGINT/SIGTERM (default %d)\n"
           "  -y, --resume 0|1          resume from the latest training state in DIR (default %d)\n"
           "      --keep K              keep the K newest checkpoints, 0 = all (default %d)\n"
           "memory\n"
           "  -r, --recompute 0|1|2     recompute GELU (1) and also layernorms (2) in the backward\n"
           "                            instead of storing them (default %d)\n"
           "several GPUs (one process per GPU; rank from RANK/WORLD_SIZE/LOCAL_RANK, mpirun or srun)\n"
           "  -z, --zero 0|1            ZeRO stage: 1 shards AdamW state and master weights (default %d)\n"
           "      --nccl-dir DIR        directory shared by all ranks for the NCCL id (default: -o)\n"
           "      --nccl-timeout S      give up when the ranks do not meet within S seconds (default %g)\n"
           "  -h, --help                this help\n",
           d.train_pattern, d.val_pattern, d.shuffle, d.vocab_dir, d.model, d.seed, d.B, d.T,
           (double)d.lr, d.warmup, d.schedule, (double)d.final_lr_frac, (double)d.weight_decay,
           (double)d.grad_clip, d.val_every, d.val_batches, d.sample_every, d.gen_tokens,
           (double)d.temperature, d.top_k, d.out_dir, d.checkpoint_every, d.resume, d.keep,
           d.recompute, d.zero_stage, d.nccl_timeout);
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
       OPT_TEMPERATURE, OPT_TOP_K, OPT_SHUFFLE, OPT_GRAD_CLIP, OPT_NCCL_DIR, OPT_NCCL_TIMEOUT };

static Options parse_options(int argc, char** argv) {
    Options o = default_options();
    static const struct option longs[] = {
        {"train", 1, 0, 'i'}, {"val", 1, 0, 'j'}, {"model", 1, 0, 'e'}, {"out", 1, 0, 'o'},
        {"batch", 1, 0, 'b'}, {"seq-len", 1, 0, 't'}, {"total-batch", 1, 0, 'd'},
        {"steps", 1, 0, 'x'}, {"lr", 1, 0, 'l'}, {"warmup", 1, 0, 'u'},
        {"final-lr-frac", 1, 0, 'q'}, {"schedule", 1, 0, 'k'}, {"weight-decay", 1, 0, 'c'},
        {"val-every", 1, 0, 'v'}, {"val-batches", 1, 0, 'm'}, {"sample-every", 1, 0, 's'},
        {"gen-tokens", 1, 0, 'g'}, {"checkpoint-every", 1, 0, 'n'}, {"resume", 1, 0, 'y'},
        {"recompute", 1, 0, 'r'}, {"zero", 1, 0, 'z'}, {"help", 0, 0, 'h'},
        {"layers", 1, 0, OPT_LAYERS}, {"channels", 1, 0, OPT_CHANNELS}, {"heads", 1, 0, OPT_HEADS},
        {"max-seq", 1, 0, OPT_MAX_SEQ}, {"seed", 1, 0, OPT_SEED}, {"vocab", 1, 0, OPT_VOCAB},
        {"keep", 1, 0, OPT_KEEP}, {"temperature", 1, 0, OPT_TEMPERATURE}, {"top-k", 1, 0, OPT_TOP_K},
        {"shuffle", 1, 0, OPT_SHUFFLE}, {"grad-clip", 1, 0, OPT_GRAD_CLIP},
        {"nccl-dir", 1, 0, OPT_NCCL_DIR}, {"nccl-timeout", 1, 0, OPT_NCCL_TIMEOUT}, {0, 0, 0, 0}};
    const long long BIG = 1LL << 40;
    opterr = 0; // we print our own message
    int c, index;
    while ((c = getopt_long(argc, argv, ":i:j:e:o:b:t:d:x:l:u:q:k:c:v:m:s:g:n:y:r:z:h", longs, &index)) != -1) {
        char name[64];
        if (c >= OPT_LAYERS) snprintf(name, sizeof name, "--%s", longs[index].name);
        else snprintf(name, sizeof name, "-%c", c);
        switch (c) {
        case 'i': o.train_pattern = optarg; break;
        case 'j': o.val_pattern = optarg; break;
        case 'e': o.model = optarg; break;
        case 'o': o.out_dir = optarg; break;
        case 'b': o.B = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case 't': o.T = (int)parse_int_option(optarg, name, 1, 1 << 20); break;
        case 'd': o.total_batch = parse_int_option(optarg, name, -1, BIG); break;
        case 'x': o.max_steps = (int)parse_int_option(optarg, name, -1, 1 << 30); break;
        case 'l': o.lr = parse_float(optarg, name, 0.0, 10.0); break;
        case 'u': o.warmup = (int)parse_int_option(optarg, name, 0, 1 << 30); break;
        case 'q': o.final_lr_frac = parse_float(optarg, name, 0.0, 1.0); break;
        case 'k': o.schedule = optarg; break;
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
        case OPT_TEMPERATURE: o.temperature = parse_float(optarg, name, 1e-3, 100.0); break;
        case OPT_TOP_K: o.top_k = (int)parse_int_option(optarg, name, 0, 1 << 20); break;
        case OPT_SHUFFLE: o.shuffle = (int)parse_int_option(optarg, name, 0, 1); break;
        case OPT_GRAD_CLIP: o.grad_clip = parse_float(optarg, name, 0.0, 1e9); break;
        case OPT_NCCL_DIR: o.nccl_dir = optarg; break;
        case OPT_NCCL_TIMEOUT: o.nccl_timeout = parse_float(optarg, name, 1.0, 1e6); break;
        case 'h': print_usage(); exit(0);
        case ':': fatal("option %s needs a value (see --help)", argv[optind - 1]);
        default: fatal("unknown option %s (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc) fatal("unexpected argument '%s' (see --help)", argv[optind]);
    if (strcmp(o.schedule, "cosine") && strcmp(o.schedule, "linear") && strcmp(o.schedule, "constant"))
        fatal("option -k: unknown schedule '%s' (cosine, linear or constant)", o.schedule);
    return o;
}

// ---- model configuration -----------------------------------------------------------------

// GPT-2 sizes by depth, as in the GPT-2 paper: layers, channels, heads.
static int preset_config(const char* name, GPT2Config* cfg) {
    static const struct { const char* name; int L, C, NH; } presets[] = {
        {"d12", 12, 768, 12}, {"d24", 24, 1024, 16}, {"d36", 36, 1280, 20}, {"d48", 48, 1600, 25}};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name) == 0) {
            cfg->num_layers = presets[i].L;
            cfg->channels = presets[i].C;
            cfg->num_heads = presets[i].NH;
            return 1;
        }
    }
    return 0;
}

// Checks an option given on the command line against the model file's value.
static void check_matches(const char* path, const char* what, int file_value, int option_value) {
    if (option_value && option_value != file_value)
        fatal("model file %s has %s = %d, but the options ask for %d", path, what, file_value, option_value);
}

// Builds the model from a preset, custom sizes or a model file; returns the file's weights (or NULL).
static float* resolve_model(const Options* o, GPT2Config* cfg) {
    int custom = o->layers || o->channels || o->heads;
    memset(cfg, 0, sizeof *cfg);
    if (preset_config(o->model, cfg)) { // from scratch: a preset, or custom sizes
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
    check_matches(o->model, "layers", cfg->num_layers, o->layers);
    check_matches(o->model, "channels", cfg->channels, o->channels);
    check_matches(o->model, "heads", cfg->num_heads, o->heads);
    check_matches(o->model, "max sequence length", cfg->max_seq_len, o->max_seq);
    return weights;
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

static uint64_t rng_next(uint64_t* state) { // xorshift64*
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545F4914F6CDD1Dull;
}

static float rng_uniform(uint64_t* state) { return (float)(rng_next(state) >> 40) / 16777216.0f; }

// Samples a token from logits (V values) with temperature and top-k.
static int sample_token(float* logits, int V, float temperature, int top_k, float* work, uint64_t* rng) {
    float max = -INFINITY;
    for (int i = 0; i < V; i++) max = fmaxf(max, logits[i]);
    float threshold = -INFINITY;
    if (top_k > 0 && top_k < V) { // the k-th largest logit, by selection on a copy
        memcpy(work, logits, V * sizeof(float));
        int lo = 0, hi = V - 1, k = top_k - 1;
        while (lo < hi) {
            float pivot = work[(lo + hi) / 2];
            int i = lo, j = hi;
            while (i <= j) {
                while (work[i] > pivot) i++;
                while (work[j] < pivot) j--;
                if (i <= j) { float t = work[i]; work[i] = work[j]; work[j] = t; i++; j--; }
            }
            if (k <= j) hi = j; else if (k >= i) lo = i; else break;
        }
        threshold = work[k];
    }
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        work[i] = logits[i] >= threshold ? expf((logits[i] - max) / temperature) : 0.0f;
        sum += work[i];
    }
    double r = rng_uniform(rng) * sum, acc = 0.0;
    for (int i = 0; i < V; i++) {
        acc += work[i];
        if (work[i] > 0.0f && r < acc) return i;
    }
    for (int i = V - 1; i >= 0; i--) if (work[i] > 0.0f) return i;
    return 0;
}

static void generate(GPT2* model, const Options* o, const Tokenizer* tok, uint64_t* rng) {
    int V = model->config.vocab_size, maxT = model->T;
    int n = o->gen_tokens + 1;
    int* tokens = xmalloc((size_t)n * sizeof(int), "sample");
    float* logits = xmalloc((size_t)V * sizeof(float), "sample");
    float* work = xmalloc((size_t)V * sizeof(float), "sample");
    tokens[0] = GPT2_EOT;
    printf("generating:\n---\n");
    for (int i = 1; i < n; i++) {
        int start = i > maxT ? i - maxT : 0, len = i - start; // the last maxT tokens as context
        gpt2_forward(model, tokens + start, NULL, 1, len, 0.0f);
        gpt2_logits_row(model, 0, len - 1, len, logits);
        tokens[i] = sample_token(logits, V, o->temperature, o->top_k, work, rng);
        size_t blen;
        const char* bytes = tok ? tokenizer_token_bytes(tok, tokens[i], &blen) : NULL;
        if (bytes) fwrite(bytes, 1, blen, stdout);
        else printf("<%d>", tokens[i]);
        fflush(stdout);
    }
    printf("\n---\n");
    free(tokens);
    free(logits);
    free(work);
}

// ---- evaluation --------------------------------------------------------------------------

// The mean over `batches` batches of every rank (each rank reads its own part of the data).
static float validation_loss(GPT2* model, DataLoader* val, int batches) {
    dataloader_reset(val);
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(val);
        sum += gpt2_forward(model, val->inputs, val->targets, val->B, val->T, 0.0f);
    }
    comm_allreduce_host(&sum, 1, COMM_SUM);
    return (float)(sum / batches / comm_world());
}

// ---- checkpoints, log, signals -----------------------------------------------------------

static volatile sig_atomic_t stop_signal = 0;
static void on_stop_signal(int sig) {
    stop_signal = sig;
    signal(sig, SIG_DFL); // a second Ctrl-C stops at once; the checkpoint files stay consistent
}

// Every rank calls it: rank 0 writes the model file, each rank its own training state (with ZeRO,
// its shard of the optimizer).
static void save_checkpoint(GPT2* model, const DataLoader* train, long long step, uint64_t rng,
                            const Options* o, int rank, int world) {
    size_t n = model->num_parameters, count = model->opt_count;
    TrainState st = {0};
    st.config = model->config;
    st.step = step;
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
    checkpoint_prune(o->out_dir, rank, o->keep);
    printf("saved checkpoint of step %lld to %s\n", step, path);
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

// Opens log.csv: fresh, or on resume keeping the rows up to the resumed step.
static FILE* open_log(const char* dir, long long resume_step) {
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/log.csv", dir);
    const char* header = "step,train_loss,val_loss,lr,grad_norm,ms,tok_per_s\n";
    char* kept = NULL;
    size_t kept_len = 0;
    if (resume_step >= 0) {
        FILE* old = fopen(path, "r");
        FILE* mem = open_memstream(&kept, &kept_len);
        if (old) {
            while (fgets(line, sizeof line, old)) {
                char* end;
                long long s = strtoll(line, &end, 10);
                if (end != line && *end == ',' && s <= resume_step) fputs(line, mem);
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

// ---- main --------------------------------------------------------------------------------

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Options o = parse_options(argc, argv);
    DistEnv env = dist_env_detect();
    int rank = env.rank, world = env.world;
    // Only rank 0 prints; errors go to stderr from every rank.
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) fatal("rank %d: cannot silence stdout", rank);

    GPT2Config cfg;
    float* file_weights = resolve_model(&o, &cfg);
    if (o.T > cfg.max_seq_len)
        fatal("sequence length -t %d is above the model's maximum of %d (--max-seq)", o.T, cfg.max_seq_len);
    long long tokens_per_micro = (long long)o.B * o.T * world;
    long long total_batch = o.total_batch < 0 ? tokens_per_micro : o.total_batch;
    if (total_batch == 0 || total_batch % tokens_per_micro != 0)
        fatal("total batch -d %lld is not a multiple of B*T*GPUs = %d*%d*%d = %lld",
              total_batch, o.B, o.T, world, tokens_per_micro);
    int accum = (int)(total_batch / tokens_per_micro);

    DataLoader train, val;
    dataloader_init(&train, o.train_pattern, o.B, o.T, rank, world, o.shuffle, o.seed, cfg.vocab_size);
    int do_val = o.val_every > 0;
    if (do_val) dataloader_init(&val, o.val_pattern, o.B, o.T, rank, world, 0, 0, cfg.vocab_size);
    int val_batches = do_val && o.val_batches > dataloader_batches_per_epoch(&val)
                          ? (int)dataloader_batches_per_epoch(&val) : o.val_batches;
    int max_steps = o.max_steps;
    if (max_steps < 0) {
        max_steps = (int)(dataloader_batches_per_epoch(&train) / accum);
        if (max_steps < 1) max_steps = 1;
    }
    ensure_dir(o.out_dir);

    backend_init(env.local_rank);
    comm_init(rank, world, o.nccl_dir ? o.nccl_dir : o.out_dir, o.nccl_timeout);
    GPT2 model;
    gpt2_build(&model, &cfg, o.B, o.T, o.recompute, o.zero_stage);
    printf("%s | %s attention\n", backend_describe(), attention_name());
    if (world > 1)
        printf("%d ranks (%s, %s), ZeRO stage %d\n", world, env.source, comm_name(), o.zero_stage);
    printf("model: L %d, C %d, NH %d, max T %d, V %d (padded %d), %zu parameters%s%s\n",
           cfg.num_layers, cfg.channels, cfg.num_heads, cfg.max_seq_len, cfg.vocab_size,
           cfg.padded_vocab_size, model.num_parameters, file_weights ? " from " : "",
           file_weights ? o.model : "");
    printf("batch: B %d x T %d x %d GPU(s) x %d accumulation = %lld tokens per step, %d steps\n",
           o.B, o.T, world, accum, total_batch, max_steps);
    if (file_weights) {
        gpt2_set_weights(&model, file_weights);
        free(file_weights);
    } else {
        gpt2_init_random(&model, o.seed);
    }

    uint64_t rng = o.seed * 0x9E3779B97F4A7C15ull + 1; // the sampler's; never 0
    long long start_step = 0;
    if (o.resume) {
        // The newest step that every rank has saved (a kill during a save can leave some ranks a
        // step ahead).
        double latest[2] = {(double)checkpoint_latest_step(o.out_dir, rank), 0};
        latest[1] = -latest[0];
        comm_allreduce_host(latest, 2, COMM_MIN);
        long long step = (long long)latest[0], newest = (long long)-latest[1];
        if (newest < 0) {
            printf("no checkpoint in %s: starting from scratch\n", o.out_dir);
        } else {
            if (step < 0)
                fatal("rank %d: %s holds training states of some ranks but not of others; resume with "
                      "the number of GPUs that saved them", rank, o.out_dir);
            char path[4096];
            checkpoint_state_path(path, sizeof path, o.out_dir, step, rank);
            double have = access(path, R_OK) == 0;
            comm_allreduce_host(&have, 1, COMM_MIN);
            if (!have) fatal("rank %d: not every rank has a training state of step %lld in %s", rank, step, o.out_dir);
            TrainState st;
            train_state_read(path, &st);
            if (memcmp(&st.config, &cfg, sizeof cfg) != 0)
                fatal("training state %s is of another model (L %d, C %d, NH %d, max T %d) than the options ask for",
                      path, st.config.num_layers, st.config.channels, st.config.num_heads, st.config.max_seq_len);
            if (st.world != world || st.rank != rank)
                fatal("training state %s was saved by rank %d of %d GPUs; resume with the same number of GPUs (now %d)",
                      path, st.rank, st.world, world);
            if (st.nparams != model.num_parameters || st.opt_offset != model.opt_offset || st.opt_count != model.opt_count)
                fatal("training state %s holds optimizer state of parameters [%zu, %zu) of %zu; this rank keeps "
                      "[%zu, %zu) of %zu (saved with another -z?)", path, st.opt_offset, st.opt_offset + st.opt_count,
                      st.nparams, model.opt_offset, model.opt_offset + model.opt_count, model.num_parameters);
            // the weights as the update of the saved step (t = st.step, seed as in the loop) left them
            gpt2_set_optimizer_state(&model, st.master, st.m, st.v, (int)st.step,
                                     o.seed + (unsigned long long)st.step - 1);
            dataloader_set_state(&train, &st.loader);
            rng = st.sample_rng;
            start_step = st.step;
            train_state_free(&st);
            printf("resumed from %s at step %lld\n", path, start_step);
        }
    }
    FILE* log = rank == 0 ? open_log(o.out_dir, o.resume ? start_step : -1) : NULL;
    char log_path[4096];
    snprintf(log_path, sizeof log_path, "%s/log.csv", o.out_dir);

    Tokenizer* tok = NULL;
    if (rank == 0 && o.sample_every > 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/encoder.json", o.vocab_dir);
        if (access(path, R_OK) == 0) tok = tokenizer_load(o.vocab_dir);
        else printf("warning: no vocabulary in %s (--vocab): samples are printed as token ids\n", o.vocab_dir);
    }

    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    // Training FLOPs per token: 6 per parameter (forward + backward) plus causal attention's
    // 6 * L * C * T (half of the 12 L C T of full attention), the usual estimate (PaLM, appendix B).
    double peak_flops = backend_peak_flops();
    double flops_per_token = 6.0 * (double)model.num_parameters + 6.0 * cfg.num_layers * cfg.channels * (double)o.T;
    double train_seconds = 0.0;
    int timed_steps = 0;
    if (start_step == 0 && do_val) {
        float vl = validation_loss(&model, &val, val_batches);
        printf("step %d: val loss %.6f\n", 0, vl);
        if (log) fprintf(log, "0,,%.9g,,,,\n", vl), fflush(log);
    }
    long long step = start_step;
    int stop = 0; // the largest signal any rank has received; all ranks stop after the same step
    while (step < max_steps && !stop) {
        double t0 = wall_seconds();
        float lr = learning_rate(&o, (int)step, max_steps);
        gpt2_zero_grad(&model);
        double loss_sum = 0.0;
        for (int micro = 0; micro < accum; micro++) {
            dataloader_next_batch(&train);
            loss_sum += gpt2_forward(&model, train.inputs, train.targets, o.B, o.T, 1.0f / (float)total_batch);
            gpt2_backward(&model);
        }
        float norm = gpt2_update(&model, lr, beta1, beta2, eps, o.weight_decay, o.grad_clip,
                                 (int)step + 1, o.seed + (unsigned long long)step);
        dev_synchronize();
        double seconds = wall_seconds() - t0;
        step++;
        double mean_loss = loss_sum / accum, signal_seen = stop_signal;
        comm_allreduce_host(&mean_loss, 1, COMM_SUM);
        comm_allreduce_host(&signal_seen, 1, COMM_MAX);
        float loss = (float)(mean_loss / world);
        stop = (int)signal_seen;
        if (step > start_step + 1 || max_steps - start_step == 1) { train_seconds += seconds; timed_steps++; }
        double mean_step = timed_steps ? train_seconds / timed_steps : seconds;
        char eta[32];
        format_eta(eta, sizeof eta, mean_step * (double)(max_steps - step));
        char mfu[32] = "";
        if (peak_flops > 0.0)
            snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100.0 * flops_per_token * total_batch / world / seconds / peak_flops);
        printf("step %5lld/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s%s | eta %s\n",
               step, max_steps, loss, norm, lr, 1e3 * seconds, total_batch / seconds, mfu, eta);

        char val_field[32] = "";
        if (do_val && (step % o.val_every == 0 || step == max_steps)) {
            float vl = validation_loss(&model, &val, val_batches);
            printf("step %lld: val loss %.6f\n", step, vl);
            snprintf(val_field, sizeof val_field, "%.9g", vl);
        }
        if (log) {
            fprintf(log, "%lld,%.9g,%s,%.7g,%.7g,%.3f,%.1f\n", step, loss, val_field, lr, norm,
                    1e3 * seconds, total_batch / seconds);
            if (fflush(log) != 0) fatal("cannot write %s: %s", log_path, strerror(errno));
        }

        if (rank == 0 && o.sample_every > 0 && o.gen_tokens > 0 && (step % o.sample_every == 0 || step == max_steps))
            generate(&model, &o, tok, &rng);
        if (step == max_steps || stop || (o.checkpoint_every > 0 && step % o.checkpoint_every == 0))
            save_checkpoint(&model, &train, step, rng, &o, rank, world);
    }
    if (max_steps == start_step) save_checkpoint(&model, &train, step, rng, &o, rank, world);
    if (log) fclose(log);
    int sig = stop;
    if (sig) printf("stopped by signal %d after step %lld; resume with -y 1\n", sig, step);
    if (tok) tokenizer_free(tok);
    if (do_val) dataloader_free(&val);
    dataloader_free(&train);
    gpt2_free(&model);
    comm_free();
    return sig ? 128 + sig : 0;
}
