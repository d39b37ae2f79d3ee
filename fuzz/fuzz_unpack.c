/*
 * fuzz_unpack.c: libFuzzer target for the parsers that read untrusted
 * payloads: pqmq_unpack (msgpack) and pqmq_json_check. See README.md.
 */
#include "pqmq.h"

#include <stdlib.h>
#include <string.h>

/* Reads every byte the tree points at, so ASan checks its pointers. */
static unsigned visit(const msgpack_object *o)
{
    unsigned sum = 0;
    const char *p = NULL;
    uint32_t n = 0;
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        p = o->via.str.ptr;
        n = o->via.str.size;
        break;
    case MSGPACK_OBJECT_BIN:
        p = o->via.bin.ptr;
        n = o->via.bin.size;
        break;
    case MSGPACK_OBJECT_EXT:
        p = o->via.ext.ptr;
        n = o->via.ext.size;
        break;
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; i++)
            sum += visit(&o->via.array.ptr[i]);
        break;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; i++)
            sum += visit(&o->via.map.ptr[i].key) + visit(&o->via.map.ptr[i].val);
        break;
    default: break;
    }
    for (uint32_t i = 0; i < n; i++)
        sum += (unsigned char)p[i];
    return sum;
}

/* msgpack-c's packing of what was accepted must be accepted too, and pack
 * back to the same bytes (its encoding is canonical). */
static void check_round_trip(const msgpack_object *o)
{
    msgpack_sbuffer a, b;
    msgpack_packer pk;
    msgpack_unpacked u;

    msgpack_sbuffer_init(&a);
    msgpack_packer_init(&pk, &a, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, *o);
    msgpack_unpacked_init(&u);
    if (pqmq_unpack(a.data, a.size, &u) != 0)
        abort();
    msgpack_sbuffer_init(&b);
    msgpack_packer_init(&pk, &b, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, u.data);
    if (a.size != b.size || (a.size && memcmp(a.data, b.data, a.size) != 0))
        abort();
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = pqmq_unpack(data, size, &u);
    if (rc != 0 && rc != PQMQ_EPAYLOAD)
        abort();
    if (rc == 0) {
        volatile unsigned sink = visit(&u.data);
        (void)sink;
        (void)pqmq_map_get(&u.data, "a");
        check_round_trip(&u.data);
    }
    msgpack_unpacked_destroy(&u);

    size_t at = pqmq_json_check((const char *)data, size);
    if (at > size + 1) /* offsets are within the input, or just past it */
        abort();
    return 0;
}
