/*
 * payload_job.c: pqmq_job_unpack, apart from payload.c so that payload.c
 * links on its own (the fuzzer builds it without consume.c).
 */
#include "pqmq.h"

PQMQ_EXPORT int pqmq_job_unpack(const pqmq_job *job, msgpack_unpacked *out)
{
    size_t len = 0;
    const void *data = job ? pqmq_job_bytes(job, &len) : NULL;
    return pqmq_unpack(data, len, out); /* no payload: NULL, refused as empty */
}
