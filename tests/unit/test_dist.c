// Rank detection from the environment, the 0/1 switches read from it (env_switch), the choice of
// rendezvous, and the hand-over of rank 0's id through a file and over TCP on 127.0.0.1. Every case
// runs in forked children with their own environment (for TCP: several children, one per rank,
// meeting on a free port); expected values come from the variables the test sets, and the id is
// checked against the random blob the test made, never against the code's own output. Errors,
// which exit the process, are checked through the child's status and stderr.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dist.h"
#include "common/rendezvous.h"
#include "common/tcp.h"
#include "common/util.h"
#include "tests/lib/testutil.h"

#define ID_BYTES 128 // sizeof(ncclUniqueId)

static char tmpdir[] = "/tmp/test_dist_XXXXXX";

// ---- children with their own environment -------------------------------------------------

// Every variable the code under test reads; a child starts with none of them set.
static const char* const dist_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "GPT_RUN_ID",
    "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_MCA_ess_base_jobid", "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", NULL};

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

// Checks that the child exited with status 0 having printed exactly want.
static void check_printed(const char* name, const Child* c, const char* want) {
    test_check(c->code == 0 && strcmp(c->out, want) == 0, name, "got \"%s\" (exit %d, stderr \"%s\"), want \"%s\"",
               c->out, c->code, c->err, want);
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
    check_printed(name, &c, want);
}

static void expect_env_error(const char* name, const char* const* env, const char* want1, const char* want2) {
    Child c;
    run(&c, env, print_env, NULL);
    check_fatal(name, &c, want1, want2);
}

#define ENV(...) ((const char* const[]){__VA_ARGS__, NULL})

// ---- 0/1 switches in the environment (env_switch: GRAD_SUMS_BESIDE_BACKWARD, ...) ------------

static void print_switch(const void* arg) {
    (void)arg;
    const int default_off = env_switch("GPT_TEST_SWITCH", 0, "on", "off"); // first: a bad value's message
    printf("%d %d", default_off, env_switch("GPT_TEST_SWITCH", 1, "on", "off"));
}

static void test_env_switch(void) {
    Child c;
    const struct { const char* name; const char* const* env; const char* want; } cases[] = {
        {"env_switch: unset is the default", NULL, "0 1"},
        {"env_switch: empty is the default", ENV("GPT_TEST_SWITCH="), "0 1"},
        {"env_switch: 1 is on", ENV("GPT_TEST_SWITCH=1"), "1 1"},
        {"env_switch: 0 is off", ENV("GPT_TEST_SWITCH=0"), "0 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run(&c, cases[i].env, print_switch, NULL);
        check_printed(cases[i].name, &c, cases[i].want);
    }
    const char* const* bad[] = {ENV("GPT_TEST_SWITCH=yes"), ENV("GPT_TEST_SWITCH=01"), ENV("GPT_TEST_SWITCH= 1")};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        run(&c, bad[i], print_switch, NULL);
        check_fatal("env_switch: another value is refused, naming both meanings", &c, bad[i][0],
                    ": use 1 (on) or 0 (off, the default)");
    }
}

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

    // Several nodes: the local rank (the GPU) against the node's count of ranks where it is given.
    expect_env("env: torchrun, second node of two", ENV("RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1",
                                                       "LOCAL_WORLD_SIZE=4"), "5 8 1 torchrun");
    expect_env("env: mpirun, second node of two", ENV("OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
                                                     "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=2"),
               "3 4 1 mpirun");
    // Slurm's SLURM_NTASKS_PER_NODE repeats a request, not what the node runs: never a reason to refuse.
    expect_env("env: slurm ignores SLURM_NTASKS_PER_NODE", ENV("SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=3",
                                                              "SLURM_NTASKS_PER_NODE=1"), "3 4 3 slurm");
    expect_env_error("env error: local rank = LOCAL_WORLD_SIZE",
                     ENV("RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4"), "LOCAL_RANK=4",
                     "LOCAL_WORLD_SIZE=4");
    expect_env_error("env error: LOCAL_WORLD_SIZE not a number",
                     ENV("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=two"), "LOCAL_WORLD_SIZE=two",
                     "integer");
    expect_env_error("env error: LOCAL_WORLD_SIZE negative",
                     ENV("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=-2"), "LOCAL_WORLD_SIZE=-2", NULL);
    expect_env_error("env error: LOCAL_WORLD_SIZE 0",
                     ENV("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=0"), "LOCAL_WORLD_SIZE=0", NULL);
    expect_env_error("env error: LOCAL_WORLD_SIZE above the world",
                     ENV("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=3"), "LOCAL_WORLD_SIZE=3",
                     "WORLD_SIZE=2");
    expect_env_error("env error: local rank = OMPI_COMM_WORLD_LOCAL_SIZE",
                     ENV("OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=2",
                         "OMPI_COMM_WORLD_LOCAL_SIZE=2"),
                     "OMPI_COMM_WORLD_LOCAL_RANK=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2");
    expect_env_error("env error: OMPI_COMM_WORLD_LOCAL_SIZE bad value",
                     ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=0",
                         "OMPI_COMM_WORLD_LOCAL_SIZE=2.5"), "OMPI_COMM_WORLD_LOCAL_SIZE=2.5", NULL);
    expect_env_error("env error: slurm local id = world", ENV("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=2"),
                     "SLURM_LOCALID=2", "SLURM_NTASKS=2");
}

// ---- run tag -----------------------------------------------------------------------------

static void print_tag(const void* arg) {
    (void)arg;
    printf("%s", dist_run_tag());
}

static void expect_tag(const char* name, const char* const* env, const char* want) {
    Child c;
    run(&c, env, print_tag, NULL);
    check_printed(name, &c, want);
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

// ---- file rendezvous ---------------------------------------------------------------------

typedef struct {
    const char* dir;
    const char* tag;
    const unsigned char* id;
    double timeout;
} FileCase;

// Rank 0 as train_gpt runs it: creates the shared directory late, then publishes.
static void publisher(const void* arg) {
    const FileCase* r = arg;
    usleep(300 * 1000);
    if (mkdir(r->dir, 0755) != 0) fatal("cannot create %s", r->dir);
    dist_publish_id(r->dir, r->tag, r->id, ID_BYTES);
}

static void publish_now(const void* arg) {
    const FileCase* r = arg;
    dist_publish_id(r->dir, r->tag, r->id, ID_BYTES);
}

static void waiter(const void* arg) {
    const FileCase* r = arg;
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
    FileCase r = {dir, "run-A", id, 10.0};
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
    snprintf(path, sizeof(path), "%s/rank0_id_run-A.bin", dir);
    struct stat st;
    test_check(stat(path, &st) == 0 && st.st_size == ID_BYTES && count_entries(dir) == 1,
               "rendezvous: one id file, no temporary left", "%d entries in %s", count_entries(dir), dir);
    dist_cleanup_id(dir, "run-A");
    test_check(count_entries(dir) == 0, "rendezvous: cleanup removes the file", "%d entries left", count_entries(dir));

    // An id left by an earlier run (another tag) is never taken for this run's id.
    dist_publish_id(dir, "run-old", stale, ID_BYTES);
    FileCase fresh = {dir, "run-B", id, 10.0};
    start(&ranks[1], rank_env[1], waiter, &fresh);
    usleep(200 * 1000);
    dist_publish_id(dir, "run-B", id, ID_BYTES);
    finish(&ranks[1]);
    int same = ranks[1].out_len == ID_BYTES && memcmp(ranks[1].out, id, ID_BYTES) == 0;
    test_check(ranks[1].code == 0 && same, "rendezvous: stale file of another run ignored",
               "exit %d, %s", ranks[1].code, same ? "this run's id" : "wrong id");
    dist_cleanup_id(dir, "run-B");

    // No publisher: a clean message naming the rank, the file and the directory after ~1 s.
    FileCase lonely = {dir, "run-C", id, 1.0};
    double t0 = wall_seconds();
    Child c;
    run(&c, rank_env[2], waiter, &lonely);
    double elapsed = wall_seconds() - t0;
    char want[1200];
    snprintf(want, sizeof(want), "rank 2: no id from rank 0 in %s/rank0_id_run-C.bin after 1 s", dir);
    check_fatal("rendezvous: missing rank 0 times out", &c, want, "is rank 0 running and is");
    test_check(elapsed > 0.95 && elapsed < 3.0, "rendezvous: timeout after about 1 s", "%.2f s", elapsed);
    test_check(c.out_len == 0, "rendezvous: nothing received on timeout", "%zu bytes", c.out_len);

    // A file of the wrong size under this run's name is reported, not read.
    snprintf(path, sizeof(path), "%s/rank0_id_run-D.bin", dir);
    write_file(path, stale, 10);
    FileCase wrong = {dir, "run-D", id, 1.0};
    run(&c, rank_env[1], waiter, &wrong);
    check_fatal("rendezvous: wrong size reported", &c, path, "expected 128 bytes, found 10");
    unlink(path);
    dist_cleanup_id(dir, "run-old");

    // Rank 0 cannot write into the directory: a message naming it.
    FileCase nowhere = {"/nonexistent_dir_for_test_dist", "run-E", id, 1.0};
    run(&c, rank_env[0], publish_now, &nowhere);
    check_fatal("rendezvous: unwritable directory reported", &c, "/nonexistent_dir_for_test_dist", NULL);
}

// ---- choice of rendezvous ----------------------------------------------------------------

static void print_choice(const void* nccl_dir) {
    Rendezvous r = rendezvous_choose(nccl_dir, "out");
    char how[600];
    printf("%s [%s]", rendezvous_describe(&r, how, sizeof how), r.tag);
}

static void expect_choice(const char* name, const char* const* env, const char* nccl_dir, const char* want) {
    Child c;
    run(&c, env, print_choice, nccl_dir);
    check_printed(name, &c, want);
}

static void expect_choice_error(const char* name, const char* const* env, const char* want1, const char* want2) {
    Child c;
    run(&c, env, print_choice, NULL);
    check_fatal(name, &c, want1, want2);
}

#define RANK1 "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0"

static void test_choice(void) {
    expect_choice("choice: no MASTER_ADDR: a file in -o", ENV(RANK1, "GPT_RUN_ID=r1"), NULL, "file out [r1]");
    // Over TCP no run id is needed (torchrun's default id is "none"); one the launcher gives is used.
    expect_choice("choice: MASTER_ADDR and MASTER_PORT: TCP", ENV(RANK1, "MASTER_ADDR=10.1.2.3", "MASTER_PORT=29500"),
                  NULL, "TCP 10.1.2.3:29500 []");
    expect_choice("choice: a host name, Slurm's run id", ENV(RANK1, "MASTER_ADDR=node-17.cluster", "MASTER_PORT=1",
                                                              "SLURM_JOB_ID=77", "SLURM_STEP_ID=0"),
                  NULL, "TCP node-17.cluster:1 [77.0]");
    expect_choice("choice: --nccl-dir wins over MASTER_ADDR", ENV(RANK1, "MASTER_ADDR=10.1.2.3", "MASTER_PORT=29500",
                                                                   "GPT_RUN_ID=r1"), "shared", "file shared [r1]");
    expect_choice("choice: torchrun's store holds MASTER_PORT: MASTER_PORT + 1",
                  ENV(RANK1, "MASTER_ADDR=h", "MASTER_PORT=65534", "TORCHELASTIC_USE_AGENT_STORE=True",
                      "TORCHELASTIC_RUN_ID=none"),
                  NULL, "TCP h:65535 (MASTER_PORT + 1: torchrun's own store holds MASTER_PORT) []");
    expect_choice("choice: torchrun without its store on MASTER_PORT",
                  ENV(RANK1, "MASTER_ADDR=h", "MASTER_PORT=29500", "TORCHELASTIC_USE_AGENT_STORE=False"), NULL,
                  "TCP h:29500 []");

    expect_choice_error("choice error: MASTER_ADDR without MASTER_PORT", ENV(RANK1, "MASTER_ADDR=10.1.2.3"),
                        "MASTER_ADDR=10.1.2.3 is set but MASTER_PORT is not", NULL);
    expect_choice_error("choice error: MASTER_PORT without MASTER_ADDR", ENV(RANK1, "MASTER_PORT=29500"),
                        "MASTER_PORT=29500 is set but MASTER_ADDR is not", NULL);
    expect_choice_error("choice error: empty MASTER_ADDR", ENV(RANK1, "MASTER_ADDR=", "MASTER_PORT=29500"),
                        "MASTER_ADDR=''", NULL);
    const char* bad_ports[] = {"MASTER_PORT=abc", "MASTER_PORT=0", "MASTER_PORT=65536", "MASTER_PORT=-1",
                               "MASTER_PORT=", "MASTER_PORT= 29500", "MASTER_PORT=29500x", "MASTER_PORT=+80",
                               "MASTER_PORT=99999999999999999999", "MASTER_PORT=29500.0"};
    for (size_t i = 0; i < sizeof bad_ports / sizeof bad_ports[0]; i++) {
        char name[96], want[96];
        snprintf(name, sizeof name, "choice error: %s", bad_ports[i]);
        snprintf(want, sizeof want, "%s is not a port", bad_ports[i]);
        expect_choice_error(name, ENV(RANK1, "MASTER_ADDR=10.1.2.3", bad_ports[i]), want, "1 to 65535");
    }
    expect_choice_error("choice error: no MASTER_PORT + 1 above 65535",
                        ENV(RANK1, "MASTER_ADDR=h", "MASTER_PORT=65535", "TORCHELASTIC_USE_AGENT_STORE=True"),
                        "MASTER_PORT=65535", "MASTER_PORT + 1");
    expect_choice_error("choice error: a file needs a run id", ENV(RANK1), "GPT_RUN_ID", NULL);
}

// ---- TCP rendezvous ----------------------------------------------------------------------

// 127.0.0.1:port (port 0: any free port, when bound).
static struct sockaddr_in loopback(int port) {
    return (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
}

// A port that nothing listens on now, and not one given out before: the kernel's pick for port 0.
// (Another program could take it before the test does; the test would then fail saying the port is
// in use, not hang.)
static int free_port(void) {
    static int given[64], count;
    for (;;) {
        struct sockaddr_in a = loopback(0);
        socklen_t len = sizeof a;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr*)&a, &len) != 0)
            fatal("cannot find a free port: %s", strerror(errno));
        close(fd);
        int port = ntohs(a.sin_port), seen = 0;
        for (int i = 0; i < count; i++) seen |= given[i] == port;
        if (seen) continue;
        if (count == 64) fatal("free_port: more than 64 ports asked for");
        given[count++] = port;
        return port;
    }
}

// A socket listening on 127.0.0.1:port, or -1 when the port is taken.
static int listen_on(int port) {
    struct sockaddr_in a = loopback(port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && bind(fd, (struct sockaddr*)&a, sizeof a) == 0 && listen(fd, 4) == 0) return fd;
    if (fd >= 0) close(fd);
    return -1;
}

// A connection to 127.0.0.1:port, trying for up to 2 s while nothing listens there yet.
static int connect_local(int port) {
    struct sockaddr_in a = loopback(port);
    for (int tries = 0; tries < 200; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr*)&a, sizeof a) == 0) return fd;
        if (fd >= 0) close(fd);
        usleep(10 * 1000);
    }
    fatal("nothing listens on 127.0.0.1:%d", port);
}

// A socket bound to 127.0.0.1:port and connected to that same address: the kernel's TCP
// simultaneous open connects it to itself, as a rank's connect can be when the kernel picks the
// port it asks for as the source (rendezvous.h). -1 where this kernel refuses it.
static int connect_to_itself(int port) {
    struct sockaddr_in a = loopback(port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && bind(fd, (struct sockaddr*)&a, sizeof a) == 0 && connect(fd, (struct sockaddr*)&a, sizeof a) == 0)
        return fd;
    if (fd >= 0) close(fd);
    return -1;
}

static void test_connected_to_itself(void) {
    int port = free_port(), self = connect_to_itself(port);
    const char* why = self >= 0 ? "connected" : strerror(errno);
    int told = self >= 0 ? tcp_connected_to_itself(self) : -1;
    test_check(told == 1, "tcp: a socket connected to itself is told apart", "socket %s, detector %d", why, told);
    if (self >= 0) close(self);
    port = free_port();
    int server = listen_on(port), client = connect_local(port), accepted = accept(server, NULL, NULL);
    test_check(tcp_connected_to_itself(client) == 0 && tcp_connected_to_itself(accepted) == 0,
               "tcp: both ends of a connection between two sockets are not", "client %d, accepted %d",
               tcp_connected_to_itself(client), tcp_connected_to_itself(accepted));
    close(accepted);
    close(client);
    close(server);
}

typedef struct {
    const unsigned char* id; // what rank 0 hands out
    double delay;            // seconds before the rank joins
    double timeout;          // --nccl-timeout
} ShareCase;

// A rank as comm_init runs it: the rendezvous from the environment, then the hand-over; prints the id.
static void share_rank(const void* arg) {
    const ShareCase* t = arg;
    DistEnv e = dist_env_detect();
    Rendezvous r = rendezvous_choose(NULL, tmpdir);
    unsigned char id[ID_BYTES] = {0};
    if (e.rank == 0) memcpy(id, t->id, ID_BYTES);
    usleep((useconds_t)(t->delay * 1e6));
    rendezvous_share(&r, e.rank, e.world, id, ID_BYTES, t->timeout);
    fwrite(id, 1, ID_BYTES, stdout);
}

// Rank 1 in a network namespace of its own, loopback up, whose kernel picks only MASTER_PORT as the
// source port of a connection: every try to reach rank 0 there connects to itself. Exits 77 where
// this process may not make the namespace (or set it up); the port range is written only once the
// namespace is this process's own, so the host's is never touched.
#define NO_NAMESPACE 77
static void rank_connecting_to_itself(const void* arg) {
    if (unshare(CLONE_NEWNET) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) exit(NO_NAMESPACE);
    struct ifreq lo = {0};
    snprintf(lo.ifr_name, sizeof lo.ifr_name, "lo");
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0 || ioctl(fd, SIOCGIFFLAGS, &lo) != 0) exit(NO_NAMESPACE);
    lo.ifr_flags |= IFF_UP;
    if (ioctl(fd, SIOCSIFFLAGS, &lo) != 0) exit(NO_NAMESPACE);
    close(fd);
    const char* port = getenv("MASTER_PORT");
    FILE* range = fopen("/proc/sys/net/ipv4/ip_local_port_range", "w");
    if (!range || fprintf(range, "%s %s", port, port) < 0 || fclose(range) != 0) exit(NO_NAMESPACE);
    share_rank(arg);
}

// The environment of a rank on a node of its own (LOCAL_RANK 0): "NAME=VALUE" strings kept here.
typedef struct {
    char rank[32], world[32], port[32];
    const char* env[10];
} RankEnv;

static const char* const* rank_env(RankEnv* e, int rank, int world, const char* addr, int port, const char* extra1,
                                   const char* extra2) {
    snprintf(e->rank, sizeof e->rank, "RANK=%d", rank);
    snprintf(e->world, sizeof e->world, "WORLD_SIZE=%d", world);
    snprintf(e->port, sizeof e->port, "MASTER_PORT=%d", port);
    const char* env[] = {e->rank, e->world, "LOCAL_RANK=0", addr, e->port, extra1, extra2, NULL};
    memcpy(e->env, env, sizeof env);
    return e->env;
}

#define LOOPBACK "MASTER_ADDR=127.0.0.1"

static void check_got_id(const char* name, const Child* c, const unsigned char* id) {
    int same = c->out_len == ID_BYTES && memcmp(c->out, id, ID_BYTES) == 0;
    test_check(c->code == 0 && same, name, "exit %d, %zu bytes, %s, stderr \"%s\"", c->code, c->out_len,
               same ? "equal" : "different", c->err);
}

// The rank's side end to end: rank 1 alone, in the namespace above, must give up as with no rank 0
// (without the check in rendezvous.c, it read its own hello back as rank 0's refusal and ended
// with an empty reason).
static void test_rank_connecting_to_itself(void) {
    const unsigned char id[ID_BYTES] = {0};
    const ShareCase quick = {id, 0.0, 0.5};
    RankEnv env;
    Child c;
    const int port = 40000;
    run(&c, rank_env(&env, 1, 2, LOOPBACK, port, "GPT_RUN_ID=t9", NULL), rank_connecting_to_itself, &quick);
    if (c.code == NO_NAMESPACE) {
        printf("SKIP tcp: a rank whose every try connects to itself (no network namespace may be made here)\n");
        return;
    }
    char want[256];
    // Its first try connects to itself; later ones find the port still held (TIME_WAIT), so the
    // reason given is the last try's.
    snprintf(want, sizeof want, "rank 1: could not reach rank 0 at 127.0.0.1:%d (MASTER_PORT) within 0.5 s", port);
    check_fatal("tcp: a rank whose every try connects to itself gives up as with no rank 0", &c, want, NULL);
}

static void test_tcp(void) {
    TestRng rng = test_rng(7);
    unsigned char id[ID_BYTES];
    for (int i = 0; i < ID_BYTES; i++) id[i] = (unsigned char)(test_uniform(&rng) * 256);
    RankEnv env[4];
    Child ranks[4];
    char want[512], name[96];
    const ShareCase now = {id, 0.0, 10.0}, soon = {id, 0.3, 10.0}, later = {id, 0.6, 10.0}, quick = {id, 0.0, 1.0};

    // Four ranks; the others start before rank 0 (they try again until it listens), one reaches it by name.
    int port = free_port();
    for (int i = 1; i < 4; i++)
        start(&ranks[i], rank_env(&env[i], i, 4, i == 3 ? "MASTER_ADDR=localhost" : LOOPBACK, port, "GPT_RUN_ID=t1",
                                  NULL), share_rank, &now);
    start(&ranks[0], rank_env(&env[0], 0, 4, LOOPBACK, port, "GPT_RUN_ID=t1", NULL), share_rank, &soon);
    for (int i = 0; i < 4; i++) finish(&ranks[i]);
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "tcp: rank %d of 4 ends with the id, byte for byte%s", i,
                 i == 0 ? " (and no warning)" : i == 3 ? " (MASTER_ADDR=localhost)" : "");
        check_got_id(name, &ranks[i], id);
    }
    test_check(ranks[0].err[0] == 0, "tcp: rank 0 warns of nothing", "stderr \"%s\"", ranks[0].err);

    // Under torchrun, whose agent's store holds MASTER_PORT (here a socket of the test), the id goes
    // over MASTER_PORT + 1, and torchrun's default run id "none" is no problem.
    int store = -1;
    while (store < 0) {
        port = free_port();
        int next = listen_on(port + 1); // MASTER_PORT + 1 must be free as well
        if (next >= 0) {
            close(next);
            store = listen_on(port);
        }
    }
    for (int i = 0; i < 2; i++)
        start(&ranks[i], rank_env(&env[i], i, 2, LOOPBACK, port, "TORCHELASTIC_USE_AGENT_STORE=True",
                                  "TORCHELASTIC_RUN_ID=none"), share_rank, &now);
    for (int i = 0; i < 2; i++) finish(&ranks[i]);
    check_got_id("tcp: under torchrun's store, rank 0 serves on MASTER_PORT + 1", &ranks[0], id);
    check_got_id("tcp: under torchrun's store, rank 1 gets the id from MASTER_PORT + 1", &ranks[1], id);
    close(store);

    // At once: rank 1 alone, with no rank 0 anywhere; and rank 0 and rank 1 given different ports.
    int absent = free_port(), right = free_port(), wrong = free_port();
    double t0 = wall_seconds();
    start(&ranks[2], rank_env(&env[2], 1, 2, LOOPBACK, absent, "GPT_RUN_ID=t2", NULL), share_rank, &quick);
    start(&ranks[0], rank_env(&env[0], 0, 2, LOOPBACK, right, "GPT_RUN_ID=t3", NULL), share_rank, &quick);
    start(&ranks[1], rank_env(&env[1], 1, 2, LOOPBACK, wrong, "GPT_RUN_ID=t3", NULL), share_rank, &quick);
    for (int i = 0; i < 3; i++) finish(&ranks[i]);
    double elapsed = wall_seconds() - t0;
    snprintf(want, sizeof want, "rank 1: could not reach rank 0 at 127.0.0.1:%d (MASTER_PORT) within 1 s: "
             "Connection refused", absent);
    check_fatal("tcp: no rank 0: the rank gives up naming the address", &ranks[2], want, "is rank 0 running");
    snprintf(want, sizeof want, "rank 1: could not reach rank 0 at 127.0.0.1:%d", wrong);
    check_fatal("tcp: wrong port: the rank gives up naming the address", &ranks[1], want, NULL);
    snprintf(want, sizeof want, "rank 0: only 1 of 2 ranks joined at port %d within 1 s (missing: rank 1)", right);
    check_fatal("tcp: wrong port: rank 0 gives up saying how many joined", &ranks[0], want, "MASTER_PORT");
    test_check(elapsed > 0.95 && elapsed < 3.0, "tcp: those time-outs take about 1 s", "%.2f s", elapsed);
    test_check(ranks[2].out_len == 0 && ranks[1].out_len == 0, "tcp: nothing received on a time-out", "%zu, %zu bytes",
               ranks[2].out_len, ranks[1].out_len);

    // Rank 2 never comes: rank 0 gives up and tells rank 1, which has joined, why.
    port = free_port();
    start(&ranks[0], rank_env(&env[0], 0, 3, LOOPBACK, port, "GPT_RUN_ID=t4", NULL), share_rank, &quick);
    start(&ranks[1], rank_env(&env[1], 1, 3, LOOPBACK, port, "GPT_RUN_ID=t4", NULL), share_rank, &now);
    for (int i = 0; i < 2; i++) finish(&ranks[i]);
    check_fatal("tcp: a rank missing: rank 0 names it", &ranks[0], "only 2 of 3 ranks joined", "(missing: rank 2)");
    snprintf(want, sizeof want, "rank 1: rank 0 at 127.0.0.1:%d says: only 2 of 3 ranks joined", port);
    check_fatal("tcp: a rank missing: the ranks that joined are told", &ranks[1], want, "(missing: rank 2)");

    // A second rank 0 on the same port stops at once; the first one goes on and serves rank 1.
    port = free_port();
    start(&ranks[0], rank_env(&env[0], 0, 2, LOOPBACK, port, "GPT_RUN_ID=t5", NULL), share_rank, &now);
    start(&ranks[2], rank_env(&env[2], 0, 2, LOOPBACK, port, "GPT_RUN_ID=t5", NULL), share_rank, &soon);
    start(&ranks[1], rank_env(&env[1], 1, 2, LOOPBACK, port, "GPT_RUN_ID=t5", NULL), share_rank, &later);
    for (int i = 0; i < 3; i++) finish(&ranks[i]);
    snprintf(want, sizeof want, "rank 0: port %d (MASTER_PORT) is in use", port);
    check_fatal("tcp: a second rank 0 is refused", &ranks[2], want, "rank 0 started twice");
    check_got_id("tcp: the first rank 0 goes on", &ranks[0], id);
    check_got_id("tcp: rank 1 gets the id from the first rank 0", &ranks[1], id);

    // A rank started with another world size: it is refused, and rank 0 stops too.
    port = free_port();
    start(&ranks[0], rank_env(&env[0], 0, 3, LOOPBACK, port, "GPT_RUN_ID=t6", NULL), share_rank, &now);
    start(&ranks[1], rank_env(&env[1], 1, 2, LOOPBACK, port, "GPT_RUN_ID=t6", NULL), share_rank, &now);
    for (int i = 0; i < 2; i++) finish(&ranks[i]);
    check_fatal("tcp: another world size: rank 0 stops", &ranks[0], "rank 0: rank 1 (from 127.0.0.1:",
                "was started with 2 ranks in all, rank 0 with 3");
    check_fatal("tcp: another world size: the rank is refused", &ranks[1], "says: rank 1 (from 127.0.0.1:",
                "was started with 2 ranks in all, rank 0 with 3");

    // Rank 1 twice: rank 0 stops, and both are told.
    port = free_port();
    start(&ranks[0], rank_env(&env[0], 0, 3, LOOPBACK, port, "GPT_RUN_ID=t7", NULL), share_rank, &now);
    start(&ranks[1], rank_env(&env[1], 1, 3, LOOPBACK, port, "GPT_RUN_ID=t7", NULL), share_rank, &now);
    start(&ranks[2], rank_env(&env[2], 1, 3, LOOPBACK, port, "GPT_RUN_ID=t7", NULL), share_rank, &soon);
    for (int i = 0; i < 3; i++) finish(&ranks[i]);
    check_fatal("tcp: a rank twice: rank 0 stops", &ranks[0], "rank 0: rank 1 joined twice", "two processes");
    check_fatal("tcp: a rank twice: the first is told", &ranks[1], "says: rank 1 joined twice", NULL);
    check_fatal("tcp: a rank twice: the second is told", &ranks[2], "says: rank 1 joined twice", NULL);

    // Strangers are turned away while rank 0 waits on: a connection that speaks something else, and
    // a rank of another launch (another run id), which is told so. Then rank 1 of this run joins.
    port = free_port();
    start(&ranks[0], rank_env(&env[0], 0, 2, LOOPBACK, port, "GPT_RUN_ID=t8", NULL), share_rank, &now);
    int stray = connect_local(port);
    const char http[] = "GET / HTTP/1.0\r\n\r\n";
    if (write(stray, http, sizeof http - 1) != (ssize_t)sizeof http - 1) fatal("cannot write to rank 0");
    close(stray);
    run(&ranks[2], rank_env(&env[2], 1, 2, LOOPBACK, port, "GPT_RUN_ID=old", NULL), share_rank, &now);
    start(&ranks[1], rank_env(&env[1], 1, 2, LOOPBACK, port, "GPT_RUN_ID=t8", NULL), share_rank, &now);
    for (int i = 0; i < 2; i++) finish(&ranks[i]);
    snprintf(want, sizeof want, "this rank belongs to run 'old', rank 0 at port %d to run 't8'", port);
    check_fatal("tcp: a rank of another launch is refused", &ranks[2], want, NULL);
    check_got_id("tcp: rank 0 serves its rank after the strangers", &ranks[0], id);
    check_got_id("tcp: rank 1 joins after the strangers", &ranks[1], id);
    test_check(strstr(ranks[0].err, "ignoring a connection from 127.0.0.1:") &&
               strstr(ranks[0].err, "not a rank of this program") && strstr(ranks[0].err, "refused rank 1 from"),
               "tcp: rank 0 warns of both strangers", "stderr \"%s\"", ranks[0].err);

    // Another program on the port: the rank says so.
    port = free_port();
    int other = listen_on(port);
    start(&ranks[1], rank_env(&env[1], 1, 2, LOOPBACK, port, "GPT_RUN_ID=t9", NULL), share_rank, &now);
    struct pollfd p = {other, POLLIN, 0};
    int conn = poll(&p, 1, 5000) == 1 ? accept(other, NULL, NULL) : -1;
    const char answer[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
    if (conn < 0 || write(conn, answer, sizeof answer - 1) != (ssize_t)sizeof answer - 1) fatal("no client came");
    finish(&ranks[1]);
    close(conn);
    close(other);
    snprintf(want, sizeof want, "rank 1: 127.0.0.1:%d (MASTER_PORT) answered, but not as rank 0 of this program", port);
    check_fatal("tcp: another program on the port is named", &ranks[1], want, NULL);

    // Without MASTER_ADDR the same code goes through the file in the directory (here tmpdir), and
    // rendezvous_done removes the file.
    start(&ranks[1], ENV("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "GPT_RUN_ID=f1"), share_rank, &now);
    start(&ranks[0], ENV("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "GPT_RUN_ID=f1"), share_rank, &soon);
    for (int i = 0; i < 2; i++) finish(&ranks[i]);
    check_got_id("file: rank 0 through rendezvous_share", &ranks[0], id);
    check_got_id("file: rank 1 through rendezvous_share", &ranks[1], id);
    char path[1024];
    snprintf(path, sizeof path, "%s/rank0_id_f1.bin", tmpdir);
    int was_there = access(path, F_OK) == 0;
    Rendezvous file = {.dir = tmpdir, .tag = "f1"};
    rendezvous_done(&file, 0);
    test_check(was_there && access(path, F_OK) != 0, "file: rendezvous_done removes the id file",
               "before: %s, after: %s", was_there ? "there" : "missing", access(path, F_OK) == 0 ? "there" : "gone");
}

int main(void) {
    if (!mkdtemp(tmpdir)) fatal("cannot create a temporary directory %s", tmpdir);
    test_env();
    test_env_switch();
    test_run_tag();
    test_rendezvous();
    test_choice();
    test_connected_to_itself();
    test_rank_connecting_to_itself();
    test_tcp();
    char shared[600];
    snprintf(shared, sizeof(shared), "%s/shared", tmpdir);
    rmdir(shared);
    rmdir(tmpdir);
    return test_summary("dist");
}
