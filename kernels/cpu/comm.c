// Data parallelism for a single process: the CPU build, and a CUDA build made with NCCL=0. With one
// rank every collective is the identity (an all-gather copies the one shard into place).
#include "common/util.h"
#include "kernels/kernels.h"

void comm_init(int rank, int world, const struct Rendezvous* rdv, double timeout_seconds) {
    (void)rdv;
    (void)timeout_seconds;
    if (world != 1)
        fatal("rank %d of %d: this build runs one process only (the CPU build, or train_gpt made with "
              "NCCL=0); train on several GPUs with train_gpt built with NCCL", rank, world);
}

void comm_free(void) {}
int comm_rank(void) { return 0; }
int comm_world(void) { return 1; }
const char* comm_name(void) { return "one process"; }
void comm_allreduce_sum(void* buf, size_t count, CommType type) { (void)buf, (void)count, (void)type; }
void comm_reduce_scatter_sum(void* buf, size_t shard, CommType type) { (void)buf, (void)shard, (void)type; }

void comm_allgather(void* out, const void* shard_in, size_t shard, CommType type) {
    size_t bytes = shard * (type == COMM_FLOATX ? sizeof(floatX) : sizeof(float));
    if (out != shard_in) dev_copy(out, shard_in, bytes);
}

void comm_allreduce_host(double* values, int n, CommOp op) { (void)values, (void)n, (void)op; }
void comm_sum_pieces_begin(void* buf, const CommPiece* pieces, int n, CommType type) {
    (void)buf, (void)pieces, (void)n, (void)type;
}
void comm_sums_wait(void) {}
