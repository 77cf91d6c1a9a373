#include "common/rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/dist.h"
#include "common/tcp.h"
#include "common/util.h"

// ---- choice ------------------------------------------------------------------------------

// Digits only (no sign, no spaces), 1 to 65535.
static int parse_port(const char* value) {
    long v = 0;
    const char* p = value;
    while (*p >= '0' && *p <= '9' && v <= 65535) v = 10 * v + (*p++ - '0');
    if (p == value || *p != 0 || v < 1 || v > 65535)
        fatal("MASTER_PORT=%s is not a port: an integer from 1 to 65535", value);
    return (int)v;
}

Rendezvous rendezvous_choose(const char* nccl_dir, const char* out_dir) {
    Rendezvous r = {0};
    const char* addr = getenv("MASTER_ADDR");
    const char* port = getenv("MASTER_PORT");
    if (nccl_dir || (!addr && !port)) {
        r.dir = nccl_dir ? nccl_dir : out_dir;
        snprintf(r.tag, sizeof r.tag, "%s", dist_run_tag());
        return r;
    }
    if (!port)
        fatal("MASTER_ADDR=%s is set but MASTER_PORT is not: set both for the TCP rendezvous, or neither "
              "(then the ranks meet through a file in --nccl-dir, default -o, which all must see)", addr);
    if (!addr)
        fatal("MASTER_PORT=%s is set but MASTER_ADDR is not: set both for the TCP rendezvous, or neither "
              "(then the ranks meet through a file in --nccl-dir, default -o, which all must see)", port);
    if (addr[0] == 0 || strlen(addr) >= sizeof r.host)
        fatal("MASTER_ADDR='%s': give the host name or IPv4 address of rank 0's host (1 to %zu characters)",
              addr, sizeof r.host - 1);
    r.tcp = 1;
    snprintf(r.host, sizeof r.host, "%s", addr);
    r.port = parse_port(port);
    r.port_source = "MASTER_PORT";
    const char* agent_store = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (agent_store && strcmp(agent_store, "True") == 0) {
        if (r.port == 65535)
            fatal("MASTER_PORT=65535: under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) rank 0 serves the "
                  "id on MASTER_PORT + 1, since torchrun's own store holds MASTER_PORT; pick a lower port");
        r.port++;
        r.port_source = "MASTER_PORT + 1: torchrun's own store holds MASTER_PORT";
    }
    snprintf(r.tag, sizeof r.tag, "%s", dist_run_tag_if_any());
    return r;
}

const char* rendezvous_describe(const Rendezvous* r, char* buf, size_t size) {
    if (!r->tcp) snprintf(buf, size, "file %s", r->dir);
    else if (strcmp(r->port_source, "MASTER_PORT") == 0) snprintf(buf, size, "TCP %s:%d", r->host, r->port);
    else snprintf(buf, size, "TCP %s:%d (%s)", r->host, r->port, r->port_source);
    return buf;
}

// ---- TCP ---------------------------------------------------------------------------------
// Two messages, every integer a big-endian uint32:
//   hello (rank r -> rank 0): MAGIC, rank, world, tag length, the tag's bytes
//   reply (rank 0 -> rank r): MAGIC, REPLY_ID or REPLY_REFUSED, length, the id or the reason (text)
// The magic number tells a rank of this program from anything else that connects (a port scanner,
// another program's client, or a different protocol); it changes whenever the messages do.

#define MAGIC 0x67707431u // "gpt1"
enum { REPLY_ID = 0, REPLY_REFUSED = 1 };
#define TEXT_MAX 1024     // the longest reason rank 0 sends
// Rank 0 reads the hellos one connection at a time: one that says nothing holds the others back
// this long at most. A rank sends its hello as soon as it is connected.
#define HELLO_SECONDS 5.0

static const char* send_reply(int fd, uint32_t kind, const void* payload, size_t n, double deadline) {
    unsigned char head[12];
    tcp_put_u32(head, MAGIC);
    tcp_put_u32(head + 4, kind);
    tcp_put_u32(head + 8, (uint32_t)n);
    const char* err = tcp_transfer(fd, head, sizeof head, 1, deadline);
    return err ? err : tcp_transfer(fd, (void*)payload, n, 1, deadline);
}

// ---- rank 0 ------------------------------------------------------------------------------

typedef struct {
    int fd;        // the connection of a rank that has joined, or -1
    char from[64]; // its address, for messages
} Peer;

// Sends the refusal `why` to a connection (as much as goes out within a second) and closes it.
static void refuse(int fd, const char* why) {
    send_reply(fd, REPLY_REFUSED, why, strlen(why), wall_seconds() + 1.0);
    close(fd);
}

// Ends the rendezvous on rank 0 and on every rank that has joined, all with the same reason.
static void __attribute__((noreturn)) give_up(Peer* peers, int world, const char* why) {
    for (int i = 1; i < world; i++)
        if (peers[i].fd >= 0) refuse(peers[i].fd, why);
    fatal("rank 0: %s", why);
}

// Why rank 0 gives up waiting: how many ranks joined and the first few that did not.
static void say_missing(char* why, size_t size, const Peer* peers, int world, int joined, int port, double timeout) {
    int len = snprintf(why, size, "only %d of %d ranks joined at port %d within %g s (missing:", joined, world,
                       port, timeout);
    for (int i = 1, listed = 0; i < world; i++) {
        if (peers[i].fd >= 0) continue;
        if (listed++ == 8) {
            len += snprintf(why + len, size - (size_t)len, " ...");
            break;
        }
        len += snprintf(why + len, size - (size_t)len, "%s rank %d", listed > 1 ? "," : "", i);
    }
    snprintf(why + len, size - (size_t)len, "); are they all started, with MASTER_ADDR naming this host and the "
             "same MASTER_PORT?");
}

// Rank 0 holds a connection to every other rank until all have joined: make room for them in the
// limit on open files (1024 by default, below the ranks of a large run).
static void raise_file_limit(int world) {
    struct rlimit lim;
    rlim_t need = (rlim_t)world + 64;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= need) return;
    lim.rlim_cur = lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need ? lim.rlim_max : need;
    setrlimit(RLIMIT_NOFILE, &lim); // if that fails, accept() says so below
}

typedef struct {
    uint32_t rank, world;
    char tag[sizeof(((Rendezvous*)0)->tag)];
} Hello;

// Reads a hello; NULL, or why the connection is not a rank of this program.
static const char* read_hello(int fd, Hello* h, double deadline) {
    unsigned char head[16];
    const char* err = tcp_transfer(fd, head, sizeof head, 0, deadline);
    if (err) return err == TCP_TIMED_OUT ? "it sent no hello in time" : err;
    uint32_t tag_len = tcp_get_u32(head + 12);
    if (tcp_get_u32(head) != MAGIC || tag_len >= sizeof h->tag) return "it is not a rank of this program";
    h->rank = tcp_get_u32(head + 4);
    h->world = tcp_get_u32(head + 8);
    err = tcp_transfer(fd, h->tag, tag_len, 0, deadline);
    h->tag[tag_len] = 0;
    return err ? "its hello was cut short" : NULL;
}

static void serve_id(const Rendezvous* r, int world, const void* id, size_t n, double timeout) {
    double deadline = wall_seconds() + timeout;
    raise_file_limit(world);
    // Every interface: MASTER_ADDR is how the others reach this host, which may be a name or an
    // address that this host cannot tell is its own (behind NAT, several networks). A port that an
    // earlier run used may linger in TIME_WAIT: tcp_listen takes it; one that a program still
    // listens on is refused all the same: that is the second rank 0.
    int lfd = tcp_listen(r->port);
    if (lfd < 0) {
        if (errno == EADDRINUSE)
            fatal("rank 0: port %d (%s) is in use: by another rank 0 (was rank 0 started twice?) or by "
                  "another program; pick another MASTER_PORT", r->port, r->port_source);
        fatal("rank 0: cannot listen on port %d (%s): %s", r->port, r->port_source, strerror(errno));
    }

    Peer* peers = xmalloc((size_t)world * sizeof *peers, "rendezvous connections");
    for (int i = 0; i < world; i++) peers[i].fd = -1;
    char why[TEXT_MAX];
    for (int joined = 1; joined < world;) {
        if (!tcp_wait(lfd, POLLIN, deadline)) {
            say_missing(why, sizeof why, peers, world, joined, r->port, timeout);
            give_up(peers, world, why);
        }
        struct sockaddr_in addr;
        socklen_t addr_len = sizeof addr;
        int fd = accept(lfd, (struct sockaddr*)&addr, &addr_len);
        if (fd < 0) {
            // A client that gave up between poll and accept, or a signal: wait on.
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK || e == ECONNABORTED || e == EINTR) continue;
            snprintf(why, sizeof why, "cannot accept the connection of a rank: %s%s", strerror(e),
                     e == EMFILE ? " (raise the limit of open files, ulimit -n, above the number of ranks)" : "");
            give_up(peers, world, why);
        }
        tcp_set_nonblocking(fd);
        char from[64], ip[INET_ADDRSTRLEN];
        snprintf(from, sizeof from, "%s:%d", inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip) ? ip : "?",
                 ntohs(addr.sin_port));
        double hello_deadline = wall_seconds() + HELLO_SECONDS;
        Hello h;
        const char* bad = read_hello(fd, &h, hello_deadline < deadline ? hello_deadline : deadline);
        if (!bad && strcmp(h.tag, r->tag) != 0) {
            // A rank of another launch: this one's rank 0 is elsewhere (or has died); not our problem.
            snprintf(why, sizeof why, "this rank belongs to run '%s', rank 0 at port %d to run '%s': does a rank 0 "
                     "of another launch hold this MASTER_PORT?", h.tag, r->port, r->tag);
            refuse(fd, why);
            fprintf(stderr, "warning: rank 0: refused rank %u from %s, of run '%s' (this run is '%s')\n", h.rank,
                    from, h.tag, r->tag);
            continue;
        }
        if (!bad && h.world != (uint32_t)world) {
            snprintf(why, sizeof why, "rank %u (from %s) was started with %u ranks in all, rank 0 with %d: every "
                     "rank needs the same world size", h.rank, from, h.world, world);
            refuse(fd, why);
            give_up(peers, world, why);
        }
        if (!bad && (h.rank == 0 || h.rank >= (uint32_t)world)) bad = "it is not a rank of this run";
        if (bad) {
            fprintf(stderr, "warning: rank 0: ignoring a connection from %s on port %d: %s\n", from, r->port, bad);
            close(fd);
            continue;
        }
        if (peers[h.rank].fd >= 0) {
            snprintf(why, sizeof why, "rank %u joined twice, from %s and from %s: two processes were started as "
                     "rank %u", h.rank, peers[h.rank].from, from, h.rank);
            refuse(fd, why);
            give_up(peers, world, why);
        }
        peers[h.rank].fd = fd;
        snprintf(peers[h.rank].from, sizeof peers[h.rank].from, "%s", from);
        joined++;
    }
    close(lfd);
    for (int i = 1; i < world; i++) {
        const char* err = send_reply(peers[i].fd, REPLY_ID, id, n, wall_seconds() + HELLO_SECONDS);
        if (err) fatal("rank 0: cannot send its id to rank %d at %s: %s", i, peers[i].from, err);
        close(peers[i].fd);
    }
    free(peers);
}

// ---- the other ranks ---------------------------------------------------------------------

// One attempt to connect to rank 0: the socket, or -1 with why it failed in `why`.
static int connect_once(const Rendezvous* r, int rank, double deadline, char* why, size_t size) {
    int fd = tcp_connect(r->host, r->port, deadline, why, size);
    if (fd == -2)
        fatal("rank %d: MASTER_ADDR=%s: %s (give a host name or IPv4 address of rank 0's host)", rank, r->host, why);
    return fd;
}

// Says hello on a connection and reads rank 0's reply: 1 with the id in `id`; 0, with why in `why`,
// when the connection broke before the reply (worth another try); exits on a refusal.
static int ask_for_id(const Rendezvous* r, int fd, int rank, int world, void* id, size_t n, double deadline,
                      double timeout, char* why, size_t size) {
    unsigned char hello[16 + sizeof r->tag];
    size_t tag_len = strlen(r->tag);
    tcp_put_u32(hello, MAGIC);
    tcp_put_u32(hello + 4, (uint32_t)rank);
    tcp_put_u32(hello + 8, (uint32_t)world);
    tcp_put_u32(hello + 12, (uint32_t)tag_len);
    memcpy(hello + 16, r->tag, tag_len);
    const char* err = tcp_transfer(fd, hello, 16 + tag_len, 1, deadline);
    unsigned char head[12];
    if (!err) err = tcp_transfer(fd, head, sizeof head, 0, deadline);
    if (err == TCP_TIMED_OUT)
        fatal("rank %d: connected to rank 0 at %s:%d, but rank 0's id did not come within %g s: rank 0 "
              "hands it out once all %d ranks have joined; is every rank started?",
              rank, r->host, r->port, timeout, world);
    if (err) {
        snprintf(why, size, "connected, but %s before rank 0 answered", err);
        return 0;
    }
    uint32_t kind = tcp_get_u32(head + 4), len = tcp_get_u32(head + 8);
    if (tcp_get_u32(head) != MAGIC)
        fatal("rank %d: %s:%d (%s) answered, but not as rank 0 of this program: does another program listen "
              "on that port?", rank, r->host, r->port, r->port_source);
    if (kind == REPLY_ID && len == n) {
        err = tcp_transfer(fd, id, n, 0, deadline);
        if (err) fatal("rank %d: rank 0's id from %s:%d was cut short: %s", rank, r->host, r->port, err);
        return 1;
    }
    if (kind == REPLY_REFUSED && len < TEXT_MAX) {
        char text[TEXT_MAX];
        err = tcp_transfer(fd, text, len, 0, deadline);
        text[err ? 0 : len] = 0;
        fatal("rank %d: rank 0 at %s:%d says: %s", rank, r->host, r->port,
              err ? "(its reason was cut short)" : text);
    }
    fatal("rank %d: rank 0 at %s:%d sent a reply this rank cannot read (kind %u, %u bytes; an id has %zu): "
          "are all ranks the same build?", rank, r->host, r->port, kind, len, n);
}

static void fetch_id(const Rendezvous* r, int rank, int world, void* id, size_t n, double timeout) {
    double deadline = wall_seconds() + timeout;
    char why[512];
    // Rank 0 may start later than this rank: try again, every 50 ms at first, then every second.
    for (double pause = 0.05;; pause = pause < 0.5 ? 2 * pause : 1.0) {
        int fd = connect_once(r, rank, deadline, why, sizeof why);
        if (fd >= 0) {
            int done = ask_for_id(r, fd, rank, world, id, n, deadline, timeout, why, sizeof why);
            close(fd);
            if (done) return;
        }
        if (wall_seconds() + pause > deadline)
            fatal("rank %d: could not reach rank 0 at %s:%d (%s) within %g s: %s; is rank 0 running, and do "
                  "MASTER_ADDR and MASTER_PORT name its host and a port this host can reach?", rank, r->host,
                  r->port, r->port_source, timeout, why);
        nanosleep(&(struct timespec){0, (long)(pause * 1e9)}, NULL);
    }
}

// ---- both --------------------------------------------------------------------------------

void rendezvous_share(const Rendezvous* r, int rank, int world, void* id, size_t n, double timeout_seconds) {
    if (r->tcp && rank == 0) serve_id(r, world, id, n, timeout_seconds);
    else if (r->tcp) fetch_id(r, rank, world, id, n, timeout_seconds);
    else if (rank == 0) dist_publish_id(r->dir, r->tag, id, n);
    else dist_wait_id(r->dir, r->tag, id, n, timeout_seconds);
}

void rendezvous_done(const Rendezvous* r, int rank) {
    if (!r->tcp && rank == 0) dist_cleanup_id(r->dir, r->tag);
}
