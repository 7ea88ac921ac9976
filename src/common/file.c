/* Atomic file writes: the bytes go to a new file in the target's directory, which is flushed, fsync'd and
 * renamed over the target, then the directory is fsync'd, so a reader (or a crash) sees the old file or the
 * complete new one, never a mix. Any failure (a full disk, RLIMIT_FSIZE, a short write) removes the
 * temporary file and leaves the target as it was; a full file system or a spent quota is named
 * (E8KV_ERROR_NO_SPACE), any other failure is E8KV_ERROR_IO. A target that is a symbolic link is written
 * through: its final target is replaced, the link stays. A target that exists and is not a regular file (a
 * character device such as /dev/null or a terminal, a FIFO) cannot be replaced and is written in place. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct e8kv_file_writer {
    int fd;
    size_t err; /* the first write's failure, returned again by later writes and by commit */
    size_t n_bytes;
    char *path;   /* the file replaced at commit (links resolved) */
    char *tmp;    /* "<path>.tmp.<pid>.<n>", removed unless renamed */
    int in_place; /* not a regular file: written directly, nothing to rename */
};

/* The error for a failed call that set errno: a full file system or a spent quota by name, else I/O. */
static size_t io_error(int e) {
    return e == ENOSPC || e == EDQUOT ? E8KV_ERR(NO_SPACE) : E8KV_ERR(IO);
}

static void writer_discard(e8kv_file_writer *w) {
    if (w->fd >= 0) close(w->fd);
    if (w->tmp) unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    free(w);
}

e8kv_file_writer *e8kv_file_writer_open(const char *path, size_t *err) {
    size_t e = 0;
    e8kv_file_writer *w = NULL;
    struct stat st;
    if (!path || !path[0]) {
        e = E8KV_ERR(BAD_ARGUMENT);
        goto fail;
    }
    w = calloc(1, sizeof *w);
    if (!w) {
        e = E8KV_ERR(OUT_OF_MEMORY);
        goto fail;
    }
    w->fd = -1;
    /* a symbolic link: write its final target (realpath), so the link is not replaced by a file */
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        w->path = realpath(path, NULL);
        if (!w->path) { /* a dangling link: refuse rather than replace the link */
            e = E8KV_ERR(IO);
            goto fail;
        }
    } else {
        const size_t n = strlen(path);
        w->path = malloc(n + 1);
        if (w->path) memcpy(w->path, path, n + 1);
    }
    if (!w->path || !(w->tmp = malloc(strlen(w->path) + 48))) {
        e = E8KV_ERR(OUT_OF_MEMORY);
        goto fail;
    }
    if (stat(w->path, &st) == 0 && S_ISDIR(st.st_mode)) {
        e = E8KV_ERR(IO);
        goto fail;
    }
    if (stat(w->path, &st) == 0 && !S_ISREG(st.st_mode)) { /* a device or FIFO: in place, no rename */
        free(w->tmp);
        w->tmp = NULL;
        w->fd = open(w->path, O_WRONLY | O_CLOEXEC);
        if (w->fd < 0) {
            e = E8KV_ERR(IO);
            goto fail;
        }
        w->in_place = 1;
        return w;
    }
    static unsigned counter; /* a name another writer of this process is not using; O_EXCL checks */
    for (int attempt = 0; attempt < 100 && w->fd < 0; attempt++) {
        snprintf(w->tmp, strlen(w->path) + 48, "%s.tmp.%ld.%u", w->path, (long)getpid(),
                 __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED));
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666); /* the umask applies */
        if (w->fd < 0 && errno != EEXIST) break;
    }
    if (w->fd < 0) {
        e = io_error(errno);
        free(w->tmp);
        w->tmp = NULL; /* nothing to remove */
        goto fail;
    }
    /* replacing a file keeps its permission bits */
    if (stat(w->path, &st) == 0 && fchmod(w->fd, st.st_mode & 07777) != 0) {
        e = E8KV_ERR(IO);
        goto fail;
    }
    return w;
fail:
    if (w) writer_discard(w);
    if (err) *err = e;
    return NULL;
}

size_t e8kv_file_writer_write(e8kv_file_writer *w, const void *src, size_t n) {
    if (!w || (!src && n)) return E8KV_ERR(BAD_ARGUMENT);
    if (w->fd < 0) return w->err ? w->err : E8KV_ERR(IO); /* an earlier write failed */
    const uint8_t *p = src;
    for (size_t done = 0; done < n;) {
        const size_t chunk = n - done < ((size_t)1 << 30) ? n - done : ((size_t)1 << 30);
        const ssize_t k = write(w->fd, p + done, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { /* the file is now incomplete: commit will refuse */
            w->err = k < 0 ? io_error(errno) : E8KV_ERR(IO);
            close(w->fd);
            w->fd = -1;
            return w->err;
        }
        done += (size_t)k;
    }
    w->n_bytes += n;
    return n;
}

size_t e8kv_file_writer_commit(e8kv_file_writer *w) {
    if (!w) return E8KV_ERR(BAD_ARGUMENT);
    size_t r = w->err ? w->err : E8KV_ERR(IO);
    if (w->in_place) {
        if (w->fd >= 0) {
            r = close(w->fd) == 0 ? w->n_bytes : io_error(errno);
            w->fd = -1;
        }
        writer_discard(w);
        return r;
    }
    /* a file system that allocates late (NFS, delayed allocation) reports a full disk at fsync or close */
    if (w->fd >= 0 && fsync(w->fd) != 0)
        r = io_error(errno);
    else if (w->fd >= 0) {
        const int c = close(w->fd);
        if (c != 0) r = io_error(errno);
        w->fd = -1;
        if (c == 0 && rename(w->tmp, w->path) == 0) {
            free(w->tmp);
            w->tmp = NULL; /* renamed: nothing to remove */
            r = w->n_bytes;
            /* make the rename itself durable; a failure here leaves the new file in place */
            char *slash = strrchr(w->path, '/');
            const char *dir = ".";
            if (slash == w->path)
                dir = "/";
            else if (slash)
                *slash = 0, dir = w->path;
            const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                if (fsync(dfd) != 0 && errno != EINVAL) r = E8KV_ERR(IO);
                close(dfd);
            }
        }
    }
    writer_discard(w);
    return r;
}

void e8kv_file_writer_abort(e8kv_file_writer *w) {
    if (w) writer_discard(w);
}

size_t e8kv_file_write(const char *path, const void *src, size_t n) {
    size_t err = 0;
    e8kv_file_writer *w = e8kv_file_writer_open(path, &err);
    if (!w) return err;
    const size_t r = e8kv_file_writer_write(w, src, n);
    if (e8kv_is_error(r)) {
        e8kv_file_writer_abort(w);
        return r;
    }
    return e8kv_file_writer_commit(w);
}

/* The whole of a regular file (e8kv_cache_read_file, include/e8kv.h): saved caches, calibrations. */
size_t e8kv_cache_read_file(void **dst, const char *path) {
    if (!dst || !path) return E8KV_ERR(BAD_ARGUMENT);
    *dst = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return E8KV_ERR(IO);
    /* Only a regular file has a size: fopen accepts a directory, whose "size" by seeking to its end is
     * 2^63 - 1 on ext4 (once answered as out of memory), and a FIFO or a device has none. */
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
        (uintmax_t)st.st_size >= SIZE_MAX) {
        fclose(f);
        return E8KV_ERR(IO);
    }
    const size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return E8KV_ERR(OUT_OF_MEMORY);
    }
    const size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return E8KV_ERR(IO);
    }
    *dst = buf;
    return got;
}
