/* File I/O that reports failures with the file name and byte offset (invariant 3: a failed or
 * short read names the file and offset, and nothing is used half-read). */
#ifndef DS4F_BASE_FILE_IO_H
#define DS4F_BASE_FILE_IO_H

#include <stddef.h>
#include <stdint.h>
#include "base/error.h"

/* Reads exactly `bytes` at `offset`; a short read (file too short) is an error. */
int file_pread_exact(int fd, void *dst, size_t bytes, uint64_t offset, const char *path, ds4f_error *err);
/* Writes exactly `bytes` at the current position. */
int file_write_exact(int fd, const void *src, size_t bytes, const char *path, ds4f_error *err);
/* Reads a whole (small) file into a NUL-terminated malloc'd buffer. */
int file_read_all(const char *path, char **out, size_t *out_len, ds4f_error *err);
/* Size of an open file. */
int file_size(int fd, uint64_t *out, const char *path, ds4f_error *err);
/* Writes a whole buffer to path (create/truncate), via a temporary name + rename so that a
 * failure never leaves a half-written file under the final name. */
int file_write_all(const char *path, const void *data, size_t len, ds4f_error *err);
/* Joins dir and name into out (always NUL-terminated). */
void path_join(char *out, size_t out_size, const char *dir, const char *name);
/* Creates a directory (and parents); succeeds if it exists. */
int dir_create(const char *path, ds4f_error *err);

#endif
