"""Reading a request body into one buffer with a size limit (the webhook's notifications and
the login form): no copy kept on the request, freed as soon as it is parsed."""

from __future__ import annotations

from aiohttp import web


class TooLarge(Exception):
    """The body grew past ``max_body_bytes`` while it was read."""


async def read_body(request: web.Request, limit: int) -> bytearray:
    """The request body in one buffer, allocated once when ``Content-Length`` is known. Unlike
    ``request.read()`` it keeps no copy on the request and makes none while growing, so the
    body is freed as soon as it is parsed. A connection closed meanwhile (by the peer, or by the
    connection limiter for a new one) is an ``OSError``, as aiohttp's ``RuntimeError`` is not."""
    try:
        return await _fill(request, limit)
    except RuntimeError as exc:  # aiohttp's "Connection closed."
        raise ConnectionResetError(str(exc)) from exc


async def _fill(request: web.Request, limit: int) -> bytearray:
    expected = request.content_length
    if not expected:  # chunked: grown as it arrives, up to the limit
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > limit:
                raise TooLarge
        return body
    body = bytearray(expected)
    filled = 0
    with memoryview(body) as view:
        async for chunk in request.content.iter_any():
            if filled + len(chunk) > expected:
                raise ValueError("body longer than its Content-Length")
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
    if filled < expected:
        raise ValueError("body shorter than its Content-Length")
    return body
