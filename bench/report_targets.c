/*
 * report_targets.c: each target beside its figure. A row's verdict is on
 * the ratio to its reference, or on the value where there is none; over
 * --repeat runs, on the median of the runs' ratios (or values), while the
 * value, reference and ratio columns show each one's range.
 */
#include <stdio.h>
#include <string.h>

#include "report.h"
#include "report_targets.h"

static const char *op_text(enum target_op op)
{
    return op == AT_LEAST ? ">=" : op == AT_MOST ? "<=" : "<";
}

/* One number in the unit's format. */
static void number(double v, const char *unit, char *buf, size_t cap)
{
    char g[32];
    if (!strcmp(unit, "msg/s"))
        snprintf(buf, cap, "%s", v > 0 ? grouped(v, g) : "0");
    else if (*unit == 'B')
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.2f", v);
}

/* "lo unit" or "lo-hi unit"; "-" for a reference the target has not. */
static void range(double lo, double hi, const char *unit, char *buf, size_t cap)
{
    char a[32], b[32];
    number(lo, unit, a, sizeof a);
    number(hi, unit, b, sizeof b);
    if (lo == hi)
        snprintf(buf, cap, "%s%s%s", a, *unit ? " " : "", unit);
    else
        snprintf(buf, cap, "%s-%s%s%s", a, b, *unit ? " " : "", unit);
}

static void row(const struct target_span *s)
{
    char v[80], ref[80] = "-", q[80] = "-", tgt[48], med[24] = "";
    const struct target *t = &s->t;
    int has_ref = t->reference > 0;
    range(s->value_lo, s->value_hi, t->unit, v, sizeof v);
    if (has_ref) {
        range(s->ref_lo, s->ref_hi, t->unit, ref, sizeof ref);
        range(s->ratio_lo, s->ratio_hi, "", q, sizeof q);
        snprintf(tgt, sizeof tgt, "%s %.2f", op_text(t->op), t->limit);
    } else {
        snprintf(tgt, sizeof tgt, "%s %g %s", op_text(t->op), t->limit, t->unit);
    }
    if (s->runs > 1)
        snprintf(med, sizeof med, "%.2f ", s->judged);
    /* Ranges of several runs need the wider columns. */
    int w = s->runs > 1 ? 21 : 15, wq = s->runs > 1 ? 9 : 5;
    printf("%-46s %*s %*s %*s  %-11s %s%s\n", t->figure, w, v, w, ref, wq, q, tgt, med,
           target_met(t->op, s->judged, t->limit) ? "ok" : "MISSED");
}

void targets_text(const struct target_span *s, int n)
{
    if (n == 0)
        return;
    int w = s[0].runs > 1 ? 21 : 15, wq = s[0].runs > 1 ? 9 : 5;
    printf("\n%-46s %*s %*s %*s  %s\n", "target", w, "value", w, "reference", wq, "ratio",
           s[0].runs > 1 ? "target      median" : "target");
    for (int i = 0; i < n; i++)
        row(&s[i]);
}

static void jmember(const char *key, double v, int present)
{
    if (present)
        printf(", \"%s\": %.6g", key, v);
    else
        printf(", \"%s\": null", key);
}

void targets_json(const struct target_span *s, int n, int last)
{
    printf("\"targets\": [");
    for (int i = 0; i < n; i++) {
        const struct target *t = &s[i].t;
        int has_ref = t->reference > 0;
        printf("%s{\"figure\": \"%s\", \"unit\": \"%s\", \"runs\": %d", i ? ", " : "",
               t->figure, t->unit, s[i].runs);
        jmember("value_min", s[i].value_lo, 1);
        jmember("value_max", s[i].value_hi, 1);
        jmember("reference_min", s[i].ref_lo, has_ref);
        jmember("reference_max", s[i].ref_hi, has_ref);
        jmember("ratio_min", s[i].ratio_lo, has_ref);
        jmember("ratio_max", s[i].ratio_hi, has_ref);
        jmember("judged", s[i].judged, 1);
        printf(", \"op\": \"%s\", \"target\": %g, \"ok\": %s}", op_text(t->op), t->limit,
               target_met(t->op, s[i].judged, t->limit) ? "true" : "false");
    }
    printf("]%s", last ? "" : ", ");
}
