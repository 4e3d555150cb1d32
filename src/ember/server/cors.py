"""Which web pages on other origins may call the server (CORS), as llama-server's --cors-origins:

    "localhost"   pages served from this machine (http(s)://localhost, 127.0.0.1, [::1], any port): the default
    "*"           any page
    "a,b"         these origins exactly
    ""            none (no CORS headers are sent)

A preflight (OPTIONS) is answered without the API key, as browsers send none; the request that
follows still needs it.
"""

from __future__ import annotations

from fastapi.middleware.cors import CORSMiddleware

DEFAULT_CORS_ORIGINS = "localhost"
LOCALHOST_ORIGIN = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


def add_cors(app, origins: str) -> None:
    """Let the pages `origins` names call `app` from a browser."""
    origins = origins.strip()
    if not origins:
        return
    if origins == "localhost":
        allowed = {"allow_origin_regex": LOCALHOST_ORIGIN}
    else:
        allowed = {"allow_origins": [origin.strip() for origin in origins.split(",") if origin.strip()]}
    app.add_middleware(CORSMiddleware, allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                       max_age=600, **allowed)
