/*
 * uuid.c: time-ordered ids in the UUIDv7 layout of RFC 9562.
 *
 *   bytes 0-5   Unix time in milliseconds, big-endian
 *   byte  6     version 7 (high nibble), then 4 bits of sub-millisecond time
 *   byte  7     8 more bits of sub-millisecond time
 *   byte  8     variant 0b10 (high bits), then random
 *   bytes 9-15  random
 *
 * The 60-bit timestamp (ms << 12 | fraction) only ever grows within a
 * process, so ids made later compare greater with memcmp, even within one
 * millisecond, across threads, and when the wall clock steps back.
 *
 * The random bits come from getrandom(2), 64 ids' worth per call, kept per
 * thread: libuuid's uuid_generate_random reseeds its fallback generator
 * with four system calls on every call, a large share of a producer's CPU.
 * libuuid remains the generator when getrandom fails.
 */
#include "pqmq.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* The last timestamp handed out; lock-free on every platform we target. */
static _Atomic uint64_t last_stamp;

/* The wall clock as ms << 12 | the millisecond's fraction in 12 bits. */
static uint64_t clock_stamp(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    uint64_t frac = (uint64_t)(ts.tv_nsec % 1000000) * 4096u / 1000000u;
    return ms << 12 | frac;
}

/* A timestamp strictly greater than every one returned before. */
static uint64_t next_stamp(void)
{
    uint64_t now = clock_stamp();
    uint64_t prev = atomic_load_explicit(&last_stamp, memory_order_relaxed);
    uint64_t next;
    do {
        /* Ahead of the clock (a burst, or the clock stepped back): count
         * on from the last one; the clock catches up. */
        next = now > prev ? now : prev + 1;
    } while (!atomic_compare_exchange_weak_explicit(
        &last_stamp, &prev, next, memory_order_relaxed, memory_order_relaxed));
    return next;
}

#define POOL_IDS 64

/* Random bytes not handed out yet, per thread. */
static _Thread_local struct {
    unsigned char bytes[POOL_IDS * 8];
    unsigned left;     /* ids' worth still unused */
    unsigned fork_gen; /* fork_gen when filled */
} pool;

/* Bumped in a forked child, so that it never reuses its parent's bytes. */
static atomic_uint fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void child_after_fork(void)
{
    atomic_fetch_add(&fork_gen, 1);
}

static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, child_after_fork);
}

/* Fills out[8..15] with random bits; 0, or -1 when getrandom failed. */
static int take_random(uuid_t out)
{
    pthread_once(&fork_once, watch_forks);
    unsigned gen = atomic_load(&fork_gen);
    if (pool.left == 0 || pool.fork_gen != gen) {
        if (getrandom(pool.bytes, sizeof pool.bytes, 0) != (ssize_t)sizeof pool.bytes)
            return -1;
        pool.left = POOL_IDS;
        pool.fork_gen = gen;
    }
    unsigned char *b = pool.bytes + 8 * --pool.left;
    memcpy(out + 8, b, 8);
    memset(b, 0, 8); /* used once */
    return 0;
}

PQMQ_EXPORT void pqmq_uuid_generate(uuid_t out)
{
    uint64_t stamp = next_stamp();
    uint64_t ms = stamp >> 12;
    unsigned frac = (unsigned)(stamp & 0xfff);

    if (take_random(out) != 0)
        uuid_generate_random(out);
    for (int i = 0; i < 6; i++)
        out[i] = (unsigned char)(ms >> (40 - 8 * i));
    out[6] = (unsigned char)(0x70 | frac >> 8);
    out[7] = (unsigned char)(frac & 0xff);
    out[8] = (unsigned char)(0x80 | (out[8] & 0x3f));
}
