#include "base/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int file_pread_exact(int fd, void *dst, size_t bytes, uint64_t offset, const char *path, ds4f_error *err) {
    uint8_t *p = dst;
    size_t done = 0;
    while (done < bytes) {
        ssize_t n = pread(fd, p + done, bytes - done, (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return error_set(err, "%s: read of %zu bytes at offset %llu failed: %s", path, bytes,
                             (unsigned long long)(offset + done), strerror(errno));
        }
        if (n == 0)
            return error_set(err, "%s: short read at offset %llu: wanted %zu bytes, file ends after %zu",
                             path, (unsigned long long)(offset + done), bytes, done);
        done += (size_t)n;
    }
    return 0;
}

int file_write_exact(int fd, const void *src, size_t bytes, const char *path, ds4f_error *err) {
    const uint8_t *p = src;
    size_t done = 0;
    while (done < bytes) {
        ssize_t n = write(fd, p + done, bytes - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return error_set(err, "%s: write of %zu bytes failed: %s", path, bytes, strerror(errno));
        }
        done += (size_t)n;
    }
    return 0;
}

int file_size(int fd, uint64_t *out, const char *path, ds4f_error *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) return error_set(err, "%s: stat failed: %s", path, strerror(errno));
    *out = (uint64_t)st.st_size;
    return 0;
}

int file_read_all(const char *path, char **out, size_t *out_len, ds4f_error *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    uint64_t size;
    if (file_size(fd, &size, path, err) != 0) { close(fd); return -1; }
    char *buf = malloc(size + 1);
    if (!buf) { close(fd); return error_set(err, "%s: out of memory reading %llu bytes", path, (unsigned long long)size); }
    if (file_pread_exact(fd, buf, size, 0, path, err) != 0) { free(buf); close(fd); return -1; }
    close(fd);
    buf[size] = 0;
    *out = buf;
    if (out_len) *out_len = size;
    return 0;
}

int file_write_all(const char *path, const void *data, size_t len, ds4f_error *err) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return error_set(err, "%s: cannot create: %s", tmp, strerror(errno));
    if (file_write_exact(fd, data, len, tmp, err) != 0) { close(fd); unlink(tmp); return -1; }
    if (close(fd) != 0) { unlink(tmp); return error_set(err, "%s: close failed: %s", tmp, strerror(errno)); }
    if (rename(tmp, path) != 0) { unlink(tmp); return error_set(err, "%s: rename failed: %s", path, strerror(errno)); }
    return 0;
}

void path_join(char *out, size_t out_size, const char *dir, const char *name) {
    size_t n = strlen(dir);
    if (n > 0 && dir[n - 1] == '/') snprintf(out, out_size, "%s%s", dir, name);
    else snprintf(out, out_size, "%s/%s", dir, name);
}

int dir_create(const char *path, ds4f_error *err) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return error_set(err, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return error_set(err, "%s: cannot create directory: %s", buf, strerror(errno));
    return 0;
}
