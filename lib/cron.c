/*
 * cron.c: five-field cron expressions (minute hour day-of-month month
 * day-of-week) parsed into bit sets the server matches local times
 * against (mq_cron_slots). Each field is a list of *, N, N-M, with an
 * optional /STEP; months and weekdays also by English name (jan, mon);
 * weekday 0 and 7 are Sunday. @hourly, @daily, @weekly, @monthly and
 * @yearly stand for their usual expressions.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pqmq-int.h"

struct field {
    const char *what;
    int lo, hi;
    const char *const *names; /* names[i] is value lo + i (NULL: none) */
};

static const char *const months[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                     "jul", "aug", "sep", "oct", "nov", "dec"};
static const char *const days[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

static const struct field fields[5] = {
    {"minute", 0, 59, NULL},  {"hour", 0, 23, NULL},       {"day of month", 1, 31, NULL},
    {"month", 1, 12, months}, {"day of week", 0, 7, days},
};

/* Reads a number or (for fields with names) a three-letter name at *p. */
static int read_value(const struct field *f, const char **p, int *out)
{
    if (isdigit((unsigned char)**p)) {
        char *end;
        long v = strtol(*p, &end, 10);
        if (end - *p > 4)
            return -1;
        *p = end;
        *out = (int)v;
        return 0;
    }
    int count = f->names == days ? 7 : 12;
    for (int i = 0; f->names && i < count; i++) {
        if (!strncasecmp(*p, f->names[i], 3) && !isalpha((unsigned char)(*p)[3])) {
            *p += 3;
            *out = f->lo + i;
            return 0;
        }
    }
    return -1;
}

/* Parses one list item (*, N, N-M, each with an optional /S) into *bits. */
static int parse_item(const struct field *f, const char *item, size_t len, uint64_t *bits,
                      char *err, size_t errlen)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        return snprintf(err, errlen, "an empty or overlong item"), -1;
    memcpy(buf, item, len);
    buf[len] = 0;
    const char *p = buf;
    int lo = f->lo, hi = f->hi, step = 1;
    if (*p == '*') {
        p++;
        if (f == &fields[4])
            hi = 6; /* 7 is Sunday again */
    } else {
        if (read_value(f, &p, &lo))
            return snprintf(err, errlen, "\"%s\" is not a value", buf), -1;
        hi = lo;
        if (*p == '-') {
            p++;
            if (read_value(f, &p, &hi))
                return snprintf(err, errlen, "\"%s\" is not a range", buf), -1;
        } else if (*p == '/') {
            hi = f->hi; /* N/S: from N to the end */
        }
    }
    if (*p == '/') {
        char *end;
        long s = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end || s < 1 || s > f->hi)
            return snprintf(err, errlen, "\"%s\" has a bad step", buf), -1;
        step = (int)s;
        p = end;
    }
    if (*p)
        return snprintf(err, errlen, "\"%s\" is not a value, range or step", buf), -1;
    if (lo < f->lo || hi > f->hi || lo > f->hi || hi < f->lo)
        return snprintf(err, errlen, "\"%s\" is outside %d..%d", buf, f->lo, f->hi), -1;
    if (lo > hi)
        return snprintf(err, errlen, "\"%s\" runs backwards", buf), -1;
    for (int v = lo; v <= hi; v += step)
        *bits |= (uint64_t)1 << v;
    return 0;
}

static int parse_field(int i, const char *text, size_t len, uint64_t *bits, char *err,
                       size_t errlen)
{
    const struct field *f = &fields[i];
    *bits = 0;
    char why[128];
    for (size_t start = 0; start <= len;) {
        size_t end = start;
        while (end < len && text[end] != ',')
            end++;
        if (parse_item(f, text + start, end - start, bits, why, sizeof why)) {
            snprintf(err, errlen, "cron: field %d (%s): %s", i + 1, f->what, why);
            return -1;
        }
        start = end + 1;
    }
    if (i == 4 && (*bits & ((uint64_t)1 << 7))) /* 7 is Sunday */
        *bits = (*bits | 1) & 0x7f;
    return 0;
}

static const char *expand_macro(const char *expr)
{
    static const char *const macros[][2] = {
        {"@hourly", "0 * * * *"},  {"@daily", "0 0 * * *"},   {"@midnight", "0 0 * * *"},
        {"@weekly", "0 0 * * 0"},  {"@monthly", "0 0 1 * *"}, {"@yearly", "0 0 1 1 *"},
        {"@annually", "0 0 1 1 *"}};
    for (size_t i = 0; i < sizeof macros / sizeof *macros; i++)
        if (!strcasecmp(expr, macros[i][0]))
            return macros[i][1];
    return expr;
}

int pqmq__cron_parse(const char *expr, pqmq__cron *out, char *err, size_t errlen)
{
    if (!expr)
        return snprintf(err, errlen, "cron: expression is NULL"), -1;
    expr = expand_macro(expr);
    const char *start[6];
    size_t len[6];
    int n = 0;
    for (const char *p = expr; *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        const char *s = p;
        while (*p && *p != ' ' && *p != '\t')
            p++;
        if (n < 6) {
            start[n] = s;
            len[n] = (size_t)(p - s);
        }
        n++;
    }
    if (n != 5)
        return snprintf(err, errlen,
                        "cron: %d fields in \"%s\"; five are needed (minute hour "
                        "day-of-month month day-of-week)",
                        n, expr),
               -1;
    uint64_t bits[5];
    for (int i = 0; i < 5; i++)
        if (parse_field(i, start[i], len[i], &bits[i], err, errlen))
            return -1;
    out->minutes = bits[0];
    out->hours = bits[1];
    out->doms = bits[2];
    out->months = bits[3];
    out->dows = bits[4];
    /* As cronie and vixie cron: when neither day field starts with '*',
     * a day matches either; when one does ('*', '*' with a step), both
     * fields' bits must match (mq_cron_slots). */
    out->dom_any = start[2][0] == '*';
    out->dow_any = start[4][0] == '*';
    return 0;
}
