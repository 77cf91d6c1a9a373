// prepare_data: encodes text files, JSONL files or standard input with GPT-2's tokenizer into llm.c
// token files: a validation part (the first N tokens) and a training part, or llm.c-named shards;
// or HellaSwag's JSONL into llm.c's evaluation file (--hellaswag). See usage() for the options.
//
// Real corpora are far larger than memory, so the input is streamed: documents are read into a
// batch, the batch is encoded on every core (each thread with its own tokenizer cache), and its
// tokens are appended in input order to the output files, which are written atomically.
#define _GNU_SOURCE // memmem, getline
#include <errno.h>
#include <getopt.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stb_ds.h>

#include "common/util.h"
#include "data/hellaswag.h"
#include "data/jsonl.h"
#include "data/tokenfile.h"
#include "data/tokenizer.h"

// Empties an stb_ds array and keeps its memory (arrsetlen(a, 0) trips gcc's -Wtype-limits).
#define arrclear(a) ((a) ? (void)(stbds_header(a)->length = 0) : (void)0)

#define END_OF_TEXT 50256 // GPT-2's <|endoftext|>, which starts every document

// A batch is encoded when it holds this much text or this many documents: large enough to keep
// every core busy with documents of a few KB, small enough to stay a small part of memory.
#define BATCH_BYTES ((size_t)16 << 20)
#define BATCH_DOCUMENTS 65536
#define SKIPPED_LINES_SHOWN 10 // --skip-bad-lines names this many skipped lines, then only counts

static void usage(FILE* out) {
    fprintf(out,
            "usage: prepare_data --vocab DIR -o PREFIX [options] FILE...\n"
            "       prepare_data --vocab DIR --hellaswag hellaswag_val.jsonl -o FILE\n"
            "Encodes the FILEs (\"-\" is standard input) with GPT-2's BPE into llm.c token files:\n"
            "PREFIX_train.bin (and PREFIX_val.bin with --val-tokens), or shards with --shard-tokens.\n"
            "  --vocab DIR          directory holding encoder.json and vocab.bpe (required)\n"
            "  -o, --output PREFIX  the output files' path and name up to \"_train.bin\" (required)\n"
            "  --format FORMAT      text: each input is one document; jsonl: one JSON object per line,\n"
            "                       each a document (default: jsonl for names ending in .jsonl, else text)\n"
            "  --text-field NAME    the JSONL field holding the text (default \"text\")\n"
            "  --skip-bad-lines     skip a malformed JSONL line (counted in the summary) instead of\n"
            "                       stopping with its file, line and problem\n"
            "  --sections           split each text input on blank lines (\"\\n\\n\"): each section is a\n"
            "                       document, and every section but an input's last keeps its \"\\n\\n\"\n"
            "  --val-tokens N       the first N tokens go to PREFIX_val.bin, the rest to PREFIX_train.bin\n"
            "                       (default 0: no validation file)\n"
            "  --shard-tokens N     write shards of exactly N tokens (the last may be shorter), named as\n"
            "                       llm.c's fineweb.py does: PREFIX_val_000000.bin (the first shard is\n"
            "                       validation), PREFIX_train_000001.bin, ...\n"
            "  --hellaswag JSONL    instead: HellaSwag's JSONL (\"-\" is standard input; its fields \"ctx\",\n"
            "                       \"endings\" and \"label\") into llm.c's evaluation file, written to\n"
            "                       exactly -o FILE, for train_gpt --hellaswag FILE (as llm.c's\n"
            "                       dev/data/hellaswag.py: the context, and each ending after a space)\n"
            "  -h, --help           show this help\n"
            "Every document is prefixed by <|endoftext|> (id 50256). Documents are encoded on every core\n"
            "(OMP_NUM_THREADS to choose); the output is the same for any number of threads.\n"
            "Example: zcat docs.jsonl.gz | prepare_data --vocab data/gpt2 --format jsonl \\\n"
            "             --shard-tokens 100000000 -o fineweb/fineweb -\n");
}

enum { FORMAT_AUTO, FORMAT_TEXT, FORMAT_JSONL };

typedef struct {
    int format;
    int sections;
} InputOptions;

// ---- output -------------------------------------------------------------------------------------

// Where the tokens go, in input order. Unsharded: the first val_tokens to `val`, the rest to
// `train`, both committed only at the end (so that a run that fails leaves no output). Sharded:
// `shard` fills up to shard_tokens and is committed, then the next one starts.
typedef struct {
    const char* prefix;
    long long val_tokens;
    long long shard_tokens; // 0: not sharded
    TokenFileWriter* val;
    TokenFileWriter* train;
    TokenFileWriter* shard;
    int shard_index;
    size_t total;
} Output;

// Static for remove_unfinished_outputs, which runs at exit: fatal() exits from anywhere.
static Output out;

static void remove_unfinished_outputs(void) {
    TokenFileWriter** open[] = {&out.val, &out.train, &out.shard};
    for (size_t i = 0; i < sizeof(open) / sizeof(open[0]); i++)
        if (*open[i]) tokenfile_discard(*open[i]), *open[i] = NULL;
}

static char* output_path(const char* prefix, const char* suffix) {
    size_t n = strlen(prefix) + strlen(suffix) + 1;
    char* path = xmalloc(n, "output path");
    snprintf(path, n, "%s%s", prefix, suffix);
    return path;
}

static char* shard_path(int index) {
    char suffix[32];
    snprintf(suffix, sizeof(suffix), "_%s_%06d.bin", index == 0 ? "val" : "train", index);
    return output_path(out.prefix, suffix);
}

static void output_start(void) {
    atexit(remove_unfinished_outputs);
    if (out.shard_tokens > 0) return; // shards start when their first token arrives
    char* path = output_path(out.prefix, "_train.bin");
    out.train = tokenfile_begin(path);
    free(path);
    if (out.val_tokens > 0) {
        path = output_path(out.prefix, "_val.bin");
        out.val = tokenfile_begin(path);
        free(path);
    }
}

// Commits the shard being filled and names it (as progress: a corpus takes a while).
static void finish_shard(void) {
    size_t n = tokenfile_count(out.shard);
    tokenfile_finish(out.shard);
    out.shard = NULL;
    char* path = shard_path(out.shard_index++);
    printf("wrote %s (%zu tokens)\n", path, n);
    fflush(stdout);
    free(path);
}

static void output_put(const uint16_t* tokens, size_t n) {
    out.total += n;
    while (n > 0) {
        TokenFileWriter* w;
        size_t room;
        if (out.shard_tokens > 0) {
            if (!out.shard) {
                char* path = shard_path(out.shard_index);
                out.shard = tokenfile_begin(path);
                free(path);
            }
            w = out.shard;
            room = (size_t)out.shard_tokens - tokenfile_count(w);
        } else if (out.val && tokenfile_count(out.val) < (size_t)out.val_tokens) {
            w = out.val;
            room = (size_t)out.val_tokens - tokenfile_count(w);
        } else {
            w = out.train;
            room = n;
        }
        size_t take = n < room ? n : room;
        tokenfile_append(w, tokens, take);
        tokens += take, n -= take;
        if (w == out.shard && tokenfile_count(w) == (size_t)out.shard_tokens) finish_shard();
    }
}

static void output_finish(void) {
    if (out.shard_tokens > 0) {
        if (out.shard) finish_shard(); // the last shard, shorter than the others
        return;
    }
    if ((unsigned long long)out.val_tokens >= out.total)
        fatal("--val-tokens %lld leaves no training tokens: the input gives only %zu tokens",
              out.val_tokens, out.total);
    char* val_path = output_path(out.prefix, "_val.bin");
    char* train_path = output_path(out.prefix, "_train.bin");
    if (out.val) {
        tokenfile_finish(out.val);
        out.val = NULL;
        printf("wrote %s\n", val_path);
    }
    tokenfile_finish(out.train);
    out.train = NULL;
    printf("wrote %s\n", train_path);
    free(train_path);
    free(val_path);
}

// ---- encoding -----------------------------------------------------------------------------------

// Items read but not yet encoded, back to back in `bytes`, item i ending at end[i]: a plain-text
// document (line[i] 0), or a JSONL line (line[i] its number in input source[i]) whose text field is
// decoded in parallel too, so that one thread reading stays a small part of the work.
typedef struct {
    char* bytes;          // stb_ds arrays, one entry per item but bytes
    size_t* end;
    long long* line;
    const char** source;
    const Tokenizer* tok;
    const char* text_field;
    int skip_bad_lines;
    TokenizerCache** caches; // one per thread
    uint16_t* tokens;        // stb_ds: the batch's tokens in input order, reused
    long long documents;     // encoded so far
    long long skipped;       // JSONL lines skipped (--skip-bad-lines)
    size_t bytes_read;       // so far
} Encoder;

// Encodes item i with the calling thread's cache. For a JSONL line that is refused, returns NULL
// with the problem in *error (malloc'd).
static int* encode_item(const Encoder* e, TokenizerCache* cache, size_t i, size_t* count, char** error) {
    size_t start = i == 0 ? 0 : e->end[i - 1], len = e->end[i] - start;
    const char* item = len ? e->bytes + start : ""; // with only empty items, bytes is NULL
    if (e->line[i] == 0) return tokenizer_encode_cached(e->tok, cache, item, len, count);
    char* text = xmalloc(len + 1, "decoded JSONL text"); // room enough: decoding never lengthens
    char err[256];
    size_t text_len;
    int* ids = NULL;
    if (jsonl_string_field(item, len, e->text_field, text, &text_len, err, sizeof(err)) == 0)
        ids = tokenizer_encode_cached(e->tok, cache, text, text_len, count);
    else
        *error = strcpy(xmalloc(strlen(err) + 1, "message"), err);
    free(text);
    return ids;
}

// Encodes the batch, items in parallel, and appends its tokens in input order; a refused JSONL line
// stops the run (or is skipped) when its turn comes, so the first bad line is the one named.
static void encode_batch(Encoder* e) {
    size_t n = arrlenu(e->end);
    if (n == 0) return;
    int** ids = xmalloc(n * sizeof(int*), "batch tokens");
    size_t* counts = xmalloc(n * sizeof(size_t), "batch token counts");
    char** errors = xcalloc(n, sizeof(char*), "batch errors");
#pragma omp parallel
    {
        TokenizerCache* cache = e->caches[omp_get_thread_num()];
        // Dynamic: documents differ in length by orders of magnitude.
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < n; i++) ids[i] = encode_item(e, cache, i, &counts[i], &errors[i]);
    }
    arrclear(e->tokens);
    for (size_t i = 0; i < n; i++) {
        if (errors[i]) {
            if (!e->skip_bad_lines)
                fatal("%s line %lld: %s (--skip-bad-lines skips such lines)", e->source[i], e->line[i],
                      errors[i]);
            if (++e->skipped <= SKIPPED_LINES_SHOWN)
                fprintf(stderr, "skipped %s line %lld: %s\n", e->source[i], e->line[i], errors[i]);
            free(errors[i]);
            continue;
        }
        // An empty document (an empty text file, section or JSONL text) is none: so an empty input is
        // no document whatever its format, and a lone <|endoftext|> is never written.
        if (counts[i] == 0) {
            free(ids[i]);
            continue;
        }
        arrput(e->tokens, END_OF_TEXT);
        uint16_t* dst = arraddnptr(e->tokens, counts[i]);
        for (size_t j = 0; j < counts[i]; j++) dst[j] = (uint16_t)ids[i][j]; // ids < vocab size <= 65536
        free(ids[i]);
        e->documents++;
    }
    output_put(e->tokens, arrlenu(e->tokens));
    e->bytes_read += arrlenu(e->bytes);
    arrclear(e->bytes);
    arrclear(e->end);
    arrclear(e->line);
    arrclear(e->source);
    free(errors);
    free(counts);
    free(ids);
}

// Appends an item (see Encoder); encodes the batch once it is full.
static void add_item(Encoder* e, const char* bytes, size_t len, const char* source, long long line) {
    char* dst = arraddnptr(e->bytes, len);
    if (len > 0) memcpy(dst, bytes, len); // an empty section: both may be NULL, which memcpy may not be given

    arrput(e->end, arrlenu(e->bytes));
    arrput(e->line, line);
    arrput(e->source, source);
    if (arrlenu(e->bytes) >= BATCH_BYTES || arrlen(e->end) >= BATCH_DOCUMENTS) encode_batch(e);
}

// ---- inputs -------------------------------------------------------------------------------------

static void check_read(FILE* f, const char* name) {
    if (ferror(f)) fatal("%s: read error: %s", name, strerror(errno));
}

// A text input: one document, or one per section with --sections (tinyshakespeare's recipe: the
// text split on "\n\n" as Python's str.split does; every section but the last gets its "\n\n" back).
static void read_text(Encoder* e, FILE* f, const char* name, int sections) {
    char* text = NULL; // stb_ds
    size_t chunk = (size_t)1 << 20, got;
    do {
        char* dst = arraddnptr(text, chunk);
        got = fread(dst, 1, chunk, f);
        arrsetlen(text, arrlenu(text) - chunk + got);
    } while (got > 0);
    check_read(f, name);
    size_t len = arrlenu(text), start = 0;

    const char* sep;
    while (sections && (sep = memmem(text + start, len - start, "\n\n", 2))) {
        size_t end = (size_t)(sep - text) + 2;
        add_item(e, text + start, end - start, name, 0);
        start = end;
    }
    add_item(e, text + start, len - start, name, 0);
    arrfree(text);
}

// A JSONL input: its lines, without their "\n", are decoded with the batch.
static void read_jsonl(Encoder* e, FILE* f, const char* name) {
    char* line = NULL;
    size_t capacity = 0;
    ssize_t got;
    long long line_number = 0;
    while ((got = getline(&line, &capacity, f)) != -1) {
        size_t len = (size_t)got;
        if (len > 0 && line[len - 1] == '\n') len--;
        add_item(e, line, len, name, ++line_number);
    }
    check_read(f, name);
    free(line);
}

static int ends_with(const char* s, const char* suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// Reads one input ("-" is standard input) into the encoder.
static void read_input(Encoder* e, const char* path, const InputOptions* in) {
    int is_stdin = strcmp(path, "-") == 0;
    const char* name = is_stdin ? "standard input" : path;
    int format = in->format != FORMAT_AUTO ? in->format : ends_with(path, ".jsonl") ? FORMAT_JSONL : FORMAT_TEXT;
    FILE* f = is_stdin ? stdin : xfopen(path, "rb");
    if (format == FORMAT_JSONL) read_jsonl(e, f, name);
    else read_text(e, f, name, in->sections);
    if (!is_stdin) fclose(f);
}

// ---- HellaSwag ----------------------------------------------------------------------------------

// --hellaswag: llm.c's evaluation file from HellaSwag's JSONL (hellaswag_val.jsonl of
// github.com/rowanz/hellaswag: per line the context "ctx", the 4 "endings" and the "label" of the
// right one, among other fields). Tokens as llm.c's dev/data/hellaswag.py makes them: the context as
// it is (no <|endoftext|> before it), each ending with a space before it. A line that llm.c's format
// cannot hold is refused naming the file, the line and the problem.
static void write_hellaswag(const Tokenizer* tok, const char* input, const char* path) {
    int is_stdin = strcmp(input, "-") == 0;
    const char* name = is_stdin ? "standard input" : input;
    FILE* f = is_stdin ? stdin : xfopen(input, "rb");
    HellaSwagExample* examples = NULL; // stb_ds; each example's tokens are one allocation
    char* line = NULL;
    size_t capacity = 0;
    ssize_t got;
    long long line_number = 0;
    int longest_row = 0, longest_row_line = 0;
    while ((got = getline(&line, &capacity, f)) != -1) {
        size_t len = (size_t)got;
        if (len > 0 && line[len - 1] == '\n') len--;
        line_number++;
        if (arrlen(examples) == HELLASWAG_MAX_EXAMPLES)
            fatal("%s line %lld: more than %d examples, the most llm.c's format numbers (16-bit indices)", name,
                  line_number, HELLASWAG_MAX_EXAMPLES);
        // Decoding never lengthens a string: the context and the endings fit len bytes each. The
        // endings' buffer keeps a byte before each for the space.
        char* context = xmalloc(len + 1, "HellaSwag context");
        char* endings = xmalloc(len + 2, "HellaSwag endings");
        char scratch[8], err[256];
        size_t context_len, ending_len[HELLASWAG_ENDINGS];
        int count;
        long long label;
        if (jsonl_string_field(line, len, "ctx", context, &context_len, err, sizeof err) ||
            jsonl_string_array_field(line, len, "endings", endings + 1, ending_len, HELLASWAG_ENDINGS, &count,
                                     err, sizeof err) ||
            jsonl_integer_field(line, len, "label", scratch, &label, err, sizeof err))
            fatal("%s line %lld: %s", name, line_number, err);
        if (count != HELLASWAG_ENDINGS)
            fatal("%s line %lld: %d endings, but llm.c's format holds %d", name, line_number, count, HELLASWAG_ENDINGS);
        if (label < 0 || label >= HELLASWAG_ENDINGS)
            fatal("%s line %lld: label %lld is not 0..%d", name, line_number, label, HELLASWAG_ENDINGS - 1);
        size_t n[1 + HELLASWAG_ENDINGS];
        int* ids[1 + HELLASWAG_ENDINGS];
        ids[0] = tokenizer_encode(tok, context, context_len, &n[0]);
        if (n[0] == 0)
            fatal("%s line %lld: the context is empty: nothing would predict the endings' first tokens", name,
                  line_number);
        char* ending = endings;
        for (int j = 0; j < HELLASWAG_ENDINGS; j++) {
            ending[0] = ' '; // over the previous ending's last byte, which is encoded by now
            ids[1 + j] = tokenizer_encode(tok, ending, 1 + ending_len[j], &n[1 + j]);
            ending += ending_len[j];
        }
        size_t total = 0;
        for (int k = 0; k <= HELLASWAG_ENDINGS; k++) total += n[k];
        uint16_t* tokens = xmalloc(total * sizeof(uint16_t), "HellaSwag tokens");
        HellaSwagExample ex = {.label = (int)label};
        uint16_t* dst = tokens;
        for (int k = 0; k <= HELLASWAG_ENDINGS; k++) {
            for (size_t t = 0; t < n[k]; t++) dst[t] = (uint16_t)ids[k][t]; // ids < vocab size < 65535
            if (k == 0) ex.context = dst, ex.context_len = (int)n[k];
            else ex.ending[k - 1] = dst, ex.ending_len[k - 1] = (int)n[k];
            dst += n[k];
            free(ids[k]);
        }
        if (hellaswag_example_bytes(&ex) > HELLASWAG_MAX_EXAMPLE_BYTES)
            fatal("%s line %lld: %zu tokens, more than llm.c's format holds in an example (%d bytes, 16-bit lengths)",
                  name, line_number, total, HELLASWAG_MAX_EXAMPLE_BYTES);
        for (int j = 0; j < HELLASWAG_ENDINGS; j++)
            if (hellaswag_row_positions(&ex, j) > longest_row)
                longest_row = hellaswag_row_positions(&ex, j), longest_row_line = (int)line_number;
        arrput(examples, ex);
        free(context);
        free(endings);
    }
    check_read(f, name);
    free(line);
    if (!is_stdin) fclose(f);
    if (arrlen(examples) == 0) fatal("%s holds no examples: nothing to write", name);
    hellaswag_write(path, examples, (int)arrlen(examples));
    printf("wrote %s: %d examples; the longest, on line %d, needs -t %d (its context and longest ending but the "
           "last token)\n", path, (int)arrlen(examples), longest_row_line, longest_row);
    for (ptrdiff_t i = 0; i < arrlen(examples); i++) free((void*)examples[i].context); // its tokens' start
    arrfree(examples);
}

int main(int argc, char** argv) {
    const char* vocab_dir = NULL;
    InputOptions in = {FORMAT_AUTO, 0};
    const char* text_field = "text";
    int skip_bad_lines = 0;
    const char* hellaswag = NULL;
    const char* corpus_option = NULL; // the last option given that only token files take
    static const struct option options[] = {
        {"vocab", required_argument, NULL, 'V'},      {"output", required_argument, NULL, 'o'},
        {"sections", no_argument, NULL, 'S'},         {"val-tokens", required_argument, NULL, 'N'},
        {"format", required_argument, NULL, 'F'},     {"text-field", required_argument, NULL, 'T'},
        {"skip-bad-lines", no_argument, NULL, 'K'},   {"shard-tokens", required_argument, NULL, 'D'},
        {"hellaswag", required_argument, NULL, 'H'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    opterr = 0; // report bad options ourselves, in one message
    int c, index = 0;
    while ((c = getopt_long(argc, argv, ":o:h", options, &index)) != -1) {
        if (strchr("SNDTKF", c)) corpus_option = options[index].name;
        switch (c) {
        case 'V': vocab_dir = optarg; break;
        case 'o': out.prefix = optarg; break;
        case 'S': in.sections = 1; break;
        case 'N': out.val_tokens = parse_int_option(optarg, "--val-tokens", 0, INT32_MAX); break;
        case 'D': out.shard_tokens = parse_int_option(optarg, "--shard-tokens", 1, INT32_MAX); break;
        case 'T': text_field = optarg; break;
        case 'K': skip_bad_lines = 1; break;
        case 'F':
            if (strcmp(optarg, "text") == 0) in.format = FORMAT_TEXT;
            else if (strcmp(optarg, "jsonl") == 0) in.format = FORMAT_JSONL;
            else fatal("--format must be text or jsonl, not '%s'", optarg);
            break;
        case 'H': hellaswag = optarg; break;
        case 'h': usage(stdout); return 0;
        case ':': fatal("option %s needs a value (see --help)", argv[optind - 1]);
        default:
            if (optopt) fatal("unknown option -%c (see --help)", optopt);
            fatal("unknown option %s (see --help)", argv[optind - 1]);
        }
    }
    if (!vocab_dir) fatal("missing --vocab DIR (the directory with encoder.json and vocab.bpe; see --help)");
    if (!out.prefix) fatal(hellaswag ? "missing -o FILE (see --help)" : "missing -o PREFIX (see --help)");
    if (hellaswag && corpus_option) fatal("--%s does not apply to --hellaswag (see --help)", corpus_option);
    if (hellaswag && optind < argc) fatal("--hellaswag converts one file: unexpected argument '%s'", argv[optind]);
    if (!hellaswag && optind >= argc) fatal("no input FILE given (see --help)");
    if (out.shard_tokens > 0 && out.val_tokens > 0)
        fatal("--val-tokens and --shard-tokens exclude each other: with shards the first shard is validation");
    int stdin_inputs = 0;
    for (int i = optind; i < argc; i++) stdin_inputs += strcmp(argv[i], "-") == 0;
    if (stdin_inputs > 1) fatal("standard input (\"-\") is given %d times; it can be read only once", stdin_inputs);

    double t0 = wall_seconds();
    Tokenizer* tok = tokenizer_load(vocab_dir);
    size_t eot_len;
    const char* eot = tokenizer_token_bytes(tok, END_OF_TEXT, &eot_len);
    if (!eot || eot_len != 13 || memcmp(eot, "<|endoftext|>", 13) != 0)
        fatal("%s: token %d is not <|endoftext|>: not GPT-2's vocabulary", vocab_dir, END_OF_TEXT);
    if (tokenizer_vocab_size(tok) > 65536)
        fatal("%s: %d tokens do not fit the token file's 16-bit ids", vocab_dir, tokenizer_vocab_size(tok));
    if (hellaswag) {
        // 65535 is the evaluation file's delimiter; GPT-2's 50257 tokens are far below it.
        if (tokenizer_vocab_size(tok) >= HELLASWAG_DELIMITER)
            fatal("%s: %d tokens do not fit the HellaSwag file's ids (below %d)", vocab_dir, tokenizer_vocab_size(tok),
                  HELLASWAG_DELIMITER);
        write_hellaswag(tok, hellaswag, out.prefix);
        tokenizer_free(tok);
        return 0;
    }

    int threads = omp_get_max_threads();
    Encoder e = {.tok = tok, .text_field = text_field, .skip_bad_lines = skip_bad_lines,
                 .caches = xmalloc((size_t)threads * sizeof(TokenizerCache*), "caches")};
    for (int t = 0; t < threads; t++) e.caches[t] = tokenizer_cache_new();
    output_start();
    for (int i = optind; i < argc; i++) read_input(&e, argv[i], &in);
    encode_batch(&e);
    if (out.total == 0) fatal("the input holds no documents: nothing to write");
    output_finish();

    double seconds = wall_seconds() - t0;
    size_t val = out.shard_tokens > 0 ? 0 : (size_t)out.val_tokens;
    printf("prepare_data: %d input(s), %lld documents, %zu bytes -> %zu tokens", argc - optind,
           e.documents, e.bytes_read, out.total);
    if (out.shard_tokens > 0) printf(" in %d shard(s)", out.shard_index);
    else printf(" (%zu val, %zu train)", val, out.total - val);
    printf(" in %.2f s (%.0f tokens/s on %d thread(s))", seconds, out.total / seconds, threads);
    if (e.skipped) printf("; skipped %lld bad line(s)", e.skipped);
    printf("\n");

    for (int t = 0; t < threads; t++) tokenizer_cache_free(e.caches[t]);
    free(e.caches);
    arrfree(e.bytes);
    arrfree(e.end);
    arrfree(e.line);
    arrfree(e.source);
    arrfree(e.tokens);
    tokenizer_free(tok);
    return 0;
}
