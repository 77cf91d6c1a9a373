// Strict JSON (RFC 8259) for one JSONL line; see jsonl.h. A recursive descent over the bytes: every
// function returns 0, or -1 after writing the first problem into the parser's message.
#include "data/jsonl.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// Deeper nesting is refused so that a hostile line cannot overflow the stack.
#define MAX_DEPTH 256

typedef struct {
    const unsigned char* s;
    size_t len, pos;
    char* err;
    size_t errlen;
} Parser;

static int fail(Parser* p, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Parser* p, const char* fmt, ...) {
    int n = snprintf(p->err, p->errlen, "column %zu: ", p->pos + 1);
    if (n >= 0 && (size_t)n < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void skip_space(Parser* p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\r' && c != '\n') break;
        p->pos++;
    }
}

static int peek(const Parser* p) { return p->pos < p->len ? p->s[p->pos] : -1; }

int utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hex4(Parser* p, uint32_t* v) {
    *v = 0;
    for (int i = 0; i < 4; i++, p->pos++) {
        int c = peek(p);
        int digit = c >= '0' && c <= '9' ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (digit < 0) return fail(p, "bad \\u escape (needs four hex digits)");
        *v = *v * 16 + (uint32_t)digit;
    }
    return 0;
}

// Reads the string at p->pos (its opening quote). Decoded into out when out is not NULL, which keeps
// its first `cap` bytes (a field name is compared on as many bytes as the name sought has); *n: the
// decoded length. Otherwise only checked.
static int string(Parser* p, char* out, size_t cap, size_t* n) {
    size_t at = 0;
    if (peek(p) != '"') return fail(p, "expected a string");
    p->pos++;
    for (;;) {
        int c = peek(p);
        if (c < 0) return fail(p, "unterminated string");
        p->pos++;
        if (c == '"') break;
        if (c < 0x20) return fail(p, "control character 0x%02X inside a string (must be escaped)", c);
        char utf8[4];
        int bytes = 1;
        utf8[0] = (char)c;
        if (c == '\\') {
            size_t escape = p->pos - 1; // where a message about the escape points
            int e = peek(p);
            const char* simple = e > 0 ? strchr("\"\\/bfnrt", e) : NULL;
            p->pos++;
            if (simple) {
                utf8[0] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            } else if (e == 'u') {
                uint32_t cp, low;
                if (hex4(p, &cp)) return -1;
                if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    p->pos = escape;
                    return fail(p, "lone low surrogate \\u%04X", cp);
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (p->pos + 1 >= p->len || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                        p->pos = escape;
                        return fail(p, "high surrogate \\u%04X not followed by a \\u low surrogate", cp);
                    }
                    p->pos += 2;
                    if (hex4(p, &low)) return -1;
                    if (low < 0xDC00 || low > 0xDFFF) {
                        p->pos = escape;
                        return fail(p, "high surrogate \\u%04X followed by \\u%04X, not a low surrogate", cp, low);
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                }
                bytes = utf8_encode(cp, utf8);
            } else {
                p->pos = escape;
                return fail(p, e < 0 ? "unterminated string" : "invalid escape \\%c", e);
            }
        }
        if (out && at < cap) memcpy(out + at, utf8, at + (size_t)bytes <= cap ? (size_t)bytes : cap - at);
        at += (size_t)bytes;
    }
    if (n) *n = at;
    return 0;
}

static int digits(Parser* p) {
    size_t start = p->pos;
    while (peek(p) >= '0' && peek(p) <= '9') p->pos++;
    return p->pos > start ? 0 : fail(p, "expected a digit in a number");
}

// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
static int number(Parser* p) {
    if (peek(p) == '-') p->pos++;
    if (peek(p) == '0') p->pos++;
    else if (digits(p)) return -1;
    if (peek(p) == '.') {
        p->pos++;
        if (digits(p)) return -1;
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-') p->pos++;
        if (digits(p)) return -1;
    }
    return 0;
}

static int value(Parser* p, int depth);

// The members of an object or the elements of an array, after its opening bracket.
static int container(Parser* p, int close, int depth) {
    if (depth > MAX_DEPTH) return fail(p, "nested deeper than %d levels", MAX_DEPTH);
    skip_space(p);
    if (peek(p) == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        skip_space(p);
        if (close == '}') {
            if (string(p, NULL, 0, NULL)) return -1;
            skip_space(p);
            if (peek(p) != ':') return fail(p, "expected ':' after a field name");
            p->pos++;
        }
        if (value(p, depth)) return -1;
        skip_space(p);
        int c = peek(p);
        p->pos++;
        if (c == close) return 0;
        if (c != ',') {
            p->pos--;
            return fail(p, "expected ',' or '%c'", close);
        }
    }
}

static int literal(Parser* p, const char* word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail(p, "invalid value");
    p->pos += n;
    return 0;
}

static int value(Parser* p, int depth) {
    skip_space(p);
    int c = peek(p);
    if (c == '"') return string(p, NULL, 0, NULL);
    if (c == '{' || c == '[') {
        p->pos++;
        return container(p, c == '{' ? '}' : ']', depth + 1);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number(p);
    if (c == 't') return literal(p, "true");
    if (c == 'f') return literal(p, "false");
    if (c == 'n') return literal(p, "null");
    return fail(p, c < 0 ? "missing value at the end of the line" : "invalid value");
}

// What a value starting with c is, for messages; NULL where no value starts with c.
static const char* kind_of_value(int c) {
    return c == '"' ? "a string" : c == '{' ? "an object" : c == '[' ? "an array"
         : c == 't' || c == 'f' ? "a boolean" : c == 'n' ? "null"
         : c == '-' || (c >= '0' && c <= '9') ? "a number" : NULL;
}

// The kinds of value the public functions take: the characters such a value starts with, and its
// name in messages.
enum { WANT_STRING, WANT_ARRAY, WANT_INTEGER };
static const char* const want_first[] = {"\"", "[", "-0123456789"};
static const char* const want_name[] = {"a string", "an array of strings", "an integer"};

// Checks the whole line as one JSON object and finds its top-level field `field`: returns 0 with
// p->pos at the field's value, or -1 (a malformed line, no such field, the field twice, or a value of
// another kind than `want`, said where it is met). Field names are decoded into scratch, which needs
// room for strlen(field) bytes.
static int find_field(Parser* p, const char* field, int want, char* scratch) {
    size_t field_len = strlen(field), found = 0, name_len;
    int have = 0;
    skip_space(p);
    if (peek(p) != '{') return fail(p, p->pos == p->len ? "empty line (expected a JSON object)" : "expected a JSON object '{'");
    p->pos++;
    skip_space(p);
    if (peek(p) == '}') {
        p->pos++;
    } else {
        for (;;) {
            skip_space(p);
            if (string(p, scratch, field_len, &name_len)) return -1;
            int is_field = name_len == field_len && memcmp(scratch, field, field_len) == 0;
            skip_space(p);
            if (peek(p) != ':') return fail(p, "expected ':' after a field name");
            p->pos++;
            skip_space(p);
            if (is_field) {
                if (have) return fail(p, "field \"%s\" appears twice", field);
                const char* kind = kind_of_value(peek(p));
                if (kind && !strchr(want_first[want], peek(p)))
                    return fail(p, "field \"%s\" is %s, not %s", field, kind, want_name[want]);
                have = 1;
                found = p->pos;
            }
            if (value(p, 1)) return -1;
            skip_space(p);
            int c = peek(p);
            p->pos++;
            if (c == '}') break;
            if (c != ',') {
                p->pos--;
                return fail(p, "expected ',' or '}'");
            }
        }
    }
    skip_space(p);
    if (p->pos != p->len) return fail(p, "text after the closing '}'");
    if (!have) {
        p->pos = 0;
        return fail(p, "no field \"%s\"", field);
    }
    p->pos = found;
    return 0;
}

int jsonl_string_field(const char* line, size_t len, const char* field, char* out, size_t* out_len,
                       char* err, size_t errlen) {
    Parser p = {(const unsigned char*)line, len, 0, err, errlen};
    if (find_field(&p, field, WANT_STRING, out)) return -1;
    return string(&p, out, len, out_len);
}

// The line is valid JSON by now (find_field checked it): the array's elements need only their kind
// checked.
int jsonl_string_array_field(const char* line, size_t len, const char* field, char* out, size_t* lens,
                             int max_count, int* count, char* err, size_t errlen) {
    Parser p = {(const unsigned char*)line, len, 0, err, errlen};
    if (find_field(&p, field, WANT_ARRAY, out)) return -1;
    size_t used = 0;
    *count = 0;
    p.pos++; // '['
    skip_space(&p);
    if (peek(&p) == ']') return 0;
    for (;;) {
        skip_space(&p);
        if (peek(&p) != '"')
            return fail(&p, "element %d of field \"%s\" is %s, not a string", *count + 1, field, kind_of_value(peek(&p)));
        if (*count == max_count) return fail(&p, "field \"%s\" has more than %d elements", field, max_count);
        if (string(&p, out + used, len - used, &lens[*count])) return -1;
        used += lens[(*count)++];
        skip_space(&p);
        if (peek(&p) == ']') return 0;
        p.pos++; // ','
    }
}

int jsonl_integer_field(const char* line, size_t len, const char* field, char* scratch, long long* value,
                        char* err, size_t errlen) {
    Parser p = {(const unsigned char*)line, len, 0, err, errlen};
    if (find_field(&p, field, WANT_INTEGER, scratch)) return -1;
    size_t start = p.pos;
    int negative = peek(&p) == '-';
    p.pos += (size_t)negative;
    long long v = 0;
    for (int c; (c = peek(&p)) >= '0' && c <= '9'; p.pos++) {
        if (v > (LLONG_MAX - (c - '0')) / 10) {
            p.pos = start;
            return fail(&p, "field \"%s\" is too large", field);
        }
        v = v * 10 + (c - '0');
    }
    if (peek(&p) == '.' || peek(&p) == 'e' || peek(&p) == 'E') {
        p.pos = start;
        return fail(&p, "field \"%s\" is a number with a fraction or exponent, not an integer", field);
    }
    *value = negative ? -v : v;
    return 0;
}
