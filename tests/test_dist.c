// Rank detection from the environment and the file rendezvous of the NCCL id. Every case runs in
// a forked child with its own environment; expected values come from the variables the test sets,
// and the rendezvous is checked against the random blob the test made, never against the code's
// own output. Errors, which exit the process, are checked through the child's status and stderr.
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/dist.h"
#include "../common/util.h"
#include "testutil.h"

#define ID_BYTES 128 // sizeof(ncclUniqueId)

static char tmpdir[] = "/tmp/test_dist_XXXXXX";

// ---- children with their own environment -------------------------------------------------

// Every variable the code under test reads; a child starts with none of them set.
static const char* const dist_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "GPT_RUN_ID",
    "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_MCA_ess_base_jobid", NULL};

typedef struct {
    pid_t pid;
    int out_fd, err_fd;
    char out[4096], err[4096];
    size_t out_len;
    int code; // exit status, or -1 when killed by a signal
} Child;

// Starts fn(arg) in a child whose environment has only the "NAME=VALUE" entries of env (NULL
// terminated) among dist_vars; its stdout and stderr go to pipes read by finish().
static void start(Child* c, const char* const* env, void (*fn)(const void*), const void* arg) {
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) fatal("pipe: cannot create");
    fflush(stdout);
    c->pid = fork();
    if (c->pid < 0) fatal("fork failed");
    if (c->pid == 0) {
        close(out[0]);
        close(err[0]);
        dup2(out[1], 1);
        dup2(err[1], 2);
        for (int i = 0; dist_vars[i]; i++) unsetenv(dist_vars[i]);
        for (int i = 0; env && env[i]; i++) putenv((char*)env[i]);
        fn(arg);
        fflush(stdout);
        _exit(0);
    }
    close(out[1]);
    close(err[1]);
    c->out_fd = out[0];
    c->err_fd = err[0];
}

static size_t read_all(int fd, char* buf, size_t size) {
    size_t len = 0;
    ssize_t got;
    while (len < size - 1 && (got = read(fd, buf + len, size - 1 - len)) > 0) len += (size_t)got;
    buf[len] = 0;
    close(fd);
    return len;
}

static void finish(Child* c) {
    c->out_len = read_all(c->out_fd, c->out, sizeof(c->out));
    read_all(c->err_fd, c->err, sizeof(c->err));
    int status;
    waitpid(c->pid, &status, 0);
    c->code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    char* nl = strchr(c->err, '\n'); // one-line messages in the report
    if (nl && nl[1] == 0) *nl = 0;
}

static void run(Child* c, const char* const* env, void (*fn)(const void*), const void* arg) {
    start(c, env, fn, arg);
    finish(c);
}

// Checks that the child exited with status 1 and an "error: " message containing want1 and want2.
static void check_fatal(const char* name, const Child* c, const char* want1, const char* want2) {
    int ok = c->code == 1 && strncmp(c->err, "error: ", 7) == 0 && strstr(c->err, want1) &&
             (!want2 || strstr(c->err, want2));
    test_check(ok, name, "exit status %d, message \"%s\"", c->code, c->err);
}

// ---- rank variables ----------------------------------------------------------------------

static void print_env(const void* arg) {
    (void)arg;
    DistEnv e = dist_env_detect();
    printf("%d %d %d %s", e.rank, e.world, e.local_rank, e.source);
}

static void expect_env(const char* name, const char* const* env, const char* want) {
    Child c;
    run(&c, env, print_env, NULL);
    test_check(c.code == 0 && strcmp(c.out, want) == 0, name, "got \"%s\" (exit %d, stderr \"%s\"), want \"%s\"",
               c.out, c.code, c.err, want);
}

static void expect_env_error(const char* name, const char* const* env, const char* want1, const char* want2) {
    Child c;
    run(&c, env, print_env, NULL);
    check_fatal(name, &c, want1, want2);
}

#define ENV(...) ((const char* const[]){__VA_ARGS__, NULL})

static void test_env(void) {
    expect_env("env: nothing set is rank 0 of 1", NULL, "0 1 0 none (single process)");
    expect_env("env: torchrun", ENV("RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=1"), "2 4 1 torchrun");
    expect_env("env: mpirun", ENV("OMPI_COMM_WORLD_RANK=7", "OMPI_COMM_WORLD_SIZE=8",
                                  "OMPI_COMM_WORLD_LOCAL_RANK=3"), "7 8 3 mpirun");
    expect_env("env: slurm", ENV("SLURM_PROCID=13", "SLURM_NTASKS=16", "SLURM_LOCALID=5"), "13 16 5 slurm");
    expect_env("env: torchrun before slurm",
               ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=1", "RANK=0", "WORLD_SIZE=3",
                   "LOCAL_RANK=0"), "0 3 0 torchrun");
    expect_env("env: mpirun before slurm",
               ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=1", "OMPI_COMM_WORLD_RANK=4",
                   "OMPI_COMM_WORLD_SIZE=6", "OMPI_COMM_WORLD_LOCAL_RANK=0"), "4 6 0 mpirun");
    expect_env("env: leading zeros", ENV("RANK=007", "WORLD_SIZE=010", "LOCAL_RANK=0"), "7 10 0 torchrun");

    expect_env_error("env error: not a number", ENV("RANK=abc", "WORLD_SIZE=4", "LOCAL_RANK=0"), "RANK=abc", NULL);
    expect_env_error("env error: negative", ENV("RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=-1"), "LOCAL_RANK=-1", NULL);
    expect_env_error("env error: empty", ENV("RANK=", "WORLD_SIZE=4", "LOCAL_RANK=0"), "RANK=", "integer");
    expect_env_error("env error: trailing text", ENV("RANK=1", "WORLD_SIZE=4x", "LOCAL_RANK=0"), "WORLD_SIZE=4x", NULL);
    expect_env_error("env error: leading space", ENV("RANK= 1", "WORLD_SIZE=4", "LOCAL_RANK=0"), "RANK= 1", NULL);
    expect_env_error("env error: plus sign", ENV("RANK=+1", "WORLD_SIZE=4", "LOCAL_RANK=0"), "RANK=+1", NULL);
    expect_env_error("env error: overflow", ENV("RANK=0", "WORLD_SIZE=99999999999", "LOCAL_RANK=0"),
                     "WORLD_SIZE=99999999999", NULL);
    expect_env_error("env error: world 0", ENV("RANK=0", "WORLD_SIZE=0", "LOCAL_RANK=0"), "WORLD_SIZE=0", NULL);
    expect_env_error("env error: rank = world", ENV("RANK=4", "WORLD_SIZE=4", "LOCAL_RANK=0"), "RANK=4", "WORLD_SIZE=4");
    expect_env_error("env error: local rank = world", ENV("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=2"),
                     "LOCAL_RANK=2", "WORLD_SIZE=2");
    expect_env_error("env error: torchrun in part", ENV("RANK=1", "LOCAL_RANK=1"), "WORLD_SIZE=(unset)", "RANK=1");
    // The first family with anything set decides, even when a later one is complete.
    expect_env_error("env error: torchrun in part before slurm",
                     ENV("LOCAL_RANK=0", "SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0"),
                     "RANK=(unset)", "torchrun");
    expect_env_error("env error: mpirun in part", ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2"),
                     "OMPI_COMM_WORLD_LOCAL_RANK=(unset)", NULL);
    expect_env_error("env error: slurm bad value", ENV("SLURM_PROCID=0", "SLURM_NTASKS=two", "SLURM_LOCALID=0"),
                     "SLURM_NTASKS=two", NULL);
    expect_env_error("env error: slurm rank too large", ENV("SLURM_PROCID=2", "SLURM_NTASKS=2", "SLURM_LOCALID=0"),
                     "SLURM_PROCID=2", "SLURM_NTASKS=2");
}

// ---- run tag -----------------------------------------------------------------------------

static void print_tag(const void* arg) {
    (void)arg;
    printf("%s", dist_run_tag());
}

static void expect_tag(const char* name, const char* const* env, const char* want) {
    Child c;
    run(&c, env, print_tag, NULL);
    test_check(c.code == 0 && strcmp(c.out, want) == 0, name, "got \"%s\" (exit %d, stderr \"%s\"), want \"%s\"",
               c.out, c.code, c.err, want);
}

static void test_run_tag(void) {
    expect_tag("tag: single process", NULL, "single");
    expect_tag("tag: GPT_RUN_ID first", ENV("GPT_RUN_ID=launch-42", "TORCHELASTIC_RUN_ID=t1", "SLURM_JOB_ID=9",
                                            "SLURM_STEP_ID=0", "OMPI_MCA_ess_base_jobid=77"), "launch-42");
    expect_tag("tag: torchrun", ENV("TORCHELASTIC_RUN_ID=t1", "SLURM_JOB_ID=9", "SLURM_STEP_ID=0"), "t1");
    expect_tag("tag: torchrun default 'none' skipped", ENV("TORCHELASTIC_RUN_ID=none", "SLURM_JOB_ID=9",
                                                           "SLURM_STEP_ID=3"), "9.3");
    expect_tag("tag: slurm job and step", ENV("SLURM_JOB_ID=123", "SLURM_STEP_ID=4",
                                              "OMPI_MCA_ess_base_jobid=77"), "123.4");
    expect_tag("tag: mpirun", ENV("SLURM_JOB_ID=123", "OMPI_MCA_ess_base_jobid=3657105409"), "3657105409");
    expect_tag("tag: unsafe characters replaced", ENV("GPT_RUN_ID=../a b/c"), ".._a_b_c");
    Child c;
    run(&c, ENV("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1"), print_tag, NULL);
    check_fatal("tag error: several ranks without a run id", &c, "GPT_RUN_ID", NULL);
    run(&c, ENV("GPT_RUN_ID="), print_tag, NULL);
    check_fatal("tag error: empty GPT_RUN_ID", &c, "GPT_RUN_ID", NULL);
}

// ---- rendezvous --------------------------------------------------------------------------

typedef struct {
    const char* dir;
    const char* tag;
    const unsigned char* id;
    double timeout;
} Rendezvous;

// Rank 0 as train_gpt runs it: creates the shared directory late, then publishes.
static void publisher(const void* arg) {
    const Rendezvous* r = arg;
    usleep(300 * 1000);
    if (mkdir(r->dir, 0755) != 0) fatal("cannot create %s", r->dir);
    dist_publish_id(r->dir, r->tag, r->id, ID_BYTES);
}

static void publish_now(const void* arg) {
    const Rendezvous* r = arg;
    dist_publish_id(r->dir, r->tag, r->id, ID_BYTES);
}

static void waiter(const void* arg) {
    const Rendezvous* r = arg;
    unsigned char id[ID_BYTES];
    dist_wait_id(r->dir, r->tag, id, ID_BYTES, r->timeout);
    fwrite(id, 1, ID_BYTES, stdout);
}

static int count_entries(const char* dir) {
    DIR* d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent* e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

static void write_file(const char* path, const unsigned char* bytes, size_t n) {
    FILE* f = xfopen(path, "wb");
    xfwrite(bytes, 1, n, f, path);
    fclose(f);
}

static void test_rendezvous(void) {
    TestRng rng = test_rng(6);
    unsigned char id[ID_BYTES], stale[ID_BYTES];
    for (int i = 0; i < ID_BYTES; i++) {
        id[i] = (unsigned char)(test_uniform(&rng) * 256);
        stale[i] = (unsigned char)(test_uniform(&rng) * 256);
    }
    char dir[512], path[1024];
    snprintf(dir, sizeof(dir), "%s/shared", tmpdir);

    // Three waiters start before rank 0 has even created the directory.
    Rendezvous r = {dir, "run-A", id, 10.0};
    const char* const* rank_env[4] = {
        ENV("RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=0"), ENV("RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1"),
        ENV("RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=2"), ENV("RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=3")};
    Child ranks[4];
    for (int i = 1; i < 4; i++) start(&ranks[i], rank_env[i], waiter, &r);
    start(&ranks[0], rank_env[0], publisher, &r);
    for (int i = 0; i < 4; i++) finish(&ranks[i]);
    test_check(ranks[0].code == 0, "rendezvous: rank 0 publishes", "exit %d, stderr \"%s\"", ranks[0].code, ranks[0].err);
    for (int i = 1; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof(name), "rendezvous: rank %d receives the id", i);
        int same = ranks[i].out_len == ID_BYTES && memcmp(ranks[i].out, id, ID_BYTES) == 0;
        test_check(ranks[i].code == 0 && same, name, "exit %d, %zu bytes, %s, stderr \"%s\"", ranks[i].code,
                   ranks[i].out_len, same ? "equal" : "different", ranks[i].err);
    }
    snprintf(path, sizeof(path), "%s/nccl_id_run-A.bin", dir);
    struct stat st;
    test_check(stat(path, &st) == 0 && st.st_size == ID_BYTES && count_entries(dir) == 1,
               "rendezvous: one id file, no temporary left", "%d entries in %s", count_entries(dir), dir);
    dist_cleanup_id(dir, "run-A");
    test_check(count_entries(dir) == 0, "rendezvous: cleanup removes the file", "%d entries left", count_entries(dir));

    // An id left by an earlier run (another tag) is never taken for this run's id.
    dist_publish_id(dir, "run-old", stale, ID_BYTES);
    Rendezvous fresh = {dir, "run-B", id, 10.0};
    start(&ranks[1], rank_env[1], waiter, &fresh);
    usleep(200 * 1000);
    dist_publish_id(dir, "run-B", id, ID_BYTES);
    finish(&ranks[1]);
    int same = ranks[1].out_len == ID_BYTES && memcmp(ranks[1].out, id, ID_BYTES) == 0;
    test_check(ranks[1].code == 0 && same, "rendezvous: stale file of another run ignored",
               "exit %d, %s", ranks[1].code, same ? "this run's id" : "wrong id");
    dist_cleanup_id(dir, "run-B");

    // No publisher: a clean message naming the rank, the file and the directory after ~1 s.
    Rendezvous lonely = {dir, "run-C", id, 1.0};
    double t0 = wall_seconds();
    Child c;
    run(&c, rank_env[2], waiter, &lonely);
    double elapsed = wall_seconds() - t0;
    char want[1200];
    snprintf(want, sizeof(want), "rank 2: no NCCL id from rank 0 in %s/nccl_id_run-C.bin after 1 s", dir);
    check_fatal("rendezvous: missing rank 0 times out", &c, want, "is rank 0 running and is");
    test_check(elapsed > 0.95 && elapsed < 3.0, "rendezvous: timeout after about 1 s", "%.2f s", elapsed);
    test_check(c.out_len == 0, "rendezvous: nothing received on timeout", "%zu bytes", c.out_len);

    // A file of the wrong size under this run's name is reported, not read.
    snprintf(path, sizeof(path), "%s/nccl_id_run-D.bin", dir);
    write_file(path, stale, 10);
    Rendezvous wrong = {dir, "run-D", id, 1.0};
    run(&c, rank_env[1], waiter, &wrong);
    check_fatal("rendezvous: wrong size reported", &c, path, "expected 128 bytes, found 10");
    unlink(path);
    dist_cleanup_id(dir, "run-old");

    // Rank 0 cannot write into the directory: a message naming it.
    Rendezvous nowhere = {"/nonexistent_dir_for_test_dist", "run-E", id, 1.0};
    run(&c, rank_env[0], publish_now, &nowhere);
    check_fatal("rendezvous: unwritable directory reported", &c, "/nonexistent_dir_for_test_dist", NULL);
}

int main(void) {
    if (!mkdtemp(tmpdir)) fatal("cannot create a temporary directory %s", tmpdir);
    test_env();
    test_run_tag();
    test_rendezvous();
    char shared[600];
    snprintf(shared, sizeof(shared), "%s/shared", tmpdir);
    rmdir(shared);
    rmdir(tmpdir);
    return test_summary("dist");
}
