/*
 * options.h: the options of a run and the shape of the messages it moves.
 */
#ifndef PQMQ_BENCH_OPTIONS_H
#define PQMQ_BENCH_OPTIONS_H

#define BENCH_SCHEMA "pqmq_bench"
#define BENCH_CHANNEL "bench"  /* every message's channel; args tell chains apart */
#define BENCH_LATENCY_WARMUP 5 /* latency messages sent before measuring */

struct opts {
    const char *dsn;        /* as given; NULL: libpq's environment */
    char *conninfo;         /* dsn plus search_path: every connection uses it */
    const char *listen_dsn; /* runners LISTEN here (pqmq_runner_set_listen_dsn) */
    int messages, producers, consumers, batch, channels, chains;
    int priorities; /* levels of the priorities phase and --backlog case; 0: none */
    double ordered; /* fraction of messages on ordered chains */
    int payload_bytes;
    int runner_threads; /* worker threads per runner; 0: derived */
    int latency_samples;
    int latency_gap_ms;
    int json, floor, backlog, profile;
    int rounds;            /* --rounds: rate phases run this often, interleaved */
    int once_only;         /* --exactly-once: only the exactly-once phases */
    int split_complete;    /* poll API: pqmq_poll + pqmq_complete_batch */
    const char *sweep;     /* "consumers=1,2,4" or NULL */
    const char *sweep_out; /* file name prefix of the sweep's CSV and PNG */
    int rate;              /* --rate: offered messages/s; 0: not a load run */
    int duration;          /* --duration: seconds of a --rate run (0: the mode's default) */
    int held_xmin;         /* --held-xmin: seconds of each of the three phases */
    int steady;            /* --steady: --rate is half the burn-down rate (steady.c) */
    double burn_down;      /* --steady: the measured burn-down, messages/s; 0: none */
    int repeat;            /* --repeat: the whole default run this often (repeat.c) */
};

/* Which messages a phase moves: message seq goes to chain/channel
 * seq % channels, and is ordered per the fraction. */
struct shape {
    int channels;
    double ordered;
    int priorities; /* message seq gets priority seq % priorities; 0: none */
};

/* Batches per call of the pipelined enqueue (pqmq_insert_batches). */
#define BENCH_PIPELINE 10

#endif
