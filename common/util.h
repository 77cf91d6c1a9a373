// Small helpers shared by every part: fatal errors with a clear message, checked allocation and
// checked file I/O. Every message names the thing (file, option) and the problem; the process then
// exits with status 1. Nothing here ever returns on failure.
#pragma once
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// Print "error: <message>\n" to stderr and exit(1).
void fatal(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

// malloc/calloc that exit with "out of host memory: <what> needs N bytes" on failure.
void* xmalloc(size_t bytes, const char* what);
void* xcalloc(size_t count, size_t size, const char* what);

// fopen that exits with "cannot open <path> (<mode>): <strerror>" on failure.
FILE* xfopen(const char* path, const char* mode);
// Read exactly count items or exit naming the path ("<path>: truncated, expected ... bytes at offset ...").
void xfread(void* dst, size_t size, size_t count, FILE* f, const char* path);
// Write exactly count items or exit naming the path and errno (disk full, ...).
void xfwrite(const void* src, size_t size, size_t count, FILE* f, const char* path);

// Size of a regular file in bytes, or exit naming the path if it cannot be inspected.
long long file_size(const char* path);
// The whole file in a new buffer, with a NUL after its *len bytes (text can be read as a string),
// or exit naming the path.
char* read_whole_file(const char* path, size_t* len);

// The integer value of a command-line option, lo..hi, or exit naming the option and the value.
long long parse_int_option(const char* s, const char* option, long long lo, long long hi);

// The 0/1 switch in environment variable `name`: default_on where it is unset or empty, else 1 or 0;
// any other value exits with "NAME=VALUE: use 1 (on) or 0 (off)", the default's side so marked.
int env_switch(const char* name, int default_on, const char* on, const char* off);

// Monotonic wall clock in seconds.
double wall_seconds(void);
// The host's memory: what allocations can still get (MemAvailable) and all of it (MemTotal).
void host_memory(size_t* available_bytes, size_t* total_bytes);

#ifdef __cplusplus
}
#endif
