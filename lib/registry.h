/*
 * registry.h: a runner's entry in mq_workers (registry.c,
 * schema/workers.sql), which pqmq workers and serve's dashboard list. The
 * entry is for watching the runners: a failure to write it never stops a
 * runner, it is tried again at the next heartbeat.
 */
#ifndef PQMQ_REGISTRY_H
#define PQMQ_REGISTRY_H

#include "workers.h"

/* Milliseconds between heartbeats (pqmq workers counts a runner gone after
 * 30 s without one, by default). */
#define PQMQ__BEAT_MS 5000

typedef struct {
    long long id;    /* mq_workers.id; 0: not registered */
    int64_t beat_at; /* when the next heartbeat is due (pqmq__now_ms) */
    char *const *channels;
    size_t nchannels; /* 0: every channel */
    int threads;
} pqmq__registry;

/* Registers the runner on c (channels: borrowed for the registry's life). */
void pqmq__registry_join(pqmq__registry *g, pqmq_client *c, char *const *channels,
                         size_t nchannels, int threads);
/* Heartbeats with the runner's counters when one is due (registering again
 * when the entry is missing). */
void pqmq__registry_beat(pqmq__registry *g, pqmq_client *c, const pqmq__counters *k);
/* Deletes the entry (a runner that stops). */
void pqmq__registry_leave(pqmq__registry *g, pqmq_client *c);

#endif
