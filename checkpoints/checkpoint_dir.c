// Names of checkpoint files, finding the latest complete one, and pruning old ones.
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "checkpoints/checkpoint.h"

#define MODEL_NAME "model_%08lld.bin"
#define STATE_NAME "state_%08lld_%05d.bin"

void checkpoint_model_path(char* buf, size_t n, const char* dir, long long step) {
    int len = snprintf(buf, n, "%s/" MODEL_NAME, dir, step);
    if (len < 0 || (size_t)len >= n) fatal("checkpoint directory %s: the path is too long", dir);
}

void checkpoint_state_path(char* buf, size_t n, const char* dir, long long step, int rank) {
    int len = snprintf(buf, n, "%s/" STATE_NAME, dir, step, rank);
    if (len < 0 || (size_t)len >= n) fatal("checkpoint directory %s: the path is too long", dir);
}

// Reads the decimal number at *s (at most 18 digits, so it cannot overflow) and advances *s.
static int parse_number(const char** s, long long* value) {
    const char* p = *s;
    long long v = 0;
    while (isdigit((unsigned char)*p) && p - *s < 18) v = v * 10 + (*p++ - '0');
    if (p == *s) return 0;
    *s = p;
    *value = v;
    return 1;
}

// Returns the step of a model file (rank < 0) or of a state file of this rank, or -1 for any other
// name, in particular the temporary "<name>.tmp.<pid>" files of interrupted writes. Only the exact
// names written by checkpoint_*_path count, so that pruning deletes exactly the files it found.
static long long checkpoint_step(const char* name, int rank) {
    const char* prefix = rank < 0 ? "model_" : "state_";
    const char* p = name;
    long long step, file_rank = 0;
    if (strncmp(p, prefix, strlen(prefix)) != 0) return -1;
    p += strlen(prefix);
    if (!parse_number(&p, &step)) return -1;
    if (rank >= 0 && (*p++ != '_' || !parse_number(&p, &file_rank) || file_rank != rank)) return -1;
    char canonical[64];
    if (rank < 0) snprintf(canonical, sizeof(canonical), MODEL_NAME, step);
    else snprintf(canonical, sizeof(canonical), STATE_NAME, step, rank);
    return strcmp(name, canonical) == 0 ? step : -1;
}

// The steps of this kind of file in dir (rank < 0: model files), sorted newest first; a missing
// directory has none.
static long long* list_steps(const char* dir, int rank, int* count) {
    *count = 0;
    DIR* d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return NULL;
        fatal("cannot list checkpoint directory %s: %s", dir, strerror(errno));
    }
    long long* steps = NULL;
    int capacity = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        long long step = checkpoint_step(e->d_name, rank);
        if (step < 0) continue;
        if (*count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            steps = realloc(steps, (size_t)capacity * sizeof(long long));
            if (!steps) fatal("out of host memory listing checkpoint directory %s", dir);
        }
        steps[(*count)++] = step;
    }
    closedir(d);
    for (int i = 1; i < *count; i++) // insertion sort, newest first: directories are small
        for (int j = i; j > 0 && steps[j - 1] < steps[j]; j--) {
            long long t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return steps;
}

long long checkpoint_latest_step(const char* dir, int rank) {
    int count;
    long long* steps = list_steps(dir, rank, &count);
    long long latest = count > 0 ? steps[0] : -1;
    free(steps);
    return latest;
}

// Deletes the temporary files that killed writers of this kind of file left behind. Only this rank
// writes its state files (and only rank 0 model files), so none of them is being written now.
static void remove_stale_temporaries(const char* dir, int rank) {
    DIR* d = opendir(dir);
    if (!d) return;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        const char* tmp = strstr(e->d_name, ".tmp.");
        if (!tmp || (size_t)(tmp - e->d_name) >= 64) continue;
        char final_name[64];
        memcpy(final_name, e->d_name, (size_t)(tmp - e->d_name));
        final_name[tmp - e->d_name] = '\0';
        if (checkpoint_step(final_name, rank) < 0) continue;
        char path[4096];
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path)) continue;
        if (unlink(path) != 0 && errno != ENOENT)
            fatal("cannot delete temporary file %s: %s", path, strerror(errno));
    }
    closedir(d);
}

// Deletes all but the `keep` newest files of one kind (rank < 0: model files) and the newest one of
// a step before confirmed_before, and the temporary files of interrupted writes.
static void prune_kind(const char* dir, int rank, int keep, long long confirmed_before) {
    remove_stale_temporaries(dir, rank);
    int count;
    long long* steps = list_steps(dir, rank, &count);
    int confirmed = 0; // index of the newest confirmed step (steps are sorted newest first)
    while (confirmed < count && steps[confirmed] >= confirmed_before) confirmed++;
    for (int i = keep; i < count; i++) {
        if (i == confirmed) continue;
        char path[4096];
        if (rank < 0) checkpoint_model_path(path, sizeof(path), dir, steps[i]);
        else checkpoint_state_path(path, sizeof(path), dir, steps[i], rank);
        if (unlink(path) != 0 && errno != ENOENT)
            fatal("cannot delete old checkpoint %s: %s", path, strerror(errno));
    }
    free(steps);
}

void checkpoint_prune(const char* dir, int rank, int keep, long long confirmed_before) {
    prune_kind(dir, rank, keep <= 0 ? INT_MAX : keep, confirmed_before);
    if (rank == 0) prune_kind(dir, -1, keep <= 0 ? INT_MAX : keep, confirmed_before);
}

// Renames the files of one kind (rank < 0: model files) of steps >= from_step; returns how many.
static int set_aside_kind(const char* dir, int rank, long long from_step) {
    int count, renamed = 0;
    long long* steps = list_steps(dir, rank, &count);
    for (int i = 0; i < count && steps[i] >= from_step; i++, renamed++) {
        char path[4096], aside[4200];
        if (rank < 0) checkpoint_model_path(path, sizeof(path), dir, steps[i]);
        else checkpoint_state_path(path, sizeof(path), dir, steps[i], rank);
        snprintf(aside, sizeof(aside), "%s.diverged", path);
        if (rename(path, aside) != 0) fatal("cannot rename %s to %s: %s", path, aside, strerror(errno));
    }
    free(steps);
    return renamed;
}

int checkpoint_set_aside(const char* dir, int rank, long long from_step) {
    if (rank == 0) set_aside_kind(dir, -1, from_step);
    return set_aside_kind(dir, rank, from_step);
}
