/*
 * output.c: escaping for the formats the pqmq command writes (JSON,
 * Prometheus labels, terminal text).
 */
#include <string.h>
#include <unistd.h>

#include "pqmq-tool.h"

void out_json_str(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20 || c == 0x7f)
                fprintf(f, "\\u%04x", c);
            else
                fputc(c, f);
        }
    }
    fputc('"', f);
}

/* The text format escapes exactly these three in label values. */
void out_prom_label(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '"')
            fputs("\\\"", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

void out_display(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\')
            fputs("\\\\", f);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
}

size_t out_display_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\' || c == '\n' || c == '\t')
            w += 2;
        else if (c < 0x20 || c == 0x7f)
            w += 4;
        else if ((c & 0xc0) != 0x80) /* count UTF-8 sequences once */
            w++;
    }
    return w;
}

int out_is_tty(FILE *f)
{
    return isatty(fileno(f));
}
