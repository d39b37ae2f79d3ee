/*
 * log.c: the lines the pqmq command writes for its operator: errors of
 * every command, and what `pqmq serve` does. Text ("pqmq CMD: message") by
 * default; with tool.log_json one JSON object a line (serve --log-format
 * json), for log collectors that parse fields instead of text.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pqmq-tool.h"

/* The length of the UTF-8 sequence that starts s (at most n bytes), or 0
 * when it is not one: JSON must be valid UTF-8, and a logged URL or peer
 * string comes from the network. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len = s[0] < 0xc2 ? 0 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : s[0] < 0xf5 ? 4 : 0;
    if (!len || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

/* msg as a JSON string into f: control bytes escaped, bytes that are not
 * UTF-8 replaced by U+FFFD. */
static void json_text(FILE *f, const char *msg)
{
    const unsigned char *s = (const unsigned char *)msg;
    size_t n = strlen(msg);
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t len;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
        } else if (c < 0x80) {
            fputc(c, f);
        } else if ((len = utf8_len(s + i, n - i))) {
            fwrite(s + i, 1, len, f);
            i += len;
            continue;
        } else {
            fputs("\\ufffd", f);
        }
        i++;
    }
    fputc('"', f);
}

static void json_line(FILE *f, const tool *t, const char *level, const char *msg)
{
    struct timespec now;
    struct tm tm;
    char when[32];
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(f, "{\"time\": \"%s.%03ldZ\", \"level\": \"%s\", \"cmd\": \"%s\", \"msg\": ", when,
            now.tv_nsec / 1000000, level, t && t->cmd ? t->cmd : "");
    json_text(f, msg);
    fputs("}\n", f);
}

/* "pqmq CMD: msg", its control bytes as \xHH: a message may quote a
 * channel name or a request, and raw escapes would reach the terminal. */
static void text_line(FILE *f, const tool *t, const char *level, const char *msg)
{
    int named = t && t->cmd;
    fprintf(f, "pqmq%s%s: %s", named ? " " : "", named ? t->cmd : "",
            strcmp(level, "warning") == 0 ? "warning: " : "");
    for (const char *p = msg; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('\n', f);
}

void tool_vlog(const tool *t, FILE *f, const char *level, const char *fmt, va_list ap)
{
    char small[512], *msg = small;
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(small, sizeof small, fmt, copy);
    va_end(copy);
    if (n >= (int)sizeof small && (msg = malloc((size_t)n + 1)))
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
    if (!msg)
        msg = small; /* out of memory: the message cut short */
    /* One locked write a line: serve logs from several threads. */
    flockfile(f);
    if (t && t->log_json)
        json_line(f, t, level, msg);
    else
        text_line(f, t, level, msg);
    funlockfile(f);
    fflush(f);
    if (msg != small)
        free(msg);
}

void tool_log(const tool *t, const char *level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tool_vlog(t, stderr, level, fmt, ap);
    va_end(ap);
}
