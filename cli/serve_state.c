/*
 * serve_state.c: pqmq serve's snapshot of the queue and its renderings.
 *
 * The sampling loop (cmd_serve.c) and each admin action read the figures
 * (mq_metrics, through tool_figures_read as status and metrics do), the
 * alert counters and the runners (as metrics and workers do) and the
 * oldest dead letters (pqmq_dead_letters, as pqmq dead does) into the
 * snapshot; requests only render it. So any number of browsers and scrapers
 * costs the database one mq_metrics per --interval, which matters on a big
 * queue (README, Metrics: a second or more per call at a million messages).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Appends a sample, dropping those older than the window (or the oldest,
 * when the ring is full). snap_lock held. */
static void history_add(serve *s, double at, long long removed)
{
    while (s->hist_n > 0 && (s->hist_n == SERVE_HISTORY_MAX ||
                             s->history[s->hist_first].at < at - SERVE_HISTORY_SECONDS)) {
        s->hist_first = (s->hist_first + 1) % SERVE_HISTORY_MAX;
        s->hist_n--;
    }
    s->history[(s->hist_first + s->hist_n) % SERVE_HISTORY_MAX] =
        (serve_point){.at = at, .removed = removed};
    s->hist_n++;
}

/* A lost connection is opened again (with --schema and the version check)
 * by the next sample, so the server outlives a database restart. */
int serve_connect(serve *s)
{
    if (s->t->client && PQstatus(s->t->conn) == CONNECTION_OK)
        return 0;
    tool_disconnect(s->t);
    return tool_connect(s->t, TOOL_MIN_VERSION);
}

int serve_sample(serve *s)
{
    char err[512] = "";
    tool_figures *rows = NULL;
    size_t n = 0;
    tool_alerts *alerts = NULL;
    size_t nalerts = 0;
    tool_worker *workers = NULL;
    size_t nworkers = 0;
    pqmq_batch *dead = NULL;

    /* A failure is logged once, when it starts or changes, and the recovery
     * once: not a line every interval while the database is down. */
    s->t->errbuf = err;
    s->t->errbuf_size = sizeof err;
    s->t->quiet = 1;
    int rc = serve_connect(s);
    if (!rc)
        rc = tool_begin(s->t);
    if (!rc)
        rc = tool_figures_read(s->t, NULL, 0, &rows, &n);
    if (!rc)
        rc = tool_alerts_read(s->t, NULL, 0, &alerts, &nalerts);
    if (!rc)
        rc = tool_workers_read(s->t, 0, &workers, &nworkers);
    if (!rc && pqmq_dead_letters(s->t->client, NULL, 0, s->dead_max, &dead) != PQMQ_OK)
        rc = tool_err(s->t, "%s", tool_lib_error(pqmq_errmsg(s->t->client)));
    /* No transaction stays open between samples (tool_begin). */
    if (tool_commit(s->t) && !rc)
        rc = EXIT_ERR;
    s->t->errbuf = NULL;
    s->t->errbuf_size = 0;
    s->t->quiet = 0;

    pthread_mutex_lock(&s->snap_lock);
    const char *why = err[0] ? err : "cannot read the queue";
    if (rc && (!s->error || strcmp(s->error, why) != 0))
        tool_log(s->t, "error", "%s", why);
    else if (!rc && s->error)
        tool_log(s->t, "info", "reading the queue again");
    free(s->error);
    s->error = NULL;
    if (rc) {
        s->error = strdup(why);
    } else {
        long long removed = 0;
        for (size_t i = 0; i < n; i++)
            removed += rows[i].removed;
        tool_figures_free(s->rows, s->nrows);
        tool_alerts_free(s->alerts, s->nalerts);
        tool_workers_free(s->workers, s->nworkers);
        pqmq_batch_free(s->dead);
        s->rows = rows;
        s->nrows = n;
        s->alerts = alerts;
        s->nalerts = nalerts;
        s->workers = workers;
        s->nworkers = nworkers;
        s->dead = dead;
        s->sampled_at = wall_now();
        history_add(s, s->sampled_at, removed);
        rows = NULL;
        alerts = NULL;
        workers = NULL;
        dead = NULL;
    }
    pthread_mutex_unlock(&s->snap_lock);
    tool_figures_free(rows, n);
    tool_alerts_free(alerts, nalerts);
    tool_workers_free(workers, nworkers);
    pqmq_batch_free(dead);
    return rc;
}

int serve_render_metrics(const serve *s, FILE *f)
{
    if (s->error || !s->rows) {
        fprintf(f, "pqmq serve: cannot read the queue: %s\n",
                s->error ? s->error : "no sample yet");
        return -1;
    }
    tool_metrics_print(f, s->rows, s->nrows, 0);
    tool_alerts_print(f, s->alerts, s->nalerts, 0);
    tool_workers_metrics(f, s->workers, s->nworkers);
    return 0;
}

static void json_str(FILE *f, const char *s)
{
    if (s)
        out_json_str(f, s, strlen(s));
    else
        fputs("null", f);
}

static void render_dead(const serve *s, FILE *f)
{
    size_t n = s->dead ? pqmq_batch_count(s->dead) : 0;
    fputs("[", f);
    for (size_t i = 0; i < n; i++) {
        const pqmq_job *j = pqmq_batch_job(s->dead, i);
        uuid_t id;
        char ids[37];
        pqmq_job_id(j, id);
        uuid_unparse_lower(id, ids);
        fprintf(f, "%s\n  {\"id\": \"%s\", \"channel\": ", i ? "," : "", ids);
        json_str(f, pqmq_job_channel(j));
        fputs(", \"args\": ", f);
        json_str(f, pqmq_job_args(j));
        fputs(", \"name\": ", f);
        json_str(f, pqmq_job_name(j));
        fprintf(f, ", \"deliveries\": %d, \"blocking\": %s, \"error\": ", pqmq_job_attempt(j),
                pqmq_job_blocking(j) ? "true" : "false");
        json_str(f, pqmq_job_last_error(j));
        fputs("}", f);
    }
    fputs(n ? "\n ]" : "]", f);
}

void serve_render_state(const serve *s, FILE *f)
{
    fprintf(f, "{\"version\": \"%s\", \"schema\": ", PACKAGE_VERSION);
    json_str(f, s->schema);
    fprintf(f,
            ", \"admin\": %s, \"interval\": %d, \"dead_max\": %d, \"history_seconds\": %d,"
            " \"now\": %.3f,",
            s->admin ? "true" : "false", s->interval, s->dead_max, SERVE_HISTORY_SECONDS,
            wall_now());
    if (s->rows)
        fprintf(f, " \"sampled_at\": %.3f,", s->sampled_at);
    else
        fputs(" \"sampled_at\": null,", f);
    fputs(" \"error\": ", f);
    json_str(f, s->error);
    fputs(",\n \"status\": ", f);
    if (s->rows)
        tool_figures_json(f, s->rows, s->nrows);
    else
        fputs("null", f);
    fputs(", \"dead\": ", f);
    render_dead(s, f);
    fputs(",\n \"workers\": ", f);
    if (s->rows)
        tool_workers_json(f, s->workers, s->nworkers);
    else
        fputs("null\n", f);
    fputs(",\n \"history\": [", f);
    for (size_t i = 0; i < s->hist_n; i++) {
        const serve_point *x = &s->history[(s->hist_first + i) % SERVE_HISTORY_MAX];
        fprintf(f, "%s[%.3f, %lld]", i ? ", " : "", x->at, x->removed);
    }
    fputs("]}\n", f);
}

void serve_state_free(serve *s)
{
    tool_figures_free(s->rows, s->nrows);
    tool_alerts_free(s->alerts, s->nalerts);
    tool_workers_free(s->workers, s->nworkers);
    pqmq_batch_free(s->dead);
    free(s->error);
    s->alerts = NULL;
    s->workers = NULL;
    s->rows = NULL;
    s->dead = NULL;
    s->error = NULL;
}
