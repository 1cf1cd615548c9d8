#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int error_set(ds4f_error *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int error_prefix(ds4f_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* Keep as much of both as fits; the inner cause is the end of the message. */
    size_t plen = strlen(prefix);
    if (plen > sizeof err->msg / 2) plen = sizeof err->msg / 2;
    memcpy(err->msg, prefix, plen);
    err->msg[plen] = ':';
    err->msg[plen + 1] = ' ';
    size_t room = sizeof err->msg - plen - 3, olen = strnlen(old, sizeof old - 1);
    if (olen > room) olen = room;
    memcpy(err->msg + plen + 2, old, olen);
    err->msg[plen + 2 + olen] = 0;
    return -1;
}
