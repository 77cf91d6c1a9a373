// Data parallelism across processes, the parts that need no GPU: which rank this process is, and
// the hand-over of rank 0's id (NCCL's unique id; without NCCL, rank 0's address) to the others
// through a file in a directory that all ranks share (the TCP hand-over is in common/rendezvous.h,
// which chooses between the two). One process per GPU; each rank uses GPU local_rank. Nothing here
// needs MPI.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int rank;           // 0 .. world-1, across all nodes
    int world;          // number of processes
    int local_rank;     // index on this node: the GPU this rank uses
    const char* source; // which launcher's variables were used, for log messages
} DistEnv;

// Reads the rank from the first family of variables with any member set, in this order:
//   RANK / WORLD_SIZE / LOCAL_RANK                                           (torchrun, launch.sh)
//   OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK (mpirun)
//   SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID                              (srun)
// None set: rank 0 of 1. A family set only in part, a value that is not a non-negative integer,
// world < 1, rank >= world or local_rank >= world exits naming the variables and their values; so
// does a local rank beyond the node's count of ranks where the launcher gives it (LOCAL_WORLD_SIZE,
// OMPI_COMM_WORLD_LOCAL_SIZE; both optional), or such a count above the world.
DistEnv dist_env_detect(void);

// A name for this launch, the same on every rank and different for every launch, so that an id
// file left over from an earlier run is never read: GPT_RUN_ID (launch.sh sets it), else
// TORCHELASTIC_RUN_ID (unless torchrun's default "none"), else SLURM_JOB_ID.SLURM_STEP_ID, else
// OMPI_MCA_ess_base_jobid; else "single" for a run of one process, and an error asking for
// GPT_RUN_ID when there are several. Characters other than [A-Za-z0-9._-] become '_'.
const char* dist_run_tag(void);
// The same tag where a launcher names the run, else "" (the TCP rendezvous needs no run id).
const char* dist_run_tag_if_any(void);

// Rank 0: writes the n-byte id to DIR/rank0_id_<run_tag>.bin atomically (temporary file, fsync,
// rename), so a reader never sees part of it.
void dist_publish_id(const char* dir, const char* run_tag, const void* id, size_t n);
// Other ranks: polls for that file and reads the n bytes; exits with a message naming the file
// and the directory after timeout_seconds without it, or if it does not hold exactly n bytes.
void dist_wait_id(const char* dir, const char* run_tag, void* id, size_t n, double timeout_seconds);
// Rank 0, once every rank has read the id (after the communicator is set up): removes the file.
void dist_cleanup_id(const char* dir, const char* run_tag);

#ifdef __cplusplus
}
#endif
