/*
 * payload.c: unpacking msgpack payloads that may be hostile.
 *
 * msgpack_unpack_next trusts the sizes in the data: an array header that
 * claims 4 billion elements makes it allocate for them before it finds the
 * data missing. So a walk over the headers comes first, allocating nothing:
 * exactly one object must span the buffer, every length must fit in the
 * bytes that are left, and every count too (each element takes at least one
 * byte). msgpack-c only runs on data that passed.
 */
#include "pqmq.h"

#include <stdbool.h>
#include <string.h>

/*
 * Nesting limit: containers on the path from the root, the root included.
 * msgpack-c's unpacker has a fixed stack of MSGPACK_EMBED_STACK_SIZE (32)
 * open containers and fails beyond it, so this is the most it can decode.
 */
#define MP_MAX_DEPTH 32

/* What a type byte says follows it. */
struct mp_head {
    enum { MP_DATA, MP_ARRAY, MP_MAP } kind;
    unsigned field; /* width of a big-endian length or count, 0: none */
    unsigned extra; /* bytes after that field before the data (ext's type) */
    uint64_t size;  /* data bytes or element count when field is 0 */
};

/* Fills h for type byte b; false for the reserved byte 0xc1. */
static bool mp_classify(unsigned char b, struct mp_head *h)
{
    static const struct mp_head heads[32] = {
        [0x00] = {MP_DATA, 0, 0, 0},  /* nil */
        [0x02] = {MP_DATA, 0, 0, 0},  /* false */
        [0x03] = {MP_DATA, 0, 0, 0},  /* true */
        [0x04] = {MP_DATA, 1, 0, 0},  /* bin 8 */
        [0x05] = {MP_DATA, 2, 0, 0},  /* bin 16 */
        [0x06] = {MP_DATA, 4, 0, 0},  /* bin 32 */
        [0x07] = {MP_DATA, 1, 1, 0},  /* ext 8 */
        [0x08] = {MP_DATA, 2, 1, 0},  /* ext 16 */
        [0x09] = {MP_DATA, 4, 1, 0},  /* ext 32 */
        [0x0a] = {MP_DATA, 0, 0, 4},  /* float 32 */
        [0x0b] = {MP_DATA, 0, 0, 8},  /* float 64 */
        [0x0c] = {MP_DATA, 0, 0, 1},  /* uint 8 */
        [0x0d] = {MP_DATA, 0, 0, 2},  /* uint 16 */
        [0x0e] = {MP_DATA, 0, 0, 4},  /* uint 32 */
        [0x0f] = {MP_DATA, 0, 0, 8},  /* uint 64 */
        [0x10] = {MP_DATA, 0, 0, 1},  /* int 8 */
        [0x11] = {MP_DATA, 0, 0, 2},  /* int 16 */
        [0x12] = {MP_DATA, 0, 0, 4},  /* int 32 */
        [0x13] = {MP_DATA, 0, 0, 8},  /* int 64 */
        [0x14] = {MP_DATA, 0, 1, 1},  /* fixext 1 */
        [0x15] = {MP_DATA, 0, 1, 2},  /* fixext 2 */
        [0x16] = {MP_DATA, 0, 1, 4},  /* fixext 4 */
        [0x17] = {MP_DATA, 0, 1, 8},  /* fixext 8 */
        [0x18] = {MP_DATA, 0, 1, 16}, /* fixext 16 */
        [0x19] = {MP_DATA, 1, 0, 0},  /* str 8 */
        [0x1a] = {MP_DATA, 2, 0, 0},  /* str 16 */
        [0x1b] = {MP_DATA, 4, 0, 0},  /* str 32 */
        [0x1c] = {MP_ARRAY, 2, 0, 0}, /* array 16 */
        [0x1d] = {MP_ARRAY, 4, 0, 0}, /* array 32 */
        [0x1e] = {MP_MAP, 2, 0, 0},   /* map 16 */
        [0x1f] = {MP_MAP, 4, 0, 0},   /* map 32 */
    };

    *h = (struct mp_head){MP_DATA, 0, 0, 0};
    if (b <= 0x7f || b >= 0xe0) /* positive and negative fixint */
        return true;
    if (b <= 0x8f)
        *h = (struct mp_head){MP_MAP, 0, 0, b & 0x0f};
    else if (b <= 0x9f)
        *h = (struct mp_head){MP_ARRAY, 0, 0, b & 0x0f};
    else if (b <= 0xbf)
        *h = (struct mp_head){MP_DATA, 0, 0, b & 0x1f}; /* fixstr */
    else if (b == 0xc1)
        return false;
    else
        *h = heads[b - 0xc0];
    return true;
}

/* Reads the header at *pos, leaving *pos after its fixed part; h->size
 * becomes the data bytes or the element count that follow. */
static bool mp_header(const unsigned char *p, size_t len, size_t *pos, struct mp_head *h)
{
    if (*pos >= len || !mp_classify(p[*pos], h))
        return false;
    (*pos)++;
    if (h->field + h->extra > len - *pos)
        return false;
    for (unsigned i = 0; i < h->field; i++)
        h->size = h->size << 8 | p[(*pos)++];
    *pos += h->extra;
    if (h->kind == MP_MAP)
        h->size *= 2; /* keys and values */
    return true;
}

/* True when p[0..len) is exactly one object within the limits above. */
static bool mp_walk(const unsigned char *p, size_t len)
{
    uint64_t left[MP_MAX_DEPTH + 1]; /* objects still due per open level */
    size_t top = 0, pos = 0;

    left[0] = 1; /* level 0: the root object */
    for (;;) {
        while (top > 0 && left[top] == 0)
            top--;
        if (left[top] == 0)
            return pos == len;
        left[top]--;
        struct mp_head h;
        /* Every element takes at least a byte, so a count over the bytes
         * left is a lie, as is a length. */
        if (!mp_header(p, len, &pos, &h) || h.size > len - pos)
            return false;
        if (h.kind == MP_DATA) {
            pos += (size_t)h.size;
            continue;
        }
        /* Empty containers count too: msgpack-c's limit does. */
        if (top == MP_MAX_DEPTH)
            return false;
        left[++top] = h.size;
    }
}

PQMQ_EXPORT int pqmq_unpack(const void *data, size_t len, msgpack_unpacked *out)
{
    if (!out)
        return PQMQ_EPAYLOAD;
    /* Like msgpack_unpack_next: whatever out held goes; on failure it is
     * left empty (a nil object, no zone). */
    msgpack_unpacked_destroy(out);
    if (!data || !mp_walk(data, len))
        return PQMQ_EPAYLOAD;
    size_t off = 0;
    if (msgpack_unpack_next(out, data, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        msgpack_unpacked_destroy(out);
        return PQMQ_EPAYLOAD;
    }
    return 0;
}

PQMQ_EXPORT const msgpack_object *pqmq_map_get(const msgpack_object *obj, const char *key)
{
    if (!obj || !key || obj->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t n = strlen(key);
    /* With duplicate keys, the first one wins. */
    for (uint32_t i = 0; i < obj->via.map.size; i++) {
        const msgpack_object_kv *kv = &obj->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == n &&
            (n == 0 || memcmp(kv->key.via.str.ptr, key, n) == 0))
            return &kv->val;
    }
    return NULL;
}
