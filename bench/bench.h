/*
 * bench.h: what the files of pqmq-bench share. Nothing here is pqmq API.
 *
 *   bench.c     options, the order of the phases, --sweep
 *   util.c      clock, errors, connections, payloads, percentiles, memory
 *   progress.c  the progress bar on a terminal
 *   queue.c     pqmq phases: enqueue, runner and poll-API processing, latency
 *   floor.c     the SQL floor: the cheapest insert and drain of the same work
 *   once.c      exactly-once processing: a result row committed with each completion
 *   load.c      --rate and --held-xmin: offered load, a held snapshot, phases
 *   hist.c      a lock-free latency histogram of fixed size
 *   backlog.c   --backlog: poll cost over a small and a large backlog
 *   profile.c   --profile: SQL function times and client CPU per phase
 *   report.c    text table, JSON, sweep CSV and plot
 */
#ifndef PQMQ_BENCH_H
#define PQMQ_BENCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <pqmq.h>

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
    int duration;          /* --duration: seconds of a --rate run */
    int held_xmin;         /* --held-xmin: seconds of each of the three phases */
};

/* Which messages a phase moves: message seq goes to chain/channel
 * seq % channels, and is ordered per the fraction. */
struct shape {
    int channels;
    double ordered;
    int priorities; /* message seq gets priority seq % priorities; 0: none */
};

struct latency {
    int n;                /* samples; 0: not measured */
    double p50, p99, max; /* milliseconds */
    /* The same messages' time split at the producer's return from
     * pqmq_insert (its insert and commit), the rest being the runner's
     * (notification, claim and its commit, handoff): p50 and p99 of each
     * part, 0 when not measured (the percentiles of the parts need not add
     * up to the whole's). */
    double insert_p50, insert_p99, runner_p50, runner_p99;
};

/* One scenario's rates in messages/s (0: not measured). */
/* Batches per call of the pipelined enqueue (pqmq_insert_batches). */
#define BENCH_PIPELINE 10

/* Physical cost per processed message (physical.c): WAL bytes and records,
 * updates of mq_msgs and the share of them that were HOT. */
struct physical {
    double wal_bytes, wal_records, updates, hot;
};

struct phys_snap {
    double wal_bytes, wal_records, updates, hot_updates;
};

struct rates {
    double enqueue, runner, poll;
    struct physical poll_cost;    /* of the poll API's drain */
    double enqueue_pipelined;     /* pqmq_insert_batches, BENCH_PIPELINE at a time */
    double locked, runner_locked; /* the locked lane: poll API, runner */
};

struct results {
    int runner_threads;
    struct rates main, ordered; /* ordered: every message on --chains chains */
    struct rates prio;          /* the main shape with --priorities priorities */
    double floor_insert, floor_drain, floor_drain_ctid;
    double floor_insert_pipelined;
    double once, floor_once;                /* exactly-once processing: pqmq, the floor's */
    double once_locked;                     /* exactly-once processing with the locked lane */
    double once_runner, once_runner_locked; /* the same with runners */
    struct latency idle, idle_ordered;
    long maxrss_kb;
};

/* ---- load runs (--rate, --held-xmin) ---- */

/* A table's statistics, summed over the tables of its name (see load.c). */
struct table_stats {
    long live, dead, bytes;
    long autovacuums, autoanalyzes; /* since the run started */
};

struct load_phase {
    const char *name; /* "run", or "before", "during", "after" the held snapshot */
    double seconds;
    long inserted, processed; /* in the phase */
    long backlog_end, backlog_max;
    struct latency poll;         /* every poll call; n: how many */
    struct table_stats stats[2]; /* the target's tables at the phase's end */
};

struct load_result {
    const char *target;    /* "pqmq" or "floor" */
    const char *tables[2]; /* names of stats[0] and stats[1]; NULL: none */
    int nphases;
    struct load_phase ph[3];
};

/*
 * One queue under load, for load.c: pqmq (queue.c) or the floor (floor.c).
 * Each producer and consumer thread opens its own state. produce inserts
 * the k messages seq first.. in one batch; consume makes one poll call and
 * returns how many messages it claimed (0: none ready), adding to
 * *completed those whose completion it committed; consumer_free settles
 * what the consumer still holds, likewise.
 */
struct load_ops {
    const char *name;
    const char *tables[2];
    void (*reset)(PGconn *admin);
    void *(*producer_new)(const struct opts *o, const struct shape *s);
    void (*produce)(void *p, long first, int k);
    void (*producer_free)(void *p);
    void *(*consumer_new)(const struct opts *o);
    int (*consume)(void *c, long *completed);
    void (*consumer_free)(void *c, long *completed);
};

#define HIST_SUB 32
#define HIST_BUCKETS (HIST_SUB + 40 * HIST_SUB)

struct hist {
    atomic_long count[HIST_BUCKETS];
    atomic_long max_us; /* since the last hist_take_max */
};

/* ---- util.c ---- */
double now_s(void);        /* monotonic seconds */
int64_t realtime_us(void); /* CLOCK_REALTIME microseconds */
void sleep_s(double s);
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* fn runs first when die is called (the progress bar clears its line). */
void die_first(void (*fn)(void));
/* dsn as key=value with our search_path (and, for --profile,
 * track_functions) added to its options. Caller frees. */
char *bench_conninfo(const char *dsn, int profile);
PGconn *bench_connect(const struct opts *o);
pqmq_client *bench_client(const struct opts *o);

void bench_sql(PGconn *conn, const char *sql);
long bench_scalar(PGconn *conn, const char *sql);
/* Is message seq on an ordered chain? Spreads the fraction evenly. */
int shape_ordered(const struct shape *s, long seq);
/* Writes a JSON object {"seq":..,"ts":..,"pad":".."} of about `bytes`
 * bytes (at least what seq and ts need) into buf; returns its length. */
int bench_payload(char *buf, size_t cap, long seq, int64_t ts, int bytes);
size_t bench_payload_cap(int bytes);
/* Sorts v[0..n) and fills p50/p99/max (inputs and outputs in ms). */
void latency_summary(double *v, int n, struct latency *out);
long maxrss_kb(void);
/* The worker threads per runner that the server's free connections allow
 * for `consumers` runners, at most batch. */
int derive_runner_threads(PGconn *admin, int consumers, int batch);

/* ---- hist.c ---- */
/* h starts zeroed. Any thread may add; one monitor snaps and takes max. */
void hist_add(struct hist *h, double ms);
double hist_take_max(struct hist *h); /* ms; resets it to 0 */
void hist_snap(struct hist *h, long *out /* [HIST_BUCKETS] */);
/* p50/p99 of the samples in now minus before (before NULL: none), max as
 * given. */
void hist_summary(const long *now, const long *before, double max_ms, struct latency *out);

/* ---- progress.c ---- */
/* Shows label and done/total on stderr until progress_end (only when stderr
 * is a terminal). done is read, never written. */
void progress_begin(const char *label, long total, const atomic_long *done);
void progress_end(void);
/* Runs fn on each of the n argument structs at args (arg_size bytes apart)
 * in a thread of its own. Each thread connects, then waits on start, a
 * barrier for n + 1; the clock starts when all have arrived and stops when
 * all have returned. Shows progress of *done out of total under label.
 * Returns the seconds. */
double bench_timed_threads(int n, void *(*fn)(void *), void *args, size_t arg_size,
                           pthread_barrier_t *start, const char *label, long total,
                           const atomic_long *done);

/* ---- queue.c ---- */
void queue_setup(PGconn *admin, const struct opts *o);
void queue_reset(PGconn *admin);
double queue_enqueue(const struct opts *o, const struct shape *s, const char *label);
/* The same with pqmq_insert_batches, BENCH_PIPELINE batches a call. */
double queue_enqueue_pipelined(const struct opts *o, const struct shape *s, const char *label);
double queue_drain_runner(const struct opts *o, int threads, const char *label);
/* The same, on the locked lane (pqmq_runner_set_locked) or not, and with
 * record set, each handler writes its bench_results row in the job's
 * transaction (exactly-once, see once.c). */
double queue_drain_runner_with(const struct opts *o, int threads, const char *label, int locked,
                               int record);
double queue_drain_poll(const struct opts *o, const char *label);
/* The same with the locked lane (pqmq_poll_locked, one transaction a batch). */
double queue_drain_locked(const struct opts *o, const char *label);
void queue_latency(const struct opts *o, int ordered, struct latency *out);
/* Fills msgs[0..k) with new messages seq first.. of shape s; json is a
 * buffer of bench_payload_cap bytes. */
void queue_fill_batch(const struct opts *o, const struct shape *s, long first, int k,
                      pqmq_msg **msgs, char *json);
extern const struct load_ops queue_load_ops;

/* ---- floor.c ---- */
void floor_setup(PGconn *admin);
double floor_insert(const struct opts *o, PGconn *admin);
/* The same, each producer sending BENCH_PIPELINE batches at a time in one
 * round trip (libpq pipeline mode), each its own transaction. */
double floor_insert_pipelined(const struct opts *o, PGconn *admin);
/* by_ctid 0: the DELETE ... WHERE id IN (...); 1: by ctid. */
double floor_drain(const struct opts *o, PGconn *admin, int by_ctid);
/* The floor's drain by id, as SQL with $1 the batch size. */
extern const char floor_drain_sql[];
extern const struct load_ops floor_load_ops;

/* ---- once.c ---- */
/* With --floor, after the poll-API phase: pqmq's and the floor's rate of
 * exactly-once processing (messages/s). */
void once_setup(PGconn *admin);
void run_once(const struct opts *o, PGconn *admin, int threads, struct results *r);

/* ---- load.c ---- */
/* --rate and/or --held-xmin: runs pqmq (and with --floor the floor) under
 * load and prints the report. */
void run_load(const struct opts *o, PGconn *admin);

/* ---- profile.c ---- */
/* With --profile: per-phase SQL function times and the bench's CPU time,
 * printed to stderr by profile_end. No-ops otherwise. */
void profile_begin(const struct opts *o, PGconn *admin);
/* messages: how many the phase moved (0: no per-message cost). */
void profile_end(const struct opts *o, PGconn *admin, const char *label, long messages);

/* ---- backlog.c ---- */
void run_backlog(const struct opts *o, PGconn *admin);

/* physical.c */
void physical_begin(PGconn *admin, struct phys_snap *s);
void physical_end(PGconn *admin, const struct phys_snap *s, long messages,
                  struct physical *out);

/* ---- rounds.c ---- */
#define BENCH_MAX_ROUNDS 9
/* The median of v[0..n-1] (n in 1..BENCH_MAX_ROUNDS); v is left as it is. */
double median_of(const double *v, int n);
/* Each figure of out: the median of that figure over in[0..n-1]. */
void rates_median(const struct rates *in, int n, struct rates *out);

/* ---- report.c ---- */
void report_text(const struct opts *o, const struct results *r);
void report_json(const struct opts *o, const struct results *r);
/* The load run's summary of n targets (text or JSON per --json). */
void report_load(const struct opts *o, const struct load_result *r, int n);

struct sweep_row {
    int value;
    int runner_threads;
    struct rates rates;
    double floor_insert, floor_drain, floor_drain_ctid;
};
void report_sweep(const struct opts *o, const char *param, const struct sweep_row *rows, int n,
                  long maxrss);

#endif
