/*
 * tests/faults/producer.c: a producer for the fault suite that remembers
 * exactly what the server acknowledged.
 *
 *   producer CONNINFO ID ACKED_FILE [options]
 *
 * Inserts batches of messages, each {"seq": N, "p": ID} with N counting up
 * from 1 in this process, until SIGTERM/SIGINT (or --max messages). Each
 * message goes, at random, to one of --chains ordered chains of its own
 * (channel PREFIXpIDcK, args "") or, unordered, to the shared channel
 * PREFIXloose. A chain belongs to one producer, so seq order is its
 * insertion order.
 *
 * Every message of a batch whose pqmq_insert returned 0 is written to
 * ACKED_FILE, one line each, flushed before the next batch:
 *     BATCH <tab> ID <tab> SEQ <tab> CHANNEL <tab> ORDERED(t|f|s) <tab> WHY
 * A batch whose outcome is unknown (the connection broke during the call)
 * goes to --doubt FILE in the same format; it may or may not exist, but it
 * must be all there or not there at all (WHY says how the call failed: see
 * write_batch; "-" elsewhere). The producer then reconnects with
 * pqmq_reconnect (short backoff, for up to --give-up seconds) and carries on
 * with new messages: an unknown batch is never sent again (its messages may
 * have been consumed already; sending them again would be a second message).
 * A batch the server refused (PQMQ_ESERVER, e.g. SQLSTATE 57014 or 55P03)
 * goes to --rejected FILE: it must not exist at all.
 *
 * Options:
 *   --batch N        messages per insert (default 10)
 *   --interval MS    pause between inserts (default 50)
 *   --chains N       ordered chains of this producer (default 4)
 *   --unordered PCT  share of unordered messages (default 25)
 *   --prefix S       channel name prefix (default "f")
 *   --hot CHANNEL    also put one ordered message on CHANNEL (args "") in
 *                    every batch (a chain shared by all producers; its
 *                    lines carry ORDERED "s": no seq order is implied)
 *   --max N          stop after about N acknowledged messages (0: no limit)
 *   --retries N      retries per message (default 30)
 *   --backoff MS     first lease and retry delay (default 250)
 *   --doubt FILE     where batches of unknown outcome go (default: none)
 *   --rejected FILE  where refused batches go (default: none)
 *   --give-up S      seconds without a connection before exiting 1 (60)
 *
 * At the end it prints one line on stdout:
 *   producer ID: acked A (B batches), doubt D (E batches), rejected R (S
 *   batches), lost connection L times (misreported M), reconnects K,
 *   sqlstates 57014:x ...
 * (misreported: lost connections that pqmq reported as PQMQ_ESERVER with no
 * SQLSTATE rather than PQMQ_ECONN; see connection_lost).
 * and exits 0 (1 when it could not reconnect in time, 2 on usage errors).
 * The first message of each kind of error is printed to stderr.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pqmq.h>

#include "fault.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Counts of refused batches by SQLSTATE (a few distinct ones at most). */
struct state_count {
    char state[6];
    long n;
};

static struct state_count states[16];
static int nstates;

/* Returns 1 the first time a state is seen. */
static int count_state(const char *state)
{
    for (int i = 0; i < nstates; i++)
        if (!strcmp(states[i].state, state)) {
            states[i].n++;
            return 0;
        }
    if (nstates < (int)(sizeof states / sizeof *states)) {
        snprintf(states[nstates].state, sizeof states[nstates].state, "%s", state);
        states[nstates++].n = 1;
    }
    return 1;
}

static FILE *open_out(const char *path)
{
    if (!path)
        return NULL;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "producer: cannot open %s: %s\n", path, strerror(errno));
        exit(2);
    }
    return f;
}

struct line {
    char id[37];
    long seq;
    char channel[128];
    char ordered; /* 't', 'f', or 's' (shared hot chain) */
};

/* why: '-' (acknowledged or refused), for a batch of unknown outcome 'c'
 * (PQMQ_ECONN), 's' (PQMQ_ESERVER with a connection-class SQLSTATE) or 'e'
 * (PQMQ_ESERVER without SQLSTATE: see connection_lost). */
static void write_batch(FILE *f, long batch, const struct line *lines, int n, char why)
{
    if (!f)
        return;
    for (int i = 0; i < n; i++)
        fprintf(f, "%ld\t%s\t%ld\t%s\t%c\t%c\n", batch, lines[i].id, lines[i].seq,
                lines[i].channel, lines[i].ordered, why);
    fflush(f);
}

/* A refusal from the server carries its SQLSTATE. PQMQ_ESERVER without one
 * is an error libpq made up itself, such as "server closed the connection
 * unexpectedly" (libpq 15 reports that with PQstatus still CONNECTION_OK,
 * after the server died while we were idle): the connection is gone and the
 * outcome unknown, whatever the code says. Counted apart ("misreported"). */
static long misreported;

/* Is this failure a lost connection rather than a refusal? A backend that
 * is terminated or shut down sends its FATAL error (class 57P) just before
 * it closes the socket; libpq may not have noticed the close yet. */
static int connection_lost(pqmq_client *c, int rc)
{
    if (rc == PQMQ_ECONN)
        return 1;
    if (rc != PQMQ_ESERVER)
        return 0;
    const char *st = pqmq_sqlstate(c);
    if (!st[0]) {
        if (misreported++ == 0)
            fprintf(stderr,
                    "producer: a lost connection reported as %s with no SQLSTATE: "
                    "\"%s\"\n",
                    pqmq_strerror(rc), pqmq_errmsg(c));
        return 1;
    }
    return !strncmp(st, "57P", 3) || !strncmp(st, "08", 2) ||
           PQstatus(pqmq_conn(c)) != CONNECTION_OK;
}

static void usage(void)
{
    fprintf(stderr, "usage: producer CONNINFO ID ACKED_FILE [--batch N] [--interval MS] "
                    "[--chains N] [--unordered PCT] [--prefix S] [--hot CHANNEL] [--max N] "
                    "[--retries N] [--backoff MS] [--doubt FILE] [--rejected FILE] "
                    "[--give-up S]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 4)
        usage();
    const char *conninfo = argv[1];
    int id = atoi(argv[2]);
    const char *acked_path = argv[3];
    int batch = 10, interval = 50, chains = 4, unordered = 25, retries = 30;
    long backoff = 250, max = 0, give_up = 60;
    const char *prefix = "f", *hot = NULL, *doubt_path = NULL, *rejected_path = NULL;
    for (int i = 4; i < argc; i++) {
        const char *opt = argv[i];
        if (i + 1 >= argc)
            usage();
        const char *val = argv[++i];
        if (!strcmp(opt, "--batch"))
            batch = atoi(val);
        else if (!strcmp(opt, "--interval"))
            interval = atoi(val);
        else if (!strcmp(opt, "--chains"))
            chains = atoi(val);
        else if (!strcmp(opt, "--unordered"))
            unordered = atoi(val);
        else if (!strcmp(opt, "--prefix"))
            prefix = val;
        else if (!strcmp(opt, "--hot"))
            hot = val;
        else if (!strcmp(opt, "--max"))
            max = atol(val);
        else if (!strcmp(opt, "--retries"))
            retries = atoi(val);
        else if (!strcmp(opt, "--backoff"))
            backoff = atol(val);
        else if (!strcmp(opt, "--doubt"))
            doubt_path = val;
        else if (!strcmp(opt, "--rejected"))
            rejected_path = val;
        else if (!strcmp(opt, "--give-up"))
            give_up = atol(val);
        else
            usage();
    }
    if (batch < 1 || batch > 1000 || chains < 1 || unordered < 0 || unordered > 100)
        usage();

    fault_on_stop_signals(on_signal);

    FILE *acked = open_out(acked_path);
    FILE *doubt = open_out(doubt_path);
    FILE *rejected = open_out(rejected_path);
    srand((unsigned)time(NULL) ^ ((unsigned)id * 2654435761u));

    pqmq_client *c = NULL;
    double lost_since = now_s();
    while (pqmq_connect(conninfo, &c) != PQMQ_OK) {
        if (now_s() - lost_since > give_up || stop_requested) {
            fprintf(stderr, "producer %d: cannot connect: %s\n", id, pqmq_errmsg(c));
            return 1;
        }
        pqmq_client_free(c);
        c = NULL;
        fault_sleep_ms(100);
    }

    int total = batch + (hot ? 1 : 0);
    pqmq_msg **msgs = calloc((size_t)total, sizeof *msgs);
    struct line *lines = calloc((size_t)total, sizeof *lines);
    if (!msgs || !lines)
        return 1;

    long seq = 0, batches = 0;
    long n_acked = 0, b_acked = 0, n_doubt = 0, b_doubt = 0, n_rej = 0, b_rej = 0;
    long lost = 0, reconnects = 0;
    int status = 0;
    while (!stop_requested && (max == 0 || n_acked < max)) {
        batches++;
        for (int i = 0; i < total; i++) {
            pqmq_msg *m = msgs[i] = pqmq_msg_new();
            struct line *l = &lines[i];
            if (!m)
                return 1;
            l->seq = ++seq;
            if (i == batch) { /* the shared hot chain */
                snprintf(l->channel, sizeof l->channel, "%s", hot);
                l->ordered = 's';
            } else if (rand() % 100 < unordered) {
                snprintf(l->channel, sizeof l->channel, "%sloose", prefix);
                l->ordered = 'f';
            } else {
                snprintf(l->channel, sizeof l->channel, "%sp%dc%d", prefix, id,
                         rand() % chains);
                l->ordered = 't';
            }
            char json[64];
            snprintf(json, sizeof json, "{\"seq\": %ld, \"p\": %d}", l->seq, id);
            uuid_t uid;
            pqmq_msg_id(m, uid);
            uuid_unparse_lower(uid, l->id);
            if (pqmq_msg_set_channel(m, l->channel, "") || pqmq_msg_set_name(m, "job") ||
                pqmq_msg_set_json(m, json) || pqmq_msg_set_ordered(m, l->ordered != 'f') ||
                pqmq_msg_set_retries(m, retries) || pqmq_msg_set_backoff(m, backoff))
                return 1;
        }
        int rc = pqmq_insert(c, msgs, (size_t)total);
        for (int i = 0; i < total; i++)
            pqmq_msg_free(msgs[i]);

        if (rc == PQMQ_OK) {
            write_batch(acked, batches, lines, total, '-');
            n_acked += total;
            b_acked++;
        } else if (connection_lost(c, rc)) {
            char why = rc == PQMQ_ECONN ? 'c' : pqmq_sqlstate(c)[0] ? 's' : 'e';
            if (lost == 0)
                fprintf(stderr, "producer %d: first lost connection (%s): %s\n", id,
                        pqmq_strerror(rc), pqmq_errmsg(c));
            lost++;
            write_batch(doubt, batches, lines, total, why);
            n_doubt += total;
            b_doubt++;
            /* Reconnect with a short backoff, also while the server
             * restarts (it refuses connections for a moment). */
            lost_since = now_s();
            long delay = 20;
            while (pqmq_reconnect(c) != PQMQ_OK) {
                if (stop_requested)
                    goto done;
                if (now_s() - lost_since > give_up) {
                    fprintf(stderr, "producer %d: no connection for %ld s, giving up: %s\n", id,
                            give_up, pqmq_errmsg(c));
                    status = 1;
                    goto done;
                }
                fault_sleep_ms(delay);
                delay = delay < 500 ? delay * 2 : 500;
            }
            reconnects++;
        } else if (rc == PQMQ_ESERVER) {
            const char *st = pqmq_sqlstate(c);
            if (count_state(st[0] ? st : "?????"))
                fprintf(stderr, "producer %d: refused (sqlstate %s): %s\n", id, st,
                        pqmq_errmsg(c));
            write_batch(rejected, batches, lines, total, '-');
            n_rej += total;
            b_rej++;
        } else {
            fprintf(stderr, "producer %d: unexpected failure %s: %s\n", id, pqmq_strerror(rc),
                    pqmq_errmsg(c));
            status = 1;
            break;
        }
        if (interval > 0 && !stop_requested)
            fault_sleep_ms(interval);
    }
done:
    printf("producer %d: acked %ld (%ld batches), doubt %ld (%ld batches), rejected %ld "
           "(%ld batches), lost connection %ld times (misreported %ld), reconnects %ld, "
           "sqlstates",
           id, n_acked, b_acked, n_doubt, b_doubt, n_rej, b_rej, lost, misreported, reconnects);
    for (int i = 0; i < nstates; i++)
        printf(" %s:%ld", states[i].state, states[i].n);
    printf("%s\n", nstates ? "" : " none");
    fflush(stdout);
    if (acked)
        fclose(acked);
    if (doubt)
        fclose(doubt);
    if (rejected)
        fclose(rejected);
    free(msgs);
    free(lines);
    pqmq_client_free(c);
    return status;
}
