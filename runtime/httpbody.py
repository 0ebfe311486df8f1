"""An outside server's reply body, read whole and bounded: one reader for every HTTP client
(the remote signer, endpoint verifiers, the model, the panel scorer).

`StreamReader.read(n)` returns what has arrived so far, not n bytes: a reply that arrived in
pieces (streamed, or just long) was cut and refused as "not JSON" in four clients before they
all read through this.
"""

from __future__ import annotations

import aiohttp


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is known to exceed `limit` bytes (by its
    Content-Length, or by what has been read, inflated: nothing past the bound is read)."""
    length = response.content_length
    if length is not None and length > limit:
        return None
    # Read in pieces even when the length is declared: it counts the bytes on the wire, and a
    # compressed body (Content-Encoding, which aiohttp inflates) can be a thousand times that.
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
