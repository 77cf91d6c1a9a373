// Tests of the GPT-2 tokenizer against independent references: encodings of short strings read off
// encoder.json by hand, lossless round trips of random bytes, and clean errors for malformed
// vocabulary files. (tiktoken's encoding of all of tinyshakespeare is checked through prepare_data
// by tests/e2e/test_prepare_data.sh.)
// Usage: test_tokenizer DATA_DIR, the directory scripts/get_data.sh fills (gpt2/encoder.json,
// gpt2/vocab.bpe, tinyshakespeare/input.txt); relative or absolute.
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "data/tokenizer.h"
#include "tests/lib/testutil.h"

static void test_speed(const Tokenizer* tok, const char* data_dir) {
    char path[4096];
    size_t len, count;
    snprintf(path, sizeof(path), "%s/tinyshakespeare/input.txt", data_dir);
    char* text = read_whole_file(path, &len);
    double t0 = wall_seconds();
    int* tokens = tokenizer_encode(tok, text, len, &count);
    double seconds = wall_seconds() - t0;
    test_check(seconds < 1.0, "encoding speed", "input.txt (%zu bytes, %zu tokens) in %.3f s (limit 1 s)",
               len, count, seconds);
    free(tokens);
    free(text);
}

// Expected ids were read off encoder.json: where a piece (a match of GPT-2's regex) is itself a token,
// it is that token; otherwise the BPE result is noted. All were confirmed with tiktoken's GPT-2.
typedef struct {
    const char* text;
    size_t len;
    int ids[8];
    size_t nids;
} KnownEncoding;

#define KNOWN(s, ...) {s, sizeof(s) - 1, {__VA_ARGS__}, sizeof((int[]){__VA_ARGS__}) / sizeof(int)}

static const KnownEncoding known[] = {
    KNOWN("Hello world", 15496, 995),             // "Hello", "Ġworld"
    KNOWN("I'm", 40, 1101),                       // "I", "'m"
    KNOWN("it's", 270, 338),                      // "it", "'s"
    KNOWN(" 's", 705, 82),                        // " '" is punctuation led by a space, then "s"
    KNOWN("I'LL", 40, 6, 3069),                   // contractions are lower case only: "'", "LL"
    KNOWN("don't", 9099, 470),                    // "don", "'t"
    KNOWN("a  b", 64, 220, 275),                  // "a", " ", " b": the last space leads "b"
    KNOWN("  Hello", 220, 18435),                 // " ", " Hello"
    KNOWN("hi   ", 5303, 220, 220, 220),          // trailing spaces are one piece; "ĠĠ" is no token
    KNOWN("\r\n", 201, 198),                      // "čĊ" is no token: "č", "Ċ"
    KNOWN("x\r\ny", 87, 201, 198, 88),            // "\r" and "\n" split around a following letter
    KNOWN("\n\nHello", 198, 198, 15496),          // "\n" then "\n" (the last space leads nothing)
    KNOWN("end\n\n", 437, 628),                   // "\n\n" at the end is one piece, token "ĊĊ"
    KNOWN("12345", 10163, 2231),                  // "12345" is no token: BPE gives "123", "45"
    KNOWN(" 123", 17031),                         // "Ġ123": a space leads numbers too
    KNOWN("<|endoftext|>", 27, 91, 437, 1659, 5239, 91, 29), // ordinary text, not the special token
    KNOWN("ab\xff" "cd", 397, 187, 10210),        // an invalid byte is a piece of its own: "ÿ"
    KNOWN("caf\xc3\xa9", 66, 1878, 2634),         // "c", "af", "Ã©"
};

static void test_known_encodings(const Tokenizer* tok) {
    for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++) {
        const KnownEncoding* e = &known[k];
        size_t count;
        int* ids = tokenizer_encode(tok, e->text, e->len, &count);
        int ok = count == e->nids && memcmp(ids, e->ids, count * sizeof(int)) == 0;
        char got[256] = "", want[256] = "", name[128];
        for (size_t i = 0; i < count && strlen(got) < 200; i++)
            snprintf(got + strlen(got), sizeof(got) - strlen(got), " %d", ids[i]);
        for (size_t i = 0; i < e->nids; i++)
            snprintf(want + strlen(want), sizeof(want) - strlen(want), " %d", e->ids[i]);
        snprintf(name, sizeof(name), "encode known string %zu", k);
        test_check(ok, name, "got [%s ] want [%s ]", got, want);
        free(ids);
    }
}

static void test_vocabulary(const Tokenizer* tok) {
    test_check(tokenizer_vocab_size(tok) == 50257, "vocabulary size", "%d (want 50257)",
               tokenizer_vocab_size(tok));
    size_t len = 0;
    const char* eot = tokenizer_token_bytes(tok, 50256, &len);
    test_check(eot && len == 13 && memcmp(eot, "<|endoftext|>", 13) == 0, "token 50256 is <|endoftext|>",
               "%zu bytes", eot ? len : 0);
    const char* space_the = tokenizer_token_bytes(tok, 262, &len);
    test_check(space_the && len == 4 && memcmp(space_the, " the", 4) == 0, "token 262 is \" the\"",
               "%zu bytes", space_the ? len : 0);
    const char* below = tokenizer_token_bytes(tok, -1, &len);
    const char* above = tokenizer_token_bytes(tok, 50257, &len);
    test_check(!below && !above, "ids -1 and 50257 have no bytes", "%s and %s", below ? "bytes" : "NULL",
               above ? "bytes" : "NULL");
    const int ids[] = {15496, -1, 50257, 995, 1 << 30};
    char* text = tokenizer_decode(tok, ids, 5, &len);
    test_check(len == 11 && strcmp(text, "Hello world") == 0, "decode skips ids outside the vocabulary",
               "got \"%s\"", text);
    free(text);
}

// Pieces of text that exercise the pre-tokeniser: invalid UTF-8 of every kind, emoji, combining
// marks, CRLF, white space runs, contractions, several scripts, digits, NUL.
static const char* const fragments[] = {
    "\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe4\xb8", "\x80", "\xf0\x9f\x98",
    "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "e\xcc\x81", "\xcc\x81", "\r\n", "\n\n",
    " ", "   ", "\t", "\x0b\x0c", "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\xa8", "'s", "'ll", "'re", "'",
    "Hello", " world", "\xe4\xb8\xad\xe6\x96\x87", "\xd0\x9f\xd1\x80\xd0\xb8", "\xd9\x85\xd8\xb1",
    "123", "\xd9\xa3", "\xe2\x85\xab", "!?", "...", "<|endoftext|>", "\x1f", "\xc2\x85",
};

static void test_round_trips(const Tokenizer* tok) {
    TestRng rng = test_rng(1234);
    const size_t nfragments = sizeof(fragments) / sizeof(fragments[0]);
    const int trials = 3000;
    int failures = 0, out_of_range = 0, first_failure = -1;
    char text[2048];
    for (int trial = 0; trial < trials; trial++) {
        size_t len = 0, pieces = 1 + (size_t)(test_uniform(&rng) * 40);
        for (size_t p = 0; p < pieces; p++) {
            if (test_uniform(&rng) < 0.3) { // a few fully random bytes, NUL included
                size_t n = 1 + (size_t)(test_uniform(&rng) * 8);
                for (size_t i = 0; i < n; i++) text[len++] = (char)(test_uniform(&rng) * 256);
            } else {
                const char* f = fragments[(size_t)(test_uniform(&rng) * nfragments)];
                memcpy(text + len, f, strlen(f));
                len += strlen(f);
            }
        }
        size_t count, decoded_len;
        int* ids = tokenizer_encode(tok, text, len, &count);
        for (size_t i = 0; i < count; i++) out_of_range += ids[i] < 0 || ids[i] >= 50257;
        char* decoded = tokenizer_decode(tok, ids, count, &decoded_len);
        if (decoded_len != len || memcmp(decoded, text, len) != 0) {
            if (first_failure < 0) first_failure = trial;
            failures++;
        }
        free(decoded);
        free(ids);
    }
    test_check(failures == 0, "decode(encode(x)) == x for random byte strings",
               "%d of %d differ (first: trial %d)", failures, trials, first_failure);
    test_check(out_of_range == 0, "encoded ids lie in the vocabulary", "%d outside", out_of_range);
}

// ---- malformed vocabulary files: the loader must exit 1 naming the file and the problem ----------

static void write_file(const char* path, const char* content) {
    FILE* f = xfopen(path, "wb");
    xfwrite(content, 1, strlen(content), f, path);
    fclose(f);
}

static void expect_load_error(const char* name, const char* dir, const char* want_file,
                              const char* want_problem) {
    char err_path[4200];
    snprintf(err_path, sizeof(err_path), "%s/stderr.txt", dir);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(err_path, "w", stderr)) _exit(99);
        Tokenizer* tok = tokenizer_load(dir);
        tokenizer_free(tok);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    size_t len = 0;
    char* message = read_whole_file(err_path, &len);
    char* newline = strchr(message, '\n');
    if (newline) *newline = '\0';
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(message, want_file) &&
             strstr(message, want_problem);
    test_check(ok, name, "exit status %d, message \"%s\"", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
               message);
    free(message);
}

static void test_malformed_vocabulary(const char* data_dir) {
    char dir[] = "/tmp/test_tokenizer_XXXXXX";
    if (!mkdtemp(dir)) fatal("cannot create a temporary directory");
    // The scratch directory links to the real files: by absolute paths, since a relative data_dir
    // means nothing from inside /tmp.
    char absolute_data_dir[PATH_MAX];
    if (!realpath(data_dir, absolute_data_dir)) fatal("%s: cannot resolve the path", data_dir);
    char encoder[4200], merges[4200], real_encoder[4200], real_merges[4200];
    snprintf(encoder, sizeof(encoder), "%s/encoder.json", dir);
    snprintf(merges, sizeof(merges), "%s/vocab.bpe", dir);
    snprintf(real_encoder, sizeof(real_encoder), "%s/gpt2/encoder.json", absolute_data_dir);
    snprintf(real_merges, sizeof(real_merges), "%s/gpt2/vocab.bpe", absolute_data_dir);

    expect_load_error("missing encoder.json", dir, "encoder.json", "cannot open");
    size_t len;
    char* real = read_whole_file(real_encoder, &len);
    real[1000] = '\0';
    write_file(encoder, real);
    expect_load_error("truncated encoder.json", dir, "encoder.json", "at byte 1000");
    free(real);
    write_file(encoder, "{\"a\": 0}");
    expect_load_error("encoder.json without byte tokens", dir, "encoder.json", "no token for the single byte");
    write_file(encoder, "{\"a\": 0, \"b\": 0}");
    expect_load_error("repeated id", dir, "encoder.json", "given to two tokens");
    write_file(encoder, "{\"a\": 0, \"a\": 1}");
    expect_load_error("repeated token", dir, "encoder.json", "appears twice");
    write_file(encoder, "{\"a\": 5}");
    expect_load_error("id out of range", dir, "encoder.json", "out of range");
    write_file(encoder, "{\"a\": -1}");
    expect_load_error("negative id", dir, "encoder.json", "non-negative integer");
    write_file(encoder, "{\"a\\q\": 0}");
    expect_load_error("bad escape", dir, "encoder.json", "unknown escape");
    write_file(encoder, "{\"\\u4e2d\": 0}");
    expect_load_error("character outside the byte alphabet", dir, "encoder.json", "byte alphabet");
    write_file(encoder, "[1, 2]");
    expect_load_error("not an object", dir, "encoder.json", "missing '{'");

    unlink(encoder);
    if (symlink(real_encoder, encoder) != 0) fatal("cannot link %s to %s", encoder, real_encoder);
    expect_load_error("missing vocab.bpe", dir, "vocab.bpe", "cannot open");
    write_file(merges, "\xc4\xa0 t\n");
    expect_load_error("vocab.bpe without a version line", dir, "vocab.bpe", "#version");
    write_file(merges, "#version: 0.2\n\xc4\xa0t\n");
    expect_load_error("merge without a space", dir, "vocab.bpe line 2", "two tokens");
    write_file(merges, "#version: 0.2\n\xc4\xa0 t\n\xc4\xa0 qqqqqqqqzz\n");
    expect_load_error("merge of an unknown token", dir, "vocab.bpe line 3", "not in encoder.json");
    write_file(merges, "#version: 0.2\n\xc4\xa0 \xc4\xa0\n"); // "ĠĠ" is no token
    expect_load_error("merge giving an unknown token", dir, "vocab.bpe line 2", "merged token");
    write_file(merges, "#version: 0.2\n\xc4\xa0 t\n\xc4\xa0 t\n");
    expect_load_error("repeated merge", dir, "vocab.bpe line 3", "appears twice");
    // The real vocab.bpe cut after its first 1000 merges, at a line boundary: every line is a good one.
    char* real_bpe = read_whole_file(real_merges, &len);
    char* cut = real_bpe;
    for (int lines = 0; lines < 1001; lines++) cut = strchr(cut, '\n') + 1;
    *cut = '\0';
    write_file(merges, real_bpe);
    free(real_bpe);
    expect_load_error("vocab.bpe cut at a line boundary", dir, "vocab.bpe: 1000 merges", "none makes token");

    // The real vocab.bpe in the scratch directory loads: the errors above came from the edits.
    unlink(merges);
    if (symlink(real_merges, merges) != 0) fatal("cannot link %s to %s", merges, real_merges);
    Tokenizer* tok = tokenizer_load(dir);
    test_check(tokenizer_vocab_size(tok) == 50257, "scratch copy of the vocabulary loads", "%d tokens",
               tokenizer_vocab_size(tok));
    tokenizer_free(tok);
    char err_path[4200];
    snprintf(err_path, sizeof(err_path), "%s/stderr.txt", dir);
    unlink(err_path);
    unlink(encoder);
    unlink(merges);
    rmdir(dir);
}

int main(int argc, char** argv) {
    if (argc != 2)
        fatal("usage: test_tokenizer DATA_DIR (the directory scripts/get_data.sh fills: gpt2/, tinyshakespeare/)");
    const char* data_dir = argv[1];
    char vocab_dir[4096];
    snprintf(vocab_dir, sizeof(vocab_dir), "%s/gpt2", data_dir);
    double t0 = wall_seconds();
    Tokenizer* tok = tokenizer_load(vocab_dir);
    printf("loaded %s in %.3f s\n", vocab_dir, wall_seconds() - t0);

    test_speed(tok, data_dir); // first, while the piece cache is empty
    test_vocabulary(tok);
    test_known_encodings(tok);
    test_round_trips(tok);
    tokenizer_free(tok);
    test_malformed_vocabulary(data_dir);
    return test_summary("test_tokenizer");
}
