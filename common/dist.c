#include "common/dist.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/util.h"

// ---- rank from the environment -----------------------------------------------------------

typedef struct {
    const char* source;
    const char* rank_var;
    const char* world_var;
    const char* local_var;
    const char* local_size_var; // ranks on this node, where the launcher says it reliably
} RankVariables;

// Slurm has no such count: SLURM_NTASKS_PER_NODE repeats the --ntasks-per-node request (unset
// without it, and not the tasks a node really got), so SLURM_LOCALID is checked against the world.
static const RankVariables families[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
};

// Digits only: no sign, no spaces, no suffix, at most INT_MAX.
static int parse_count(const char* name, const char* value) {
    char* end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (value[0] < '0' || value[0] > '9' || *end != 0 || errno != 0 || v > INT_MAX)
        fatal("%s=%s is not a non-negative integer", name, value);
    return (int)v;
}

DistEnv dist_env_detect(void) {
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        const RankVariables* f = &families[i];
        const char* rank = getenv(f->rank_var);
        const char* world = getenv(f->world_var);
        const char* local = getenv(f->local_var);
        if (!rank && !world && !local) continue;
        if (!rank || !world || !local)
            fatal("%s=%s %s=%s %s=%s: the %s rank variables are set only in part; set all three or none",
                  f->rank_var, rank ? rank : "(unset)", f->world_var, world ? world : "(unset)",
                  f->local_var, local ? local : "(unset)", f->source);
        DistEnv env = {parse_count(f->rank_var, rank), parse_count(f->world_var, world),
                       parse_count(f->local_var, local), f->source};
        if (env.world < 1) fatal("%s=%d: the number of processes must be at least 1", f->world_var, env.world);
        if (env.rank >= env.world)
            fatal("%s=%d must be less than %s=%d", f->rank_var, env.rank, f->world_var, env.world);
        // The local rank picks this node's GPU: below the node's rank count where it is known.
        const char* local_size = f->local_size_var ? getenv(f->local_size_var) : NULL;
        if (local_size) {
            int n = parse_count(f->local_size_var, local_size);
            if (n < 1) fatal("%s=%d: a node runs at least 1 rank", f->local_size_var, n);
            if (n > env.world)
                fatal("%s=%d is more than %s=%d", f->local_size_var, n, f->world_var, env.world);
            if (env.local_rank >= n)
                fatal("%s=%d must be less than %s=%d", f->local_var, env.local_rank, f->local_size_var, n);
        }
        if (env.local_rank >= env.world)
            fatal("%s=%d must be less than %s=%d", f->local_var, env.local_rank, f->world_var, env.world);
        return env;
    }
    return (DistEnv){0, 1, 0, "none (single process)"};
}

// ---- run tag -----------------------------------------------------------------------------

// The launch's id and the variable it came from, or NULL when no launcher names the run.
static const char* run_id(const char** from, char* slurm, size_t size) {
    const char* id = getenv("GPT_RUN_ID");
    const char* torch = getenv("TORCHELASTIC_RUN_ID");
    const char* job = getenv("SLURM_JOB_ID");
    const char* step = getenv("SLURM_STEP_ID");
    *from = "GPT_RUN_ID";
    if (!id && torch && strcmp(torch, "none") != 0) { // torchrun's default id is the same for every run
        id = torch;
        *from = "TORCHELASTIC_RUN_ID";
    }
    if (!id && job && step) {
        snprintf(slurm, size, "%s.%s", job, step);
        id = slurm;
        *from = "SLURM_JOB_ID.SLURM_STEP_ID";
    }
    if (!id && (id = getenv("OMPI_MCA_ess_base_jobid"))) *from = "OMPI_MCA_ess_base_jobid";
    return id;
}

// The tag of a run id: checked, and characters other than [A-Za-z0-9._-] made '_'.
static const char* tag_of(const char* id, const char* from) {
    static char tag[200];
    if (id[0] == 0 || strlen(id) >= sizeof(tag))
        fatal("%s='%s': a run id must have 1 to %zu characters", from, id, sizeof(tag) - 1);
    // The tag becomes part of a file name: keep it to characters that are safe there.
    for (size_t i = 0;; i++) {
        char c = id[i];
        int safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '_' || c == '-';
        tag[i] = c == 0 || safe ? c : '_';
        if (c == 0) break;
    }
    return tag;
}

const char* dist_run_tag(void) {
    const char* from;
    char slurm[200];
    const char* id = run_id(&from, slurm, sizeof slurm);
    if (!id) {
        if (dist_env_detect().world > 1)
            fatal("several ranks but no run id to tell this run's rank 0 id file from older ones: "
                  "export GPT_RUN_ID with a value unique to this launch and the same on every rank");
        id = "single";
    }
    return tag_of(id, from);
}

const char* dist_run_tag_if_any(void) {
    const char* from;
    char slurm[200];
    const char* id = run_id(&from, slurm, sizeof slurm);
    return id ? tag_of(id, from) : "";
}

// ---- rank 0's id through a file ---------------------------------------------------------

static void id_path(char* buf, size_t size, const char* dir, const char* run_tag) {
    int n = snprintf(buf, size, "%s/rank0_id_%s.bin", dir, run_tag);
    if (n < 0 || (size_t)n >= size) fatal("--nccl-dir %s: the path is too long", dir);
}

void dist_publish_id(const char* dir, const char* run_tag, const void* id, size_t n) {
    char path[4096];
    id_path(path, sizeof(path), dir, run_tag);
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, id, n);
    atomic_commit(&af);
}

void dist_wait_id(const char* dir, const char* run_tag, void* id, size_t n, double timeout_seconds) {
    char path[4096];
    id_path(path, sizeof(path), dir, run_tag);
    double deadline = wall_seconds() + timeout_seconds;
    struct stat st;
    // Rank 0 renames the complete file into place, so once the name exists its contents are whole.
    // Until then stat fails with ENOENT (also while rank 0 has not yet created the directory).
    while (stat(path, &st) != 0) {
        if (errno != ENOENT) fatal("cannot inspect %s: %s", path, strerror(errno));
        if (wall_seconds() > deadline)
            fatal("rank %d: no id from rank 0 in %s after %g s; is rank 0 running and is %s "
                  "shared by all ranks?", dist_env_detect().rank, path, timeout_seconds, dir);
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size != n)
        fatal("%s is not a rank 0 id file of this program: expected %zu bytes, found %lld", path, n,
              (long long)st.st_size);
    FILE* f = xfopen(path, "rb");
    xfread(id, 1, n, f, path);
    fclose(f);
}

void dist_cleanup_id(const char* dir, const char* run_tag) {
    char path[4096];
    id_path(path, sizeof(path), dir, run_tag);
    // A file that cannot be removed harms nothing (the next run has another tag): warn only.
    if (unlink(path) != 0 && errno != ENOENT)
        fprintf(stderr, "warning: cannot remove %s: %s\n", path, strerror(errno));
}
