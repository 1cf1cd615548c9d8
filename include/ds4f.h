/* ds4f — DeepSeek-V4-Flash on an ordinary computer.
 *
 * The narrow public interface: open a checkpoint, create a session (one sequence with its decode
 * state), feed tokens, read logits. The CLI and the HTTP server use only this header. */
#ifndef DS4F_H
#define DS4F_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every fallible call returns 0 on success, -1 on failure with one sentence in msg. */
typedef struct ds4f_error {
    char msg[1024];
} ds4f_error;

#ifdef __cplusplus
}
#endif
#endif
