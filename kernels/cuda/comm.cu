// Data parallelism through NCCL: one process per GPU, one communicator over all ranks.
//
// Collectives run on a stream of their own, ordered after the work queued so far on the default
// stream (an event), and the caller waits for each result, but for the gradients' sums of
// comm_sum_pieces_begin, which run beside the work queued after them until comm_sums_wait. The
// communicator is non-blocking, so that a wait never hangs: every wait polls NCCL's error state and
// a deadline, and when a peer died or hangs, the communicator is aborted and the process exits with
// a message instead of waiting forever inside a collective. A run of one process creates no
// communicator at all.
#include <nccl.h>
#include <unistd.h>

#include "common/rendezvous.h"
#include "kernels/cuda/common.cuh"

static int comm_rank_ = 0, comm_world_ = 1;
static double comm_timeout = 300.0;
static ncclComm_t comm;
static cudaStream_t comm_stream;
static cudaEvent_t work_queued, comm_done;
static double* host_values_dev; // staging for comm_allreduce_host
#define HOST_VALUES_MAX 16

static void comm_abort_and_exit(const char* what, const char* problem) {
    ncclCommAbort(comm);
    fatal("rank %d of %d: %s: %s", comm_rank_, comm_world_, what, problem);
}

// A call on a non-blocking communicator returns ncclInProgress while it is being set up; anything
// else but success is an error.
#define ncclCheck(call, what) nccl_check((call), #call, what)
static void nccl_check(ncclResult_t r, const char* call, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    char problem[1024];
    snprintf(problem, sizeof problem, "%s failed: %s (%s)", call, ncclGetErrorString(r),
             comm ? ncclGetLastError(comm) : "");
    if (comm) comm_abort_and_exit(what, problem);
    fatal("rank %d of %d: %s: %s", comm_rank_, comm_world_, what, problem);
}

// Raises a pending asynchronous NCCL error; returns 1 while a call is still in progress.
static int comm_in_progress(const char* what) {
    ncclResult_t state;
    nccl_check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError", what);
    if (state == ncclInProgress) return 1;
    if (state != ncclSuccess) {
        char problem[1024];
        snprintf(problem, sizeof problem, "NCCL reports %s (%s); another rank may have failed",
                 ncclGetErrorString(state), ncclGetLastError(comm));
        comm_abort_and_exit(what, problem);
    }
    return 0;
}

static void check_deadline(double deadline, const char* what) {
    if (wall_seconds() <= deadline) return;
    char problem[256];
    snprintf(problem, sizeof problem, "did not finish within %.0f s: another rank has died or hangs "
             "(--nccl-timeout sets the limit)", comm_timeout);
    comm_abort_and_exit(what, problem);
}

// Waits until the communicator has finished setting up the last call.
static void comm_settle(const char* what) {
    double deadline = wall_seconds() + comm_timeout;
    while (comm_in_progress(what)) {
        check_deadline(deadline, what);
        usleep(100);
    }
}

// The collective's stream waits for the work queued so far.
static void comm_begin(void) {
    cudaCheck(cudaEventRecord(work_queued, 0));
    cudaCheck(cudaStreamWaitEvent(comm_stream, work_queued, 0));
}

// Waits for the collective just queued to complete.
static void comm_finish(const char* what) {
    comm_settle(what);
    cudaCheck(cudaEventRecord(comm_done, comm_stream));
    double deadline = wall_seconds() + comm_timeout;
    cudaError_t err;
    while ((err = cudaEventQuery(comm_done)) == cudaErrorNotReady) {
        comm_in_progress(what);
        check_deadline(deadline, what);
        usleep(20);
    }
    cudaCheck(err);
}

void comm_init(int rank, int world, const Rendezvous* rdv, double timeout_seconds) {
    comm_rank_ = rank;
    comm_world_ = world;
    comm_timeout = timeout_seconds;
    if (world == 1) return;
    ncclUniqueId id;
    if (rank == 0) ncclCheck(ncclGetUniqueId(&id), "creating the NCCL id");
    rendezvous_share(rdv, rank, world, &id, sizeof id, timeout_seconds);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclCheck(ncclCommInitRankConfig(&comm, world, id, rank, &config), "joining the other ranks");
    comm_settle("joining the other ranks (is every rank started?)");
    // Every rank has joined, so every rank has read the id.
    rendezvous_done(rdv, rank);
    cudaCheck(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&work_queued, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&comm_done, cudaEventDisableTiming));
    host_values_dev = (double*)dev_malloc(HOST_VALUES_MAX * sizeof(double), "NCCL staging");
}

void comm_free(void) {
    if (comm_world_ == 1) return;
    ncclCheck(ncclCommFinalize(comm), "closing the communicator");
    comm_settle("closing the communicator");
    ncclCommDestroy(comm);
    comm = NULL;
    dev_free(host_values_dev);
    cudaCheck(cudaEventDestroy(work_queued));
    cudaCheck(cudaEventDestroy(comm_done));
    cudaCheck(cudaStreamDestroy(comm_stream));
    comm_world_ = 1;
    comm_rank_ = 0;
}

int comm_rank(void) { return comm_rank_; }
int comm_world(void) { return comm_world_; }
const char* comm_name(void) { return comm_world_ > 1 ? "NCCL" : "one process"; }

static ncclDataType_t nccl_type(CommType type) {
    if (type == COMM_FLOAT) return ncclFloat;
    return sizeof(floatX) == 2 ? ncclBfloat16 : ncclFloat;
}

static size_t type_bytes(CommType type) { return type == COMM_FLOAT ? sizeof(float) : sizeof(floatX); }

void comm_allreduce_sum(void* buf, size_t count, CommType type) {
    if (comm_world_ == 1) return;
    comm_begin();
    ncclCheck(ncclAllReduce(buf, buf, count, nccl_type(type), ncclSum, comm, comm_stream), "all-reduce");
    comm_finish("all-reduce of the gradients");
}

void comm_reduce_scatter_sum(void* buf, size_t shard, CommType type) {
    if (comm_world_ == 1) return;
    comm_begin();
    char* mine = (char*)buf + comm_rank_ * shard * type_bytes(type);
    ncclCheck(ncclReduceScatter(buf, mine, shard, nccl_type(type), ncclSum, comm, comm_stream), "reduce-scatter");
    comm_finish("reduce-scatter of the gradients");
}

void comm_allgather(void* out, const void* shard_in, size_t shard, CommType type) {
    if (comm_world_ == 1) {
        if (out != shard_in) dev_copy(out, shard_in, shard * type_bytes(type));
        return;
    }
    comm_begin();
    ncclCheck(ncclAllGather(shard_in, out, shard, nccl_type(type), comm, comm_stream), "all-gather");
    comm_finish("all-gather of the weights");
}

// NCCL takes the group's calls as one operation. The pieces' sums are on comm_stream, which other
// collectives use too, so those queued after them also run after them.
void comm_sum_pieces_begin(void* buf, const CommPiece* pieces, int n, CommType type) {
    if (comm_world_ == 1 || n == 0) return;
    comm_begin();
    const size_t bytes = type_bytes(type);
    ncclCheck(ncclGroupStart(), "sums of gradients");
    for (int i = 0; i < n; i++) {
        char* at = (char*)buf + pieces[i].offset * bytes;
        if (pieces[i].root < 0)
            ncclCheck(ncclAllReduce(at, at, pieces[i].count, nccl_type(type), ncclSum, comm, comm_stream),
                      "all-reduce");
        else
            ncclCheck(ncclReduce(at, at, pieces[i].count, nccl_type(type), ncclSum, pieces[i].root, comm, comm_stream),
                      "reduce");
    }
    ncclCheck(ncclGroupEnd(), "sums of gradients");
    comm_settle("sums of gradients");
}

void comm_sums_wait(void) {
    if (comm_world_ == 1) return;
    comm_finish("sums of the gradients");
}

void comm_allreduce_host(double* values, int n, CommOp op) {
    if (comm_world_ == 1) return;
    if (n > HOST_VALUES_MAX) fatal("internal: comm_allreduce_host of %d values (at most %d)", n, HOST_VALUES_MAX);
    dev_upload(host_values_dev, values, n * sizeof(double));
    ncclRedOp_t nccl_op = op == COMM_SUM ? ncclSum : op == COMM_MIN ? ncclMin : ncclMax;
    comm_begin();
    ncclCheck(ncclAllReduce(host_values_dev, host_values_dev, n, ncclDouble, nccl_op, comm, comm_stream), "all-reduce");
    comm_finish("all-reduce of a few numbers");
    dev_download(values, host_values_dev, n * sizeof(double));
}
