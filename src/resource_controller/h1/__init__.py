"""HTTP/1.1 for every client of the project: one sans-I/O core on h11, two shells.

``core`` frames requests and reads answers (h11 holds the rules); ``blocking`` runs it
on a socket for ``rc`` and the synchronous API, ``aio`` on asyncio streams for the
worker, the asynchronous API, the relay halves and webhooks. Each shell owns only its
reads and writes.
"""
