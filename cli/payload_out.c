/*
 * payload_out.c: a message's payload for people. JSON arrives
 * pretty-printed by the server (jsonb_pretty); a binary payload that is one
 * msgpack object (pqmq_unpack) is written as JSON, with bin and ext values
 * as {"$bin": "HEX"} and {"$ext": TYPE, "hex": "HEX"}; other bytes as hex.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

#define HEX_SHOWN 64 /* bytes of a non-msgpack payload shown */

static void hex(FILE *f, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        fprintf(f, "%02x", p[i]);
}

static void newline(FILE *f, int indent)
{
    if (indent < 0)
        return;
    fputc('\n', f);
    for (int i = 0; i < indent; i++)
        fputc(' ', f);
}

static void write_obj(FILE *f, const msgpack_object *o, int indent, int depth);

/* A map key: strings as they are, anything else as its JSON text. */
static void write_key(FILE *f, const msgpack_object *k)
{
    if (k->type == MSGPACK_OBJECT_STR) {
        out_json_str(f, k->via.str.ptr, k->via.str.size);
        return;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) {
        fputs("\"?\"", f);
        return;
    }
    write_obj(m, k, -1, 0);
    fclose(m);
    out_json_str(f, buf, len);
    free(buf);
}

static void write_obj(FILE *f, const msgpack_object *o, int indent, int depth)
{
    int inner = indent < 0 ? -1 : indent + 4;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: fputs("null", f); break;
    case MSGPACK_OBJECT_BOOLEAN: fputs(o->via.boolean ? "true" : "false", f); break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        fprintf(f, "%llu", (unsigned long long)o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: fprintf(f, "%lld", (long long)o->via.i64); break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (isfinite(o->via.f64))
            fprintf(f, "%.17g", o->via.f64);
        else /* JSON has no NaN or infinity */
            fprintf(f, "\"%s\"",
                    isnan(o->via.f64) ? "NaN"
                    : o->via.f64 > 0  ? "Infinity"
                                      : "-Infinity");
        break;
    case MSGPACK_OBJECT_STR: out_json_str(f, o->via.str.ptr, o->via.str.size); break;
    case MSGPACK_OBJECT_BIN:
        fputs("{\"$bin\": \"", f);
        hex(f, o->via.bin.ptr, o->via.bin.size);
        fputs("\"}", f);
        break;
    case MSGPACK_OBJECT_EXT:
        fprintf(f, "{\"$ext\": %d, \"hex\": \"", (int)o->via.ext.type);
        hex(f, o->via.ext.ptr, o->via.ext.size);
        fputs("\"}", f);
        break;
    case MSGPACK_OBJECT_ARRAY:
        if (o->via.array.size == 0) {
            fputs("[]", f);
            break;
        }
        fputc('[', f);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i)
                fputs(indent < 0 ? ", " : ",", f);
            newline(f, inner);
            write_obj(f, &o->via.array.ptr[i], inner, depth + 1);
        }
        newline(f, indent);
        fputc(']', f);
        break;
    case MSGPACK_OBJECT_MAP:
        if (o->via.map.size == 0) {
            fputs("{}", f);
            break;
        }
        fputc('{', f);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            if (i)
                fputs(indent < 0 ? ", " : ",", f);
            newline(f, inner);
            write_key(f, &o->via.map.ptr[i].key);
            fputs(": ", f);
            write_obj(f, &o->via.map.ptr[i].val, inner, depth + 1);
        }
        newline(f, indent);
        fputc('}', f);
        break;
    default: fputs("null", f);
    }
}

void out_msgpack_json(FILE *f, const msgpack_object *o, int indent)
{
    write_obj(f, o, indent, 0);
}

/* Writes text with every line indented. */
static void indented(FILE *f, const char *text, int indent)
{
    fprintf(f, "%*s", indent, "");
    for (; *text; text++) {
        fputc(*text, f);
        if (*text == '\n' && text[1])
            fprintf(f, "%*s", indent, "");
    }
    fputc('\n', f);
}

void out_payload(FILE *f, const char *pretty_json, const void *bytes, size_t len, int indent)
{
    if (pretty_json) {
        fprintf(f, "%*spayload (JSON):\n", indent, "");
        indented(f, pretty_json, indent + 4);
    }
    if (!bytes)
        return;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (pqmq_unpack(bytes, len, &u) == PQMQ_OK) {
        fprintf(f, "%*spayload (msgpack, %zu bytes, as JSON):\n", indent, "", len);
        char *buf = NULL;
        size_t n = 0;
        FILE *m = open_memstream(&buf, &n);
        if (m) {
            out_msgpack_json(m, &u.data, 0);
            fclose(m);
            indented(f, buf, indent + 4);
            free(buf);
        }
    } else {
        fprintf(f, "%*spayload (bytes, %zu): ", indent, "", len);
        hex(f, bytes, len < HEX_SHOWN ? len : HEX_SHOWN);
        fputs(len > HEX_SHOWN ? "...\n" : "\n", f);
    }
    msgpack_unpacked_destroy(&u);
}
