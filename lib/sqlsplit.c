/*
 * sqlsplit.c: splits a script (a migration) into its statements, for servers
 * that take one statement per query string: a Citus coordinator forwards a
 * DDL statement's query string to its workers, and a string of several
 * statements fails there ("cannot insert multiple commands into a prepared
 * statement"). Knows what can hide a semicolon: quoted strings and
 * identifiers, dollar-quoted bodies, and both kinds of comment.
 */
#include <ctype.h>
#include <string.h>

#include "pqmq-int.h"

/* Length of the dollar-quote tag at s ("$$" or "$name$"), 0 if none. */
static size_t dollar_tag(const char *s)
{
    size_t i = 1;
    if (s[0] != '$')
        return 0;
    if (isdigit((unsigned char)s[1]))
        return 0; /* $1: a parameter, not a tag */
    while (s[i] == '_' || isalnum((unsigned char)s[i]))
        i++;
    return s[i] == '$' ? i + 1 : 0;
}

/* Index just past the construct that starts at s[i] (a quote, comment or
 * dollar quote), or i + 1 for any other character; n is the script's length.
 * Unterminated: n. */
static size_t skip(const char *s, size_t i, size_t n)
{
    char q = s[i];
    if (q == '\'' || q == '"') {
        for (i++; i < n; i++)
            if (s[i] == q) {
                if (s[i + 1] != q)
                    return i + 1;
                i++; /* doubled quote */
            }
        return n;
    }
    if (q == '-' && s[i + 1] == '-') {
        const char *nl = strchr(s + i, '\n');
        return nl ? (size_t)(nl - s) + 1 : n;
    }
    if (q == '/' && s[i + 1] == '*') {
        int depth = 0; /* block comments nest in PostgreSQL */
        for (; i < n; i++) {
            if (s[i] == '/' && s[i + 1] == '*')
                depth++, i++;
            else if (s[i] == '*' && s[i + 1] == '/' && --depth == 0)
                return i + 2;
            else if (s[i] == '*' && s[i + 1] == '/')
                i++;
        }
        return n;
    }
    size_t tag = dollar_tag(s + i);
    if (tag && (i == 0 || !(isalnum((unsigned char)s[i - 1]) || s[i - 1] == '_'))) {
        for (size_t j = i + tag; j < n; j++)
            if (s[j] == '$' && !strncmp(s + j, s + i, tag))
                return j + tag;
        return n;
    }
    return i + 1;
}

/* Whether s[from..to) holds anything but blanks and comments. */
static int has_code(const char *s, size_t from, size_t to, size_t n)
{
    for (size_t i = from; i < to;) {
        if ((s[i] == '-' && s[i + 1] == '-') || (s[i] == '/' && s[i + 1] == '*')) {
            i = skip(s, i, n);
            continue;
        }
        if (!isspace((unsigned char)s[i]))
            return 1;
        i++;
    }
    return 0;
}

size_t pqmq__sql_next(const char *s, size_t n, size_t *start, size_t *len)
{
    size_t i = *start, from = *start;
    while (i < n) {
        if (s[i] == ';') {
            if (has_code(s, from, i, n)) {
                *start = from;
                *len = i + 1 - from;
                return i + 1;
            }
            from = i + 1;
            i++;
            continue;
        }
        i = skip(s, i, n);
    }
    if (has_code(s, from, i, n)) {
        *start = from;
        *len = i - from;
        return i;
    }
    *len = 0;
    return i;
}
