"""A Hugging Face Hub on the loopback interface: the few endpoints huggingface_hub calls to list
a model repository and download its files, serving files the tests give it.

    with FakeHub({"org/tiny-GGUF": {"tiny-Q4_K_M.gguf": path_or_bytes}}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)

- GET  /api/models/{repo}/tree/{revision}[/{path}]  the repository's files (paths, sizes)
- HEAD /{repo}/resolve/{revision}/{path}             a file's commit, ETag and size
- GET  /{repo}/resolve/{revision}/{path}             its bytes (Range requests honoured)

A repository listed in `private` answers 401 unless the request carries `Authorization: Bearer
<token>`; an unknown one answers 404 with the Hub's RepoNotFound error code. Every request is
recorded in `requests` as (method, path, authorization header).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes | Path]], private: dict[str, str] | None = None):
        self.repos = {repo: {name: (data.read_bytes() if isinstance(data, Path) else data)
                             for name, data in files.items()} for repo, files in repos.items()}
        self.private = private or {}  # repo -> token
        self.requests: list[tuple[str, str, str | None]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def downloads(self) -> list[str]:
        """The file paths fetched with GET, in order."""
        return [path.split("/resolve/", 1)[1].split("/", 1)[1] for method, path, _ in self.requests
                if method == "GET" and "/resolve/" in path]

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(hub: FakeHub):
    tree = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
    resolve = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _answer(self, head: bool) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Authorization")))
            if match := tree.match(path):
                if self._repo_ok(match["repo"]):
                    self._tree(match["repo"], match["path"] or "")
            elif match := resolve.match(path):
                if self._repo_ok(match["repo"]):
                    self._file(match["repo"], match["path"], head)
            else:
                self._error(404, "EntryNotFound", "no such route")

        def _repo_ok(self, repo: str) -> bool:
            if repo not in hub.repos:
                self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}")
                return False
            token = hub.private.get(repo)
            if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
                self._error(401, "RepoNotFound", "Invalid username or password.")
                return False
            return True

        def _tree(self, repo: str, prefix: str) -> None:
            entries = [{"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": name}
                       for name, data in sorted(hub.repos[repo].items()) if name.startswith(prefix)]
            self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"})

        def _file(self, repo: str, name: str, head: bool) -> None:
            data = hub.repos[repo].get(name)
            if data is None:
                self._error(404, "EntryNotFound", f"{name} does not exist")
                return
            etag = '"' + hashlib.sha256(data).hexdigest() + '"'
            headers = {"X-Repo-Commit": COMMIT, "ETag": etag, "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            status, body = 200, data
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if ranged and not head:
                start = int(ranged[1])
                end = int(ranged[2]) if ranged[2] else len(data) - 1
                status, body = 206, data[start:end + 1]
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(status, b"" if head else body, headers, length=len(body))

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                      "X-Error-Message": message})

        def _send(self, status: int, body: bytes, headers: dict, length: int | None = None) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

    return Handler
