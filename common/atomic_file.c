// Atomic file replacement: write "<path>.tmp.<pid>" in the same directory (so the rename stays on
// one file system), make its contents durable, rename it over <path>, then make the rename durable
// by syncing the directory. A reader sees either the old file or the complete new one.
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "common/atomic_file.h"

// Removes the temporary file and exits; the previous file at the final path is left untouched.
static void __attribute__((noreturn)) abandon(AtomicFile* af, const char* what, int error) {
    atomic_discard(af);
    unlink(af->tmp_path); // also when the file was already closed (a failed close)
    fatal("cannot write %s: %s: %s", af->final_path, what, strerror(error));
}

void atomic_open(AtomicFile* af, const char* path) {
    int n = snprintf(af->final_path, sizeof(af->final_path), "%s", path);
    int m = snprintf(af->tmp_path, sizeof(af->tmp_path), "%s.tmp.%d", path, (int)getpid());
    if (n < 0 || m < 0 || (size_t)m >= sizeof(af->tmp_path))
        fatal("cannot write %s: the path is too long", path);
    af->f = fopen(af->tmp_path, "wb");
    if (!af->f) {
        int error = errno;
        char buf[sizeof(af->final_path)];
        memcpy(buf, af->final_path, sizeof(buf));
        fatal("cannot write %s: cannot create a file in directory %s: %s", path, dirname(buf),
              strerror(error));
    }
}

void atomic_write(AtomicFile* af, const void* src, size_t bytes) {
    if (fwrite(src, 1, bytes, af->f) != bytes) abandon(af, "write failed", errno);
}

void atomic_discard(AtomicFile* af) {
    if (!af->f) return; // committed, or already removed
    fclose(af->f);
    af->f = NULL;
    unlink(af->tmp_path);
}

void atomic_seek(AtomicFile* af, long long offset) {
    if (fseeko(af->f, (off_t)offset, SEEK_SET) != 0) abandon(af, "seek failed", errno);
}

void atomic_commit(AtomicFile* af) {
    if (fflush(af->f) != 0) abandon(af, "write failed", errno);
    if (fsync(fileno(af->f)) != 0) abandon(af, "fsync failed", errno);
    int closed = fclose(af->f);
    af->f = NULL;
    if (closed != 0) abandon(af, "close failed", errno);
    if (rename(af->tmp_path, af->final_path) != 0) abandon(af, "rename of the temporary file failed", errno);

    char buf[sizeof(af->final_path)];
    memcpy(buf, af->final_path, sizeof(buf));
    const char* dir = dirname(buf);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) fatal("cannot sync directory %s after writing %s: %s", dir, af->final_path, strerror(errno));
    // Some file systems cannot sync a directory (EINVAL); the rename is then as durable as they allow.
    if (fsync(fd) != 0 && errno != EINVAL)
        fatal("cannot sync directory %s after writing %s: %s", dir, af->final_path, strerror(errno));
    close(fd);
}
