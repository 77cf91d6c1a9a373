// Data parallelism without NCCL: the CPU build, and a CUDA build made with NCCL=0. One process,
// where every collective is the identity; or several, each connected to rank 0 over TCP. For the
// tests of data parallelism on machines without GPUs (make test runs them) and for runs on a few
// hosts without NCCL; slow, since every value goes through rank 0.
//
// Rank 0 adds the ranks' values in rank order, ((rank 0 + rank 1) + rank 2) + ..., so the sums
// do not depend on timing; on 2 ranks a sum is a + b, as NCCL's. Each collective moves its values in
// chunks through host buffers (on a GPU, with copies that wait for the work queued so far):
//   sums       every other rank sends its chunk; rank 0 adds them to its own and sends the sum to
//              the ranks that receive it (all, or a ZeRO shard's owner)
//   all-gather every other rank sends its shard; rank 0 sends the whole array back to each
// Every rank calls the collectives in the same order; each starts with a header (which collective,
// its size) that rank 0 checks against its own call, so ranks that fall out of step stop with a
// message instead of adding unrelated values. Values travel in the host's byte order: the ranks are
// one build, on hosts of one architecture. Each wait ends at --nccl-timeout, and a rank that dies
// closes its connection: the others stop with a message, not a hang.
//
// The ranks meet as NCCL's would (common/rendezvous.h): rank 0 listens on a port the kernel picks
// and hands its host name, the port and a random key to the others in place of NCCL's id.
//
// The sums that comm_sum_pieces_begin queues are made at once, the earliest moment NCCL may make
// them; with TCP_SUMS_AT_WAIT=1 at comm_sums_wait (or the next collective), the latest. A model
// that wrote a piece after its begin trains other bits in the first, one that read a sum before the
// wait in the second: tests/e2e/test_ranks_cpu.sh runs both against the sums after the backward.
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/rendezvous.h"
#include "common/tcp.h"
#include "common/util.h"
#include "kernels/kernels.h"

static int comm_rank_ = 0, comm_world_ = 1;
static double comm_timeout = 300.0;
static int* peer_fd;       // rank 0: the connection of each other rank (index 0 unused); others: [0] is rank 0's
static unsigned char* mine;  // this rank's chunk (rank 0: the running sum)
static unsigned char* other; // rank 0: another rank's chunk
static bool sums_at_wait;     // TCP_SUMS_AT_WAIT=1: comm_sum_pieces_begin's sums made at the wait
static CommPiece* pending;    // the sums comm_sum_pieces_begin queued, in order, not yet made
static int num_pending, pending_capacity;
static void* pending_buf;     // the buffer and type of all of them (the one array of gradients)
static CommType pending_type;
#define CHUNK_BYTES (4u << 20)
#define HOST_VALUES_MAX 16

// What rank 0 hands out through the rendezvous: MAGIC, port, key (two u32), then its host name.
#define MAGIC 0x67707463u // "gptc"
#define HOST_NAME_BYTES 256
typedef struct {
    unsigned char bytes[16 + HOST_NAME_BYTES];
} Invitation;

enum { OP_JOIN = 1, OP_SUM, OP_GATHER, OP_HOST };
#define HEADER_BYTES 24

static void __attribute__((noreturn)) stop(const char* what, int peer, const char* problem) {
    if (problem == TCP_TIMED_OUT)
        fatal("rank %d of %d: %s: did not finish within %.0f s: another rank has died or hangs "
              "(--nccl-timeout sets the limit)", comm_rank_, comm_world_, what, comm_timeout);
    fatal("rank %d of %d: %s: the connection to rank %d failed (%s): another rank has died or stopped "
          "(its own message says why)", comm_rank_, comm_world_, what, peer, problem);
}

static void send_to(int peer, const void* buf, size_t n, double deadline, const char* what) {
    const char* err = tcp_transfer(peer_fd[comm_rank_ == 0 ? peer : 0], (void*)buf, n, 1, deadline);
    if (err) stop(what, peer, err);
}

static void receive_from(int peer, void* buf, size_t n, double deadline, const char* what) {
    const char* err = tcp_transfer(peer_fd[comm_rank_ == 0 ? peer : 0], buf, n, 0, deadline);
    if (err) stop(what, peer, err);
}

static size_t type_bytes(CommType type) { return type == COMM_FLOAT ? sizeof(float) : sizeof(floatX); }

// The collective's header: every other rank sends it to rank 0, which stops the run when it is not
// its own (the ranks called different collectives, or with different sizes).
static void agree(uint32_t op, uint32_t type, size_t a, size_t b, double deadline, const char* what) {
    unsigned char head[HEADER_BYTES];
    tcp_put_u32(head, op);
    tcp_put_u32(head + 4, type);
    tcp_put_u32(head + 8, (uint32_t)(a >> 32));
    tcp_put_u32(head + 12, (uint32_t)a);
    tcp_put_u32(head + 16, (uint32_t)(b >> 32));
    tcp_put_u32(head + 20, (uint32_t)b);
    if (comm_rank_ != 0) {
        send_to(0, head, sizeof head, deadline, what);
        return;
    }
    for (int r = 1; r < comm_world_; r++) {
        unsigned char theirs[HEADER_BYTES];
        receive_from(r, theirs, sizeof theirs, deadline, what);
        if (memcmp(theirs, head, sizeof head) != 0)
            fatal("rank 0 of %d: %s: rank %d called another collective (op %u, %u, sizes %u/%u, %u/%u against "
                  "%u, %u, %u/%u, %u/%u): the ranks are out of step", comm_world_, what, r, tcp_get_u32(theirs),
                  tcp_get_u32(theirs + 4), tcp_get_u32(theirs + 8), tcp_get_u32(theirs + 12), tcp_get_u32(theirs + 16),
                  tcp_get_u32(theirs + 20), op, type, (uint32_t)(a >> 32), (uint32_t)a, (uint32_t)(b >> 32),
                  (uint32_t)b);
    }
}

// ---- joining -------------------------------------------------------------------------------

static uint64_t random_key(void) {
    uint64_t key = 0;
    FILE* f = fopen("/dev/urandom", "rb");
    if (!f || fread(&key, sizeof key, 1, f) != 1) key = (uint64_t)time(NULL) * 6364136223846793005ull ^ (uint64_t)getpid();
    if (f) fclose(f);
    return key;
}

static void no_delay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); // the few numbers of OP_HOST go out at once
}

// A hello: MAGIC, rank, key.
static void accept_ranks(int lfd, uint64_t key, double deadline) {
    for (int joined = 1; joined < comm_world_;) {
        if (!tcp_wait(lfd, POLLIN, deadline)) {
            int missing = 1;
            while (peer_fd[missing] >= 0) missing++;
            fatal("rank 0 of %d: only %d of %d ranks joined within %.0f s (rank %d is missing): is every rank "
                  "started, and can it reach this host?", comm_world_, joined, comm_world_, comm_timeout, missing);
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EINTR) continue;
            fatal("rank 0 of %d: cannot accept the connection of a rank: %s", comm_world_, strerror(errno));
        }
        tcp_set_nonblocking(fd);
        unsigned char hello[16];
        const char* err = tcp_transfer(fd, hello, sizeof hello, 0, wall_seconds() + 5.0);
        uint32_t rank = err ? 0 : tcp_get_u32(hello + 4);
        uint64_t theirs = err ? 0 : (uint64_t)tcp_get_u32(hello + 8) << 32 | tcp_get_u32(hello + 12);
        if (err || tcp_get_u32(hello) != MAGIC || theirs != key || rank == 0 || rank >= (uint32_t)comm_world_) {
            fprintf(stderr, "warning: rank 0: ignoring a connection that is not a rank of this run (%s)\n",
                    err ? err : "its hello does not match");
            close(fd);
            continue;
        }
        if (peer_fd[rank] >= 0) fatal("rank 0 of %d: rank %u connected twice", comm_world_, rank);
        no_delay(fd);
        peer_fd[rank] = fd;
        joined++;
    }
}

static void join_rank0(const Invitation* inv, double deadline) {
    const unsigned char* b = inv->bytes;
    if (tcp_get_u32(b) != MAGIC)
        fatal("rank %d of %d: what rank 0 handed out is not this build's invitation: are all ranks the same build "
              "(NCCL or not)?", comm_rank_, comm_world_);
    int port = (int)tcp_get_u32(b + 4);
    char host[HOST_NAME_BYTES], here[HOST_NAME_BYTES];
    memcpy(host, b + 16, HOST_NAME_BYTES);
    host[HOST_NAME_BYTES - 1] = 0;
    // Rank 0 on this host: the loopback reaches it even where the host's name does not resolve.
    const char* to = gethostname(here, sizeof here) == 0 && strcmp(here, host) == 0 ? "127.0.0.1" : host;
    char why[256];
    int fd = tcp_connect(to, port, deadline, why, sizeof why);
    if (fd < 0)
        fatal("rank %d of %d: cannot connect to rank 0 at %s:%d: %s", comm_rank_, comm_world_, to, port, why);
    unsigned char hello[16];
    tcp_put_u32(hello, MAGIC);
    tcp_put_u32(hello + 4, (uint32_t)comm_rank_);
    memcpy(hello + 8, b + 8, 8);
    const char* err = tcp_transfer(fd, hello, sizeof hello, 1, deadline);
    if (err) fatal("rank %d of %d: rank 0 at %s:%d: %s", comm_rank_, comm_world_, to, port, err);
    no_delay(fd);
    peer_fd[0] = fd;
}

void comm_init(int rank, int world, const Rendezvous* rdv, double timeout_seconds) {
    comm_rank_ = rank;
    comm_world_ = world;
    comm_timeout = timeout_seconds;
    if (world == 1) return;
    sums_at_wait = env_switch("TCP_SUMS_AT_WAIT", 0,
                              "the sums beside the backward made at its end, the latest moment they may be", "at once");
    if (sizeof(gradX) != sizeof(float))
        fatal("rank %d of %d: the gradients of this build are bf16, which ranks without NCCL cannot add: build "
              "train_gpt with NCCL, or with GRADS=FP32", rank, world);
    peer_fd = xmalloc((size_t)world * sizeof *peer_fd, "connections of the ranks");
    for (int i = 0; i < world; i++) peer_fd[i] = -1;
    mine = xmalloc(CHUNK_BYTES, "the ranks' sums");
    other = xmalloc(CHUNK_BYTES, "the ranks' sums");
    Invitation inv = {{0}};
    int lfd = -1;
    uint64_t key = 0;
    if (rank == 0) {
        lfd = tcp_listen(0);
        if (lfd < 0) fatal("rank 0 of %d: cannot listen for the other ranks: %s", world, strerror(errno));
        key = random_key();
        tcp_put_u32(inv.bytes, MAGIC);
        tcp_put_u32(inv.bytes + 4, (uint32_t)tcp_port(lfd));
        tcp_put_u32(inv.bytes + 8, (uint32_t)(key >> 32));
        tcp_put_u32(inv.bytes + 12, (uint32_t)key);
        // The name the others reach this host by: MASTER_ADDR over TCP, else the host's own name.
        char* host = (char*)inv.bytes + 16;
        if (rdv->tcp) snprintf(host, HOST_NAME_BYTES, "%s", rdv->host);
        else if (gethostname(host, HOST_NAME_BYTES - 1) != 0) fatal("rank 0: gethostname: %s", strerror(errno));
    }
    rendezvous_share(rdv, rank, world, &inv, sizeof inv, timeout_seconds);
    double deadline = wall_seconds() + timeout_seconds;
    if (rank == 0) {
        accept_ranks(lfd, key, deadline);
        close(lfd);
    } else {
        join_rank0(&inv, deadline);
    }
    // Every rank has connected, so every rank has read the invitation.
    agree(OP_JOIN, 0, 0, 0, deadline, "joining the other ranks");
    rendezvous_done(rdv, rank);
}

void comm_free(void) {
    if (comm_world_ == 1) return;
    for (int i = 0; i < comm_world_; i++)
        if (peer_fd[i] >= 0) close(peer_fd[i]);
    free(peer_fd);
    free(mine);
    free(other);
    free(pending);
    peer_fd = NULL;
    pending = NULL;
    num_pending = pending_capacity = 0;
    comm_world_ = 1;
    comm_rank_ = 0;
}

int comm_rank(void) { return comm_rank_; }
int comm_world(void) { return comm_world_; }
const char* comm_name(void) { return comm_world_ > 1 ? "TCP through rank 0" : "one process"; }

// ---- collectives ---------------------------------------------------------------------------

// The length of the chunk from `done` on of `total`, at most `most`: the collectives go chunk by chunk.
static size_t chunk_length(size_t done, size_t total, size_t most) { return total - done < most ? total - done : most; }

// The count elements of buf at offset: their sum over the ranks, on every rank (root < 0) or on rank
// root alone (the others' are left as they were).
static void sum_range(void* buf, size_t offset, size_t count, int root, CommType type, const char* what) {
    const size_t bytes = type_bytes(type), per_chunk = CHUNK_BYTES / bytes;
    if (type == COMM_FLOATX && sizeof(floatX) != sizeof(float))
        fatal("internal: %s: sums of 16-bit values without NCCL", what);
    double deadline = wall_seconds() + comm_timeout;
    agree(OP_SUM, type, offset, (size_t)(root + 1) << 48 | count, deadline, what);
    for (size_t done = 0; done < count; done += per_chunk) {
        const size_t n = chunk_length(done, count, per_chunk);
        char* at = (char*)buf + (offset + done) * bytes;
        dev_download(mine, at, n * bytes);
        if (comm_rank_ != 0) {
            send_to(0, mine, n * bytes, deadline, what);
            if (root < 0 || root == comm_rank_) {
                receive_from(0, mine, n * bytes, deadline, what);
                dev_upload(at, mine, n * bytes);
            }
            continue;
        }
        float* sum = (float*)mine;
        const float* add = (const float*)other;
        for (int r = 1; r < comm_world_; r++) {
            receive_from(r, other, n * bytes, deadline, what);
            for (size_t i = 0; i < n; i++) sum[i] += add[i];
        }
        if (root <= 0) dev_upload(at, mine, n * bytes);
        for (int r = 1; r < comm_world_; r++)
            if (root < 0 || root == r) send_to(r, mine, n * bytes, deadline, what);
    }
}

void comm_allreduce_sum(void* buf, size_t count, CommType type) {
    if (comm_world_ == 1) return;
    comm_sums_wait();
    sum_range(buf, 0, count, -1, type, "all-reduce of the gradients");
}

void comm_reduce_scatter_sum(void* buf, size_t shard, CommType type) {
    if (comm_world_ == 1) return;
    comm_sums_wait();
    for (int r = 0; r < comm_world_; r++) sum_range(buf, (size_t)r * shard, shard, r, type, "reduce-scatter of the gradients");
}

void comm_allgather(void* out, const void* shard_in, size_t shard, CommType type) {
    const size_t bytes = type_bytes(type);
    if (out != shard_in) dev_copy((char*)out + (size_t)comm_rank_ * shard * bytes, shard_in, shard * bytes);
    if (comm_world_ == 1) return;
    comm_sums_wait();
    const char* what = "all-gather of the weights";
    double deadline = wall_seconds() + comm_timeout;
    agree(OP_GATHER, type, shard, 0, deadline, what);
    // The shards go to rank 0 (each rank's own is in place in out), then the whole array to each rank.
    for (int r = 1; r < comm_world_; r++) {
        if (comm_rank_ != 0 && comm_rank_ != r) continue;
        char* at = (char*)out + (size_t)r * shard * bytes;
        for (size_t done = 0; done < shard * bytes; done += CHUNK_BYTES) {
            const size_t n = chunk_length(done, shard * bytes, CHUNK_BYTES);
            if (comm_rank_ == 0) {
                receive_from(r, mine, n, deadline, what);
                dev_upload(at + done, mine, n);
            } else {
                dev_download(mine, at + done, n);
                send_to(0, mine, n, deadline, what);
            }
        }
    }
    const size_t total = (size_t)comm_world_ * shard * bytes;
    for (size_t done = 0; done < total; done += CHUNK_BYTES) {
        const size_t n = chunk_length(done, total, CHUNK_BYTES);
        if (comm_rank_ == 0) {
            dev_download(mine, (char*)out + done, n);
            for (int r = 1; r < comm_world_; r++) send_to(r, mine, n, deadline, what);
        } else {
            receive_from(0, mine, n, deadline, what);
            dev_upload((char*)out + done, mine, n);
        }
    }
}

void comm_allreduce_host(double* values, int n, CommOp op) {
    if (comm_world_ == 1) return;
    comm_sums_wait();
    if (n > HOST_VALUES_MAX) fatal("internal: comm_allreduce_host of %d values (at most %d)", n, HOST_VALUES_MAX);
    const char* what = "all-reduce of a few numbers";
    double deadline = wall_seconds() + comm_timeout;
    agree(OP_HOST, op, (size_t)n, 0, deadline, what);
    const size_t bytes = (size_t)n * sizeof(double);
    if (comm_rank_ != 0) {
        send_to(0, values, bytes, deadline, what);
        receive_from(0, values, bytes, deadline, what);
        return;
    }
    for (int r = 1; r < comm_world_; r++) {
        double theirs[HOST_VALUES_MAX];
        receive_from(r, theirs, bytes, deadline, what);
        for (int i = 0; i < n; i++)
            values[i] = op == COMM_SUM ? values[i] + theirs[i]
                      : op == COMM_MIN ? (theirs[i] < values[i] ? theirs[i] : values[i])
                                       : (theirs[i] > values[i] ? theirs[i] : values[i]);
    }
    for (int r = 1; r < comm_world_; r++) send_to(r, values, bytes, deadline, what);
}

// Queued, then made at once, in the order given (the work queued before the call has finished when
// its values are read: dev_download waits for it), so each piece has the bits of the same elements
// summed after the backward; with TCP_SUMS_AT_WAIT=1 made by comm_sums_wait, which every collective
// calls first, as NCCL runs collectives in the order they are called.
void comm_sum_pieces_begin(void* buf, const CommPiece* pieces, int n, CommType type) {
    if (comm_world_ == 1) return;
    if (num_pending > 0 && (buf != pending_buf || type != pending_type))
        fatal("internal: comm_sum_pieces_begin: sums of another buffer queued before the wait");
    if (num_pending + n > pending_capacity) {
        pending_capacity = 2 * (num_pending + n);
        pending = realloc(pending, (size_t)pending_capacity * sizeof *pending);
        if (!pending) fatal("out of memory for the queued sums of the gradients");
    }
    memcpy(pending + num_pending, pieces, (size_t)n * sizeof *pieces);
    num_pending += n;
    pending_buf = buf, pending_type = type;
    if (!sums_at_wait) comm_sums_wait();
}

void comm_sums_wait(void) {
    for (int i = 0; i < num_pending; i++)
        sum_range(pending_buf, pending[i].offset, pending[i].count, pending[i].root, pending_type,
                  "sums of the gradients");
    num_pending = 0;
}
