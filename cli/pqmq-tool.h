/*
 * pqmq-tool.h: what the files of the pqmq command share (cli/pqmq.c holds
 * main, the common options and the connection; one cmd_*.c per group of
 * subcommands).
 *
 * Exit statuses: 0 success, 1 an error (one line on stderr says what), 2 a
 * usage error (bad option or argument).
 */
#ifndef PQMQ_TOOL_H
#define PQMQ_TOOL_H

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>

#include <getopt.h>

#include "pqmq.h"

enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2 };

/* The schema version the subcommands other than migrate need: this
 * release's, whose functions they call. */
#define TOOL_MIN_VERSION pqmq_schema_version()

typedef struct {
    const char *cmd;     /* the subcommand's name, for messages */
    const char *dsn;     /* --dsn, $PQMQ_DSN, $DATABASE_URL, or NULL: libpq's */
    const char *schema;  /* --schema, $PQMQ_SCHEMA, or NULL: search_path's */
    pqmq_client *client; /* after tool_connect */
    PGconn *conn;        /* borrowed from client */
    char *errbuf;        /* when set, tool_err and tool_usage also keep their */
    size_t errbuf_size;  /* last message here (pqmq serve answers with it) */
    int quiet;           /* tool_err and tool_usage keep the message, print nothing */
    int log_json;        /* lines as JSON objects (serve --log-format json) */
} tool;

/* log.c: one line for the operator on f: "pqmq CMD: message", or with
 * log_json a JSON object with time, level ("error", "warning", "info"), cmd
 * and msg. Safe from several threads. */
void tool_vlog(const tool *t, FILE *f, const char *level, const char *fmt, va_list ap);
void tool_log(const tool *t, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One line "pqmq CMD: message" on stderr. Return EXIT_ERR / EXIT_USAGE. */
int tool_err(const tool *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tool_usage(const tool *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The options every subcommand takes; add TOOL_COMMON_OPTS to a getopt_long
 * table and pass unknown option characters to tool_common_opt, which
 * returns 0 when it handled c, EXIT_USAGE otherwise (message printed). */
#define TOOL_OPT_SCHEMA 0x100
#define TOOL_COMMON_OPTS                                                                       \
    {"dsn", required_argument, NULL, 'd'},                                                     \
        {"schema", required_argument, NULL, TOOL_OPT_SCHEMA},                                  \
    {                                                                                          \
        "help", no_argument, NULL, 'h'                                                         \
    }
#define TOOL_COMMON_SHORT "d:h"
int tool_common_opt(tool *t, int c, const char *arg);
/* The lines of --help that describe the common options. */
extern const char tool_common_help[];

/* Connects and selects the schema (--schema, with tool_begin); then, unless
 * min_version is negative, checks that the schema holds a queue migrated at
 * least to min_version. Returns 0, or EXIT_ERR with the reason printed. */
int tool_connect(tool *t, int min_version);
/* With --schema, opens a transaction that selects the schema for itself
 * only (set_config(..., true)): a session setting would stay behind in a
 * pooled server connection (PgBouncer in transaction mode) for its next
 * client, and would not follow this one to the next. Does nothing without
 * --schema or in an open transaction. main ends the command's transaction
 * with tool_commit; a command that waits (watch, serve) ends it before it
 * waits and begins another after. 0 or EXIT_ERR (printed). */
int tool_begin(tool *t);
/* Commits the open transaction (rolls back a failed one); 0 or EXIT_ERR. */
int tool_commit(tool *t);
void tool_disconnect(tool *t);
/* The error for a --schema that current_schema() does not select: no
 * USAGE on it, or (followed by missing_hint, may be NULL) no such schema.
 * Returns EXIT_ERR (printed). */
int tool_schema_unusable(tool *t, const char *missing_hint);
/* The schema the queue lives in (after tool_connect). Caller frees. */
char *tool_current_schema(tool *t);

/* Runs sql with nparams text parameters. Returns the result (caller
 * PQclear's), or NULL with the server's message printed. */
PGresult *tool_query(tool *t, const char *sql, int nparams, const char *const *params);
/* The first line of a libpq or pqmq message, without its "ERROR:  "
 * prefix. Borrowed; valid until the next call. */
const char *tool_first_line(const char *msg);
/* A library error (pqmq_errmsg) as the command says it: its first line,
 * without the C call's name, "msgs[i]" as "message i+1", and pqmq_migrate
 * as 'pqmq migrate'. Borrowed; valid until the next call. */
const char *tool_lib_error(const char *msg);

/* A PostgreSQL text[] literal for names[0..n) (a parameter value, never
 * SQL text), or NULL for n == 0. Caller frees. */
char *tool_text_array(char *const *names, size_t n);
/* Parses a message id; returns 0 or EXIT_USAGE (message printed). */
int tool_parse_id(const tool *t, const char *text, uuid_t out);
/* Parses an integer option in min..max; 0, or EXIT_USAGE with the usage
 * error printed ("OPT: \"TEXT\" is not a whole number in MIN..MAX"). */
int tool_parse_range(const tool *t, const char *opt, const char *text, long long min,
                     long long max, long long *out);
/* tool_parse_range from 0. */
int tool_parse_int(const tool *t, const char *opt, const char *text, long long max,
                   long long *out);
/* -n N, how many rows: 1..PQMQ_MAX_BATCH. 0, or EXIT_USAGE with the usage
 * error printed. */
int tool_parse_rows(tool *t, const char *text, long long *out);

/* Output helpers (output.c). */
void out_json_str(FILE *f, const char *s, size_t len);
/* A label value as the Prometheus text format wants it. */
void out_prom_label(FILE *f, const char *s);
/* s for a terminal: control characters and backslashes escaped. */
void out_display(FILE *f, const char *s);
/* Number of display columns out_display uses for s. */
size_t out_display_width(const char *s);
int out_is_tty(FILE *f);
/* Whether stdout's reader has gone (a closed pipe: `pqmq ... | head`).
 * Writes then fail with EPIPE, SIGPIPE being ignored; main exits with the
 * command's own status, and a command that loops stops. */
int tool_output_closed(void);

/* Payloads (payload_out.c): prints a message's payload for people,
 * indented by indent spaces: JSON pretty-printed (pretty is the server's
 * jsonb_pretty text), msgpack decoded to JSON, other bytes as hex. */
void out_payload(FILE *f, const char *pretty_json, const void *bytes, size_t len, int indent);
/* Writes a msgpack object as JSON (pretty when indent >= 0). */
void out_msgpack_json(FILE *f, const msgpack_object *o, int indent);

/* The status figures of one channel (cmd_status.c), shared by status,
 * metrics and watch. */
typedef struct {
    char *channel;
    long long ready, in_flight, scheduled, uncommitted, waiting, dead, blocked;
    double oldest_ready_age;
    long long removed;
    int paused; /* the channel is paused (pqmq pause) */
} tool_figures;

/* Reads mq_metrics for the channels (n == 0: all). *out (caller frees with
 * tool_figures_free) holds *count rows. Returns 0 or EXIT_ERR. */
int tool_figures_read(tool *t, char *const *channels, size_t n, tool_figures **out,
                      size_t *count);
void tool_figures_free(tool_figures *f, size_t count);
/* Prints the table of status with a total row, and a REMOVED/S column
 * when rates (one per row) is not NULL. */
void tool_figures_table(FILE *f, const tool_figures *rows, size_t n, const double *rates);
/* The JSON object of 'status --json': {"channels": [...], "total": {...}}. */
void tool_figures_json(FILE *f, const tool_figures *rows, size_t n);
/* The Prometheus text of 'pqmq metrics' (cmd_metrics.c). With tty set,
 * channel names are escaped for a terminal (out_display) instead of for
 * the format, which lets control characters through. */
void tool_metrics_print(FILE *f, const tool_figures *rows, size_t n, int tty);
/* Fails (EXIT_ERR, printed) when a named channel is not among rows. */
int tool_figures_check_named(const tool *t, char *const *channels, size_t n,
                             const tool_figures *rows, size_t count);

/* The alert counters of one channel (mq_alert_metrics; cmd_metrics.c). */
#define TOOL_WAIT_BUCKETS_MAX 32
typedef struct {
    char *channel;
    long long failed, retried, dead, completed;
    double wait_sum;
    size_t nbuckets;                          /* finite bounds */
    double le[TOOL_WAIT_BUCKETS_MAX];         /* their upper bounds, seconds */
    long long buckets[TOOL_WAIT_BUCKETS_MAX]; /* cumulative counts */
    double last_completed;                    /* Unix seconds; 0: none yet */
} tool_alerts;

/* Reads mq_alert_metrics for the channels (n == 0: all) into *out (caller
 * frees with tool_alerts_free). Returns 0 or EXIT_ERR (printed). */
int tool_alerts_read(tool *t, char *const *channels, size_t n, tool_alerts **out,
                     size_t *count);
void tool_alerts_free(tool_alerts *a, size_t count);
/* The alert families of 'pqmq metrics' (counters, the time-in-queue
 * histogram, the last completion); tty: as for tool_metrics_print. */
void tool_alerts_print(FILE *f, const tool_alerts *rows, size_t n, int tty);

/* One runner of mq_workers (cmd_workers.c). */
typedef struct {
    long long id, jobs_done, jobs_failed;
    char *host, *version;
    char *channels;      /* for people: "a, b", or NULL: every channel */
    char *channels_json; /* a JSON array, or null */
    int pid, threads, in_flight, live;
    double started_at, last_seen, seen_ago; /* Unix seconds; seconds */
} tool_worker;

/* Reads mq_workers (a runner is gone after stale_after seconds without a
 * heartbeat; 0: the server's default, 30) into *out (caller frees with tool_workers_free).
 * Returns 0 or EXIT_ERR (printed). */
int tool_workers_read(tool *t, int stale_after, tool_worker **out, size_t *count);
void tool_workers_free(tool_worker *w, size_t count);
/* The runners as JSON: an array of objects. */
void tool_workers_json(FILE *f, const tool_worker *w, size_t n);
/* The pqmq_workers{state} gauge of 'pqmq metrics'. */
void tool_workers_metrics(FILE *f, const tool_worker *w, size_t n);

/* One message's story as a JSON object (mq_message; with with_payload,
 * "payload": mq_message_payload's preview of at most max_bytes), for show
 * --json and serve's /api/message (cmd_show.c). *out (caller frees) is
 * NULL when there is no such message. Returns 0 or EXIT_ERR (printed). */
int tool_message_json(tool *t, const char *id, int max_bytes, int with_payload, char **out);
/* Its query: $1 the id, $2 with_payload ("t" or "f"), $3 max_bytes; one
 * row of one text column, or none. */
extern const char tool_message_sql[];

/* The subcommands: argv[0] is the subcommand's name. */
int cmd_migrate(tool *t, int argc, char **argv);
int cmd_status(tool *t, int argc, char **argv);
int cmd_metrics(tool *t, int argc, char **argv);
int cmd_watch(tool *t, int argc, char **argv);
int cmd_peek(tool *t, int argc, char **argv);
int cmd_dead(tool *t, int argc, char **argv);
int cmd_retry(tool *t, int argc, char **argv);
int cmd_skip(tool *t, int argc, char **argv);
int cmd_purge(tool *t, int argc, char **argv);
int cmd_send(tool *t, int argc, char **argv);
int cmd_workers(tool *t, int argc, char **argv);
int cmd_pause(tool *t, int argc, char **argv);
int cmd_resume(tool *t, int argc, char **argv);
int cmd_show(tool *t, int argc, char **argv);
/* cmd_serve.c, or serve_missing.c when built without libmicrohttpd. */
int cmd_serve(tool *t, int argc, char **argv);

#endif
