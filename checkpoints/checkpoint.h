// Model files (llm.c-compatible), the training state for a bit-exact resume, and the checkpoint
// directory. Every file is written atomically (common/atomic_file.h): a crash or kill never leaves
// a broken file under a final name.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/atomic_file.h"
#include "common/loader_state.h"
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- model file --------------------------------------------------------------------------
// Header of 256 int32: [0] 20240326, [1] 3 (fp32) or 5 (bf16), [2] maxT, [3] V, [4] L, [5] NH,
// [6] C, [7] Vp, [8..25] checksums (zero in llm.c's files); then the parameters in the order of
// model/config.h.
#define MODEL_FILE_MAGIC 20240326
#define MODEL_FILE_VERSION_FP32 3
#define MODEL_FILE_VERSION_BF16 5
// Header slot [8] of a file with checksums ("CRCC"); see checkpoints/model_file.c.
#define MODEL_FILE_CRC_MARK 0x43435243
// Checks a header against the file size. Returns 0 and fills cfg and *version, or -1 with a message
// in err. Never exits (the fuzz harness calls it).
int model_file_parse_header(const int32_t header[256], long long file_bytes, GPT2Config* cfg,
                            int* version, char* err, size_t errlen);
// Reads a model file (fp32 or bf16) into a malloc'd fp32 array of *nparams values; exits naming
// the file on any problem (missing, truncated, wrong magic or version, impossible sizes), and the
// tensor on a checksum mismatch or a non-finite value.
float* model_file_read(const char* path, GPT2Config* cfg, size_t* nparams);
// Writes an fp32 model file atomically, with checksums.
void model_file_write(const char* path, const GPT2Config* cfg, const float* params);
// The CRC-32C of each parameter tensor's part of values, which hold parameters [offset, offset + count)
// (a tensor with no part there gets 0): the model file's and the training state's checksums.
void checkpoint_tensor_crcs(const GPT2Config* cfg, const float* values, size_t offset, size_t count,
                            uint32_t crc[NUM_PARAMETER_TENSORS]);

// ---- training state ----------------------------------------------------------------------
#define TRAIN_STATE_MAGIC 0x54504754 // "TGPT" little endian
#define TRAIN_STATE_VERSION 4 // 3: checksums; 4: loss scaling; 2 and 3 are still read (see checkpoints/train_state.c)
#define TRAIN_STATE_HEADER_INTS 64
// What the divergence guard of train.c remembers: the loss and gradient norm of the last `count`
// steps whose update was applied, oldest first; the window of the z-scores of --skip-loss-z and
// --skip-norm-z (llm.c's outlier detector keeps 128 too).
#define STEP_HISTORY 128
typedef struct {
    int32_t count;
    float loss[STEP_HISTORY];
    float norm[STEP_HISTORY];
} StepHistory;
typedef struct {
    GPT2Config config;
    int64_t step;            // training steps completed, applied or skipped
    int64_t updates;         // of which applied: AdamW's t of the last update
    int64_t last_applied;    // the step whose update was applied last (0: none yet); the steps after
                             // it were skipped, step - last_applied of them in a row
    StepHistory history;
    // --loss-scale dynamic (0, 0, 0 when off, and in states of versions 2 and 3): the scale, a power
    // of two in [1, 2^24]; the applied steps since it last changed (it doubles after
    // --loss-scale-growth of them); the overflow skips since last_applied, which --max-skips ignores
    double loss_scale;
    int64_t scale_clean_steps;
    int64_t overflow_skips;
    uint64_t sample_rng;     // state of the sampler's RNG
    int32_t rank, world;
    DataLoaderState loader;  // the training loader's position
    size_t nparams;          // parameters of the whole model
    // master weights and AdamW moments cover parameters [opt_offset, opt_offset + opt_count): the
    // whole model (0, nparams) without ZeRO, this rank's shard with it.
    size_t opt_offset, opt_count;
    float* master;
    float* m;
    float* v;
} TrainState;
void train_state_write(const char* path, const TrainState* st);
// Checks a state header against the file size. Returns 0 and fills every field of st but the
// history values and the arrays, or -1 with a message in err. Never exits (the fuzz harness calls it).
int train_state_parse_header(const int64_t header[TRAIN_STATE_HEADER_INTS], long long file_bytes,
                             TrainState* st, char* err, size_t errlen);
// Reads a state file, allocating master, m and v. Returns 0, or -1 with the problem in err (missing,
// truncated, wrong magic or version, inconsistent sizes or history, a checksum mismatch or a
// non-finite value, naming the tensor) and nothing allocated.
int train_state_load(const char* path, TrainState* st, char* err, size_t errlen);
// The same from an open stream of `bytes` bytes (the fuzz harness reads from memory).
int train_state_load_stream(FILE* f, long long bytes, TrainState* st, char* err, size_t errlen);
// train_state_load, exiting with a message naming the file on any problem.
void train_state_read(const char* path, TrainState* st);
void train_state_free(TrainState* st);

// ---- checkpoint directory ----------------------------------------------------------------
// DIR/model_%08lld.bin and DIR/state_%08lld_%05d.bin (step, rank).
void checkpoint_model_path(char* buf, size_t n, const char* dir, long long step);
void checkpoint_state_path(char* buf, size_t n, const char* dir, long long step, int rank);
// Largest step with a complete state file for this rank (rank < 0: a model file) in dir, or -1 if
// none (temporary files of interrupted writes are ignored).
long long checkpoint_latest_step(const char* dir, int rank);
// Deletes this rank's state files (and, on rank 0, model files) of all but the `keep` newest steps
// (keep <= 0 keeps everything), and the temporary files that killed writes of them left behind. The
// newest checkpoint of a step before `confirmed_before` is kept in any case: a later training step
// on its weights was applied, so it is the newest checkpoint known to be good.
void checkpoint_prune(const char* dir, int rank, int keep, long long confirmed_before);
// Renames this rank's state files (and, on rank 0, model files) of steps >= from_step to
// "<name>.diverged", so that resuming and pruning no longer see them, and returns how many
// checkpoints (state files) it renamed.
int checkpoint_set_aside(const char* dir, int rank, long long from_step);
// The same, renaming to "<name>.<suffix>" (set_aside uses "diverged").
int checkpoint_set_aside_as(const char* dir, int rank, long long from_step, const char* suffix);
// Makes the existing directory dir this rank's for the life of the process: locks DIR/lock_RRRRR
// (flock; a second run is refused at once, naming the directory and the holder's pid). Without
// resume, a directory holding an earlier run's files (log.csv, checkpoints, their temporary and
// set-aside files) is refused, unless overwrite, which deletes them first; so pruning (--keep) and
// resuming only ever see this run's files. Exits with a message on any problem.
void checkpoint_dir_claim(const char* dir, int rank, int resume, int overwrite);

#ifdef __cplusplus
}
#endif
