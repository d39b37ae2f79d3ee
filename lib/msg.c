/*
 * msg.c: pqmq_msg, the message a producer builds. Setters only copy; all
 * checks happen in pqmq_insert so that one place names what is wrong.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

PQMQ_EXPORT pqmq_msg *pqmq_msg_new(void)
{
    pqmq_msg *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    pqmq_uuid_generate(m->id);
    m->retries = 4;
    m->backoff_ms = 1000;
    m->commit_interval_ms = -1;
    return m;
}

PQMQ_EXPORT void pqmq_msg_free(pqmq_msg *m)
{
    if (!m)
        return;
    free(m->channel);
    free(m->args);
    free(m->name);
    free(m->json);
    free(m->bytes);
    free(m->unique_key);
    free(m);
}

/* Replaces *slot with a copy of s (NULL clears it). */
static int set_str(char **slot, const char *s)
{
    char *copy = NULL;
    if (s && !(copy = strdup(s)))
        return PQMQ_ENOMEM;
    free(*slot);
    *slot = copy;
    return 0;
}

/* The scalar setters: store the value; only a missing message is refused. */
#define SET_FIELD(m, field, value) ((m) ? ((m)->field = (value), 0) : PQMQ_EINVAL)

PQMQ_EXPORT int pqmq_msg_set_channel(pqmq_msg *m, const char *channel, const char *args)
{
    if (!m)
        return PQMQ_EINVAL;
    char *old_args = m->args;
    m->args = NULL;
    int rc = set_str(&m->args, args);
    if (rc) {
        m->args = old_args;
        return rc;
    }
    free(old_args);
    return set_str(&m->channel, channel);
}

PQMQ_EXPORT int pqmq_msg_set_name(pqmq_msg *m, const char *name)
{
    return m ? set_str(&m->name, name) : PQMQ_EINVAL;
}

PQMQ_EXPORT int pqmq_msg_set_json(pqmq_msg *m, const char *json)
{
    return m ? set_str(&m->json, json) : PQMQ_EINVAL;
}

PQMQ_EXPORT int pqmq_msg_set_bytes(pqmq_msg *m, const void *data, size_t len)
{
    if (!m)
        return PQMQ_EINVAL;
    void *copy = NULL;
    if (data) {
        copy = malloc(len ? len : 1); /* a zero-length payload is still one */
        if (!copy)
            return PQMQ_ENOMEM;
        if (len)
            memcpy(copy, data, len);
    }
    free(m->bytes);
    m->bytes = copy;
    m->bytes_len = data ? len : 0;
    return 0;
}

PQMQ_EXPORT int pqmq_msg_set_msgpack(pqmq_msg *m, const msgpack_sbuffer *buf)
{
    if (!m || !buf)
        return PQMQ_EINVAL;
    return pqmq_msg_set_bytes(m, buf->data ? buf->data : "", buf->size);
}

PQMQ_EXPORT int pqmq_msg_set_delay(pqmq_msg *m, int64_t delay_ms)
{
    return SET_FIELD(m, delay_ms, delay_ms);
}

PQMQ_EXPORT int pqmq_msg_set_retries(pqmq_msg *m, int retries)
{
    return SET_FIELD(m, retries, retries);
}

PQMQ_EXPORT int pqmq_msg_set_backoff(pqmq_msg *m, int64_t backoff_ms)
{
    return SET_FIELD(m, backoff_ms, backoff_ms);
}

PQMQ_EXPORT int pqmq_msg_set_commit_interval(pqmq_msg *m, int64_t interval_ms)
{
    return SET_FIELD(m, commit_interval_ms, interval_ms < 0 ? -1 : interval_ms);
}

PQMQ_EXPORT int pqmq_msg_set_ordered(pqmq_msg *m, int ordered)
{
    return SET_FIELD(m, ordered, ordered != 0);
}

PQMQ_EXPORT int pqmq_msg_set_id(pqmq_msg *m, const uuid_t id)
{
    if (!m || !id)
        return PQMQ_EINVAL;
    memcpy(m->id, id, sizeof(uuid_t));
    return 0;
}

PQMQ_EXPORT void pqmq_msg_id(const pqmq_msg *m, uuid_t out)
{
    if (m)
        memcpy(out, m->id, sizeof(uuid_t));
    else
        uuid_clear(out);
}

PQMQ_EXPORT int pqmq_msg_set_unique_key(pqmq_msg *m, const char *key)
{
    return m ? set_str(&m->unique_key, key) : PQMQ_EINVAL;
}

PQMQ_EXPORT int pqmq_msg_set_priority(pqmq_msg *m, int priority)
{
    return SET_FIELD(m, priority, priority);
}
