/*
 * test_bench_rounds: pqmq-bench --rounds reports medians (bench/rounds.c):
 * of an odd and an even number of rounds, whatever their order, without
 * touching the rounds' own values, and for every figure of a scenario on
 * its own (a round's runner and poll rates need not come from one round).
 * tests/test_bench.sh runs the bench itself with --rounds.
 */
#include "../bench/results.h"
#include "../bench/rounds.h"
#include "harness.h"

static void test_median_odd_even_unsorted(void)
{
    double one[] = {7.5};
    double three[] = {30, 10, 20};
    double four[] = {40, 10, 30, 20};
    CHECK(median_of(one, 1) == 7.5);
    CHECK(median_of(three, 3) == 20);
    CHECK(median_of(four, 4) == 25);
    /* The caller's values stay in their order. */
    CHECK(three[0] == 30 && three[1] == 10 && three[2] == 20);
    CHECK(four[0] == 40 && four[3] == 20);
}

static void test_median_ignores_one_burst(void)
{
    /* One round hit by a burst (a fifth of the rate) moves no median. */
    double runs[] = {30000, 6000, 31000, 29000, 30500};
    CHECK(median_of(runs, 5) == 30000);
}

static void test_rates_median_field_by_field(void)
{
    struct rates in[3];
    memset(in, 0, sizeof in);
    in[0].enqueue = 1, in[1].enqueue = 3, in[2].enqueue = 2;
    in[0].runner = 9, in[1].runner = 7, in[2].runner = 8;
    in[0].poll = 5, in[1].poll = 6, in[2].poll = 4;
    in[0].enqueue_pipelined = 10, in[1].enqueue_pipelined = 30, in[2].enqueue_pipelined = 20;
    in[0].locked = 100, in[1].locked = 300, in[2].locked = 200;
    in[0].runner_locked = 3, in[1].runner_locked = 1, in[2].runner_locked = 2;
    in[0].poll_cost.wal_bytes = 260, in[1].poll_cost.wal_bytes = 280,
    in[2].poll_cost.wal_bytes = 270;
    in[0].poll_cost.wal_records = 3.2, in[1].poll_cost.wal_records = 3.4,
    in[2].poll_cost.wal_records = 3.3;
    in[0].poll_cost.updates = 1, in[1].poll_cost.updates = 1, in[2].poll_cost.updates = 2;
    in[0].poll_cost.hot = 1, in[1].poll_cost.hot = 0.5, in[2].poll_cost.hot = 1;
    struct rates out;
    memset(&out, 0xff, sizeof out);
    rates_median(in, 3, &out);
    CHECK(out.enqueue == 2);
    CHECK(out.runner == 8);
    CHECK(out.poll == 5);
    CHECK(out.enqueue_pipelined == 20);
    CHECK(out.locked == 200);
    CHECK(out.runner_locked == 2);
    CHECK(out.poll_cost.wal_bytes == 270);
    CHECK(out.poll_cost.wal_records == 3.3);
    CHECK(out.poll_cost.updates == 1);
    CHECK(out.poll_cost.hot == 1);
}

int main(void)
{
    t_init("bench_rounds");
    T_RUN(test_median_odd_even_unsorted);
    T_RUN(test_median_ignores_one_burst);
    T_RUN(test_rates_median_field_by_field);
    return t_done();
}
