/*
 * fault.h: what the fault suite's helper programs (producer, plain_worker,
 * locked_worker) share. They link nothing but the library, so these are
 * static inline.
 */
#ifndef PQMQ_FAULT_H
#define PQMQ_FAULT_H

#include <signal.h>
#include <string.h>
#include <time.h>

/* SIGINT and SIGTERM call handler: how run-faults.sh asks for a clean
 * stop. */
static inline void fault_on_stop_signals(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* Sleeps ms; a signal cuts the pause short (we want to stop promptly). */
static inline void fault_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#endif
