// GPT-2 byte-level BPE (see tokenizer.h). Encoding cuts the text into pieces exactly where GPT-2's
// regex would, then merges each piece: its bytes start as single-byte tokens and the adjacent pair
// with the lowest rank in vocab.bpe is merged until no adjacent pair is a merge. Decoding
// concatenates the tokens' bytes.
#define STB_DS_IMPLEMENTATION
#include <stb_ds.h>

#include "data/tokenizer.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "data/jsonl.h" // utf8_encode
#include "data/unicode_tables.h"

// Empties an stb_ds array and keeps its memory (arrsetlen(a, 0) trips gcc's -Wtype-limits).
#define arrclear(a) ((a) ? (void)(stbds_header(a)->length = 0) : (void)0)

// encoder.json and vocab.bpe spell every byte as a printable code point: the printable Latin-1
// bytes stand for themselves, the other 68 bytes map to U+0100, U+0101, ... in byte order.
#define MAPPED_CODE_POINTS (256 + 68)

// The piece cache is emptied when its keys and tokens pass this size, so memory stays bounded
// however much varied text is encoded (a fuzzer, a large corpus).
#define PIECE_CACHE_LIMIT_BYTES ((size_t)64 << 20)

typedef struct { char* key; int value; } VocabEntry; // mapped token string -> id (loading only)

typedef struct { int rank; int merged; } Merge;
typedef struct { uint64_t key; Merge value; } MergeEntry; // (left id << 32 | right id) -> merge

typedef struct { size_t start; size_t count; } CachedPiece; // a run of TokenizerCache.tokens
typedef struct { char* key; CachedPiece value; } CacheEntry; // mapped piece string -> its tokens
struct TokenizerCache {
    CacheEntry* map;
    int* tokens;  // stb_ds array holding the tokens of every cached piece
    size_t bytes; // size of the keys and tokens held, compared with PIECE_CACHE_LIMIT_BYTES
};

struct Tokenizer {
    int vocab_size;
    char* token_bytes;     // the raw bytes of every token, back to back, in id order
    size_t* token_offset;  // token id is token_bytes[token_offset[id] .. token_offset[id + 1])
    int byte_token[256];   // id of the token that is this single byte
    char byte_key[256][3]; // NUL-terminated UTF-8 of the code point that spells this byte
    MergeEntry* merges; // read only after loading: encoding looks up with hmgeti_ts
    TokenizerCache* cache; // tokenizer_encode's cache; threads bring their own
};

// ---- loading ----------------------------------------------------------------------------------

static int byte_is_printable(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

static uint32_t byte_to_code_point(int b) {
    if (byte_is_printable(b)) return (uint32_t)b;
    uint32_t cp = 256;
    for (int i = 0; i < b; i++) cp += !byte_is_printable(i);
    return cp;
}

// A strict reader for encoder.json: one flat JSON object of string keys and integer values.
typedef struct {
    const char* path;
    const char* text;
    size_t len, pos;
} JsonReader;

static void json_fail(const JsonReader* r, const char* problem) {
    fatal("%s: %s at byte %zu (expected a JSON object of token strings to ids)", r->path, problem,
          r->pos);
}

static void json_skip_space(JsonReader* r) {
    while (r->pos < r->len) {
        char c = r->text[r->pos];
        if (c != ' ' && c != '\t' && c != '\r' && c != '\n') break;
        r->pos++;
    }
}

static void json_expect(JsonReader* r, char c, const char* problem) {
    json_skip_space(r);
    if (r->pos >= r->len || r->text[r->pos] != c) json_fail(r, problem);
    r->pos++;
}

static uint32_t json_hex4(JsonReader* r) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++, r->pos++) {
        char c = r->pos < r->len ? r->text[r->pos] : '\0';
        int digit = c >= '0' && c <= '9' ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (digit < 0) json_fail(r, "bad \\u escape (needs four hex digits)");
        v = v * 16 + (uint32_t)digit;
    }
    return v;
}

// Reads a JSON string into *out (an stb_ds array, NUL-terminated) as UTF-8.
static void json_string(JsonReader* r, char** out) {
    arrclear(*out);
    json_expect(r, '"', "missing '\"' opening a token string");
    for (;;) {
        if (r->pos >= r->len) json_fail(r, "unterminated string");
        unsigned char c = (unsigned char)r->text[r->pos++];
        if (c == '"') break;
        if (c < 0x20) json_fail(r, "control character inside a string");
        if (c != '\\') {
            arrput(*out, (char)c);
            continue;
        }
        if (r->pos >= r->len) json_fail(r, "unterminated string");
        char e = r->text[r->pos++];
        const char* simple = strchr("\"\\/bfnrt", e);
        if (e != '\0' && simple) {
            arrput(*out, "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"]);
        } else if (e == 'u') {
            uint32_t cp = json_hex4(r);
            if (cp >= 0xDC00 && cp <= 0xDFFF) json_fail(r, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (r->pos + 2 > r->len || r->text[r->pos] != '\\' || r->text[r->pos + 1] != 'u')
                    json_fail(r, "high surrogate not followed by a \\u low surrogate");
                r->pos += 2;
                uint32_t low = json_hex4(r);
                if (low < 0xDC00 || low > 0xDFFF) json_fail(r, "high surrogate not followed by a low surrogate");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            if (cp == 0) json_fail(r, "NUL character (\\u0000) in a string");
            char utf8[4];
            int n = utf8_encode(cp, utf8);
            memcpy(arraddnptr(*out, n), utf8, (size_t)n);
        } else {
            json_fail(r, "unknown escape in string");
        }
    }
    arrput(*out, '\0');
}

static int json_token_id(JsonReader* r) {
    json_skip_space(r);
    long long v = 0;
    size_t start = r->pos;
    while (r->pos < r->len && r->text[r->pos] >= '0' && r->text[r->pos] <= '9') {
        v = v * 10 + (r->text[r->pos++] - '0');
        if (v > INT_MAX) json_fail(r, "token id too large");
    }
    if (r->pos == start) json_fail(r, "token id is not a non-negative integer");
    return (int)v;
}

// Turns a token string of encoder.json or vocab.bpe (mapped code points, UTF-8) back into raw bytes.
// code_point_to_byte inverts byte_to_code_point, with -1 for code points outside the alphabet.
static void unmap_token(const char* path, const char* mapped, const int* code_point_to_byte,
                        char** raw) {
    arrclear(*raw);
    const unsigned char* s = (const unsigned char*)mapped;
    while (*s) {
        uint32_t cp = UINT32_MAX; // stays outside the alphabet unless one or two bytes spell a code point
        if (s[0] < 0x80) {
            cp = s[0];
            s += 1;
        } else if ((s[0] & 0xE0) == 0xC0 && (s[1] & 0xC0) == 0x80) {
            cp = (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
            s += 2;
        }
        if (cp >= MAPPED_CODE_POINTS || code_point_to_byte[cp] < 0)
            fatal("%s: token \"%s\" has a character outside GPT-2's byte alphabet", path, mapped);
        arrput(*raw, (char)code_point_to_byte[cp]);
    }
    if (arrlen(*raw) == 0) fatal("%s: empty token string", path);
}

// Reads encoder.json into tok's token bytes; returns the map from mapped strings to ids.
static VocabEntry* load_encoder(Tokenizer* tok, const char* path) {
    size_t len;
    char* text = read_whole_file(path, &len);
    JsonReader r = {path, text, len, 0};
    VocabEntry* vocab = NULL;
    sh_new_strdup(vocab);
    char* key = NULL;
    char* raw = NULL;
    char* all_bytes = NULL;        // raw bytes of the tokens in file order
    size_t* file_offset = NULL;    // where each token of the file starts in all_bytes
    int* file_id = NULL;
    int code_point_to_byte[MAPPED_CODE_POINTS];
    for (int cp = 0; cp < MAPPED_CODE_POINTS; cp++) code_point_to_byte[cp] = -1;
    for (int b = 0; b < 256; b++) code_point_to_byte[byte_to_code_point(b)] = b;

    json_expect(&r, '{', "missing '{'");
    json_skip_space(&r);
    if (r.pos < r.len && r.text[r.pos] == '}') json_fail(&r, "empty vocabulary");
    for (;;) {
        json_string(&r, &key);
        if (shgeti(vocab, key) >= 0) fatal("%s: token \"%s\" appears twice", path, key);
        json_expect(&r, ':', "missing ':' after a token string");
        int id = json_token_id(&r);
        unmap_token(path, key, code_point_to_byte, &raw);
        shput(vocab, key, id);
        arrput(file_offset, arrlenu(all_bytes));
        arrput(file_id, id);
        memcpy(arraddnptr(all_bytes, arrlen(raw)), raw, arrlenu(raw));
        json_skip_space(&r);
        if (r.pos < r.len && r.text[r.pos] == ',') { r.pos++; continue; }
        json_expect(&r, '}', "missing ',' or '}' after a token id");
        break;
    }
    json_skip_space(&r);
    if (r.pos != r.len) json_fail(&r, "text after the closing '}'");
    arrput(file_offset, arrlenu(all_bytes));

    // The ids must be exactly 0 .. n-1 so that a token file's ids index the vocabulary densely.
    int n = (int)arrlen(file_id);
    size_t* id_length = xcalloc((size_t)n, sizeof(size_t), "token lengths");
    int* id_position = xmalloc((size_t)n * sizeof(int), "token positions");
    for (int i = 0; i < n; i++) {
        int id = file_id[i];
        if (id >= n) fatal("%s: token id %d is out of range: %d tokens need ids 0..%d", path, id, n, n - 1);
        if (id_length[id]) fatal("%s: token id %d is given to two tokens", path, id);
        id_length[id] = file_offset[i + 1] - file_offset[i];
        id_position[id] = i;
    }
    tok->vocab_size = n;
    tok->token_bytes = xmalloc(arrlenu(all_bytes), "token bytes");
    tok->token_offset = xmalloc(((size_t)n + 1) * sizeof(size_t), "token offsets");
    size_t at = 0;
    for (int id = 0; id < n; id++) {
        tok->token_offset[id] = at;
        memcpy(tok->token_bytes + at, all_bytes + file_offset[id_position[id]], id_length[id]);
        at += id_length[id];
    }
    tok->token_offset[n] = at;

    for (int b = 0; b < 256; b++) {
        char* k = tok->byte_key[b];
        char utf8[4];
        int n_utf8 = utf8_encode(byte_to_code_point(b), utf8); // 1 or 2 bytes: code points < 324
        memcpy(k, utf8, (size_t)n_utf8);
        k[n_utf8] = '\0';
        ptrdiff_t i = shgeti(vocab, k);
        if (i < 0) fatal("%s: no token for the single byte 0x%02X", path, b);
        tok->byte_token[b] = vocab[i].value;
    }
    free(id_length);
    free(id_position);
    arrfree(file_id);
    arrfree(file_offset);
    arrfree(all_bytes);
    arrfree(raw);
    arrfree(key);
    free(text);
    return vocab;
}

// Every token of two or more bytes but the special ones ("<|endoftext|>") is made by a merge: a
// vocab.bpe cut short (at a line boundary, where no line is broken) or taken from another
// vocabulary leaves some without one, and would encode text into other tokens than GPT-2's.
// Returns the first token that should be made by a merge and is not (made[id]: one makes it), or -1.
static int unmade_token(const Tokenizer* tok, const char* made) {
    for (int id = 0; id < tok->vocab_size; id++) {
        const char* bytes = tok->token_bytes + tok->token_offset[id];
        size_t len = tok->token_offset[id + 1] - tok->token_offset[id];
        int special = len >= 4 && memcmp(bytes, "<|", 2) == 0 && memcmp(bytes + len - 2, "|>", 2) == 0;
        if (len >= 2 && !special && !made[id]) return id;
    }
    return -1;
}

// Reads vocab.bpe: a "#version" line, then one merge "LEFT RIGHT" per line, lowest rank first.
static void load_merges(Tokenizer* tok, VocabEntry* vocab, const char* path) {
    size_t len;
    char* text = read_whole_file(path, &len);
    if (strlen(text) != len) fatal("%s: contains a NUL byte (expected text)", path);
    if (strncmp(text, "#version", 8) != 0) fatal("%s: the first line must be \"#version: ...\"", path);
    char* line = strchr(text, '\n');
    char* merged = NULL;
    char* made = xcalloc((size_t)tok->vocab_size, 1, "merged tokens"); // made[id]: a merge makes token id
    int rank = 0;
    for (int line_number = 2; line && line[1] != '\0'; line_number++) {
        line++;
        char* end = strchr(line, '\n');
        if (end) *end = '\0';
        char* space = strchr(line, ' ');
        if (!space || space == line || space[1] == '\0' || strchr(space + 1, ' '))
            fatal("%s line %d: expected two tokens separated by one space, got \"%s\"", path,
                  line_number, line);
        *space = '\0';
        const char* right = space + 1;
        ptrdiff_t left_index = shgeti(vocab, line), right_index = shgeti(vocab, right);
        if (left_index < 0) fatal("%s line %d: token \"%s\" is not in encoder.json", path, line_number, line);
        if (right_index < 0) fatal("%s line %d: token \"%s\" is not in encoder.json", path, line_number, right);
        arrclear(merged);
        memcpy(arraddnptr(merged, strlen(line)), line, strlen(line));
        memcpy(arraddnptr(merged, strlen(right) + 1), right, strlen(right) + 1);
        ptrdiff_t merged_index = shgeti(vocab, merged);
        if (merged_index < 0)
            fatal("%s line %d: the merged token \"%s\" is not in encoder.json", path, line_number, merged);
        uint64_t pair = (uint64_t)(uint32_t)vocab[left_index].value << 32 | (uint32_t)vocab[right_index].value;
        if (hmgeti(tok->merges, pair) >= 0)
            fatal("%s line %d: the merge \"%s %s\" appears twice", path, line_number, line, right);
        Merge m = {rank++, vocab[merged_index].value};
        hmput(tok->merges, pair, m);
        made[m.merged] = 1;
        line = end;
    }
    int unmade = unmade_token(tok, made);
    free(made);
    arrfree(merged);
    free(text);
    if (unmade >= 0) {
        size_t len = tok->token_offset[unmade + 1] - tok->token_offset[unmade];
        fatal("%s: %d merges, but none makes token %d (\"%.*s\") of encoder.json: the file is cut short or belongs "
              "to another vocabulary", path, rank, unmade, (int)len, tok->token_bytes + tok->token_offset[unmade]);
    }
}

Tokenizer* tokenizer_load(const char* dir) {
    Tokenizer* tok = xcalloc(1, sizeof(Tokenizer), "tokenizer");
    size_t path_len = strlen(dir) + 32;
    char* path = xmalloc(path_len, "path");
    snprintf(path, path_len, "%s/encoder.json", dir);
    VocabEntry* vocab = load_encoder(tok, path);
    snprintf(path, path_len, "%s/vocab.bpe", dir);
    load_merges(tok, vocab, path);
    shfree(vocab);
    free(path);
    tok->cache = tokenizer_cache_new();
    return tok;
}

void tokenizer_free(Tokenizer* tok) {
    if (!tok) return;
    free(tok->token_bytes);
    free(tok->token_offset);
    hmfree(tok->merges);
    tokenizer_cache_free(tok->cache);
    free(tok);
}

TokenizerCache* tokenizer_cache_new(void) {
    TokenizerCache* cache = xcalloc(1, sizeof(TokenizerCache), "piece cache");
    sh_new_strdup(cache->map);
    return cache;
}

void tokenizer_cache_free(TokenizerCache* cache) {
    if (!cache) return;
    shfree(cache->map);
    arrfree(cache->tokens);
    free(cache);
}

int tokenizer_vocab_size(const Tokenizer* tok) { return tok->vocab_size; }

// ---- pre-tokenisation ---------------------------------------------------------------------------

enum { CHAR_LETTER, CHAR_NUMBER, CHAR_SPACE, CHAR_OTHER };

static int in_ranges(uint32_t cp, const uint32_t (*ranges)[2], size_t n) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < ranges[mid][0]) hi = mid;
        else if (cp > ranges[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

#define IN_TABLE(cp, table) in_ranges(cp, table, sizeof(table) / sizeof(table[0]))

// The class of the character at s[i], whose length in bytes goes to *len. A byte that does not start
// a well-formed UTF-8 sequence (Unicode's Table 3-7) is a one-byte character of class CHAR_OTHER, so
// any bytes are encoded and decoded losslessly.
static int char_class(const unsigned char* s, size_t n, size_t i, size_t* len) {
    unsigned char b = s[i];
    *len = 1;
    if (b < 0x80) {
        if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')) return CHAR_LETTER;
        if (b >= '0' && b <= '9') return CHAR_NUMBER;
        if (b == ' ' || (b >= '\t' && b <= '\r')) return CHAR_SPACE;
        return CHAR_OTHER;
    }
    size_t continuation;
    uint32_t cp;
    unsigned char lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
        continuation = 1, cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        continuation = 2, cp = b & 0x0F;
        if (b == 0xE0) lo = 0xA0; // no overlong forms
        if (b == 0xED) hi = 0x9F; // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        continuation = 3, cp = b & 0x07;
        if (b == 0xF0) lo = 0x90; // no overlong forms
        if (b == 0xF4) hi = 0x8F; // nothing above U+10FFFF
    } else {
        return CHAR_OTHER;
    }
    if (i + continuation >= n) return CHAR_OTHER;
    for (size_t k = 1; k <= continuation; k++) {
        unsigned char c = s[i + k];
        if (c < lo || c > hi) return CHAR_OTHER;
        cp = cp << 6 | (c & 0x3F);
        lo = 0x80, hi = 0xBF;
    }
    *len = continuation + 1;
    if (IN_TABLE(cp, unicode_letter_ranges)) return CHAR_LETTER;
    if (IN_TABLE(cp, unicode_number_ranges)) return CHAR_NUMBER;
    if (IN_TABLE(cp, unicode_space_ranges)) return CHAR_SPACE;
    return CHAR_OTHER;
}

// Where the piece starting at s[i] ends: the match GPT-2's regex finds there, trying its
// alternatives in order: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static size_t piece_end(const unsigned char* s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char c = s[i + 1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
        if (i + 2 < n && ((c == 'r' && s[i + 2] == 'e') || (c == 'v' && s[i + 2] == 'e') ||
                          (c == 'l' && s[i + 2] == 'l')))
            return i + 3;
    }
    size_t len;
    int cls = char_class(s, n, i, &len);
    size_t run_start = i;
    // A space may lead a run of letters, numbers or other characters.
    if (s[i] == ' ' && i + 1 < n) {
        size_t next_len;
        int next = char_class(s, n, i + 1, &next_len);
        if (next != CHAR_SPACE) run_start = i + 1, cls = next, len = next_len;
    }
    size_t end = run_start + len;
    if (cls != CHAR_SPACE) {
        while (end < n && char_class(s, n, end, &len) == cls) end += len;
        return end;
    }
    // A run of white space. When a non-space follows it, its last character is left to lead the
    // next piece (\s+(?!\S)), unless it is the run's only character (\s+).
    size_t last = i; // start of the run's last character so far
    while (end < n) {
        if (char_class(s, n, end, &len) != CHAR_SPACE) return last > i ? last : end;
        last = end;
        end += len;
    }
    return end;
}

// ---- byte pair encoding -------------------------------------------------------------------------

// Rank of merging the adjacent tokens (left, right), with the merged token in *merged; INT_MAX (and
// -1) if vocab.bpe has no such merge.
static int merge_rank(const Tokenizer* tok, int left, int right, int* merged) {
    // hmgeti would write its result into the map's header, shared by every thread; the _ts form
    // keeps it in a local. The macro also writes the map pointer back, hence the local copy.
    MergeEntry* merges = tok->merges;
    *merged = -1;
    if (!merges) return INT_MAX;
    ptrdiff_t temp, i = hmgeti_ts(merges, (uint64_t)(uint32_t)left << 32 | (uint32_t)right, temp);
    if (i < 0) return INT_MAX;
    *merged = merges[i].value.merged;
    return merges[i].value.rank;
}

// A possible merge: the symbol at `left` with the symbol after it, at this rank.
typedef struct { int rank; ptrdiff_t left; } Candidate;

// Work arrays (stb_ds) reused across the pieces of one encode call. A piece's bytes are symbols in a
// linked list; merging a pair keeps the left symbol and unlinks the right one.
typedef struct {
    char* key;        // the piece spelled as in encoder.json, NUL-terminated: the cache key
    int* ids;         // token of each symbol; -1 once merged into its left neighbour
    ptrdiff_t* next;  // following symbol, -1 at the end
    ptrdiff_t* prev;  // preceding symbol, -1 at the start
    Candidate* heap;  // binary min-heap of candidates, lowest rank first, leftmost on a tie
} BpeScratch;

static int candidate_before(Candidate a, Candidate b) {
    return a.rank < b.rank || (a.rank == b.rank && a.left < b.left);
}

static void push_candidate(const Tokenizer* tok, BpeScratch* s, ptrdiff_t left) {
    ptrdiff_t right = s->next[left];
    int merged;
    if (right < 0) return;
    int rank = merge_rank(tok, s->ids[left], s->ids[right], &merged);
    if (rank == INT_MAX) return;
    Candidate c = {rank, left};
    arrput(s->heap, c);
    Candidate* h = s->heap;
    for (size_t i = arrlenu(h) - 1; i > 0 && candidate_before(h[i], h[(i - 1) / 2]); i = (i - 1) / 2) {
        Candidate parent = h[(i - 1) / 2];
        h[(i - 1) / 2] = h[i];
        h[i] = parent;
    }
}

static Candidate pop_candidate(BpeScratch* s) {
    Candidate* h = s->heap;
    Candidate top = h[0];
    Candidate last = arrpop(h);
    size_t n = arrlenu(h);
    if (n == 0) return top;
    size_t i = 0;
    for (;;) { // sift `last` down from the root
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && candidate_before(h[child + 1], h[child])) child++;
        if (!candidate_before(h[child], last)) break;
        h[i] = h[child];
        i = child;
    }
    h[i] = last;
    return top;
}

// Merges the bytes of one piece into tokens, left in s->ids: repeatedly the adjacent pair with the
// lowest rank, the leftmost on a tie, in O(n log n) so that a long run of letters stays fast. Heap
// entries are not removed when a merge changes their pair; they are checked when popped instead.
static void bpe_piece(const Tokenizer* tok, const unsigned char* piece, size_t n, BpeScratch* s) {
    arrsetlen(s->ids, n);
    arrsetlen(s->next, n);
    arrsetlen(s->prev, n);
    arrclear(s->heap);
    for (size_t j = 0; j < n; j++) {
        s->ids[j] = tok->byte_token[piece[j]];
        s->next[j] = j + 1 < n ? (ptrdiff_t)j + 1 : -1;
        s->prev[j] = (ptrdiff_t)j - 1;
    }
    for (size_t j = 0; j + 1 < n; j++) push_candidate(tok, s, (ptrdiff_t)j);
    while (arrlen(s->heap) > 0) {
        Candidate c = pop_candidate(s);
        ptrdiff_t left = c.left, right = s->next[left];
        int merged;
        if (s->ids[left] < 0 || right < 0) continue; // stale: left was merged away or is now last
        if (merge_rank(tok, s->ids[left], s->ids[right], &merged) != c.rank) continue; // stale pair
        s->ids[left] = merged;
        s->ids[right] = -1;
        s->next[left] = s->next[right];
        if (s->next[right] >= 0) s->prev[s->next[right]] = left;
        if (s->prev[left] >= 0) push_candidate(tok, s, s->prev[left]);
        push_candidate(tok, s, left);
    }
    size_t count = 0;
    for (ptrdiff_t j = 0; j >= 0; j = s->next[j]) s->ids[count++] = s->ids[j];
    arrsetlen(s->ids, count);
}

// Appends the tokens of one piece to *out, from the cache when the piece was seen before.
static void encode_piece(const Tokenizer* tok, TokenizerCache* cache, const unsigned char* piece,
                         size_t n, int** out, BpeScratch* s) {
    arrclear(s->key);
    for (size_t j = 0; j < n; j++) {
        const char* k = tok->byte_key[piece[j]];
        arrput(s->key, k[0]);
        if (k[1]) arrput(s->key, k[1]);
    }
    arrput(s->key, '\0');
    ptrdiff_t hit = shgeti(cache->map, s->key);
    if (hit >= 0) {
        CachedPiece p = cache->map[hit].value;
        memcpy(arraddnptr(*out, p.count), cache->tokens + p.start, p.count * sizeof(int));
        return;
    }
    bpe_piece(tok, piece, n, s);
    size_t count = arrlenu(s->ids);
    memcpy(arraddnptr(*out, count), s->ids, count * sizeof(int));

    size_t entry_bytes = arrlenu(s->key) + count * sizeof(int);
    if (cache->bytes + entry_bytes > PIECE_CACHE_LIMIT_BYTES) {
        shfree(cache->map);
        sh_new_strdup(cache->map);
        arrclear(cache->tokens);
        cache->bytes = 0;
    }
    CachedPiece p = {arrlenu(cache->tokens), count};
    memcpy(arraddnptr(cache->tokens, count), s->ids, count * sizeof(int));
    shput(cache->map, s->key, p);
    cache->bytes += entry_bytes;
}

int* tokenizer_encode(const Tokenizer* tok, const char* text, size_t len, size_t* ntokens) {
    return tokenizer_encode_cached(tok, tok->cache, text, len, ntokens);
}

int* tokenizer_encode_cached(const Tokenizer* tok, TokenizerCache* cache, const char* text,
                             size_t len, size_t* ntokens) {
    const unsigned char* s = (const unsigned char*)text;
    BpeScratch scratch = {0};
    int* tokens = NULL;
    for (size_t start = 0; start < len;) {
        size_t end = piece_end(s, len, start);
        encode_piece(tok, cache, s + start, end - start, &tokens, &scratch);
        start = end;
    }
    *ntokens = arrlenu(tokens);
    int* result = xmalloc(*ntokens * sizeof(int), "encoded tokens");
    if (*ntokens) memcpy(result, tokens, *ntokens * sizeof(int));
    arrfree(tokens);
    arrfree(scratch.key);
    arrfree(scratch.ids);
    arrfree(scratch.next);
    arrfree(scratch.prev);
    arrfree(scratch.heap);
    return result;
}

// ---- decoding -----------------------------------------------------------------------------------

const char* tokenizer_token_bytes(const Tokenizer* tok, int id, size_t* len) {
    if (id < 0 || id >= tok->vocab_size) return NULL;
    *len = tok->token_offset[id + 1] - tok->token_offset[id];
    return tok->token_bytes + tok->token_offset[id];
}

char* tokenizer_decode(const Tokenizer* tok, const int* ids, size_t n, size_t* len) {
    size_t total = 0, token_len;
    for (size_t i = 0; i < n; i++)
        if (tokenizer_token_bytes(tok, ids[i], &token_len)) total += token_len;
    char* text = xmalloc(total + 1, "decoded text");
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const char* bytes = tokenizer_token_bytes(tok, ids[i], &token_len);
        if (!bytes) continue;
        memcpy(text + at, bytes, token_len);
        at += token_len;
    }
    text[at] = '\0';
    *len = at;
    return text;
}
