/*
 * test_bench_targets: the targets pqmq-bench prints beside its figures
 * (bench/targets.c): only figures a run measured are judged; each target's
 * bound and direction; under load, which of the steady-load and held-
 * snapshot targets a run's mode has; over --repeat runs, the ranges and
 * the verdict on the median, not on the best or worst run.
 * tests/test_bench.sh checks the printed tables and JSON.
 */
#include "../bench/load_ops.h"
#include "../bench/options.h"
#include "../bench/results.h"
#include "../bench/targets.h"
#include "harness.h"

static const struct target *find(const struct target *t, int n, const char *figure)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].figure, figure))
            return &t[i];
    return NULL;
}

static int met(const struct target *t)
{
    return target_met(t->op, target_measure(t), t->limit);
}

static void test_results_without_floor(void)
{
    struct opts o = {.chains = 1000};
    struct results r;
    memset(&r, 0, sizeof r);
    r.main = (struct rates){.enqueue = 50000, .runner = 30000, .poll = 40000, .locked = 50000};
    r.ordered = (struct rates){.runner = 24000, .poll = 31000, .locked = 45000};
    r.main.poll_cost.wal_bytes = 262;
    struct target t[TARGETS_MAX];
    int n = targets_of_results(&o, &r, t);
    /* No floor, no runner on the locked lane, no latency: none of theirs. */
    CHECK(!find(t, n, "enqueue, of the floor"));
    CHECK(!find(t, n, "processing, poll API, of the floor"));
    CHECK(!find(t, n, "1000 chains, of unordered: runner, locked lane"));
    CHECK(!find(t, n, "idle latency p50"));
    CHECK_INT(n, 4);
    const struct target *c = find(t, n, "1000 chains, of unordered: runner");
    CHECK(c && c->value == 24000 && c->reference == 30000 && c->limit == 0.8);
    CHECK(c && met(c)); /* 0.8 exactly */
    c = find(t, n, "1000 chains, of unordered: poll API");
    CHECK(c && !met(c)); /* 0.775 */
    const struct target *w = find(t, n, "WAL a processed message (poll API)");
    CHECK(w && w->reference == 262 && w->op == AT_MOST && !met(w));
    r.main.poll_cost.wal_bytes = 209; /* under 0.8 of 262 (209.6) */
    n = targets_of_results(&o, &r, t);
    w = find(t, n, "WAL a processed message (poll API)");
    CHECK(w && met(w));
}

static void test_results_with_floor_and_latency(void)
{
    struct opts o = {.chains = 8};
    struct results r;
    memset(&r, 0, sizeof r);
    r.main = (struct rates){.enqueue = 75, .runner = 54, .poll = 60, .locked = 66};
    r.floor_insert = 100, r.floor_drain = 100;
    r.idle = (struct latency){.n = 10, .p50 = 1.5, .p99 = 5.1};
    struct target t[TARGETS_MAX];
    int n = targets_of_results(&o, &r, t);
    const struct target *x;
    CHECK((x = find(t, n, "enqueue, of the floor")) && met(x));
    CHECK((x = find(t, n, "processing, poll API, of the floor")) && met(x));
    CHECK((x = find(t, n, "processing, runner, of the floor")) && !met(x)); /* 0.54 < 0.55 */
    CHECK((x = find(t, n, "processing, locked lane, of the floor")) && met(x));
    CHECK((x = find(t, n, "idle latency p50")) && x->reference == 0 && met(x));
    CHECK((x = find(t, n, "idle latency p99")) && !met(x));
}

static void test_load_targets_by_mode(void)
{
    struct load_result r;
    memset(&r, 0, sizeof r);
    r.nphases = 1;
    r.ph[0] = (struct load_phase){.seconds = 10, .processed = 100000, .backlog_end = 999};
    r.ph[0].poll.p99 = 20;
    struct opts steady = {.rate = 1000, .burn_down = 2000};
    struct target t[TARGETS_MAX];
    int n = targets_of_load(&steady, &r, t);
    const struct target *x;
    CHECK_INT(n, 2);
    CHECK((x = find(t, n, "kept up: backlog at the end, s of load")) && met(x));
    CHECK((x = find(t, n, "poll call p99")) && met(x));
    r.ph[0].backlog_end = 1000; /* a full second of load: not kept up */
    n = targets_of_load(&steady, &r, t);
    CHECK((x = find(t, n, "kept up: backlog at the end, s of load")) && !met(x));
    /* A --rate run without --steady judges no poll p99. */
    struct opts rate = {.rate = 1000};
    n = targets_of_load(&rate, &r, t);
    CHECK_INT(n, 1);

    /* A held snapshot at an offered rate: the backlog at the hold's end;
     * saturated: the rate during the hold against before it. */
    r.nphases = 3;
    r.ph[1] = (struct load_phase){.seconds = 10, .processed = 40000, .backlog_end = 9999};
    r.ph[2] = (struct load_phase){.seconds = 10, .processed = 50000};
    n = targets_of_load(&rate, &r, t);
    CHECK((x = find(t, n, "backlog at the end of the hold, s of load")) && met(x));
    CHECK(!find(t, n, "processed during the hold / before"));
    struct opts saturated = {0};
    n = targets_of_load(&saturated, &r, t);
    CHECK_INT(n, 1);
    CHECK((x = find(t, n, "processed during the hold / before")) && !met(x)); /* 0.4 */
}

static void test_span_judged_on_median(void)
{
    struct target runs[3][TARGETS_MAX];
    memset(runs, 0, sizeof runs);
    double v[3] = {50, 90, 80}, ref[3] = {100, 100, 100};
    for (int i = 0; i < 3; i++)
        runs[i][0] = (struct target){"x", "msg/s", v[i], ref[i], 0.75, AT_LEAST};
    struct target_span s[1];
    targets_span((const struct target(*)[TARGETS_MAX])runs, 3, 1, s);
    CHECK(s[0].runs == 3 && s[0].value_lo == 50 && s[0].value_hi == 90);
    CHECK(s[0].ratio_lo == 0.5 && s[0].ratio_hi == 0.9);
    CHECK(s[0].judged == 0.8); /* the median: one bad run does not decide */
    CHECK(target_met(s[0].t.op, s[0].judged, s[0].t.limit));
    runs[2][0].value = 60; /* two of three below: the median is too */
    targets_span((const struct target(*)[TARGETS_MAX])runs, 3, 1, s);
    CHECK(s[0].judged == 0.6 && !target_met(s[0].t.op, s[0].judged, s[0].t.limit));
}

int main(void)
{
    t_init("bench_targets");
    T_RUN(test_results_without_floor);
    T_RUN(test_results_with_floor_and_latency);
    T_RUN(test_load_targets_by_mode);
    T_RUN(test_span_judged_on_median);
    return t_done();
}
