/*
 * progress.c: a one-line progress bar on stderr, redrawn ten times a second
 * by its own thread, shown only when stderr is a terminal; and the timed
 * phases that show it (bench_timed_threads).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "progress.h"
#include "util.h"

static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int running, stop;
    const char *label;
    long total;
    const atomic_long *done;
    double t0;
} P = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void draw(void)
{
    enum { WIDTH = 30 };
    long done = atomic_load(P.done);
    if (done > P.total)
        done = P.total;
    int fill = P.total > 0 ? (int)(WIDTH * done / P.total) : 0;
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r\033[K  %-34s [%s] %ld/%ld  %.1fs", P.label, bar, done, P.total,
            now_s() - P.t0);
    fflush(stderr);
}

static void *progress_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&P.lock);
    while (!P.stop) {
        draw();
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&P.cond, &P.lock, &until);
    }
    pthread_mutex_unlock(&P.lock);
    return NULL;
}

void progress_begin(const char *label, long total, const atomic_long *done)
{
    progress_end();
    if (!isatty(STDERR_FILENO))
        return;
    die_first(progress_end); /* an error message starts on a clean line */
    P.label = label;
    P.total = total;
    P.done = done;
    P.t0 = now_s();
    P.stop = 0;
    if (pthread_create(&P.thread, NULL, progress_main, NULL) == 0)
        P.running = 1;
}

void progress_end(void)
{
    if (!P.running || pthread_equal(P.thread, pthread_self()))
        return;
    pthread_mutex_lock(&P.lock);
    P.stop = 1;
    pthread_cond_signal(&P.cond);
    pthread_mutex_unlock(&P.lock);
    pthread_join(P.thread, NULL);
    P.running = 0;
    fputs("\r\033[K", stderr);
    fflush(stderr);
}

double bench_timed_threads(int n, void *(*fn)(void *), void *args, size_t arg_size,
                           pthread_barrier_t *start, const char *label, long total,
                           const atomic_long *done)
{
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!th)
        die("out of memory");
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, fn, (char *)args + (size_t)i * arg_size))
            die("cannot start a thread");
    pthread_barrier_wait(start);
    double t0 = now_s();
    progress_begin(label, total, done);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    double t = now_s() - t0;
    progress_end();
    free(th);
    return t;
}
