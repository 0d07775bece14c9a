"""A local, in-memory stand-in for the Hugging Face Hub HTTP API, enough for the real `huggingface_hub` client.

It serves what `create_repo`, `create_commit`, `repo_info`, `list_repo_tree`, `get_paths_info`, `hf_hub_download`,
`snapshot_download`, `HfFileSystem` and `datasets.load_dataset("org/name")` call, and can be told to fail or stall so
that tests can check how callers behave when the Hub misbehaves. As on the Hub, Parquet files go through Git LFS:
`preupload` answers "lfs" for them, and the client uploads them with the LFS batch API's basic transfer (a PUT per
object, then a verify) before the commit names them by sha256; the other files travel inline in the commit. The client
takes that path when Xet is off (`HF_HUB_DISABLE_XET=1`).
Point the client at it with `HF_ENDPOINT=http://127.0.0.1:<port>`; see `tests/store/test_hub.py` for the fixture.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.loopback import LoopbackServer

REPO_TYPES = ("model", "dataset", "space")
# The client asks for a revision by name or by 40-hex commit id.
COMMIT_ID = re.compile(r"^[0-9a-f]{40}$")
# Files the Hub stores in LFS whatever their size (its default .gitattributes lists them); the rest go inline.
LFS_SUFFIXES = (".parquet", ".safetensors", ".bin", ".arrow")
GITATTRIBUTES = b"".join(b"*%s filter=lfs diff=lfs merge=lfs -text\n" % suffix.encode() for suffix in LFS_SUFFIXES)


def git_blob_id(content: bytes) -> str:
    """The git object id of a blob: the client compares it with `preupload`'s `oid` to skip unchanged files."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Commit:
    oid: str
    files: dict[str, bytes]  # the whole tree at this commit; repos here are small
    title: str
    date: str
    lfs: frozenset[str] = frozenset()  # paths of `files` stored as LFS objects


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)  # oldest first; only one branch, "main"

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def commit_at(self, revision: str) -> Commit | None:
        if revision == "main":
            return self.head
        return next((commit for commit in self.commits if commit.oid == revision), None)


class HubError(Exception):
    """An error answer: status, the `X-Error-Code` the client maps to an exception type, and a message."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.code, self.headers, self.extra = status, message, code, headers or {}, extra


class LocalHub(LoopbackServer):
    """The server's state and its fault-injection switches; thread-safe."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, for assertions
        self.unknown: list[tuple[str, str]] = []  # requests no route matched: the client needs an endpoint we lack
        self.authorizations: list[str] = []  # Authorization headers seen, to check a token was (only) sent here
        self.lfs_objects: dict[str, bytes] = {}  # sha256 hex -> content, shared by every repo as on the Hub
        self.create_requests: list[dict] = []  # bodies of /api/repos/create, to check what the client asked for
        self._failures_left = 0
        self._failure_status = 500
        self._failure_match: str | None = None
        self._stall_until = 0.0
        self._gate: threading.Event | None = None  # `hold`: requests wait for it
        self.held: list[bool] = []  # per request `hold` made wait: True when `release` let it go (not the limit)
        self._lock = threading.RLock()
        super().__init__(_make_handler(self), host, port, name="local-hub")

    # -- lifecycle -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self.heal()
        super().stop()

    # -- fault injection -------------------------------------------------------------------------------------
    def fail_next(self, count: int, status: int = 500, path_contains: str | None = None) -> None:
        """Answer `status` to the next `count` requests (only those whose path contains `path_contains`)."""
        with self._lock:
            self._failures_left, self._failure_status, self._failure_match = count, status, path_contains

    def stall(self, seconds: float) -> None:
        """Hold every request that arrives in the next `seconds` until that time has passed, then serve it."""
        with self._lock:
            self._stall_until = time.monotonic() + seconds

    def hold(self, limit: float = 120.0) -> None:
        """Hold every request from now on until `release` (or, so that a test never hangs, `limit` seconds)."""
        with self._lock:
            self._gate, self._hold_limit = threading.Event(), limit

    def release(self) -> None:
        """Lets the requests `hold` keeps go, and serves the next ones at once."""
        with self._lock:
            gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    def heal(self) -> None:
        self.release()
        with self._lock:
            self._failures_left, self._stall_until = 0, 0.0

    def _injected_fault(self, path: str) -> int | None:
        with self._lock:
            stall = self._stall_until - time.monotonic()
            gate, limit = self._gate, getattr(self, "_hold_limit", 0.0)
        if stall > 0:
            time.sleep(stall)
        if gate is not None:
            released = gate.wait(limit)
            with self._lock:
                self.held.append(released)
        with self._lock:
            if self._failures_left > 0 and (self._failure_match is None or self._failure_match in path):
                self._failures_left -= 1
                return self._failure_status
        return None

    # -- state helpers for tests -----------------------------------------------------------------------------
    def files(self, repo_id: str, repo_type: str = "dataset", revision: str = "main") -> dict[str, bytes]:
        with self._lock:
            return dict(self._repo(repo_type, repo_id).commit_at(revision).files)

    def commit_titles(self, repo_id: str, repo_type: str = "dataset") -> list[str]:
        with self._lock:
            return [commit.title for commit in self._repo(repo_type, repo_id).commits]

    def lfs_paths(self, repo_id: str, repo_type: str = "dataset") -> set[str]:
        """Paths of the repo's head that were uploaded through LFS (not inline in the commit)."""
        with self._lock:
            return set(self._repo(repo_type, repo_id).head.lfs)

    def add_repo(self, repo_id: str, repo_type: str = "dataset", private: bool = False) -> None:
        """Creates a repo as if someone had made it on the Hub earlier (e.g. public, to test visibility checks)."""
        with self._lock:
            repo = Repo(repo_type, repo_id, private=private)
            repo.commits.append(_new_commit({".gitattributes": GITATTRIBUTES}, "initial commit"))
            self.repos[(repo_type, repo_id)] = repo

    # -- routing ---------------------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, headers, body: bytes) -> tuple[int, dict, bytes]:
        url = urlsplit(raw_path)
        path, query = url.path, {key: values[-1] for key, values in parse_qs(url.query).items()}
        with self._lock:
            self.requests.append((method, path))
            if headers.get("Authorization"):
                self.authorizations.append(headers["Authorization"])
        status = self._injected_fault(path)
        if status is not None:
            return _json(status, {"error": f"Injected failure {status}"})
        try:
            for pattern, route_method, handler in self._routes():
                match = re.fullmatch(pattern, path)
                if match and method in route_method:
                    params = {key: unquote(value) for key, value in match.groupdict().items() if value is not None}
                    return handler(method=method, query=query, headers=headers, body=body, **params)
        except HubError as error:
            return _json(error.status, {"error": error.message, **error.extra}, code=error.code, headers=error.headers)
        with self._lock:
            self.unknown.append((method, raw_path))
        return _json(501, {"error": f"The local hub does not implement {method} {path}"})

    def _routes(self):
        repo = r"(?P<repo_type>models|datasets|spaces)/(?P<repo_id>[^/]+/[^/]+)"
        return (
            (r"/api/repos/create", ("POST",), self._create_repo),
            (r"/api/validate-yaml", ("POST",), self._validate_yaml),
            (r"/api/agent-harnesses", ("GET",), self._agent_harnesses),
            (
                r"/(?:(?P<prefix>datasets|spaces)/)?(?P<repo_id>[^/]+/[^/]+)\.git/info/lfs/objects/batch",
                ("POST",),
                self._lfs_batch,
            ),
            (r"/lfs-upload/(?P<oid>[0-9a-f]{64})/(?P<size>\d+)", ("PUT",), self._lfs_upload),
            (r"/lfs-verify", ("POST",), self._lfs_verify),
            (rf"/api/{repo}/preupload/(?P<revision>[^/]+)", ("POST",), self._preupload),
            (rf"/api/{repo}/commit/(?P<revision>[^/]+)", ("POST",), self._commit),
            (rf"/api/{repo}/tree/(?P<revision>[^/]+)(?:/(?P<subpath>.*))?", ("GET",), self._tree),
            (rf"/api/{repo}/paths-info/(?P<revision>[^/]+)", ("POST",), self._paths_info),
            (rf"/api/{repo}/refs", ("GET",), self._refs),
            (rf"/api/{repo}(?:/revision/(?P<revision>[^/]+))?", ("GET",), self._info),
            (
                r"/(?:(?P<prefix>datasets|spaces)/)?(?P<repo_id>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)",
                ("GET", "HEAD"),
                self._resolve,
            ),
        )

    def _repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type.rstrip("s"), repo_id))
        if repo is None:
            raise HubError(404, f"Repository {repo_id} not found", code="RepoNotFound")
        return repo

    def _commit_of(self, repo: Repo, revision: str) -> Commit:
        commit = repo.commit_at(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return commit

    # -- endpoints -------------------------------------------------------------------------------------------
    def _create_repo(self, body, **_):
        payload = json.loads(body or b"{}")
        with self._lock:
            self.create_requests.append(payload)
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
        url = f"{self.endpoint}/{'' if repo_type == 'model' else repo_type + 's/'}{repo_id}"
        with self._lock:
            if (repo_type, repo_id) in self.repos:
                # `create_repo(exist_ok=True)` reads the url from the conflict answer.
                raise HubError(409, f"You already created this {repo_type} repo", url=url)
            # huggingface_hub sends `visibility`, or nothing (the account's default: public here).
            repo = Repo(repo_type, repo_id, private=payload.get("visibility") == "private")
            # A new repo on the Hub has one commit with a .gitattributes file.
            repo.commits.append(_new_commit({".gitattributes": GITATTRIBUTES}, "initial commit"))
            self.repos[(repo_type, repo_id)] = repo
        return _json(200, {"url": url, "name": repo_id, "id": repo_id})

    def _validate_yaml(self, **_):
        return _json(200, {"errors": [], "warnings": []})

    def _agent_harnesses(self, **_):
        # The client fetches this registry once per process to tag its user agent; an empty one is valid.
        return _json(200, {"standardEnvVars": [], "harnesses": {}})

    def _preupload(self, repo_type, repo_id, revision, body, **_):
        with self._lock:
            commit = self._commit_of(self._repo(repo_type, repo_id), revision)
            files = [
                {
                    "path": entry["path"],
                    "uploadMode": "lfs" if entry["path"].endswith(LFS_SUFFIXES) else "regular",
                    "shouldIgnore": False,
                    # The client compares this with its own oid to skip unchanged files: sha256 for LFS, else sha1.
                    "oid": _oid(commit, entry["path"]) if entry["path"] in commit.files else None,
                }
                for entry in json.loads(body)["files"]
            ]
        return _json(200, {"files": files, "commitOid": commit.oid})

    def _commit(self, repo_type, repo_id, revision, body, **_):
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            if revision != "main":
                raise HubError(400, "The local hub only commits to 'main'")
            files, lfs = dict(repo.head.files), set(repo.head.lfs)
            header = {}
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "header":
                    header = value
                    if value.get("parentCommit") not in (None, repo.head.oid):
                        raise HubError(412, "A commit has happened since. Please refresh and try again.")
                elif key == "file":
                    files[value["path"]] = base64.b64decode(value["content"])
                    lfs.discard(value["path"])
                elif key == "lfsFile":
                    if value["oid"] not in self.lfs_objects:  # the Hub refuses a pointer to an object never uploaded
                        raise HubError(400, f"LFS object {value['oid']} of {value['path']} was not uploaded")
                    files[value["path"]] = self.lfs_objects[value["oid"]]
                    lfs.add(value["path"])
                elif key == "deletedFile":
                    if value["path"] not in files:
                        raise HubError(404, "A file with this name doesn't exist", code="EntryNotFound")
                    del files[value["path"]]
                    lfs.discard(value["path"])
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    files = {path: data for path, data in files.items() if not path.startswith(prefix)}
                    lfs = {path for path in lfs if path in files}
                else:
                    raise HubError(400, f"The local hub does not support '{key}' commit entries")
            commit = _new_commit(files, header.get("summary", ""), lfs)
            repo.commits.append(commit)
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        return _json(
            200,
            {
                "success": True,
                "commitOid": commit.oid,
                "commitUrl": f"{self.endpoint}/{prefix}{repo_id}/commit/{commit.oid}",
                "pullRequestUrl": None,
            },
        )

    # -- Git LFS batch API, basic transfer (https://github.com/git-lfs/git-lfs/blob/main/docs/api/batch.md) ---------
    def _lfs_batch(self, repo_id, body, prefix=None, **_):
        payload = json.loads(body)
        with self._lock:
            self._repo(prefix[:-1] if prefix else "model", repo_id)
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            raise HubError(400, f"The local hub only does basic LFS uploads, not {payload}")
        objects = []
        for obj in payload["objects"]:
            oid, size = obj["oid"], obj["size"]
            entry = {"oid": oid, "size": size, "authenticated": True}
            with self._lock:
                stored = oid in self.lfs_objects
            if not stored:  # an object the storage already holds gets no actions: the client skips its upload
                entry["actions"] = {
                    "upload": {"href": f"{self.endpoint}/lfs-upload/{oid}/{size}", "header": {}},
                    "verify": {"href": f"{self.endpoint}/lfs-verify", "header": {}},
                }
            objects.append(entry)
        return _json(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def _lfs_upload(self, oid, size, body, **_):
        if len(body) != int(size) or hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"LFS upload of {oid}: content does not match its oid and size")
        with self._lock:
            self.lfs_objects[oid] = body
        return 200, {"Content-Length": "0"}, b""

    def _lfs_verify(self, body, **_):
        payload = json.loads(body)
        with self._lock:
            data = self.lfs_objects.get(payload["oid"])
        if data is None or len(data) != payload["size"]:
            raise HubError(404, f"LFS object {payload['oid']} not found")
        return _json(200, {"success": True})

    def _info(self, repo_type, repo_id, revision="main", **_):
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            commit = self._commit_of(repo, revision)
            siblings = [
                {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
                for path, data in commit.files.items()
            ]
        return _json(
            200,
            {
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "author": repo_id.split("/")[0],
                "sha": commit.oid,
                "lastModified": commit.date,
                "createdAt": repo.commits[0].date,
                "private": repo.private,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
            },
        )

    def _refs(self, repo_type, repo_id, **_):
        with self._lock:
            head = self._repo(repo_type, repo_id).head
        branch = {"name": "main", "ref": "refs/heads/main", "targetCommit": head.oid}
        return _json(200, {"branches": [branch], "converts": [], "tags": []})

    def _tree(self, repo_type, repo_id, revision, query, subpath="", **_):
        with self._lock:
            commit = self._commit_of(self._repo(repo_type, repo_id), revision)
            files = dict(commit.files)
        recursive = query.get("recursive", "false").lower() in ("1", "true")
        prefix = subpath.strip("/") + "/" if subpath.strip("/") else ""
        if prefix and not any(path.startswith(prefix) for path in files):
            raise HubError(404, f"Entry not found: {subpath}", code="EntryNotFound", headers=_commit_header(commit))
        entries: dict[str, dict] = {}
        for path, data in sorted(files.items()):
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix) :].split("/")
            # Every folder on the way to a file is an entry of its own, as on the Hub.
            for depth in range(1, len(parts)):
                folder = prefix + "/".join(parts[:depth])
                if recursive or depth == 1:
                    entries.setdefault(folder, _folder_entry(folder))
            if recursive or len(parts) == 1:
                entries[path] = _file_entry(path, data, commit)
        return _json(200, list(entries.values()))

    def _paths_info(self, repo_type, repo_id, revision, headers, body, **_):
        if "json" in headers.get("Content-Type", ""):
            paths = json.loads(body).get("paths", [])
        else:
            paths = parse_qs(body.decode()).get("paths", [])
        with self._lock:
            commit = self._commit_of(self._repo(repo_type, repo_id), revision)
            files = dict(commit.files)
        entries = []
        for requested in paths:
            requested = requested.strip("/")
            if requested in files:
                entries.append(_file_entry(requested, files[requested], commit))
            elif requested == "" or any(path.startswith(requested + "/") for path in files):
                entries.append(_folder_entry(requested))
        return _json(200, entries)

    def _resolve(self, method, repo_id, revision, file, headers, prefix=None, **_):
        repo_type = prefix[:-1] if prefix else "model"
        with self._lock:
            commit = self._commit_of(self._repo(repo_type, repo_id), revision)
            data = commit.files.get(file)
        if data is None:
            raise HubError(404, f"Entry not found: {file}", code="EntryNotFound", headers=_commit_header(commit))
        out_headers = {
            **_commit_header(commit),
            "ETag": f'"{_oid(commit, file)}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        status, payload = 200, data
        byte_range = re.fullmatch(r"bytes=(\d*)-(\d*)", headers.get("Range", "") or "")
        if byte_range:
            start_text, end_text = byte_range.groups()
            if start_text:
                start, end = int(start_text), min(int(end_text) if end_text else len(data) - 1, len(data) - 1)
            else:  # a suffix range: the last N bytes
                start, end = max(len(data) - int(end_text), 0), len(data) - 1
            if start >= len(data):
                return 416, {"Content-Range": f"bytes */{len(data)}"}, b""
            status, payload = 206, data[start : end + 1]
            out_headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        if file in commit.lfs:  # what the Hub adds for an LFS file (the client prefers it to ETag)
            out_headers.update({"X-Linked-Etag": out_headers["ETag"], "X-Linked-Size": str(len(data))})
        out_headers["Content-Length"] = str(len(payload))
        return status, out_headers, b"" if method == "HEAD" else payload


def _new_commit(files: dict[str, bytes], title: str, lfs: set[str] | frozenset[str] = frozenset()) -> Commit:
    digest = hashlib.sha1(json.dumps(sorted((p, git_blob_id(d)) for p, d in files.items())).encode())
    digest.update(f"{title}{time.time_ns()}".encode())
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return Commit(oid=digest.hexdigest(), files=files, title=title, date=date, lfs=frozenset(lfs))


def _oid(commit: Commit, path: str) -> str:
    """What the Hub calls a file's oid: sha256 of the content for an LFS file, git's blob sha1 for the others."""
    data = commit.files[path]
    return hashlib.sha256(data).hexdigest() if path in commit.lfs else git_blob_id(data)


def _file_entry(path: str, data: bytes, commit: Commit) -> dict:
    entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
    if path in commit.lfs:
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


def _folder_entry(path: str) -> dict:
    return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0, "path": path}


def _commit_header(commit: Commit) -> dict:
    return {"X-Repo-Commit": commit.oid}


def _json(status: int, payload, code: str | None = None, headers: dict | None = None) -> tuple[int, dict, bytes]:
    body = json.dumps(payload).encode()
    out = {"Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
    if code:
        out["X-Error-Code"] = code
        out["X-Error-Message"] = payload.get("error", "")
    return status, out, body


def _make_handler(hub: LocalHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as the client's connection pool expects; every answer carries a Content-Length.
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":  # streamed uploads (LFS PUT)
                body = self._read_chunked()
            else:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
            status, headers, payload = hub.handle(self.command, self.path, self.headers, body)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _read_chunked(self) -> bytes:
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()  # the empty line after the last chunk (no trailers from the client)
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format, *args):  # noqa: A002 - the base class's signature
            pass  # tests read `hub.requests` instead of stderr noise

    return Handler
