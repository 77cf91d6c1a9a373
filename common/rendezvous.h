// How the ranks of a run meet before NCCL can connect them: rank 0 creates NCCL's unique id (a
// small blob that says where rank 0's NCCL listens) and every other rank needs a copy; without NCCL,
// the same for rank 0's address (kernels/cpu/comm.c). Two ways, neither needs a GPU (so the CPU
// tests run both):
//   TCP   rank 0 serves the id on a port; the others connect to MASTER_ADDR:MASTER_PORT, torchrun's
//         variables (set them by hand under srun or mpirun). No shared file system: several hosts.
//   file  rank 0 writes the id to a file in a directory that every rank sees (common/dist.h).
// Which one: the file in DIR when --nccl-dir DIR is given (asked for by name, it wins); else TCP
// when MASTER_ADDR and MASTER_PORT are set; else the file in the output directory (one host).
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Rendezvous {
    int tcp;                 // 1: over TCP, 0: through a file
    char host[256];          // TCP: MASTER_ADDR, a host name or an IPv4 address
    int port;                // TCP: the port rank 0 listens on
    const char* port_source; // TCP: where the port comes from, for messages
    const char* dir;         // file: the shared directory
    char tag[200];           // the launch's run tag (dist.h); "" over TCP when no launcher names the run
} Rendezvous;

// The rendezvous of a run of several ranks (the rule above). Under torchrun, whose agent serves its
// own key-value store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), rank 0 listens on
// MASTER_PORT + 1. Exits with a message naming the variable when only one of MASTER_ADDR and
// MASTER_PORT is set, when MASTER_ADDR is empty, or when MASTER_PORT is not a port (1 to 65535);
// and, for the file rendezvous, as dist_run_tag() does.
Rendezvous rendezvous_choose(const char* nccl_dir, const char* out_dir);
// "TCP HOST:PORT" or "file DIR" (with where the port comes from when it is not MASTER_PORT).
const char* rendezvous_describe(const Rendezvous* r, char* buf, size_t size);

// Hands the n bytes at id from rank 0 to every other rank (rank 0's are read, the others' written).
// TCP: rank 0 listens until all world - 1 other ranks have said hello (magic number, rank, world,
// run tag), then sends each the id; the others connect, retrying until rank 0 listens. Every rank
// waits at most timeout_seconds, then exits with a message: rank 0 says how many ranks joined and
// which are missing, the others that they could not reach rank 0 at HOST:PORT. A rank that
// disagrees on the world size, or a rank number that joins twice, ends the run on rank 0 and on
// every rank connected to it, each with that reason. A connection that is not a rank of this
// program is closed with a warning, and a rank of another launch (another run tag) is refused;
// rank 0 goes on waiting in both cases. A port in use (another rank 0) ends rank 0 at once.
void rendezvous_share(const Rendezvous* r, int rank, int world, void* id, size_t n, double timeout_seconds);
// Rank 0, once every rank has joined NCCL: removes what the rendezvous left (the id file).
void rendezvous_done(const Rendezvous* r, int rank);

#ifdef __cplusplus
}
#endif
