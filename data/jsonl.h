// One line of a JSONL file: a strict JSON decoder that takes the value of one top-level field of an
// object (a document's text; HellaSwag's context, endings and label) and checks the whole line,
// skipping the other fields whatever their values (strings, numbers, objects, arrays, true, false,
// null).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Decodes the string value of the top-level field `field` of the JSON object in line[0..len) into
// out, which needs room for len bytes (decoding never makes a string longer), as UTF-8: escapes are
// decoded, \u surrogate pairs combined, other bytes copied as they are. White space (including a
// CR of a CRLF line end) may surround the object. Returns 0 with *out_len set, or -1 with a message
// "column N: problem" in err (for a malformed line, a missing or non-string field, a field given
// twice, an invalid escape, a lone surrogate). Never exits: the fuzz harness calls it.
int jsonl_string_field(const char* line, size_t len, const char* field, char* out, size_t* out_len,
                       char* err, size_t errlen);

// The same for a field whose value is an array of at most max_count strings: decoded back to back
// into out (room for len bytes), string i of lens[i] bytes, *count of them. An element that is not a
// string, or more than max_count elements, is refused.
int jsonl_string_array_field(const char* line, size_t len, const char* field, char* out, size_t* lens,
                             int max_count, int* count, char* err, size_t errlen);

// The same for a field whose value is an integer (a number without fraction or exponent that fits
// a long long). scratch: room for strlen(field) bytes (field names are decoded into it).
int jsonl_integer_field(const char* line, size_t len, const char* field, char* scratch, long long* value,
                        char* err, size_t errlen);

// Writes the UTF-8 encoding of the code point cp (at most U+10FFFF) to out; returns its length.
int utf8_encode(uint32_t cp, char out[4]);

#ifdef __cplusplus
}
#endif
