// prepare_data: encodes text files with GPT-2's tokenizer into llm.c token files, split into a
// validation part (the first N tokens) and a training part. See usage() for the options.
#define _GNU_SOURCE // memmem
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stb_ds.h>

#include "common/util.h"
#include "data/tokenfile.h"
#include "data/tokenizer.h"

#define END_OF_TEXT 50256 // GPT-2's <|endoftext|>, which starts every document

static void usage(FILE* out) {
    fprintf(out,
            "usage: prepare_data --vocab DIR -o PREFIX [--sections] [--val-tokens N] FILE...\n"
            "Encodes the FILEs with GPT-2's BPE into PREFIX_train.bin and PREFIX_val.bin (llm.c token files).\n"
            "  --vocab DIR          directory holding encoder.json and vocab.bpe (required)\n"
            "  -o, --output PREFIX  where to write PREFIX_train.bin and PREFIX_val.bin (required)\n"
            "  --sections           split each file on blank lines (\"\\n\\n\"): each section is a document,\n"
            "                       and every section but a file's last keeps its \"\\n\\n\"\n"
            "                       (default: each file is one document)\n"
            "  --val-tokens N       the first N tokens go to PREFIX_val.bin, the rest to PREFIX_train.bin\n"
            "                       (default 0: no validation file)\n"
            "  -h, --help           show this help\n"
            "Every document is prefixed by <|endoftext|> (id 50256).\n");
}

static char* read_whole_file(const char* path, size_t* len) {
    *len = (size_t)file_size(path);
    char* text = xmalloc(*len, path);
    FILE* f = xfopen(path, "rb");
    xfread(text, 1, *len, f, path);
    fclose(f);
    return text;
}

// Appends <|endoftext|> and the tokens of one document to *tokens (an stb_ds array).
static void encode_document(const Tokenizer* tok, const char* text, size_t len, uint16_t** tokens) {
    size_t count;
    int* ids = tokenizer_encode(tok, text, len, &count);
    arrput(*tokens, END_OF_TEXT);
    uint16_t* dst = arraddnptr(*tokens, count);
    for (size_t i = 0; i < count; i++) dst[i] = (uint16_t)ids[i]; // ids < vocab size <= 65536
    free(ids);
}

// tinyshakespeare's recipe: the text split on "\n\n" as Python's str.split does; every section but
// the last gets its "\n\n" back before encoding.
static void encode_sections(const Tokenizer* tok, const char* text, size_t len, uint16_t** tokens) {
    size_t start = 0;
    for (;;) {
        const char* sep = memmem(text + start, len - start, "\n\n", 2);
        if (!sep) break;
        size_t end = (size_t)(sep - text) + 2;
        encode_document(tok, text + start, end - start, tokens);
        start = end;
    }
    encode_document(tok, text + start, len - start, tokens);
}

static char* output_path(const char* prefix, const char* suffix) {
    size_t n = strlen(prefix) + strlen(suffix) + 1;
    char* path = xmalloc(n, "output path");
    snprintf(path, n, "%s%s", prefix, suffix);
    return path;
}

int main(int argc, char** argv) {
    const char* vocab_dir = NULL;
    const char* prefix = NULL;
    int sections = 0;
    long long val_tokens = 0;
    static const struct option options[] = {
        {"vocab", required_argument, NULL, 'V'},   {"output", required_argument, NULL, 'o'},
        {"sections", no_argument, NULL, 'S'},      {"val-tokens", required_argument, NULL, 'N'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    opterr = 0; // report bad options ourselves, in one message
    int c;
    while ((c = getopt_long(argc, argv, ":o:h", options, NULL)) != -1) {
        switch (c) {
        case 'V': vocab_dir = optarg; break;
        case 'o': prefix = optarg; break;
        case 'S': sections = 1; break;
        case 'N': {
            char* end;
            errno = 0;
            val_tokens = strtoll(optarg, &end, 10);
            if (errno || end == optarg || *end != '\0' || val_tokens < 0)
                fatal("--val-tokens needs a non-negative integer, got '%s'", optarg);
            break;
        }
        case 'h': usage(stdout); return 0;
        case ':': fatal("option %s needs a value (see --help)", argv[optind - 1]);
        default:
            if (optopt) fatal("unknown option -%c (see --help)", optopt);
            fatal("unknown option %s (see --help)", argv[optind - 1]);
        }
    }
    if (!vocab_dir) fatal("missing --vocab DIR (the directory with encoder.json and vocab.bpe; see --help)");
    if (!prefix) fatal("missing -o PREFIX (see --help)");
    if (optind >= argc) fatal("no input FILE given (see --help)");

    double t0 = wall_seconds();
    Tokenizer* tok = tokenizer_load(vocab_dir);
    size_t eot_len;
    const char* eot = tokenizer_token_bytes(tok, END_OF_TEXT, &eot_len);
    if (!eot || eot_len != 13 || memcmp(eot, "<|endoftext|>", 13) != 0)
        fatal("%s: token %d is not <|endoftext|>: not GPT-2's vocabulary", vocab_dir, END_OF_TEXT);
    if (tokenizer_vocab_size(tok) > 65536)
        fatal("%s: %d tokens do not fit the token file's 16-bit ids", vocab_dir, tokenizer_vocab_size(tok));

    uint16_t* tokens = NULL;
    size_t total_bytes = 0;
    for (int i = optind; i < argc; i++) {
        size_t len;
        char* text = read_whole_file(argv[i], &len);
        if (sections) encode_sections(tok, text, len, &tokens);
        else encode_document(tok, text, len, &tokens);
        total_bytes += len;
        free(text);
    }
    size_t ntokens = arrlenu(tokens);
    if ((unsigned long long)val_tokens >= ntokens)
        fatal("--val-tokens %lld leaves no training tokens: the input gives only %zu tokens", val_tokens,
              ntokens);

    char* val_path = output_path(prefix, "_val.bin");
    char* train_path = output_path(prefix, "_train.bin");
    if (val_tokens > 0) tokenfile_write(val_path, tokens, (size_t)val_tokens);
    tokenfile_write(train_path, tokens + val_tokens, ntokens - (size_t)val_tokens);
    printf("prepare_data: %d file(s), %zu bytes -> %zu tokens (%lld val, %zu train) in %.2f s\n",
           argc - optind, total_bytes, ntokens, val_tokens, ntokens - (size_t)val_tokens,
           wall_seconds() - t0);
    if (val_tokens > 0) printf("wrote %s\n", val_path);
    printf("wrote %s\n", train_path);

    free(train_path);
    free(val_path);
    arrfree(tokens);
    tokenizer_free(tok);
    return 0;
}
