// Tests of the JSONL line decoder (data/jsonl.c) against expected bytes written out by hand: every
// escape, surrogate pairs, other fields of every JSON type skipped, CRLF line ends, and each kind of
// malformed line refused with its column and problem; arrays of strings and integers.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jsonl.h"
#include "tests/lib/testutil.h"

// decodes LINE's field FIELD; the result must be exactly want[0..want_len).
static void expect_text(const char* name, const char* line, const char* field, const char* want,
                        size_t want_len) {
    size_t len = strlen(line), got_len = 0;
    char* out = malloc(len + 1);
    char err[256] = "";
    int rc = jsonl_string_field(line, len, field, out, &got_len, err, sizeof(err));
    test_check(rc == 0 && got_len == want_len && memcmp(out, want, want_len) == 0, name,
               "rc %d, %zu bytes (want %zu), error '%s'", rc, got_len, want_len, err);
    free(out);
}

// LINE must be refused with a message containing WANT.
static void expect_error(const char* name, const char* line, size_t len, const char* want) {
    size_t got_len;
    char* out = malloc(len + 1);
    char err[256] = "";
    int rc = jsonl_string_field(line, len, "text", out, &got_len, err, sizeof(err));
    test_check(rc == -1 && strstr(err, want) != NULL, name, "rc %d, error '%s' (want '%s')", rc, err, want);
    free(out);
}

// LINE's array field "endings" (at most max strings) must hold `count` strings, want_joined: them
// joined by '|'.
static void expect_strings(const char* name, const char* line, int max, int count, const char* want_joined) {
    size_t len = strlen(line), lens[8];
    char* out = malloc(len + 1);
    char err[256] = "", joined[256] = "";
    int got = -1;
    int rc = jsonl_string_array_field(line, len, "endings", out, lens, max, &got, err, sizeof(err));
    for (int i = 0, at = 0, n = 0; rc == 0 && i < got; at += (int)lens[i++])
        n += snprintf(joined + n, sizeof(joined) - (size_t)n, "%s%.*s", i ? "|" : "", (int)lens[i], out + at);
    test_check(rc == 0 && got == count && strcmp(joined, want_joined) == 0, name,
               "rc %d, %d strings '%s' (want %d '%s'), error '%s'", rc, got, joined, count, want_joined, err);
    free(out);
}

static void expect_strings_error(const char* name, const char* line, int max, const char* want) {
    size_t len = strlen(line), lens[8];
    char* out = malloc(len + 1);
    char err[256] = "";
    int count;
    int rc = jsonl_string_array_field(line, len, "endings", out, lens, max, &count, err, sizeof(err));
    test_check(rc == -1 && strstr(err, want) != NULL, name, "rc %d, error '%s' (want '%s')", rc, err, want);
    free(out);
}

// LINE's integer field "label" must be want, or be refused with a message containing want_err.
static void expect_integer(const char* name, const char* line, long long want) {
    char scratch[8], err[256] = "";
    long long v = -999;
    int rc = jsonl_integer_field(line, strlen(line), "label", scratch, &v, err, sizeof(err));
    test_check(rc == 0 && v == want, name, "rc %d, %lld (want %lld), error '%s'", rc, v, want, err);
}

static void expect_integer_error(const char* name, const char* line, const char* want) {
    char scratch[8], err[256] = "";
    long long v;
    int rc = jsonl_integer_field(line, strlen(line), "label", scratch, &v, err, sizeof(err));
    test_check(rc == -1 && strstr(err, want) != NULL, name, "rc %d, error '%s' (want '%s')", rc, err, want);
}

#define TEXT(name, line, want) expect_text(name, line, "text", want, sizeof(want) - 1)
#define ERROR(name, line, want) expect_error(name, line, strlen(line), want)

int main(void) {
    TEXT("plain", "{\"text\": \"hello\"}", "hello");
    TEXT("escapes", "{\"text\":\"a\\nb\\\"c\\\\d\\/e\\tf\\rg\\bh\\fi\"}", "a\nb\"c\\d/e\tf\rg\bh\fi");
    TEXT("\\u00e9 (two UTF-8 bytes)", "{\"text\":\"caf\\u00e9\"}", "caf\xC3\xA9");
    TEXT("\\u20AC (three UTF-8 bytes)", "{\"text\":\"\\u20AC\"}", "\xE2\x82\xAC");
    TEXT("surrogate pair (emoji U+1F600)", "{\"text\":\"\\ud83d\\ude00!\"}", "\xF0\x9F\x98\x80!");
    TEXT("\\u0000 is a NUL byte", "{\"text\":\"a\\u0000b\"}", "a\0b");
    TEXT("raw UTF-8 copied", "{\"text\":\"\xC3\xA9\xF0\x9F\x98\x80\"}", "\xC3\xA9\xF0\x9F\x98\x80");
    TEXT("empty text", "{\"text\":\"\"}", "");
    TEXT("CRLF line end", "{\"text\":\"x\"}\r", "x");
    TEXT("other fields of every type skipped",
         "{\"id\":\"<urn:\\\"x\\\">\",\"n\":-12.5e+3,\"z\":0,\"f\":1E-2,\"ok\":true,\"no\":false,"
         "\"nul\":null,\"obj\":{\"text\":\"inner\",\"a\":[1,{\"b\":[]},\"]\"]},\"arr\":[],\"e\":{},"
         "\"text\":\"outer\",\"after\":[true]}",
         "outer");
    TEXT("escaped field name", "{\"t\\u0065xt\":\"named by an escape\"}", "named by an escape");
    expect_text("another field", "{\"text\":\"no\",\"content\":\"yes\"}", "content", "yes", 3);

    // A very long line: 3 MB of text with an escape every 1000 bytes.
    size_t n = 3 << 20;
    char* line = malloc(n + 32);
    char* want = malloc(n);
    size_t at = (size_t)sprintf(line, "{\"text\":\""), w = 0;
    for (size_t i = 0; w < n - 2; i++) {
        if (i % 1000 == 999) line[at++] = '\\', line[at++] = 'n', want[w++] = '\n';
        else line[at++] = want[w++] = (char)('a' + i % 26);
    }
    strcpy(line + at, "\"}");
    expect_text("3 MB line", line, "text", want, w);
    free(want);
    free(line);

    ERROR("not JSON", "this is not JSON", "column 1: expected a JSON object");
    ERROR("empty line", "", "empty line");
    ERROR("blank line (CR only)", "\r", "empty line");
    ERROR("an array, not an object", "[\"text\"]", "expected a JSON object");
    ERROR("missing field", "{\"body\":\"x\"}", "no field \"text\"");
    ERROR("field not a string", "{\"text\":42}", "field \"text\" is a number, not a string");
    ERROR("field null", "{\"text\":null}", "is null, not a string");
    ERROR("field an object", "{\"text\":{}}", "is an object, not a string");
    ERROR("field twice", "{\"text\":\"a\",\"text\":\"b\"}", "field \"text\" appears twice");
    ERROR("invalid escape", "{\"text\":\"a\\qb\"}", "column 11: invalid escape \\q");
    ERROR("short \\u escape", "{\"text\":\"\\u12\"}", "needs four hex digits");
    ERROR("lone high surrogate", "{\"text\":\"\\ud83d!\"}", "not followed by a \\u low surrogate");
    ERROR("high surrogate then not a low one", "{\"text\":\"\\ud83d\\u0041\"}", "not a low surrogate");
    ERROR("lone low surrogate", "{\"text\":\"\\ude00\"}", "column 10: lone low surrogate \\uDE00");
    ERROR("lone surrogate in another field", "{\"text\":\"ok\",\"x\":\"\\udc00\"}", "lone low surrogate");
    ERROR("raw control character", "{\"text\":\"a\tb\"}", "control character 0x09");
    ERROR("unterminated string", "{\"text\":\"abc", "unterminated string");
    ERROR("truncated object", "{\"text\":\"abc\"", "expected ',' or '}'");
    ERROR("missing colon", "{\"text\" \"abc\"}", "expected ':'");
    ERROR("trailing comma", "{\"text\":\"abc\",}", "expected a string");
    ERROR("text after the object", "{\"text\":\"abc\"} x", "text after the closing '}'");
    ERROR("two objects on one line", "{\"text\":\"a\"}{\"text\":\"b\"}", "text after the closing '}'");
    ERROR("bad number", "{\"n\":01,\"text\":\"a\"}", "expected ',' or '}'");
    ERROR("bad number sign", "{\"n\":-,\"text\":\"a\"}", "expected a digit");
    ERROR("bad literal", "{\"ok\":tru,\"text\":\"a\"}", "invalid value");
    ERROR("single quotes", "{'text':'a'}", "expected a string");
    expect_error("NUL byte after the object", "{\"text\":\"a\"}\0", 13, "text after the closing '}'");
    expect_error("NUL byte (raw) inside a string", "{\"text\":\"a\0b\"}", 14, "control character 0x00");

    // Arrays of strings and integers (HellaSwag's "endings" and "label"), the rest of the line checked
    // as for a string field.
    expect_strings("four endings", "{\"label\": 2, \"endings\": [\"a\", \"caf\\u00e9\", \"\", \" x \\\" y\"], \"z\": [1]}",
                   4, 4, "a|caf\xC3\xA9|| x \" y");
    expect_strings("empty array", "{\"endings\":[]}", 4, 0, "");
    expect_strings_error("element not a string", "{\"endings\":[\"a\",3]}", 4, "column 17: element 2 of field \"endings\" is a number, not a string");
    expect_strings_error("too many elements", "{\"endings\":[\"a\",\"b\",\"c\"]}", 2, "column 21: field \"endings\" has more than 2 elements");
    expect_strings_error("a string, not an array", "{\"endings\":\"abc\"}", 4, "is a string, not an array of strings");
    expect_strings_error("malformed after the array", "{\"endings\":[\"a\"],}", 4, "expected a string");
    expect_integer("integer", "{\"ctx\":\"x\",\"label\":3}", 3);
    expect_integer("negative integer", "{\"label\" : -12 }", -12);
    expect_integer("zero", "{\"label\":0}", 0);
    expect_integer_error("fraction", "{\"label\":3.0}", "column 10: field \"label\" is a number with a fraction or exponent");
    expect_integer_error("exponent", "{\"label\":1e2}", "not an integer");
    expect_integer_error("too large", "{\"label\":99999999999999999999}", "column 10: field \"label\" is too large");
    expect_integer_error("a string", "{\"label\":\"3\"}", "is a string, not an integer");
    expect_integer_error("missing", "{\"labels\":3}", "column 1: no field \"label\"");

    // Nesting deeper than the limit is refused, not a stack overflow.
    size_t depth = 100000;
    char* deep = malloc(2 * depth + 32);
    at = (size_t)sprintf(deep, "{\"text\":\"a\",\"x\":");
    memset(deep + at, '[', depth);
    memset(deep + at + depth, ']', depth);
    strcpy(deep + at + 2 * depth, "}");
    ERROR("nested 100000 deep", deep, "nested deeper than 256 levels");
    free(deep);

    // utf8_encode at the boundaries of each length.
    struct { unsigned cp; const char* utf8; } cps[] = {
        {0x7F, "\x7F"}, {0x80, "\xC2\x80"}, {0x7FF, "\xDF\xBF"}, {0x800, "\xE0\xA0\x80"},
        {0xFFFF, "\xEF\xBF\xBF"}, {0x10000, "\xF0\x90\x80\x80"}, {0x10FFFF, "\xF4\x8F\xBF\xBF"},
    };
    for (size_t i = 0; i < sizeof(cps) / sizeof(cps[0]); i++) {
        char buf[4];
        int len = utf8_encode(cps[i].cp, buf);
        char name[64];
        snprintf(name, sizeof(name), "utf8_encode U+%04X", cps[i].cp);
        test_check(len == (int)strlen(cps[i].utf8) && memcmp(buf, cps[i].utf8, (size_t)len) == 0, name,
                   "%d bytes", len);
    }
    return test_summary("jsonl");
}
