// Atomic file replacement: every write goes to a temporary file in the same directory, is flushed
// and fsynced, then renamed over the final name, so a crash or kill never leaves a broken file under
// a final name; a failed write (full disk, unwritable directory) removes the temporary file and exits
// with a message naming the path.
#pragma once
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    FILE* f;
    char final_path[4096];
    char tmp_path[4096];
} AtomicFile;
// Opens "<path>.tmp.<pid>" for writing; exits naming the directory if it cannot.
void atomic_open(AtomicFile* af, const char* path);
// Writes bytes; on failure removes the temporary file and exits naming the path.
void atomic_write(AtomicFile* af, const void* src, size_t bytes);
// Moves the write position to offset bytes from the start (to fill in a header written last); on
// failure removes the temporary file and exits naming the path.
void atomic_seek(AtomicFile* af, long long offset);
// fflush + fsync + close + rename (+ fsync of the directory); on failure removes the temporary file
// and exits naming the path.
void atomic_commit(AtomicFile* af);
// Closes and removes the temporary file, leaving the final path untouched: for a write given up
// because of a problem elsewhere. Harmless after a commit or a failure (nothing left to remove).
void atomic_discard(AtomicFile* af);

#ifdef __cplusplus
}
#endif
