/*
 * test_payload.c: ids (uuid.c), JSON validation (json.c) and msgpack
 * unpacking (payload.c). None of it needs the database beyond t_init.
 */
#include "harness.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- ids ---------------------------------------------------------------- */

static uint64_t uuid_ms(const uuid_t id)
{
    uint64_t ms = 0;
    for (int i = 0; i < 6; i++)
        ms = ms << 8 | id[i];
    return ms;
}

static void test_uuid_layout(void)
{
    uuid_t id;
    pqmq_uuid_generate(id);
    CHECK_INT(id[6] >> 4, 7); /* version */
    CHECK_INT(id[8] >> 6, 2); /* variant 0b10 */
    int64_t now = (int64_t)time(NULL) * 1000;
    int64_t ms = (int64_t)uuid_ms(id);
    if (ms < now - 2000 || ms > now + 2000)
        t_fail(__FILE__, __LINE__, "id time %lld ms, now %lld ms", (long long)ms,
               (long long)now);
}

static void test_uuid_increasing(void)
{
    uuid_t prev, id;
    pqmq_uuid_generate(prev);
    int bad = 0;
    for (int i = 0; i < 10000; i++, memcpy(prev, id, sizeof id)) {
        pqmq_uuid_generate(id);
        if (memcmp(prev, id, sizeof id) >= 0 && bad++ == 0)
            t_fail(__FILE__, __LINE__, "id %d does not sort after the one before", i);
    }
    CHECK_INT(bad, 0);
}

#define PER_THREAD 20000

struct uuid_run {
    uuid_t *ids;   /* PER_THREAD of them */
    int unordered; /* ids that did not sort after their thread's previous */
};

static void *uuid_thread(void *arg)
{
    struct uuid_run *run = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        pqmq_uuid_generate(run->ids[i]);
        if (i > 0 && memcmp(run->ids[i - 1], run->ids[i], sizeof(uuid_t)) >= 0)
            run->unordered++;
    }
    return NULL;
}

static int uuid_cmp(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(uuid_t));
}

static void test_uuid_threads(void)
{
    uuid_t *all = calloc(2 * PER_THREAD, sizeof(uuid_t));
    struct uuid_run runs[2] = {{all, 0}, {all + PER_THREAD, 0}};
    pthread_t th[2];
    if (!all)
        abort();
    for (int i = 0; i < 2; i++)
        CHECK_INT(pthread_create(&th[i], NULL, uuid_thread, &runs[i]), 0);
    for (int i = 0; i < 2; i++)
        CHECK_INT(pthread_join(th[i], NULL), 0);
    CHECK_INT(runs[0].unordered, 0);
    CHECK_INT(runs[1].unordered, 0);

    qsort(all, 2 * PER_THREAD, sizeof(uuid_t), uuid_cmp);
    int dups = 0;
    for (int i = 1; i < 2 * PER_THREAD; i++)
        dups += memcmp(all[i - 1], all[i], sizeof(uuid_t)) == 0;
    CHECK_INT(dups, 0);
    free(all);
}

/* The random part of an id (bytes 8..15 without the variant bits). */
static uint64_t uuid_tail(const uuid_t id)
{
    uint64_t t = id[8] & 0x3f;
    for (int i = 9; i < 16; i++)
        t = t << 8 | id[i];
    return t;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Counts values present in both sorted arrays. */
static int common_values(const uint64_t *a, const uint64_t *b, size_t n)
{
    int common = 0;
    for (size_t i = 0, j = 0; i < n && j < n;) {
        if (a[i] == b[j])
            common++, i++, j++;
        else if (a[i] < b[j])
            i++;
        else
            j++;
    }
    return common;
}

/* Random bits are drawn in bulk and kept per thread: no id reuses another's. */
static void test_uuid_random_bits_never_repeat(void)
{
    enum { N = 10000 };
    uint64_t *tails = malloc(N * sizeof *tails);
    if (!tails)
        abort();
    for (int i = 0; i < N; i++) {
        uuid_t id;
        pqmq_uuid_generate(id);
        tails[i] = uuid_tail(id);
    }
    qsort(tails, N, sizeof *tails, u64_cmp);
    int repeats = 0;
    for (int i = 1; i < N; i++)
        repeats += tails[i] == tails[i - 1];
    CHECK_INT(repeats, 0);
    free(tails);
}

/* A forked child draws fresh random bits, never the rest of its parent's
 * batch: otherwise both make the same ids in the same millisecond. */
static void test_uuid_fork_draws_fresh_bits(void)
{
    enum { N = 32 };
    uuid_t id;
    pqmq_uuid_generate(id); /* the parent now holds unused random bits */
    int fds[2];
    CHECK_INT(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t t[N];
        for (int i = 0; i < N; i++) {
            pqmq_uuid_generate(id);
            t[i] = uuid_tail(id);
        }
        _exit(write(fds[1], t, sizeof t) == (ssize_t)sizeof t ? 0 : 1);
    }
    CHECK(pid > 0);
    uint64_t mine[N], child[N];
    for (int i = 0; i < N; i++) {
        pqmq_uuid_generate(id);
        mine[i] = uuid_tail(id);
    }
    close(fds[1]);
    CHECK_INT(read(fds[0], child, sizeof child), (long long)sizeof child);
    close(fds[0]);
    int status = 0;
    CHECK_INT(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    qsort(mine, N, sizeof *mine, u64_cmp);
    qsort(child, N, sizeof *child, u64_cmp);
    CHECK_INT(common_values(mine, child, N), 0);
}

/* ---- JSON --------------------------------------------------------------- */

#define ANY ((size_t)-1) /* invalid, at whatever offset */

struct json_case {
    const char *doc;
    size_t len;
    size_t want; /* 0: valid; else the 1-based offset of the error, or ANY */
};

/* sizeof, not strlen, so that documents may hold NUL bytes. */
#define J(doc, want)                                                                           \
    {                                                                                          \
        doc, sizeof(doc) - 1, want                                                             \
    }

static const struct json_case json_cases[] = {
    /* valid */
    J("0", 0),
    J("-0", 0),
    J("1e5", 0),
    J("1E+5", 0),
    J("-1.5e-10", 0),
    J("0.0", 0),
    J("123456789012345678901234567890", 0),
    J("true", 0),
    J("false", 0),
    J("null", 0),
    J("\"\"", 0),
    J(" \t\n\r[1, 2]\n ", 0),
    J("{}", 0),
    J("[]", 0),
    J("[[],{}]", 0),
    J("{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", 0),
    J("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", 0),
    J("\"\\u00e9\\uD83D\\uDE00\\uffff\"", 0),
    J("\"caf\xc3\xa9 \xf0\x9f\x98\x80\"", 0),
    J("\"\xed\x9f\xbf\"", 0),     /* U+D7FF */
    J("\"\xee\x80\x80\"", 0),     /* U+E000 */
    J("\"\xf4\x8f\xbf\xbf\"", 0), /* U+10FFFF */
    /* structure */
    J("", 1),
    J("   ", 4),
    J("[", 2),
    J("[1,]", 4),
    J("[1}", 3),
    J("[1 2]", 4),
    J("{\"a\" 1}", 6),
    J("{\"a\":1,}", 8),
    J("{1:2}", 2),
    J("{\"a\"", 5),
    J("{\"a\":1 \"b\":2}", 8),
    J("'a'", 1),
    J("]", 1),
    /* trailing garbage */
    J("1 2", 3),
    J("[1] x", 5),
    J("nulll", 5),
    J("{}{}", 3),
    /* literals */
    J("tru", 4),
    J("trux", 4),
    J("nul", 4),
    J("True", 1),
    J("NaN", 1),
    J("Infinity", 1),
    /* numbers */
    J("01", 2),
    J("-01", 3),
    J("-", 2),
    J("-a", 2),
    J("1.", 3),
    J("1.e5", 3),
    J("1e", 3),
    J("1e+", 4),
    J("+1", 1),
    J(".5", 1),
    J("1e5x", 4),
    J("0x10", 2),
    /* strings and escapes */
    J("\"abc", 5),
    J("\"a\tb\"", 3),
    J("\"\\x\"", 3),
    J("\"\\u12G4\"", 6),
    J("\"\\u123\"", 7),
    J("\"\\", 3),
    J("\"\\u0000\"", 2), /* jsonb refuses it */
    J("\"\\ud800\"", 8),
    J("\"\\ud800\\u0041\"", 8),
    J("\"\\ud800\\n\"", 9),
    J("\"\\udc00\"", 2),
    J("\"\\ud800", 8),
    /* UTF-8 */
    J("\"\xc0\x80\"", 2),         /* overlong NUL */
    J("\"\xc1\xbf\"", 2),         /* overlong */
    J("\"\xe0\x80\xaf\"", 3),     /* overlong 3-byte */
    J("\"\xf0\x80\x80\xaf\"", 3), /* overlong 4-byte */
    J("\"\xed\xa0\x80\"", 3),     /* surrogate U+D800 */
    J("\"\xed\xbf\xbf\"", 3),     /* surrogate U+DFFF */
    J("\"\xf4\x90\x80\x80\"", 3), /* U+110000 */
    J("\"\xf5\x80\x80\x80\"", 2),
    J("\"\x80\"", 2),
    J("\"\xc3\"", 3),
    J("\"\xc3", 3),
    J("\"\xe2\x82\"", 4),
    J("\xef\xbb\xbf"
      "1",
      1), /* byte order mark */
    J("\xc3\xa9", 1),
    /* NUL bytes */
    J("[1,\0]", 4),
    J("1\0", 2),
    J("\0", 1),
    J("\"a\0\"", 3),
};

static void test_json_table(void)
{
    for (size_t i = 0; i < sizeof json_cases / sizeof json_cases[0]; i++) {
        const struct json_case *c = &json_cases[i];
        size_t got = pqmq_json_check(c->doc, c->len);
        if (c->want == ANY ? got == 0 : got != c->want)
            t_fail(__FILE__, __LINE__, "case %zu (%.*s): got %zu, expected %zu", i, (int)c->len,
                   c->doc, got, c->want);
    }
    CHECK_INT(pqmq_json_check(NULL, 0), 1);
    /* Only len bytes count: what follows is never read. */
    CHECK_INT(pqmq_json_check("[1]]", 3), 0);
    CHECK_INT(pqmq_json_check("truex", 4), 0);
}

/* depth arrays around 1, or objects {"a": ... } when obj. */
static char *nested(int depth, int obj, size_t *len)
{
    const char *open = obj ? "{\"a\":" : "[", *close = obj ? "}" : "]";
    size_t ol = strlen(open);
    char *s = malloc(depth * (ol + 1) + 2), *p = s;
    if (!s)
        abort();
    for (int i = 0; i < depth; i++, p += ol)
        memcpy(p, open, ol);
    *p++ = '1';
    for (int i = 0; i < depth; i++)
        *p++ = *close;
    *len = (size_t)(p - s);
    return s;
}

static void test_json_nesting(void)
{
    size_t len;
    char *s;
    for (int obj = 0; obj < 2; obj++) {
        s = nested(1000, obj, &len);
        CHECK_INT(pqmq_json_check(s, len), 0);
        free(s);
        s = nested(1001, obj, &len);
        /* The 1001st opening bracket is the first bad byte. */
        CHECK_INT(pqmq_json_check(s, len), 1000 * (obj ? 5 : 1) + 1);
        free(s);
    }
    /* Far deeper than any stack would take recursively. */
    s = nested(1000000, 0, &len);
    CHECK_INT(pqmq_json_check(s, len), 1001);
    free(s);
}

/* ---- msgpack ------------------------------------------------------------ */

/* {"a": 1, "b": [true, "x"], "c": bin(01 02 03)} */
static void pack_sample(msgpack_sbuffer *sb)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "a", 1);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_str_with_body(&pk, "b", 1);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_true(&pk);
    msgpack_pack_str_with_body(&pk, "x", 1);
    msgpack_pack_str_with_body(&pk, "c", 1);
    msgpack_pack_bin_with_body(&pk, "\1\2\3", 3);
}

/* pqmq_unpack of an exact-size heap copy, so ASan sees any read past len. */
static int unpack_copy(const void *data, size_t len, msgpack_unpacked *out)
{
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy)
        abort();
    if (len)
        memcpy(copy, data, len);
    int rc = pqmq_unpack(copy, len, out);
    free(copy);
    return rc;
}

/* pqmq_unpack's verdict alone. */
static int unpack_rc(const void *data, size_t len)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = unpack_copy(data, len, &u);
    msgpack_unpacked_destroy(&u);
    return rc;
}

static void test_msgpack_sample(void)
{
    msgpack_sbuffer sb;
    msgpack_unpacked u;
    pack_sample(&sb);
    msgpack_unpacked_init(&u);
    CHECK_INT(pqmq_unpack(sb.data, sb.size, &u), 0);
    const msgpack_object *root = &u.data, *v;
    CHECK_INT(root->type, MSGPACK_OBJECT_MAP);

    v = pqmq_map_get(root, "a");
    CHECK(v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == 1);
    v = pqmq_map_get(root, "b");
    CHECK(v && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 2);
    if (v && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 2) {
        const msgpack_object *e = v->via.array.ptr;
        CHECK(e[0].type == MSGPACK_OBJECT_BOOLEAN && e[0].via.boolean);
        CHECK(e[1].type == MSGPACK_OBJECT_STR && e[1].via.str.size == 1 &&
              e[1].via.str.ptr[0] == 'x');
    }
    v = pqmq_map_get(root, "c");
    CHECK(v && v->type == MSGPACK_OBJECT_BIN && v->via.bin.size == 3 &&
          memcmp(v->via.bin.ptr, "\1\2\3", 3) == 0);

    CHECK(pqmq_map_get(root, "d") == NULL);
    CHECK(pqmq_map_get(root, "") == NULL);
    CHECK(pqmq_map_get(root, "ab") == NULL);
    CHECK(pqmq_map_get(root, NULL) == NULL);
    CHECK(pqmq_map_get(NULL, "a") == NULL);
    v = pqmq_map_get(root, "b");
    CHECK(pqmq_map_get(v, "x") == NULL); /* an array is no map */
    CHECK(pqmq_map_get(&v->via.array.ptr[0], "a") == NULL);

    /* Unpacking again into the same out releases the old zone (ASan's
     * leak check would say otherwise). */
    CHECK_INT(pqmq_unpack(sb.data, sb.size, &u), 0);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

static void test_msgpack_truncated(void)
{
    msgpack_sbuffer sb;
    pack_sample(&sb);
    for (size_t n = 0; n < sb.size; n++)
        if (unpack_rc(sb.data, n) != PQMQ_EPAYLOAD)
            t_fail(__FILE__, __LINE__, "prefix of %zu of %zu bytes accepted", n, sb.size);
    CHECK_INT(unpack_rc(sb.data, sb.size), 0);

    /* One byte too many: a valid object follows, but only one may be there. */
    char *more = malloc(sb.size + 1);
    if (!more)
        abort();
    memcpy(more, sb.data, sb.size);
    more[sb.size] = (char)0xc0;
    CHECK_INT(unpack_rc(more, sb.size + 1), PQMQ_EPAYLOAD);
    free(more);
    msgpack_sbuffer_destroy(&sb);
}

/* Every type msgpack has, in several widths. */
static void pack_zoo(msgpack_sbuffer *sb, size_t big)
{
    msgpack_packer pk;
    char *blob = calloc(1, big + 1);
    if (!blob)
        abort();
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 40);
    msgpack_pack_nil(&pk);
    msgpack_pack_false(&pk);
    msgpack_pack_int8(&pk, -100);
    msgpack_pack_int16(&pk, -30000);
    msgpack_pack_int32(&pk, -2000000000);
    msgpack_pack_int64(&pk, INT64_MIN);
    msgpack_pack_uint8(&pk, 200);
    msgpack_pack_uint16(&pk, 60000);
    msgpack_pack_uint32(&pk, 4000000000u);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    msgpack_pack_int(&pk, -5);
    msgpack_pack_float(&pk, 1.5f);
    msgpack_pack_double(&pk, 2.5);
    size_t sizes[] = {0, 5, 40, 300, big};
    for (size_t i = 0; i < 5; i++) {
        msgpack_pack_str_with_body(&pk, blob, sizes[i]);
        msgpack_pack_bin_with_body(&pk, blob, sizes[i]);
    }
    size_t ext_sizes[] = {1, 2, 4, 8, 16, 3, 300, big};
    for (size_t i = 0; i < 8; i++)
        msgpack_pack_ext_with_body(&pk, blob, ext_sizes[i], 7);
    msgpack_pack_map(&pk, 17); /* map 16 */
    for (int i = 0; i < 17; i++) {
        msgpack_pack_int(&pk, i);
        msgpack_pack_array(&pk, 0);
    }
    msgpack_pack_array(&pk, 20); /* array 16 */
    for (int i = 0; i < 20; i++)
        msgpack_pack_map(&pk, 0);
    for (int i = 0; i < 7; i++) /* 33 so far: pad to 40 */
        msgpack_pack_nil(&pk);
    free(blob);
}

static void test_msgpack_types(void)
{
    msgpack_sbuffer sb;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);

    /* Lengths over 64 KiB: str 32, bin 32, ext 32. */
    pack_zoo(&sb, 70000);
    CHECK_INT(unpack_copy(sb.data, sb.size, &u), 0);
    CHECK(u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size == 40);
    msgpack_sbuffer_destroy(&sb);

    pack_zoo(&sb, 1000);
    CHECK_INT(unpack_copy(sb.data, sb.size, &u), 0);
    int accepted = 0;
    for (size_t n = 0; n < sb.size; n++)
        accepted += unpack_rc(sb.data, n) != PQMQ_EPAYLOAD;
    CHECK_INT(accepted, 0);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
}

static void test_msgpack_bad_args(void)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    CHECK_INT(pqmq_unpack(NULL, 0, &u), PQMQ_EPAYLOAD);
    CHECK_INT(pqmq_unpack(NULL, 5, &u), PQMQ_EPAYLOAD);
    CHECK_INT(pqmq_unpack("", 0, &u), PQMQ_EPAYLOAD);
    CHECK_INT(pqmq_unpack("\xc0", 1, NULL), PQMQ_EPAYLOAD);
    CHECK_INT(pqmq_job_unpack(NULL, &u), PQMQ_EPAYLOAD);

    /* A failure leaves out empty, even when it held an object. */
    CHECK_INT(pqmq_unpack("\x92\x01\x02", 3, &u), 0);
    CHECK(pqmq_map_get(&u.data, "a") == NULL); /* an array is no map */
    CHECK_INT(pqmq_unpack("\x92\x01", 2, &u), PQMQ_EPAYLOAD);
    CHECK(u.zone == NULL && u.data.type == MSGPACK_OBJECT_NIL);
    msgpack_unpacked_destroy(&u);
}

static void test_msgpack_hostile(void)
{
    static const struct {
        const char *what;
        const char *bytes;
        size_t len;
    } cases[] = {
#define H(what, b) {what, b, sizeof(b) - 1}
        H("map32 of 0xFFFFFFFF entries", "\xdf\xff\xff\xff\xff"),
        H("map32 with a few entries there", "\xdf\xff\xff\xff\xff\x01\x02\x03\x04"),
        H("array32 of 4 billion", "\xdd\xee\x6b\x28\x00"),
        H("array32 with a few elements there", "\xdd\xff\xff\xff\xff\xc0\xc0\xc0"),
        H("array16 longer than the data", "\xdc\xff\xff\xc0\xc0"),
        H("map16 that needs twice the bytes", "\xde\x00\x02\xc0\xc0\xc0"),
        H("str32 of 4 GB", "\xdb\xff\xff\xff\xff"
                           "abc"),
        H("str8 one too long", "\xd9\x04"
                               "abc"),
        H("bin32 of 4 GB", "\xc6\xff\xff\xff\xff"
                           "abc"),
        H("ext32 of 4 GB", "\xc9\xff\xff\xff\xff\x01"
                           "abc"),
        H("ext8 without its type", "\xc7\x00"),
        H("fixext16 short", "\xd8\x01"
                            "0123456789abcde"),
        H("uint64 short", "\xcf\x00\x00\x00\x00\x00\x00\x00"),
        H("str16 with half a length", "\xda\x00"),
        H("fixarray of 15 with 14", "\x9f\xc0\xc0\xc0\xc0\xc0\xc0\xc0\xc0\xc0\xc0"
                                    "\xc0\xc0\xc0\xc0"),
        H("reserved 0xc1", "\xc1"),
        H("reserved 0xc1 inside", "\x92\xc0\xc1"),
        H("reserved 0xc1 as a key", "\x81\xc1\xc0"),
        H("two objects", "\xc0\xc0"),
#undef H
    };
    int64_t t0 = t_now_ms();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (unpack_rc(cases[i].bytes, cases[i].len) != PQMQ_EPAYLOAD)
            t_fail(__FILE__, __LINE__, "%s: accepted", cases[i].what);
    /* Claimed sizes are never allocated (ASan would also abort on a
     * multi-gigabyte request), so this takes no time. */
    CHECK(t_now_ms() - t0 < 1000);
}

/* depth arrays (or maps {"k": ...}) around nil; the innermost one empty
 * when empty. */
static int unpack_nested(int depth, int map, int empty)
{
    unsigned char *b = malloc(3 * (size_t)depth + 1), *p = b;
    if (!b)
        abort();
    for (int i = 0; i < depth; i++) {
        int last = empty && i == depth - 1;
        *p++ = (unsigned char)((map ? 0x80 : 0x90) | !last);
        if (map && !last) {
            *p++ = 0xa1;
            *p++ = 'k';
        }
    }
    if (!empty)
        *p++ = 0xc0;
    int rc = unpack_rc(b, (size_t)(p - b));
    free(b);
    return rc;
}

static void test_msgpack_nesting(void)
{
    /* 32 is msgpack-c's own limit (MSGPACK_EMBED_STACK_SIZE). */
    for (int map = 0; map < 2; map++) {
        for (int empty = 0; empty < 2; empty++) {
            CHECK_INT(unpack_nested(1, map, empty), 0);
            CHECK_INT(unpack_nested(32, map, empty), 0);
            CHECK_INT(unpack_nested(33, map, empty), PQMQ_EPAYLOAD);
            CHECK_INT(unpack_nested(64, map, empty), PQMQ_EPAYLOAD);
            CHECK_INT(unpack_nested(65, map, empty), PQMQ_EPAYLOAD);
        }
    }
    /* Far deeper than any stack would take recursively. */
    CHECK_INT(unpack_nested(1000000, 0, 0), PQMQ_EPAYLOAD);
}

int main(void)
{
    t_init("payload");
    T_RUN(test_uuid_layout);
    T_RUN(test_uuid_increasing);
    T_RUN(test_uuid_threads);
    T_RUN(test_uuid_random_bits_never_repeat);
    T_RUN(test_uuid_fork_draws_fresh_bits);
    T_RUN(test_json_table);
    T_RUN(test_json_nesting);
    T_RUN(test_msgpack_sample);
    T_RUN(test_msgpack_truncated);
    T_RUN(test_msgpack_types);
    T_RUN(test_msgpack_bad_args);
    T_RUN(test_msgpack_hostile);
    T_RUN(test_msgpack_nesting);
    return t_done();
}
