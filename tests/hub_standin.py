"""A Hugging Face hub stand-in on 127.0.0.1 for the hub tests: the endpoints ``huggingface_hub``
calls to download (``HEAD``/``GET /{repo}/resolve/{rev}/{path}``), list (``GET
/api/models/{repo}/tree/{rev}``, ``GET /api/models/{repo}[/revision/{rev}]``), create a repo
(``POST /api/repos/create``) and commit (``POST /api/validate-yaml``, ``POST
/api/models/{repo}/preupload/{rev}`` - every file "regular", so its bytes come in the commit
itself -, ``POST /api/models/{repo}/commit/{rev}``). Repos keep every commit: a branch name or a
commit id reads that revision. ``token`` set: writes need ``Authorization: Bearer <token>``.
"""
from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
from urllib.parse import unquote, urlparse


class Repo:
    def __init__(self) -> None:
        self.commits: list[tuple[str, dict[str, bytes]]] = []
        self.branches: dict[str, str] = {}

    def files(self, rev: str | None) -> dict[str, bytes] | None:
        sha = self.branches.get(rev or "main", rev)
        return next((f for s, f in self.commits if s == sha), None)

    def sha(self, rev: str | None) -> str | None:
        sha = self.branches.get(rev or "main", rev)
        return sha if any(s == sha for s, _ in self.commits) else None

    def commit(self, branch: str, changes: dict[str, bytes]) -> str:
        base = dict(self.files(branch) or {})
        base.update(changes)
        sha = hashlib.sha1(f"{len(self.commits)}{sorted(base)}".encode() + b"".join(base.values())).hexdigest()
        self.commits.append((sha, base))
        self.branches[branch] = sha
        return sha


class StandInHub:
    """``with StandInHub() as hub:`` serves at ``hub.url``; ``hub.repos`` (repo id -> Repo),
    ``hub.requests`` ((method, path) of every request)."""

    def __init__(self, token: str | None = None) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.token = token
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 5

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._route(body=False)

            def do_GET(self) -> None:
                self._route(body=True)

            def do_POST(self) -> None:
                self._route(body=True)

            # -- answers
            def _send(self, code: int, data: bytes = b"", headers: dict | None = None, body: bool = True,
                      ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if body and data:
                    self.wfile.write(data)

            def _json(self, code: int, obj: object, headers: dict | None = None) -> None:
                self._send(code, json.dumps(obj).encode(), headers)

            def _error(self, code: int, error_code: str, body: bool = True) -> None:
                data = json.dumps({"error": f"{error_code} (stand-in hub)"}).encode()
                self._send(code, data, {"X-Error-Code": error_code, "X-Error-Message": f"{error_code} (stand-in hub)"},
                           body)

            def _read(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _authorised(self) -> bool:
                return hub.token is None or self.headers.get("Authorization") == f"Bearer {hub.token}"

            # -- routes
            def _route(self, body: bool) -> None:
                hub.requests.append((self.command, self.path))
                url = urlparse(self.path)
                parts = [unquote(p) for p in url.path.lstrip("/").split("/")]
                try:
                    if self.command == "POST":
                        return self._post(parts)
                    if parts[:2] == ["api", "models"] and len(parts) >= 4:
                        return self._api_get(parts[2] + "/" + parts[3], parts[4:])
                    if len(parts) >= 5 and parts[2] == "resolve":
                        return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), body)
                    self._error(404, "RepoNotFound", body)
                except Exception as exc:   # noqa: BLE001 - a bug here shows up as a 500 the test reports
                    self._json(500, {"error": repr(exc)})

            def _resolve(self, repo_id: str, rev: str, path: str, body: bool) -> None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._error(404, "RepoNotFound", body)
                files = repo.files(rev)
                if files is None:
                    return self._error(404, "RevisionNotFound", body)
                data = files.get(path)
                if data is None:
                    return self._error(404, "EntryNotFound", body)
                self._send(200, data, {"ETag": f'"{hashlib.sha1(data).hexdigest()}"', "X-Repo-Commit": repo.sha(rev),
                                       "Accept-Ranges": "bytes"}, body, "application/octet-stream")

            def _api_get(self, repo_id: str, rest: list[str]) -> None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._error(404, "RepoNotFound")
                rev = rest[1] if len(rest) >= 2 and rest[0] in ("tree", "revision") else None
                files = repo.files(rev)
                if files is None:
                    return self._error(404, "RevisionNotFound")
                if rest and rest[0] == "tree":
                    return self._json(200, [{"type": "file", "path": p, "size": len(d),
                                             "oid": hashlib.sha1(d).hexdigest()} for p, d in sorted(files.items())])
                self._json(200, {"id": repo_id, "modelId": repo_id, "sha": repo.sha(rev), "private": False,
                                 "siblings": [{"rfilename": p} for p in sorted(files)]})

            def _post(self, parts: list[str]) -> None:
                raw = self._read()
                if not self._authorised():
                    return self._error(401, "Unauthorized")
                if parts == ["api", "repos", "create"]:
                    payload = json.loads(raw)
                    repo_id = f"{payload['organization']}/{payload['name']}"
                    if repo_id in hub.repos:
                        return self._json(409, {"error": "You already created this model repo", "url": self._url(repo_id)})
                    hub.repos[repo_id] = Repo()
                    return self._json(200, {"url": self._url(repo_id), "name": repo_id})
                if parts == ["api", "validate-yaml"]:
                    return self._json(200, {})
                if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] in ("preupload", "commit"):
                    repo = hub.repos.get(f"{parts[2]}/{parts[3]}")
                    if repo is None:
                        return self._error(404, "RepoNotFound")
                    if parts[4] == "preupload":
                        files = json.loads(raw)["files"]
                        return self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                           "shouldIgnore": False, "oid": None} for f in files]})
                    changes = {}
                    for line in raw.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            changes[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                        elif item["key"] != "header":
                            return self._json(400, {"error": f"the stand-in takes regular files, not {item['key']}"})
                    sha = repo.commit(parts[5], changes)
                    return self._json(200, {"commitUrl": f"{hub.url}/{parts[2]}/{parts[3]}/commit/{sha}",
                                            "commitOid": sha})
                self._error(404, "RepoNotFound")

            def _url(self, repo_id: str) -> str:
                return f"{hub.url}/{repo_id}"

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> StandInHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def point_hub_at(monkeypatch, tmp_path, url: str) -> None:
    """Point huggingface_hub (and libreyolo's hub calls) at ``url``: downloads on, no proxies, no
    token, its cache and home under ``tmp_path``; pooled connections dropped before and after."""
    import huggingface_hub.utils as hf_utils
    from huggingface_hub import constants, file_download

    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "HF_TOKEN",
                "HUGGING_FACE_HUB_TOKEN", "LIBREYOLO_HUB_TIMEOUT", "LIBREYOLO_HF_REPO", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("LIBREYOLO_OFFLINE", "0")
    monkeypatch.setenv("LIBREYOLO_WEIGHTS_DIR", str(tmp_path / "weights"))
    template = url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf_home" / "stored_tokens"), raising=False)
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 5, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 5, raising=False)
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf_home" / "agents.json"), raising=False)
    for name, value in (("ENDPOINT", url), ("HUGGINGFACE_CO_URL_TEMPLATE", template), ("HF_HUB_OFFLINE", False)):
        if hasattr(file_download, name):
            monkeypatch.setattr(file_download, name, value)
    for name in ("close_session", "reset_sessions"):
        fn = getattr(hf_utils, name, None)
        if callable(fn):
            fn()
