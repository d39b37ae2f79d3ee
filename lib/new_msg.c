/*
 * new_msg.c: a message as one mq_new_t element, in PostgreSQL's binary
 * form of a record, written by a libpqtypes type handler in one pass.
 *
 * libpqtypes puts a composite field by field: two PQputf calls for the
 * fields (its prepared specs hold 8 types at most) and a third for the
 * element. Every PQputf first clears its thread's error state, a memset of
 * many kilobytes, which at three calls a message is a large part of a
 * producer's CPU (docs/performance.md). Registered as mq_new_t's handler,
 * this writes the element from the message itself, and types.c puts
 * eight elements a PQputf.
 */
#include <limits.h>
#include <string.h>

#include "pqmq-int.h"

#define NFIELDS 11

static char *put32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
    return p + 4;
}

/* A field: its type, its length (-1: NULL) and its bytes. */
static char *put_field(char *p, uint32_t oid, const void *data, size_t len)
{
    p = put32(put32(p, oid), data ? (uint32_t)len : UINT32_MAX);
    if (data && len) {
        memcpy(p, data, len);
        p += len;
    }
    return p;
}

/* An interval of ms milliseconds: microseconds, then no days or months
 * (_mq_insert_rows takes a month or day field as 30 days or 24 hours). */
static char *put_interval(char *p, int64_t ms)
{
    uint64_t us = (uint64_t)(ms * 1000);
    p = put32(put32(p, PQMQ__OID_INTERVAL), 16);
    p = put32(put32(p, (uint32_t)(us >> 32)), (uint32_t)us);
    return put32(put32(p, 0), 0);
}

static size_t text_len(const char *s)
{
    return s ? strlen(s) : 0;
}

/* libpqtypes' put handler of mq_new_t: the argument is a const pqmq_msg *
 * (checked by pqmq__check_batch). Returns the element's length, or -1. */
int pqmq__put_new_msg(PGtypeArgs *args)
{
    const pqmq_msg *m = va_arg(args->ap, const pqmq_msg *);
    if (!m)
        return args->errorf(args, "message is NULL");
    /* Each text's length once: a JSON payload may be 16 MiB. */
    size_t chan = text_len(m->channel), margs = text_len(m->args), name = text_len(m->name),
           json = text_len(m->json);
    /* The field count, each field's type and length, the fixed sizes. */
    size_t need =
        4 + NFIELDS * 8 + 16 + 3 * 16 + 4 + 1 + chan + margs + name + json + m->bytes_len;
    if (need > INT_MAX || args->put.expandBuffer(args, (int)need) == -1)
        return args->errorf(args, "message of %zu bytes", need);
    char *p = put32(args->put.out, NFIELDS);
    p = put_field(p, PQMQ__OID_UUID, m->id, sizeof(uuid_t));
    p = put_interval(p, m->delay_ms);
    char n[4];
    put32(n, (uint32_t)m->retries);
    p = put_field(p, PQMQ__OID_INT4, n, 4);
    p = put_interval(p, m->backoff_ms);
    p = put_field(p, PQMQ__OID_TEXT, m->channel, chan);
    p = put_field(p, PQMQ__OID_TEXT, m->args ? m->args : "", margs);
    p = m->commit_interval_ms >= 0 ? put_interval(p, m->commit_interval_ms)
                                   : put_field(p, PQMQ__OID_INTERVAL, NULL, 0);
    char b = m->ordered ? 1 : 0;
    p = put_field(p, PQMQ__OID_BOOL, &b, 1);
    p = put_field(p, PQMQ__OID_TEXT, m->name ? m->name : "", name);
    p = put_field(p, PQMQ__OID_TEXT, m->json, json);
    p = put_field(p, PQMQ__OID_BYTEA, m->bytes, m->bytes_len);
    return (int)(p - args->put.out);
}
