"""The bearer token check of the emit API and the alert streams.

`Authorization: Bearer <token>` compared in constant time with the content of
`[http] emit_token_file`. No token configured: the endpoint is disabled and
answers 403 naming the key that enables it. Missing or wrong: 401. Nothing
durable here; the token never reaches a log line or a response.
"""

from __future__ import annotations

import hmac

from lumio_ingestd.config import Secret
from lumio_ingestd.web.server import Request, Response

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="lumio-ingestd"'}


def check_bearer(request: Request, token: Secret | None, key: str, what: str) -> Response | None:
    """None when the request carries the token; else the response that refuses it."""
    if token is None:
        return Response.json(403, {"error": f"{what}: disabled until {key} is set"})
    header = request.headers.get("Authorization") or ""
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return Response.json(401, {"error": "missing bearer token"}, _CHALLENGE)
    if not hmac.compare_digest(given.strip().encode(), token.reveal().encode()):
        return Response.json(401, {"error": "wrong bearer token"}, _CHALLENGE)
    return None
