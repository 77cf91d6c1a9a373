// Names of checkpoint files, finding the latest complete one, pruning old ones, and the run's claim
// on its output directory.
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
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
static int set_aside_kind(const char* dir, int rank, long long from_step, const char* suffix) {
    int count, renamed = 0;
    long long* steps = list_steps(dir, rank, &count);
    for (int i = 0; i < count && steps[i] >= from_step; i++, renamed++) {
        char path[4096], aside[4200];
        if (rank < 0) checkpoint_model_path(path, sizeof(path), dir, steps[i]);
        else checkpoint_state_path(path, sizeof(path), dir, steps[i], rank);
        snprintf(aside, sizeof(aside), "%s.%s", path, suffix);
        if (rename(path, aside) != 0) fatal("cannot rename %s to %s: %s", path, aside, strerror(errno));
    }
    free(steps);
    return renamed;
}

int checkpoint_set_aside_as(const char* dir, int rank, long long from_step, const char* suffix) {
    if (rank == 0) set_aside_kind(dir, -1, from_step, suffix);
    return set_aside_kind(dir, rank, from_step, suffix);
}

int checkpoint_set_aside(const char* dir, int rank, long long from_step) {
    return checkpoint_set_aside_as(dir, rank, from_step, "diverged");
}

// ---- the run's ownership of the directory ----------------------------------------------------

// Whether a file of dir belongs to a run as seen from this rank: rank 0's log.csv and model files,
// this rank's state files, and what came of them: temporary files of interrupted writes and the
// checkpoints set aside as *.diverged or *.corrupt.
static int run_file(const char* name, int rank) {
    if (rank == 0 && strcmp(name, "log.csv") == 0) return 1;
    char base[64];
    size_t len = strcspn(name, ".");
    if (len >= sizeof(base)) return 0;
    memcpy(base, name, len);
    base[len] = '\0';
    const char* rest = name + len;
    if (strcmp(rest, ".bin") != 0 && strncmp(rest, ".bin.tmp.", 9) != 0 && strcmp(rest, ".bin.diverged") != 0 &&
        strcmp(rest, ".bin.corrupt") != 0)
        return 0;
    strcat(base, ".bin");
    return checkpoint_step(base, rank) >= 0 || (rank == 0 && checkpoint_step(base, -1) >= 0);
}

// Moves this rank's run files from dir into the directory trash; returns how many.
static int move_run_files(const char* dir, int rank, const char* trash) {
    DIR* d = opendir(dir);
    if (!d) fatal("cannot list output directory %s: %s", dir, strerror(errno));
    int moved = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (!run_file(e->d_name, rank)) continue;
        char from[4096], to[4096];
        if (snprintf(from, sizeof from, "%s/%s", dir, e->d_name) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s/%s", trash, e->d_name) >= (int)sizeof to)
            fatal("output directory %s: the path is too long", dir);
        if (rename(from, to) != 0) fatal("cannot move %s to %s: %s", from, to, strerror(errno));
        moved++;
    }
    closedir(d);
    return moved;
}

static void sync_dir(const char* dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) fatal("cannot open directory %s: %s", dir, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL) fatal("cannot sync directory %s: %s", dir, strerror(errno));
    close(fd);
}

// Deletes this rank's run files from dir. The trash directory is made (and made durable) first and
// the files are renamed into it before anything is deleted, so that a kill at any moment leaves
// either the whole earlier run or the trash directory, whose presence tells the next start to finish
// the job: never a part of the earlier run that would look like a run of its own.
static void delete_run(const char* dir, int rank, const char* trash) {
    if (mkdir(trash, 0755) != 0 && errno != EEXIST) fatal("cannot create %s: %s", trash, strerror(errno));
    sync_dir(dir);
    move_run_files(dir, rank, trash);
    DIR* d = opendir(trash);
    if (!d) fatal("cannot list %s: %s", trash, strerror(errno));
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", trash, e->d_name) >= (int)sizeof path)
            fatal("%s: the path is too long", trash);
        if (unlink(path) != 0 && errno != ENOENT) fatal("cannot delete %s: %s", path, strerror(errno));
    }
    closedir(d);
    if (rmdir(trash) != 0) fatal("cannot delete %s: %s", trash, strerror(errno));
    sync_dir(dir);
}

// A line naming an earlier run's files in dir for this rank ("log.csv and checkpoints up to step N"),
// or "" when there are none.
static void describe_run(const char* dir, int rank, char* buf, size_t n) {
    int has_log = 0, others = 0;
    DIR* d = opendir(dir);
    if (!d) fatal("cannot list output directory %s: %s", dir, strerror(errno));
    struct dirent* e;
    while ((e = readdir(d)) != NULL)
        if (run_file(e->d_name, rank)) {
            if (strcmp(e->d_name, "log.csv") == 0) has_log = 1;
            else others++;
        }
    closedir(d);
    long long state = checkpoint_latest_step(dir, rank), model = rank == 0 ? checkpoint_latest_step(dir, -1) : -1;
    long long latest = state > model ? state : model;
    buf[0] = '\0';
    if (latest >= 0) snprintf(buf, n, "%scheckpoints up to step %lld", has_log ? "log.csv and " : "", latest);
    else if (has_log) snprintf(buf, n, "log.csv");
    else if (others) snprintf(buf, n, "files of interrupted or set-aside checkpoints");
}

void checkpoint_dir_claim(const char* dir, int rank, int resume, int overwrite) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/lock_%05d", dir, rank) >= (int)sizeof path)
        fatal("output directory %s: the path is too long", dir);
    // Kept open for the life of the process: the kernel drops the lock when it ends, however it ends.
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fatal("cannot create the lock file %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) fatal("cannot lock %s: %s", path, strerror(errno));
        char pid[32] = "";
        ssize_t got = pread(fd, pid, sizeof pid - 1, 0);
        pid[got > 0 ? got : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        fatal("output directory %s is in use by another run (pid %s, holding %s): wait for it to end, or choose "
              "another -o", dir, pid[0] ? pid : "unknown", path);
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
        fatal("cannot write %s: %s", path, strerror(errno));

    char trash[4096];
    if (snprintf(trash, sizeof trash, "%s/overwritten_%05d.deleting", dir, rank) >= (int)sizeof trash)
        fatal("output directory %s: the path is too long", dir);
    if (access(trash, F_OK) == 0) {
        printf("%s: finishing the deletion of an earlier run that an interrupted --overwrite began\n", dir);
        delete_run(dir, rank, trash);
    }
    char earlier[256];
    describe_run(dir, rank, earlier, sizeof earlier);
    if (resume || !earlier[0]) return;
    if (!overwrite)
        fatal("output directory %s holds an earlier run (%s): resume it with -y 1, delete it with --overwrite, "
              "or choose another -o", dir, earlier);
    printf("--overwrite: deleting the earlier run in %s (%s)\n", dir, earlier);
    delete_run(dir, rank, trash);
}
