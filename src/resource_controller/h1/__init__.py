"""HTTP/1.1 for every client of the project: one sans-I/O core on h11 (``core``), run on a
blocking socket (``blocking``: ``rc``, the synchronous API) or asyncio streams (``aio``:
the worker, the asynchronous API, the relay halves, webhooks).
"""
