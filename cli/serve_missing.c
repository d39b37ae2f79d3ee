/*
 * serve_missing.c: pqmq serve in a build without libmicrohttpd (configure
 * found none, or was given --without-microhttpd): it says so and how to
 * get it. cmd_serve.c is the real one.
 */
#include "pqmq-tool.h"

int cmd_serve(tool *t, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return tool_err(t, "this pqmq was built without libmicrohttpd: install it (Debian: "
                       "libmicrohttpd-dev) and run configure again");
}
