/*
 * repeat.c: --repeat N. --rounds takes the median of interleaved rate
 * phases inside one run; a target, though, is read over whole runs (the
 * floor, the exactly-once phases and the latency included), as a range:
 * each run measures everything again, and each target is judged on the
 * median of its runs so that neither the best nor the worst run decides.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repeat.h"
#include "report.h"
#include "targets.h"
#include "util.h"

void run_repeat(const struct opts *o, PGconn *admin, measure_fn *measure)
{
    struct target(*t)[TARGETS_MAX] = calloc((size_t)o->repeat, sizeof *t);
    struct results *r = malloc(sizeof *r);
    if (!t || !r)
        die("out of memory");
    int n = 0;
    for (int i = 0; i < o->repeat; i++) {
        fprintf(stderr, "repeat: run %d of %d\n", i + 1, o->repeat);
        measure(o, admin, r);
        int k = targets_of_results(o, r, t[i]);
        if (i && k != n)
            die("repeat: run %d measured %d targets, run 1 %d", i + 1, k, n);
        n = k;
        if (!o->json) {
            printf("==== run %d of %d\n", i + 1, o->repeat);
            report_text(o, r);
            printf("\n");
        }
    }
    struct target_span s[TARGETS_MAX];
    targets_span(t, o->repeat, n, s);
    report_repeat(o, s, n);
    free(r);
    free(t);
}
