/*
 * json.c: a strict JSON (RFC 8259) validator.
 *
 * It accepts one value with optional surrounding whitespace, and is a little
 * stricter than the RFC where the server's jsonb is: "\u0000" and unpaired
 * surrogate escapes are refused, so that a payload that passes here is not
 * refused by the INSERT. Iterative, with nesting limited to JSON_MAX_DEPTH,
 * so hostile input cannot exhaust the stack. Errors are 1-based offsets of
 * the first offending byte; input that ends too early gives len + 1.
 * Numbers are checked against the grammar only: jsonb also refuses those
 * beyond numeric's range (1e1000000), which the server then reports.
 */
#include "pqmq-int.h"

#include <stdbool.h>

#define JSON_MAX_DEPTH 1000

/* What may come next. */
enum json_state {
    ST_VALUE,          /* a value */
    ST_VALUE_OR_CLOSE, /* a value or ']' (just after '[') */
    ST_KEY,            /* a member name (after ',' in an object) */
    ST_KEY_OR_CLOSE,   /* a member name or '}' (just after '{') */
    ST_COLON,          /* ':' after a member name */
    ST_AFTER           /* ',', a closing bracket, or the end */
};

struct json_parser {
    const unsigned char *s;
    size_t len;
    size_t pos;                         /* the next byte to read */
    size_t err;                         /* 0, or the 1-based offset of the first bad byte */
    size_t depth;                       /* open containers */
    unsigned char open[JSON_MAX_DEPTH]; /* '[' or '{' per open container */
};

/* Records the first error at byte index at (0-based). */
static bool fail_at(struct json_parser *p, size_t at)
{
    if (!p->err)
        p->err = at + 1;
    return false;
}

static void skip_ws(struct json_parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return;
        p->pos++;
    }
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One or more digits; fails at the first byte that should be one. */
static bool scan_digits(struct json_parser *p)
{
    if (p->pos >= p->len || !is_digit(p->s[p->pos]))
        return fail_at(p, p->pos);
    while (p->pos < p->len && is_digit(p->s[p->pos]))
        p->pos++;
    return true;
}

/* number = [ "-" ] ( "0" / 1-9 *DIGIT ) [ "." 1*DIGIT ] [ e [ sign ] 1*DIGIT ]
 * A digit right after a leading 0 is left for the caller to refuse. */
static bool scan_number(struct json_parser *p)
{
    if (p->s[p->pos] == '-')
        p->pos++;
    if (p->pos < p->len && p->s[p->pos] == '0')
        p->pos++;
    else if (!scan_digits(p))
        return false;
    if (p->pos < p->len && p->s[p->pos] == '.') {
        p->pos++;
        if (!scan_digits(p))
            return false;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
            p->pos++;
        if (!scan_digits(p))
            return false;
    }
    return true;
}

static bool scan_literal(struct json_parser *p, const char *word)
{
    for (; *word; word++, p->pos++)
        if (p->pos >= p->len || p->s[p->pos] != (unsigned char)*word)
            return fail_at(p, p->pos);
    return true;
}

/* The 4 hex digits of a \u escape at p->pos; -1 after failing. */
static long scan_hex4(struct json_parser *p)
{
    long v = 0;
    for (int i = 0; i < 4; i++, p->pos++) {
        int h = p->pos < p->len ? hex_value(p->s[p->pos]) : -1;
        if (h < 0) {
            fail_at(p, p->pos);
            return -1;
        }
        v = v << 4 | h;
    }
    return v;
}

/* "\uXXXX" (p->pos on the 'u'), with a low surrogate escape after a high
 * one. "\u0000" and a lone low surrogate fail at their backslash (start),
 * a high surrogate without its partner where that should begin. */
static bool scan_unicode_escape(struct json_parser *p, size_t start)
{
    p->pos++;
    long v = scan_hex4(p);
    if (v < 0)
        return false;
    if (v == 0 || (v >= 0xdc00 && v <= 0xdfff))
        return fail_at(p, start); /* jsonb refuses both */
    if (v < 0xd800 || v > 0xdbff)
        return true;
    /* A high surrogate: the next escape must be a low one. */
    size_t low = p->pos;
    if (low >= p->len || p->s[low] != '\\')
        return fail_at(p, low);
    if (low + 1 >= p->len || p->s[low + 1] != 'u')
        return fail_at(p, low + 1);
    p->pos += 2;
    v = scan_hex4(p);
    if (v < 0)
        return false;
    if (v < 0xdc00 || v > 0xdfff)
        return fail_at(p, low);
    return true;
}

/* A backslash escape; p->pos is on the backslash. */
static bool scan_escape(struct json_parser *p)
{
    size_t start = p->pos++;
    if (p->pos >= p->len)
        return fail_at(p, p->pos);
    switch (p->s[p->pos]) {
    case '"':
    case '\\':
    case '/':
    case 'b':
    case 'f':
    case 'n':
    case 'r':
    case 't': p->pos++; return true;
    case 'u': return scan_unicode_escape(p, start);
    default: return fail_at(p, p->pos);
    }
}

/* Continuation bytes a UTF-8 lead byte needs (-1: not a lead byte), and the
 * range of the first one, which is what excludes overlong forms,
 * surrogates and code points above U+10FFFF. */
static int utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        return 1;
    if (c >= 0xe0 && c <= 0xef) {
        if (c == 0xe0)
            *lo = 0xa0;
        else if (c == 0xed)
            *hi = 0x9f;
        return 2;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (c == 0xf0)
            *lo = 0x90;
        else if (c == 0xf4)
            *hi = 0x8f;
        return 3;
    }
    return -1;
}

/* One multi-byte UTF-8 sequence; p->pos is on its lead byte. */
static bool scan_utf8(struct json_parser *p)
{
    unsigned char lo, hi;
    int more = utf8_lead(p->s[p->pos], &lo, &hi);
    if (more < 0)
        return fail_at(p, p->pos);
    p->pos++;
    for (int i = 0; i < more; i++, p->pos++) {
        if (p->pos >= p->len || p->s[p->pos] < lo || p->s[p->pos] > hi)
            return fail_at(p, p->pos);
        lo = 0x80;
        hi = 0xbf;
    }
    return true;
}

int pqmq__utf8_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char lo, hi;
        int more = *p < 0x80 ? 0 : utf8_lead(*p, &lo, &hi);
        if (more < 0)
            return 0;
        p++;
        for (int i = 0; i < more; i++, p++) {
            if (*p < lo || *p > hi) /* also stops at the terminating NUL */
                return 0;
            lo = 0x80;
            hi = 0xbf;
        }
    }
    return 1;
}

/* A string; p->pos is on the opening quote. */
static bool scan_string(struct json_parser *p)
{
    p->pos++;
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        bool ok = true;
        if (c == '"') {
            p->pos++;
            return true;
        } else if (c == '\\') {
            ok = scan_escape(p);
        } else if (c < 0x20) {
            ok = fail_at(p, p->pos); /* control characters must be escaped */
        } else if (c < 0x80) {
            p->pos++;
        } else {
            ok = scan_utf8(p);
        }
        if (!ok)
            return false;
    }
    return fail_at(p, p->pos);
}

/* A string, number or literal, per its first byte c. */
static bool scan_scalar(struct json_parser *p, unsigned char c)
{
    switch (c) {
    case '"': return scan_string(p);
    case 't': return scan_literal(p, "true");
    case 'f': return scan_literal(p, "false");
    case 'n': return scan_literal(p, "null");
    default:
        if (c == '-' || is_digit(c))
            return scan_number(p);
        return fail_at(p, p->pos);
    }
}

/* A value where one is expected: opens a container or scans a scalar. */
static bool on_value(struct json_parser *p, unsigned char c, enum json_state *next)
{
    if (c == '[' || c == '{') {
        if (p->depth == JSON_MAX_DEPTH)
            return fail_at(p, p->pos);
        p->open[p->depth++] = c;
        p->pos++;
        *next = c == '[' ? ST_VALUE_OR_CLOSE : ST_KEY_OR_CLOSE;
        return true;
    }
    *next = ST_AFTER;
    return scan_scalar(p, c);
}

/* After a value inside a container: ',' or the matching close. */
static bool on_after(struct json_parser *p, unsigned char c, enum json_state *next)
{
    if (p->depth == 0)
        return fail_at(p, p->pos); /* trailing garbage */
    unsigned char open = p->open[p->depth - 1];
    if (c == ',') {
        *next = open == '[' ? ST_VALUE : ST_KEY;
    } else if (c == (open == '[' ? ']' : '}')) {
        p->depth--;
        *next = ST_AFTER;
    } else {
        return fail_at(p, p->pos);
    }
    p->pos++;
    return true;
}

/* A member name where one is expected. */
static bool on_key(struct json_parser *p, unsigned char c, enum json_state *next)
{
    if (c != '"')
        return fail_at(p, p->pos);
    *next = ST_COLON;
    return scan_string(p);
}

/* Consumes one token in state st; false after recording an error. */
static bool step(struct json_parser *p, enum json_state *st)
{
    unsigned char c = p->s[p->pos];
    switch (*st) {
    case ST_VALUE_OR_CLOSE:
    case ST_KEY_OR_CLOSE:
        if (c == (*st == ST_VALUE_OR_CLOSE ? ']' : '}')) {
            p->depth--;
            p->pos++;
            *st = ST_AFTER;
            return true;
        }
        if (*st == ST_VALUE_OR_CLOSE)
            return on_value(p, c, st);
        return on_key(p, c, st);
    case ST_KEY: return on_key(p, c, st);
    case ST_COLON:
        if (c != ':')
            return fail_at(p, p->pos);
        p->pos++;
        *st = ST_VALUE;
        return true;
    case ST_VALUE: return on_value(p, c, st);
    case ST_AFTER: return on_after(p, c, st);
    }
    return fail_at(p, p->pos);
}

PQMQ_EXPORT size_t pqmq_json_check(const char *text, size_t len)
{
    struct json_parser p = {.s = (const unsigned char *)text, .len = len};
    enum json_state st = ST_VALUE;

    if (!text)
        return 1;
    for (;;) {
        skip_ws(&p);
        if (p.pos == p.len)
            return st == ST_AFTER && p.depth == 0 ? 0 : p.len + 1;
        if (!step(&p, &st))
            return p.err;
    }
}
