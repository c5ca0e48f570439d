"""The worker's output half ends its body and waits for the answer before hanging up.

uvicorn answers a request whose sender already hung up with ``http.disconnect``, even
when body bytes it received are still unread, so the worker's output half must not
close before the relay's answer: that lost the last chunks of ``rc cp`` downloads.
"""

from __future__ import annotations

import asyncio

from resource_controller.h1 import aio
from resource_controller.worker import attached


async def _server(answered: asyncio.Event, body: bytearray, delay: float) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readuntil(b"\r\n")) != b"\r\n":
            pass  # request headers
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            body.extend(data[:-2])
        await asyncio.sleep(delay)  # the relay still handing the last chunk on
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        answered.set()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_hang_up_returns_only_after_the_answer_ends() -> None:
    async def main() -> None:
        answered = asyncio.Event()
        body = bytearray()
        server = await _server(answered, body, delay=0.3)
        port = server.sockets[0].getsockname()[1]
        async with server:
            stream = await aio.relay(f"http://127.0.0.1:{port}", "POST", "/x", "t")
            over = asyncio.create_task(attached.session_over(stream))
            await stream.write(b"last bytes")
            await attached.hang_up(stream, over, wait=5.0)
            assert answered.is_set()  # plain finish() would return before this
            assert over.result() == attached.REASON_CLIENT_LEFT  # a clean answer
        assert bytes(body) == b"last bytes"

    asyncio.run(main())


def test_an_answer_that_never_comes_is_waited_for_a_bounded_time() -> None:
    async def main() -> None:
        answered = asyncio.Event()
        server = await _server(answered, bytearray(), delay=30.0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            stream = await aio.relay(f"http://127.0.0.1:{port}", "POST", "/x", "t")
            loop = asyncio.get_running_loop()
            began = loop.time()
            over = asyncio.create_task(attached.session_over(stream))
            await attached.hang_up(stream, over, wait=0.2)
            assert loop.time() - began < 5.0 and not answered.is_set()
            server.close()

    asyncio.run(main())
