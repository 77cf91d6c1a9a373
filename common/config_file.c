#include "common/config_file.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

// Where each argument read from a file came from, for config_origin.
typedef struct {
    const char* arg;
    char* where;
} Origin;
static Origin* origins;
static int n_origins;
// Every expanded argv lives as long as the program: the parsed options point into it (a program may
// expand more than one, as train_gpt does to resume with the options recorded in a file).
static char*** expanded_argvs;
static int n_expanded;

const char* config_origin(const char* arg) {
    for (int i = 0; i < n_origins; i++)
        if (origins[i].arg == arg) return origins[i].where;
    return NULL;
}

// The long option that "--name" (len characters) selects as getopt_long would: an exact name, else
// the only one it abbreviates; NULL when none or several.
static const struct option* find_long(const struct option* longs, const char* name, size_t len) {
    const struct option* found = NULL;
    int matches = 0;
    for (const struct option* o = longs; o->name; o++) {
        if (strncmp(o->name, name, len) != 0) continue;
        if (strlen(o->name) == len) return o;
        found = o;
        matches++;
    }
    return matches == 1 ? found : NULL;
}

typedef struct {
    char** v;
    int n, cap;
} Args;

static void push(Args* a, char* s) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        char** grown = realloc(a->v, (size_t)a->cap * sizeof(char*));
        if (!grown) fatal("out of host memory: options need %d pointers", a->cap);
        a->v = grown;
    }
    a->v[a->n++] = s;
}

static char* copy(const char* s, size_t len) {
    char* c = xmalloc(len + 1, "config file");
    memcpy(c, s, len);
    c[len] = '\0';
    return c;
}

static void remember(const char* arg, const char* path, int line) {
    Origin* grown = realloc(origins, (size_t)(n_origins + 1) * sizeof(Origin));
    if (!grown) fatal("out of host memory: config file %s", path);
    origins = grown;
    char where[4200];
    snprintf(where, sizeof where, "%s line %d", path, line);
    origins[n_origins++] = (Origin){arg, copy(where, strlen(where))};
}

// The whole file (also a pipe) as a stream over *text in memory, after refusing a NUL byte: fgets
// below would end a line at a NUL unseen, so "lr 5e-4\0lr 1e-1" would read as lr 5e-4.
static FILE* read_text(const char* path, char** text_out) {
    FILE* f = fopen(path, "r");
    if (!f) fatal("cannot read config file %s: %s", path, strerror(errno));
    char* text = NULL;
    size_t len = 0;
    FILE* all = open_memstream(&text, &len);
    if (!all) fatal("out of host memory: config file %s", path);
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, got, all);
    if (ferror(f) || fclose(all) != 0) fatal("cannot read config file %s", path);
    fclose(f);
    const char* nul = memchr(text, '\0', len);
    if (nul) {
        int line = 1;
        for (const char* p = text; p < nul; p++) line += *p == '\n';
        free(text);
        fatal("%s line %d: a NUL byte (a config file is text)", path, line);
    }
    FILE* m = len ? fmemopen(text, len, "r") : fopen("/dev/null", "r");
    if (!m) fatal("cannot read config file %s: %s", path, strerror(errno));
    *text_out = text;
    return m;
}

// Appends "--name" "value" for each option line of the file.
static void read_file(Args* out, const char* path, const struct option* longs) {
    char* text;
    FILE* f = read_text(path, &text);
    char line[4096];
    for (int number = 1; fgets(line, sizeof line, f); number++) {
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n' && !feof(f))
            fatal("%s line %d: longer than %zu characters", path, number, sizeof line - 2);
        for (char* p = line; *p; p++) // a comment starts at a # at the start or after a space
            if (*p == '#' && (p == line || isspace((unsigned char)p[-1]))) {
                *p = '\0';
                break;
            }
        char* name = line;
        while (isspace((unsigned char)*name)) name++;
        if (!*name) continue;
        char* end = name;
        while (*end && !isspace((unsigned char)*end)) end++;
        char* value = end;
        while (isspace((unsigned char)*value)) value++;
        char* value_end = value + strlen(value);
        while (value_end > value && isspace((unsigned char)value_end[-1])) value_end--;
        size_t name_len = (size_t)(end - name);
        const struct option* o = NULL;
        for (const struct option* c = longs; c->name; c++) // exact names only: a recipe spells them out
            if (strlen(c->name) == name_len && strncmp(c->name, name, name_len) == 0) o = c;
        if (!o || o->has_arg != required_argument)
            fatal("%s line %d: unknown option '%.*s' (long option names without their dashes, see --help)",
                  path, number, (int)name_len, name);
        if (strcmp(o->name, "config") == 0) fatal("%s line %d: a config file cannot read another", path, number);
        if (value == value_end) fatal("%s line %d: option '%s' has no value", path, number, o->name);
        char flag[128];
        snprintf(flag, sizeof flag, "--%s", o->name);
        push(out, copy(flag, strlen(flag)));
        push(out, copy(value, (size_t)(value_end - value)));
        remember(out->v[out->n - 2], path, number);
        remember(out->v[out->n - 1], path, number);
    }
    if (ferror(f)) fatal("cannot read config file %s", path);
    fclose(f);
    free(text);
}

char** config_expand_argv(int* argc, char** argv, const struct option* longs, const char* shorts) {
    Args out = {0};
    push(&out, argv[0]);
    for (int i = 1; i < *argc; i++) {
        char* a = argv[i];
        const char* file = NULL;
        int takes_value = 0;
        if (strcmp(a, "--") == 0) { // the rest are not options
            for (; i < *argc; i++) push(&out, argv[i]);
            break;
        } else if (a[0] == '-' && a[1] == '-') {
            const char* eq = strchr(a, '=');
            const struct option* o = find_long(longs, a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
            if (o && strcmp(o->name, "config") == 0) {
                if (!eq && i + 1 >= *argc) fatal("option --config needs a file (see --help)");
                file = eq ? eq + 1 : argv[++i];
            } else {
                takes_value = o && o->has_arg == required_argument && !eq;
            }
        } else if (a[0] == '-' && a[1] == 'f') {
            if (!a[2] && i + 1 >= *argc) fatal("option -f needs a file (see --help)");
            file = a[2] ? a + 2 : argv[++i];
        } else if (a[0] == '-' && a[1]) {
            const char* s = strchr(shorts, a[1]);
            takes_value = s && s[1] == ':' && !a[2];
        }
        if (file) {
            read_file(&out, file, longs);
            continue;
        }
        push(&out, a);
        if (takes_value && i + 1 < *argc) push(&out, argv[++i]);
    }
    push(&out, NULL);
    *argc = out.n - 1;
    char*** grown = realloc(expanded_argvs, (size_t)(n_expanded + 1) * sizeof(char**));
    if (!grown) fatal("out of host memory: options");
    expanded_argvs = grown;
    expanded_argvs[n_expanded++] = out.v;
    return out.v;
}
