/* ds4f serve: the bounded FIFO of requests waiting for the one generator.
 *
 * One generation runs at a time (the model's decode state is one sequence); requests that arrive
 * meanwhile wait here in arrival order, at most `capacity` of them, so that a burst cannot pile
 * up unbounded work: one more is refused (HTTP 429) at once instead of waiting for minutes. The
 * items are opaque; the queue neither owns nor frees them. */
#ifndef DS4F_APP_SERVER_QUEUE_H
#define DS4F_APP_SERVER_QUEUE_H

#include <pthread.h>
#include <stdbool.h>

typedef struct server_queue {
    pthread_mutex_t mu;
    pthread_cond_t nonempty;
    void **items; /* ring of capacity + 1 */
    int capacity, head, count;
    bool running; /* the consumer holds an item (between pop and done) */
    bool closed;
} server_queue;

enum { SERVER_QUEUE_OK = 0, SERVER_QUEUE_FULL = -1, SERVER_QUEUE_CLOSED = -2 };

/* capacity: how many items may wait while the consumer works on one (0: none). -1 when memory
 * runs out. */
int server_queue_init(server_queue *q, int capacity);
void server_queue_destroy(server_queue *q);

/* Appends an item: SERVER_QUEUE_OK (and *ahead: how many come before it, the one being worked on
 * included), SERVER_QUEUE_FULL, or SERVER_QUEUE_CLOSED after server_queue_close. */
int server_queue_push(server_queue *q, void *item, int *ahead);
/* The oldest item, for the consumer to work on until server_queue_done; blocks while the queue
 * is empty and open. NULL once it is closed. */
void *server_queue_pop(server_queue *q);
void server_queue_done(server_queue *q);
/* Refuses later pushes and wakes every pop (which then returns NULL). Items still queued stay
 * for server_queue_take to hand back. */
void server_queue_close(server_queue *q);
/* Removes and returns the oldest item without waiting; NULL when empty. */
void *server_queue_take(server_queue *q);
int server_queue_waiting(server_queue *q);

#endif
