"""The serving process around the app: uvicorn's protocols with the client edge's checks.

``edge`` (HTTP) and ``wsedge`` (WebSocket) are the connection's limits before
the app sees a request; ``signals`` turns SIGTERM and Ctrl-C into the drain;
``supervisor`` runs ``serve --workers N``. Nothing here judges a stream or
talks to an upstream.
"""
