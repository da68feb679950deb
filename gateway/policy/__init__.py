"""Pure decisions about a request: which route, which upstream, whether to retry.

Nothing here does I/O or keeps time: no asyncio, sockets, clocks, httpx, aiohttp,
uvicorn or starlette (``tests/unit/test_layout.py`` holds this folder to that).
A clock, where a decision needs one, is handed in (``Pool(clock=)``).
"""
