"""A local stand-in for the Hugging Face hub: repos from folders, served over HTTP as the hub
serves them to `huggingface_hub` (point HF_ENDPOINT at `url`).

What huggingface_hub 1.x asks for, and what the hub answers:
  GET  /api/models/{repo}/revision/{rev}  JSON: id, sha (the commit), siblings [{rfilename}]
  HEAD /{repo}/resolve/{rev}/{file}       200 with X-Repo-Commit, ETag (the git blob id) and
                                          Content-Length; an LFS file (weights) answers 302 to
                                          the CDN with X-Linked-Etag (its sha256) and X-Linked-Size
  GET  the same, or the CDN's URL         the bytes (a Range resumes a partial download)
An unknown repo is 401 with `X-Error-Code: RepoNotFound` (the hub does not say whether a
private repo exists), an unknown revision 404 RevisionNotFound, a missing file 404 EntryNotFound.
A gated repo's info is public; its files need `Authorization: Bearer TOKEN` of a user who
accepted its terms (401 GatedRepo without a token, 403 with another).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".onnx", ".pt")
_INFO = re.compile(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?")
_RESOLVE = re.compile(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")
_CDN = re.compile(r"/cdn/([0-9a-f]{64})")


@dataclass(frozen=True)
class RepoFile:
    path: Path
    git_oid: str  # sha1 of the git blob
    sha256: str
    size: int

    @property
    def lfs(self) -> bool:
        return self.path.suffix in LFS_SUFFIXES


class Repo:
    def __init__(self, folder: Path) -> None:
        self.files: dict[str, RepoFile] = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = path.read_bytes()
            self.files[path.relative_to(folder).as_posix()] = RepoFile(
                path,
                hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                hashlib.sha256(data).hexdigest(),
                len(data),
            )
        tree = "".join(f"{name} {f.git_oid}\n" for name, f in self.files.items())
        self.sha = hashlib.sha1(tree.encode()).hexdigest()


class HubMirror:
    """Serves `repos` (repo id -> folder) on a free local port until `stop()`; `gated` maps a
    repo id to the one token that may read its files."""

    def __init__(self, repos: dict[str, Path], gated: dict[str, str] | None = None) -> None:
        self.repos = {repo_id: Repo(folder) for repo_id, folder in repos.items()}
        self.gated = gated or {}
        self.requests: list[tuple[str, str]] = []  # (method, path), in order
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def __enter__(self) -> HubMirror:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _blob(self, sha256: str) -> RepoFile | None:
        for repo in self.repos.values():
            for f in repo.files.values():
                if f.sha256 == sha256:
                    return f
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                path = urlsplit(self.path).path
                mirror.requests.append((self.command, path))
                if match := _INFO.fullmatch(path):
                    self._info(unquote(match[1]), unquote(match[2] or "main"))
                elif match := _RESOLVE.fullmatch(path):
                    self._resolve(unquote(match[1]), unquote(match[2]), unquote(match[3]), body)
                elif (match := _CDN.fullmatch(path)) and (blob := mirror._blob(match[1])):
                    self._file(blob, {}, body)
                else:
                    self._send(404, {}, b"Not Found")

            def _repo(self, repo_id: str, revision: str) -> Repo | None:
                repo = mirror.repos.get(repo_id)
                if repo is None:
                    status = 404 if "authorization" in self.headers else 401
                    self._error(status, "RepoNotFound", "Repository not found")
                elif revision not in ("main", repo.sha):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                    repo = None
                return repo

            def _info(self, repo_id: str, revision: str) -> None:
                if repo := self._repo(repo_id, revision):
                    info = {
                        "_id": repo.sha[:24],
                        "id": repo_id,
                        "modelId": repo_id,
                        "author": repo_id.split("/")[0],
                        "sha": repo.sha,
                        "lastModified": "2026-01-01T00:00:00.000Z",
                        "private": False,
                        "gated": "manual" if repo_id in mirror.gated else False,
                        "disabled": False,
                        "tags": ["transformers", "safetensors"],
                        "library_name": "transformers",
                        "siblings": [{"rfilename": name} for name in repo.files],
                    }
                    data = json.dumps(info).encode()
                    self._send(200, {"Content-Type": "application/json"}, data)

            def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
                repo = self._repo(repo_id, revision)
                if repo is None:
                    return
                commit = {"X-Repo-Commit": repo.sha}
                f = repo.files.get(name)
                token = mirror.gated.get(repo_id)
                if token and self.headers["Authorization"] != f"Bearer {token}":
                    status = 403 if "authorization" in self.headers else 401
                    self._error(status, "GatedRepo", "Access to this model is restricted")
                elif f is None:
                    self._error(404, "EntryNotFound", f"{name} does not exist", commit)
                elif f.lfs:
                    self._send(
                        302,
                        {
                            **commit,
                            "ETag": f'"{f.git_oid}"',
                            "X-Linked-Etag": f'"{f.sha256}"',
                            "X-Linked-Size": str(f.size),
                            "Location": f"{mirror.url}/cdn/{f.sha256}",
                        },
                        b"",
                    )
                else:
                    self._file(f, {**commit, "ETag": f'"{f.git_oid}"'}, body)

            def _file(self, f: RepoFile, headers: dict[str, str], body: bool) -> None:
                data = f.path.read_bytes()
                status = 200
                if body and (ranged := re.fullmatch(r"bytes=(\d+)-", self.headers["Range"] or "")):
                    start = int(ranged[1])
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    data, status = data[start:], 206
                headers.setdefault("ETag", f'"{f.sha256}"')
                headers["Content-Type"] = "application/octet-stream"
                self._send(status, headers, data if body else b"", length=len(data))

            def _error(
                self, status: int, code: str, message: str, headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps({"error": message}).encode()
                headers = {**(headers or {}), "X-Error-Code": code, "X-Error-Message": message}
                self._send(status, {**headers, "Content-Type": "application/json"}, data)

            def _send(
                self, status: int, headers: dict[str, str], data: bytes, length: int | None = None
            ) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data) if length is None else length))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

        return Handler
