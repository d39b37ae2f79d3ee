/*
 * steady.c: --steady. A queue that only just keeps up when it starts
 * empty may fall behind once its dead rows pile up, so the question is
 * whether it keeps up at a load it can carry with room to spare: half of
 * its own burn-down rate. The burn-down is --messages queued messages
 * (STEADY_BURN_MESSAGES unless given) drained by the poll-API consumers of
 * the load run (the same --consumers and --batch), timed from their first
 * poll to the empty queue: seconds of work, so that the rate includes what
 * the queue does a second or more after a claim (the log's upkeep deletes
 * what was completed) and not only the claims of its first moments. Then
 * load.c offers half that rate for --duration seconds (or through
 * --held-xmin's phases) with autovacuum at the server's settings: the
 * bench runs no VACUUM or ANALYZE in either step.
 */
#include <stdio.h>

#include "load.h"
#include "options.h"
#include "queue.h"
#include "steady.h"
#include "util.h"

/* Messages/s of the poll-API consumers over a full backlog of o->messages. */
static double burn_down(const struct opts *o, PGconn *admin)
{
    struct shape s = {o->channels, o->ordered, 0};
    queue_reset(admin);
    queue_enqueue(o, &s, "steady: prefill");
    double seconds = queue_drain_poll(o, "steady: burn-down");
    long left = bench_scalar(admin, "SELECT count(*) FROM mq_msgs");
    if (left)
        die("steady: the burn-down left %ld messages in the queue", left);
    return o->messages / seconds;
}

void run_steady(const struct opts *o, PGconn *admin)
{
    if (bench_scalar(admin, "SELECT (current_setting('autovacuum') = 'on')::int") != 1)
        fprintf(stderr, "steady: autovacuum is off on this server: the run cannot say whether\n"
                        "  the queue keeps up with it at its defaults\n");
    struct opts run = *o;
    run.burn_down = burn_down(&run, admin);
    run.rate = (int)(run.burn_down / 2 + 0.5);
    if (run.rate < 1)
        run.rate = 1;
    if (!o->json)
        fprintf(stderr, "steady: burn-down %.0f messages/s; offering %d messages/s\n",
                run.burn_down, run.rate);
    run_load(&run, admin);
}
