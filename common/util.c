#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void fatal(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void* xmalloc(size_t bytes, const char* what) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p) fatal("out of host memory: %s needs %zu bytes", what, bytes);
    return p;
}

void* xcalloc(size_t count, size_t size, const char* what) {
    void* p = calloc(count ? count : 1, size ? size : 1);
    if (!p) fatal("out of host memory: %s needs %zu x %zu bytes", what, count, size);
    return p;
}

FILE* xfopen(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (!f) fatal("cannot open %s (mode %s): %s", path, mode, strerror(errno));
    return f;
}

void xfread(void* dst, size_t size, size_t count, FILE* f, const char* path) {
    long offset = ftell(f);
    size_t got = fread(dst, size, count, f);
    if (got != count) {
        if (ferror(f)) fatal("cannot read %s: %s", path, strerror(errno));
        fatal("%s is truncated: expected %zu bytes at offset %ld, the file ends after %zu",
              path, size * count, offset, size * got);
    }
}

void xfwrite(const void* src, size_t size, size_t count, FILE* f, const char* path) {
    if (fwrite(src, size, count, f) != count)
        fatal("cannot write %s: %s", path, strerror(errno));
}

long long file_size(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) fatal("cannot open %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal("%s is not a regular file", path);
    return (long long)st.st_size;
}

char* read_whole_file(const char* path, size_t* len) {
    *len = (size_t)file_size(path);
    char* bytes = xmalloc(*len + 1, path);
    FILE* f = xfopen(path, "rb");
    xfread(bytes, 1, *len, f, path);
    fclose(f);
    bytes[*len] = '\0';
    return bytes;
}

double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

long long parse_int_option(const char* s, const char* option, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0') fatal("option %s: '%s' is not an integer", option, s);
    if (v < lo || v > hi) fatal("option %s: %lld is outside %lld..%lld", option, v, lo, hi);
    return v;
}

int env_switch(const char* name, int default_on, const char* on, const char* off) {
    const char* value = getenv(name);
    if (!value || !value[0]) return default_on;
    if (strcmp(value, "1") == 0) return 1;
    if (strcmp(value, "0") == 0) return 0;
    fatal("%s=%s: use 1 (%s%s) or 0 (%s%s)", name, value, on, default_on ? ", the default" : "", off,
          default_on ? "" : ", the default");
}

// MemAvailable, not MemFree: the kernel gives back page cache when a process asks for memory.
void host_memory(size_t* available_bytes, size_t* total_bytes) {
    long long available = -1, total = -1, kib;
    char line[256];
    FILE* f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1) available = kib * 1024;
        if (sscanf(line, "MemTotal: %lld kB", &kib) == 1) total = kib * 1024;
    }
    if (f) fclose(f);
    if (total < 0) total = (long long)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE);
    if (available < 0) available = (long long)sysconf(_SC_AVPHYS_PAGES) * sysconf(_SC_PAGE_SIZE);
    *available_bytes = (size_t)available;
    *total_bytes = (size_t)total;
}
