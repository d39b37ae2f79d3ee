#!/usr/bin/env python3
"""bench/delay_proxy.py: a TCP proxy that delays each direction, to measure
pqmq as if the server were across a network (this machine has no netem).

    python3 bench/delay_proxy.py ONE_WAY_MS LISTEN_PORT UNIX_SOCKET
    e.g. python3 bench/delay_proxy.py 0.5 6499 /tmp/pg/.s.PGSQL.5432 &
         pqmq-bench --dsn "host=127.0.0.1 port=6499 ..." [--split-complete]

Every chunk read from one side is written to the other ONE_WAY_MS later, in
order. asyncio's timers add their own jitter (a round trip costs a few ms
more than twice the delay); compare runs through the same proxy only.
"""
import asyncio
import sys
import time


async def relay(reader, writer, delay):
    queue = asyncio.Queue()

    async def pump():
        while True:
            due, data = await queue.get()
            if data is None:
                writer.close()
                return
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    task = asyncio.ensure_future(pump())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            queue.put_nowait((time.monotonic() + delay, data))
    finally:
        queue.put_nowait((0, None))
    await task


async def main(delay, port, socket_path):
    async def handle(client_r, client_w):
        server_r, server_w = await asyncio.open_unix_connection(socket_path)
        await asyncio.gather(relay(client_r, server_w, delay),
                             relay(server_r, client_w, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main(float(sys.argv[1]) / 1000.0, int(sys.argv[2]), sys.argv[3]))
