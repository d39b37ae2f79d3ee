/*
 * targets.c: which targets a run measured, their ratios and verdicts, and
 * their ranges over repeated runs (--repeat). A target whose figure was
 * not measured (0) is left out, so nothing unmeasured is judged.
 */
#include <stdio.h>
#include <string.h>

#include "rounds.h"
#include "targets.h"

double target_measure(const struct target *t)
{
    if (t->reference <= 0)
        return t->value;
    return t->value / t->reference;
}

int target_met(enum target_op op, double x, double limit)
{
    switch (op) {
    case AT_LEAST: return x >= limit;
    case AT_MOST: return x <= limit;
    case BELOW: return x < limit;
    }
    return 0;
}

/* Appends a target. */
static void put(struct target *out, int *n, const char *figure, const char *unit, double value,
                double reference, double limit, enum target_op op)
{
    if (*n >= TARGETS_MAX)
        return;
    struct target *t = &out[(*n)++];
    snprintf(t->figure, sizeof t->figure, "%s", figure);
    t->unit = unit;
    t->value = value;
    t->reference = reference;
    t->limit = limit;
    t->op = op;
}

/* Appends a target if its figure was measured: a rate, size or latency of
 * 0 (and a reference of 0, if it has one) is one the run did not take. */
static void add(struct target *out, int *n, const char *figure, const char *unit, double value,
                double reference, double limit, enum target_op op, int has_reference)
{
    if (value <= 0 || (has_reference && reference <= 0))
        return;
    put(out, n, figure, unit, value, has_reference ? reference : 0, limit, op);
}

int targets_of_results(const struct opts *o, const struct results *r, struct target *out)
{
    int n = 0;
    const struct rates *m = &r->main, *c = &r->ordered;
    add(out, &n, "enqueue, of the floor", "msg/s", m->enqueue, r->floor_insert, TARGET_ENQUEUE,
        AT_LEAST, 1);
    add(out, &n, "processing, poll API, of the floor", "msg/s", m->poll, r->floor_drain,
        TARGET_POLL, AT_LEAST, 1);
    add(out, &n, "processing, runner, of the floor", "msg/s", m->runner, r->floor_drain,
        TARGET_PROCESS, AT_LEAST, 1);
    add(out, &n, "processing, locked lane, of the floor", "msg/s", m->locked, r->floor_drain,
        TARGET_LOCKED, AT_LEAST, 1);
    /* Every processing lane the bench runs on the chains. */
    const char *lane[4] = {"poll API", "runner", "locked lane", "runner, locked lane"};
    double ordered[4] = {c->poll, c->runner, c->locked, c->runner_locked};
    double unordered[4] = {m->poll, m->runner, m->locked, m->runner_locked};
    for (int i = 0; i < 4; i++) {
        char f[64];
        snprintf(f, sizeof f, "%d chains, of unordered: %s", o->chains, lane[i]);
        add(out, &n, f, "msg/s", ordered[i], unordered[i], TARGET_ORDERED, AT_LEAST, 1);
    }
    add(out, &n, "WAL a processed message (poll API)", "B", m->poll_cost.wal_bytes,
        WAL_REFERENCE_BYTES, TARGET_WAL, AT_MOST, 1);
    if (r->idle.n) {
        add(out, &n, "idle latency p50", "ms", r->idle.p50, 0, TARGET_IDLE_P50_MS, AT_MOST, 0);
        add(out, &n, "idle latency p99", "ms", r->idle.p99, 0, TARGET_IDLE_P99_MS, AT_MOST, 0);
    }
    return n;
}

int targets_of_load(const struct opts *o, const struct load_result *r, struct target *out)
{
    int n = 0;
    const struct load_phase *last = &r->ph[r->nphases - 1];
    /* A backlog or a rate of 0 is a measured 0 here, so put, not add. */
    if (o->rate)
        put(out, &n, "kept up: backlog at the end, s of load", "s",
            (double)last->backlog_end / o->rate, 0, TARGET_KEPT_UP_S, BELOW);
    if (o->burn_down > 0 && r->nphases == 1)
        put(out, &n, "poll call p99", "ms", last->poll.p99, 0, TARGET_POLL_P99_MS, AT_MOST);
    if (r->nphases == 3 && o->rate)
        put(out, &n, "backlog at the end of the hold, s of load", "s",
            (double)r->ph[1].backlog_end / o->rate, 0, TARGET_HOLD_BACKLOG_S, BELOW);
    if (r->nphases == 3 && !o->rate && r->ph[0].processed > 0 && r->ph[1].seconds > 0)
        put(out, &n, "processed during the hold / before", "msg/s",
            r->ph[1].processed / r->ph[1].seconds, r->ph[0].processed / r->ph[0].seconds,
            TARGET_HOLD_RATIO, AT_LEAST);
    return n;
}

void targets_span(const struct target (*runs)[TARGETS_MAX], int nruns, int n,
                  struct target_span *out)
{
    for (int k = 0; k < n; k++) {
        struct target_span *s = &out[k];
        double judged[BENCH_MAX_ROUNDS];
        s->t = runs[0][k];
        s->runs = nruns;
        s->value_lo = s->value_hi = runs[0][k].value;
        s->ref_lo = s->ref_hi = runs[0][k].reference;
        s->ratio_lo = s->ratio_hi = target_measure(&runs[0][k]);
        for (int i = 0; i < nruns; i++) {
            const struct target *t = &runs[i][k];
            double q = target_measure(t);
            judged[i] = q;
            s->value_lo = t->value < s->value_lo ? t->value : s->value_lo;
            s->value_hi = t->value > s->value_hi ? t->value : s->value_hi;
            s->ref_lo = t->reference < s->ref_lo ? t->reference : s->ref_lo;
            s->ref_hi = t->reference > s->ref_hi ? t->reference : s->ref_hi;
            s->ratio_lo = q < s->ratio_lo ? q : s->ratio_lo;
            s->ratio_hi = q > s->ratio_hi ? q : s->ratio_hi;
        }
        s->judged = median_of(judged, nruns);
    }
}
