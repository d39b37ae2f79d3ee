/*
 * serve_form.c: the decoding of application/x-www-form-urlencoded text for
 * pqmq serve: the bodies of the admin POSTs (serve_api.c, serve_pause.c)
 * and the query arguments of the GET pages (serve_story.c), one decoder so
 * that every route accepts and refuses the same escapes.
 */
#include <string.h>

#include "serve.h"

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int serve_form_decode(char *s)
{
    char *out = s;
    for (; *s; s++) {
        if (*s == '+') {
            *out++ = ' ';
        } else if (*s == '%') {
            /* s[2] is read only when s[1] is a digit, so never past the NUL. */
            int hi = hex_digit(s[1]), lo = hi < 0 ? -1 : hex_digit(s[2]);
            if (lo < 0 || (hi == 0 && lo == 0))
                return -1;
            *out++ = (char)(hi * 16 + lo);
            s += 2;
        } else {
            *out++ = *s;
        }
    }
    *out = '\0';
    return 0;
}

int serve_form_next(char **rest, char **name, char **value)
{
    char *field = *rest + strspn(*rest, "&");
    if (!*field) {
        *rest = field;
        return 0;
    }
    char *end = field + strcspn(field, "&");
    *rest = *end ? end + 1 : end;
    *end = '\0';
    char *eq = strchr(field, '=');
    if (eq)
        *eq++ = '\0';
    else
        eq = end; /* no '=': the value is the empty string at the field's end */
    *name = field;
    *value = eq;
    return serve_form_decode(field) || serve_form_decode(eq) ? -1 : 1;
}
