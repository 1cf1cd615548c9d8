/* ds4f serve: bounded request queue (see server_queue.h). */
#include "app/server_queue.h"

#include <stdlib.h>

int server_queue_init(server_queue *q, int capacity) {
    q->capacity = capacity > 0 ? capacity : 0;
    q->head = q->count = 0;
    q->running = q->closed = false;
    q->items = calloc((size_t)q->capacity + 1, sizeof *q->items);
    if (!q->items) return -1;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->nonempty, NULL);
    return 0;
}

void server_queue_destroy(server_queue *q) {
    if (!q->items) return;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->nonempty);
    free(q->items);
    q->items = NULL;
}

int server_queue_push(server_queue *q, void *item, int *ahead) {
    pthread_mutex_lock(&q->mu);
    int rc = SERVER_QUEUE_OK;
    if (q->closed) rc = SERVER_QUEUE_CLOSED;
    /* The item being worked on counts too: when the consumer is idle, one more may come in. */
    else if (q->count + q->running >= q->capacity + 1) rc = SERVER_QUEUE_FULL;
    else {
        if (ahead) *ahead = q->count + q->running;
        q->items[(q->head + q->count) % (q->capacity + 1)] = item;
        q->count++;
        pthread_cond_signal(&q->nonempty);
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

static void *take_locked(server_queue *q) {
    if (q->count == 0) return NULL;
    void *item = q->items[q->head];
    q->head = (q->head + 1) % (q->capacity + 1);
    q->count--;
    return item;
}

void *server_queue_pop(server_queue *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->closed && q->count == 0) pthread_cond_wait(&q->nonempty, &q->mu);
    void *item = q->closed ? NULL : take_locked(q);
    if (item) q->running = true;
    pthread_mutex_unlock(&q->mu);
    return item;
}

void server_queue_done(server_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->running = false;
    pthread_mutex_unlock(&q->mu);
}

void server_queue_close(server_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->nonempty);
    pthread_mutex_unlock(&q->mu);
}

void *server_queue_take(server_queue *q) {
    pthread_mutex_lock(&q->mu);
    void *item = take_locked(q);
    pthread_mutex_unlock(&q->mu);
    return item;
}

int server_queue_waiting(server_queue *q) {
    pthread_mutex_lock(&q->mu);
    int n = q->count;
    pthread_mutex_unlock(&q->mu);
    return n;
}
