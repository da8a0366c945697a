"""Orchard's Python client: browser and desktop sandboxes, episodes, tasks
and recordings. Standard library only (Python 3.9+).

Shell sandboxes speak Orchard Env's API, so Orchard Env's own SDK
(``orchard_env``) drives them unchanged; this client covers that API's
basics too (create, exec, files) and everything Orchard adds.

    from orchard import Client

    c = Client()  # ORCHARD_URL / ORCHARD_API_KEY, or SANDBOX_BASE_URL / SANDBOX_API_KEY
    with c.create_sandbox(kind="browser", block_network=False) as sb:
        r = sb.browser.act({"type": "navigate", "url": "https://example.com"},
                           observe={"screenshot": "jpeg", "som": True})
        png = sb.browser.screenshot().data
"""

import asyncio
import base64
import concurrent.futures
import functools
import http.client
import json
import os
import random
import threading
import time
import urllib.parse

__all__ = ["Client", "AsyncClient", "Sandbox", "Browser", "Desktop", "Episode", "Image", "OrchardError", "ServiceEndpoint",
           "screenshot_bytes"]

DEFAULT_URL = "http://127.0.0.1:8000"
# KEEP_ALIVE_IDLE: a connection idle this long may have been closed by the
# server (or a proxy between), so it is not reused.
KEEP_ALIVE_IDLE = 30.0


class OrchardError(Exception):
    """An error the server reported, classified as the server classified it
    (``code`` such as ``site.dns`` or ``sandbox.not_found``; ``source``:
    who caused it; ``retryable``), or a transport failure (status 0,
    code ``client.unreachable``)."""

    def __init__(self, status, code, message, category="", source="", retryable=False, detail=None):
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.category = category
        self.source = source
        self.retryable = retryable
        self.detail = detail

    @classmethod
    def from_response(cls, status, body):
        try:
            doc = json.loads(body or b"null")
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            e = doc.get("error")
            if isinstance(e, dict):
                return cls(status, e.get("code", ""), e.get("message", ""), e.get("category", ""),
                           e.get("source", ""), bool(e.get("retryable")), doc.get("detail"))
            if "detail" in doc:
                return cls(status, "", json.dumps(doc["detail"]) if not isinstance(doc["detail"], str) else doc["detail"],
                           detail=doc["detail"])
        text = (body or b"")[:300].decode("utf-8", "replace")
        return cls(status, "", text or http.client.responses.get(status, "error"))


class Image:
    """Image bytes with the frame and scale that actions naming this image's
    pixels need."""

    def __init__(self, data, content_type, frame=None, scale=None, width=None, height=None):
        self.data = data
        self.content_type = content_type
        self.frame = frame
        self.scale = scale
        self.width = width
        self.height = height

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self.data)


def screenshot_bytes(observation):
    """The screenshot of an observation (a dict from act/observe/step) as
    bytes, or None when it has none."""
    shot = (observation or {}).get("screenshot")
    if not shot or not shot.get("data"):
        return None
    return base64.b64decode(shot["data"])


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _float(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class Client:
    """One Orchard server, over one kept-alive connection per thread.
    Requests that change nothing (GET, DELETE) are retried on connection
    failures and on 503s the server marks retryable; others are sent once,
    so an exec never runs twice."""

    def __init__(self, base_url=None, api_key=None, timeout=300.0, retries=3):
        self.base_url = (base_url or os.environ.get("ORCHARD_URL") or os.environ.get("SANDBOX_BASE_URL")
                         or DEFAULT_URL).rstrip("/")
        self.api_key = api_key or os.environ.get("ORCHARD_API_KEY") or os.environ.get("SANDBOX_API_KEY")
        self.timeout = timeout
        self.retries = max(1, retries)
        u = urllib.parse.urlsplit(self.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url {self.base_url!r}: want http(s)://host[:port][/prefix]")
        self._prefix = u.path.rstrip("/")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns = set()  # every thread's connection, for close

    # -- transport -------------------------------------------------------

    def request(self, method, path, body=None, query=None, data=None, content_type=None, timeout=None):
        """Send one request; returns (status, headers, body bytes). body is
        sent as JSON, data as raw bytes. Raises OrchardError."""
        target = self._prefix + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                target += "?" + urllib.parse.urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in q.items()})
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["X-API-Key"] = self.api_key
        if body is not None:
            data = json.dumps(body).encode()
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        idempotent = method in ("GET", "HEAD", "DELETE")
        attempt = 0
        while True:
            last = attempt >= self.retries - 1
            conn, reused = self._conn(timeout or self.timeout)
            sent = False
            try:
                conn.request(method, target, body=data, headers=headers)
                sent = True
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.HTTPException, OSError) as e:
                self._drop()
                # A kept-alive connection the server had closed fails before
                # anything was sent, or with no answer at all: try once more
                # on a new one when nothing can have run twice.
                if reused and (not sent or idempotent):
                    continue
                if idempotent and not last:
                    attempt += 1
                    self._backoff(attempt - 1)
                    continue
                raise OrchardError(0, "client.unreachable", f"{method} {self.base_url}{target}: {e}", retryable=True) from e
            if resp.will_close:
                self._drop()
            else:
                self._local.used = time.monotonic()
            if 200 <= resp.status < 300:
                return resp.status, resp.headers, raw
            err = OrchardError.from_response(resp.status, raw)
            if idempotent and not last and resp.status == 503 and err.retryable:
                attempt += 1
                self._backoff(attempt - 1, resp.headers.get("Retry-After"))
                continue
            raise err

    def _conn(self, timeout):
        """This thread's kept-alive connection (one per thread: http.client
        connections are not safe to share), and whether it served before.
        One idle longer than keepAliveIdle is replaced rather than trusted."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and time.monotonic() - self._local.used > KEEP_ALIVE_IDLE:
            self._drop()
            conn = None
        reused = conn is not None
        if conn is None:
            u = urllib.parse.urlsplit(self.base_url)
            cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
            conn = cls(u.hostname, u.port, timeout=timeout)
            self._local.conn, self._local.used = conn, time.monotonic()
            with self._lock:
                self._conns.add(conn)
        conn.timeout = timeout
        if conn.sock is not None:
            try:
                conn.sock.settimeout(timeout)
            except OSError:  # closed under us: start afresh
                self._drop()
                return self._conn(timeout)
        return conn, reused

    def _drop(self):
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self):
        """Close the connections of every thread that used the client."""
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _backoff(attempt, retry_after=None):
        delay = _float(retry_after)
        if delay is None:
            delay = min(0.5 * 2 ** attempt, 5.0)
        time.sleep(delay + random.uniform(0, delay / 2))

    def json(self, method, path, body=None, query=None, timeout=None):
        _, _, raw = self.request(method, path, body=body, query=query, timeout=timeout)
        return json.loads(raw) if raw else None

    def image(self, path, query):
        _, headers, raw = self.request("GET", path, query=query)
        return Image(raw, headers.get("Content-Type", ""),
                     frame=_int(headers.get("X-Orchard-Frame")), scale=_float(headers.get("X-Orchard-Scale")),
                     width=_int(headers.get("X-Screenshot-Width")), height=_int(headers.get("X-Screenshot-Height")))

    # -- server ----------------------------------------------------------

    def health(self):
        return self.json("GET", "/health")

    def resources(self):
        return self.json("GET", "/resources")

    def site_health(self):
        return self.json("GET", "/sitehealth")["hosts"]

    # -- sandboxes -------------------------------------------------------

    def create_sandbox(self, kind=None, image=None, wait=True, wait_timeout=300, pool=None, **fields):
        """Create a sandbox (fields as POST /sandboxes takes them: browser,
        desktop, egress, env, labels, ttl_seconds, faults, block_network,
        cpu, memory, snapshot, exec, harnesses, ...) and, with wait, return it once
        ready. A sandbox that fails to start is deleted and its fault
        raised. Kind and image default to shell and host, or to the
        snapshot's. pool claims a ready sandbox of that warm pool (a create
        whose fields match a pool's spec claims from it without naming it)."""
        body = {"block_network": fields.pop("block_network", True)}
        if kind is not None or "snapshot" not in fields:
            body["kind"] = kind or "shell"
        if image is not None or "snapshot" not in fields:
            body["image"] = image or "host"
        body.update(fields)
        if pool is not None:
            body["pool"] = pool
        info = self.json("POST", "/sandboxes", body)
        sb = Sandbox(self, info)
        if wait:
            try:
                sb.wait(wait_timeout)
            except BaseException:
                sb.delete()
                raise
        return sb

    def sandbox(self, sandbox_id):
        return Sandbox(self, self.json("GET", f"/sandboxes/{_seg(sandbox_id)}"))

    def snapshots(self):
        """Every snapshot, oldest first."""
        return self.json("GET", "/snapshots")["snapshots"]

    def snapshot(self, snapshot_id):
        return self.json("GET", f"/snapshots/{_seg(snapshot_id)}")

    def delete_snapshot(self, snapshot_id):
        """Delete a snapshot; sandboxes started from it keep working."""
        return self.json("DELETE", f"/snapshots/{_seg(snapshot_id)}")

    def sandboxes(self, kind=None, status=None, labels=None):
        q = {"kind": kind, "status": status}
        if labels:
            q["labels"] = ",".join(f"{k}={v}" for k, v in labels.items())
        return [Sandbox(self, s) for s in self.json("GET", "/sandboxes", query=q)["sandboxes"]]

    # -- warm pools --------------------------------------------------------

    def create_pool(self, name, size, max=None, kind="shell", image="host", **fields):
        """Define a warm pool of size ready sandboxes made from the fields
        of a create (as create_sandbox takes them); max bounds ready plus
        starting ones (default size). Returns the pool with its counts."""
        sandbox = {"image": image, "kind": kind, "block_network": fields.pop("block_network", True)}
        sandbox.update(fields)
        body = {"name": name, "size": size, "sandbox": sandbox}
        if max is not None:
            body["max"] = max
        return self.json("POST", "/pools", body)

    def list_pools(self):
        """Every pool with its counts: ready, starting, claims, misses."""
        return self.json("GET", "/pools")["pools"]

    def pool(self, name):
        return self.json("GET", f"/pools/{_seg(name)}")

    def delete_pool(self, name):
        """Delete a pool and its unclaimed sandboxes (claimed ones stay);
        returns how many it deleted."""
        return self.json("DELETE", f"/pools/{_seg(name)}")["drained"]

    # -- tasks, episodes, recordings ----------------------------------------

    def tasks(self):
        return self.json("GET", "/tasks")["suites"]

    def load_tasks(self, suite, data, name="tasks.jsonl"):
        """Load a task suite from the file's content (bytes or str): our
        JSONL or YAML, WebVoyager JSONL or Online-Mind2Web JSON."""
        if isinstance(data, str):
            data = data.encode()
        _, _, raw = self.request("POST", "/tasks", query={"suite": suite, "name": name}, data=data,
                                 content_type="application/octet-stream")
        return json.loads(raw)

    def start_episode(self, task_id=None, task=None, sandbox=None, observe=None, max_steps=None,
                      step_timeout_ms=None, record=None):
        """Start an episode on a loaded task (task_id) or an inline task;
        returns it with its first observation."""
        body = {"task_id": task_id, "task": task, "sandbox": sandbox, "observe": observe,
                "max_steps": max_steps, "step_timeout_ms": step_timeout_ms, "record": record}
        return Episode(self, self.json("POST", "/episodes", {k: v for k, v in body.items() if v is not None}))

    def episodes(self):
        return self.json("GET", "/episodes")["episodes"]

    def fork_episode(self, episode_id, count, timeout=600):
        """Branch a running episode into ``count`` episodes that continue
        from its current step k, each in its own forked sandbox (files and
        browser state; the task's setup commands run again). Returns the
        branches as Episodes, each with step k's observation taken in its
        own sandbox. The parent goes on."""
        r = self.json("POST", f"/episodes/{_seg(episode_id)}/fork", {"count": count}, timeout=timeout)
        return [Episode(self, b) for b in r["branches"]]

    def episode_tree(self, episode_id):
        """The episode's family: {root, episodes: [{episode_id, parent,
        branch_step, steps, status, outcome, reward, recording_id,
        children}]}, flat, root first, parents before children."""
        return self.json("GET", f"/episodes/{_seg(episode_id)}/tree")

    def value_of_step(self, episode_id, n, policy=None, k=None, max_steps=30, workers=None, policy_factory=None):
        """Monte-Carlo value of an episode's current step: branch it into
        ``n``, run ``policy(observation)`` in each branch until the episode
        is done, the policy returns None, or ``max_steps`` more steps, then
        finish each. ``policy`` returns an action, a list of actions, or
        None to stop. ``k``, when given, must be the episode's current step
        (an episode branches where it is). Returns {value, rewards,
        outcomes, episodes}: ``value`` is the mean reward of the branches
        that did not end ``env_error`` (None when all did) — the
        environment's failures are not the policy's. A policy with memory
        passes ``policy_factory`` instead: called once per branch, it
        returns that branch's policy. The branches roll out in parallel
        threads (``workers``, default n)."""
        if (policy is None) == (policy_factory is None):
            raise ValueError("give policy or policy_factory")
        if k is not None:
            at = self.json("GET", f"/episodes/{_seg(episode_id)}")["steps"]
            if at != k:
                raise ValueError(f"episode {episode_id} is at step {at}, not {k}: it branches at its current step")
        branches = self.fork_episode(episode_id, n)

        def rollout(ep):
            act = policy if policy is not None else policy_factory()
            try:
                for _ in range(max_steps):
                    if ep.done:
                        break
                    action = act(ep.observation)
                    if action is None:
                        break
                    if isinstance(action, list):
                        r = self.json("POST", f"/episodes/{_seg(ep.id)}/step", {"actions": action})
                        ep.observation = r.get("observation", ep.observation)
                        ep.done = bool(r.get("done"))
                    else:
                        ep.step(action)
            finally:
                res = ep.finish()
            return res

        with concurrent.futures.ThreadPoolExecutor(max_workers=workers or n) as pool:
            results = list(pool.map(rollout, branches))
        rewards = [r.get("reward") for r in results]
        counted = [r.get("reward") or 0.0 for r in results if r.get("outcome") != "env_error"]
        return {"value": sum(counted) / len(counted) if counted else None, "rewards": rewards,
                "outcomes": [r.get("outcome") for r in results], "episodes": [ep.id for ep in branches]}

    def recordings(self):
        return self.json("GET", "/recordings")["recordings"]

    def recording(self, recording_id):
        return self.json("GET", f"/recordings/{_seg(recording_id)}")

    def export_recording(self, recording_id, format="jsonl"):
        """A recording as jsonl, parquet, gif, mp4 or html (bytes)."""
        _, _, raw = self.request("GET", f"/recordings/{_seg(recording_id)}/export", query={"format": format})
        return raw


def _seg(s):
    return urllib.parse.quote(str(s), safe="")


class Sandbox:
    """A sandbox; ``browser`` and ``desktop`` reach its kind's API. As a
    context manager it is deleted on exit."""

    def __init__(self, client, info):
        self.client = client
        self.info = info
        self.id = info["sandbox_id"]
        self.browser = Browser(self)
        self.desktop = Desktop(self)

    def __repr__(self):
        return f"Sandbox({self.id!r}, kind={self.kind!r}, status={self.status!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.delete()

    @property
    def kind(self):
        return self.info.get("kind") or "shell"

    @property
    def status(self):
        return self.info.get("status")

    def _path(self, rest=""):
        return f"/sandboxes/{_seg(self.id)}{rest}"

    def refresh(self):
        self.info = self.client.json("GET", self._path())
        return self

    def wait(self, timeout=300):
        """Block until the sandbox is ready; a failed start raises its fault."""
        info = self.client.json("GET", self._path("/wait"), query={"timeout": int(timeout)}, timeout=timeout + 30)
        self.info = info
        if info.get("status") != "ready":
            f = info.get("fault") or {}
            raise OrchardError(0, f.get("code", "sandbox.failed"),
                               f.get("message") or info.get("status_message") or f"sandbox {self.id} is {info.get('status')}",
                               f.get("category", ""), f.get("source", "sandbox"), bool(f.get("retryable")))
        return self

    def delete(self):
        try:
            self.client.json("DELETE", self._path())
        except OrchardError as e:
            if e.status != 404:
                raise

    def heartbeat(self):
        return self.client.json("POST", self._path("/heartbeat"))

    def expose_service(self, port, ttl_seconds=None, wait_ready=False, health_path="/health", ready_timeout=60):
        """Expose a service listening on port inside the sandbox (on any
        address, loopback included) and return its ServiceEndpoint. The
        URL is a bearer credential: anyone holding it reaches the service,
        without an API key, until it expires (ttl_seconds, at most and by
        default the sandbox's remaining lifetime) or is revoked. With
        wait_ready, block until health_path answers 2xx (OrchardError
        service.not_ready, 408, after ready_timeout seconds)."""
        body = {"port": port, "wait_ready": wait_ready, "health_path": health_path, "ready_timeout": ready_timeout}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        timeout = (ready_timeout if wait_ready else 0) + self.client.timeout
        return ServiceEndpoint(self.client.json("POST", self._path("/services"), body, timeout=timeout))

    def list_services(self):
        """The ports the sandbox exposes."""
        return self.client.json("GET", self._path("/services")).get("ports", [])

    def revoke_service(self, port):
        """Stop exposing port: its URLs fail at once."""
        return self.client.json("DELETE", self._path(f"/services/{int(port)}"))

    def pause(self):
        """Stop every process in place, memory kept; exec, files and actions
        raise OrchardError sandbox.paused (409) until resume()."""
        self.info = self.client.json("POST", self._path("/pause"))
        return self

    def resume(self):
        """Let a paused sandbox's processes go on where they stopped."""
        self.info = self.client.json("POST", self._path("/resume"))
        return self

    def snapshot(self, labels=None):
        """Save the sandbox's files (and a browser's state) as a snapshot;
        returns it ({snapshot_id, ...}). Start sandboxes from it with
        client.create_sandbox(snapshot=id)."""
        return self.client.json("POST", self._path("/snapshots"), {"labels": labels} if labels else {})

    def fork(self, count, labels=None, timeout=300):
        """Branch count ready sandboxes off this one's current state (files,
        browser state; not running processes)."""
        body = {"count": int(count), "timeout": int(timeout)}
        if labels:
            body["labels"] = labels
        res = self.client.json("POST", self._path("/fork"), body, timeout=timeout + 30)
        return [Sandbox(self.client, s) for s in res["sandboxes"]]

    def exec(self, command, timeout=None, cwd=None, env=None, login_shell=False):
        """Run a command (bash -c) and wait for it; returns the job: status,
        exit_code, stdout, stderr (and fault when the sandbox, not the
        command, failed)."""
        body = {"command": command, "timeout_seconds": timeout, "cwd": cwd, "env": env,
                "login_shell": login_shell, "wait": True}
        job = self.client.json("POST", self._path("/exec"), body,
                               timeout=(timeout or 3600) + 60)
        # The server's wait ends at the command's timeout + 30 s, time spent
        # queued behind the sandbox's other jobs included: keep waiting on
        # the job (a GET, safe to retry) until it has ended.
        while job.get("status") not in ("succeeded", "failed"):
            job = self.client.json("GET", f"/jobs/{_seg(job['job_id'])}/wait", query={"timeout": 60}, timeout=90)
        return job

    def upload(self, path, data, mode=None):
        if isinstance(data, str):
            data = data.encode()
        body = {"path": path, "content": base64.b64encode(data).decode()}
        if mode:
            body["mode"] = mode
        return self.client.json("POST", self._path("/files"), body)

    def download(self, path):
        doc = self.client.json("GET", self._path("/files"), query={"path": path})
        return base64.b64decode(doc["content"])

    def list_files(self, path="/workspace"):
        return self.client.json("GET", self._path("/files/list"), query={"path": path})


class ServiceEndpoint:
    """An exposed service: url (HTTP; append the service's own paths) and
    ws_url (the same for WebSocket clients), valid until expires_at."""

    def __init__(self, data):
        self.sandbox_id = data["sandbox_id"]
        self.port = data["port"]
        self.url = data["url"]
        self.expires_at = data["expires_at"]

    @property
    def ws_url(self):
        if self.url.startswith("https://"):
            return "wss://" + self.url[len("https://"):]
        return "ws://" + self.url[len("http://"):]

    def __repr__(self):
        # The URL is a credential: not shown.
        return f"ServiceEndpoint(sandbox_id={self.sandbox_id!r}, port={self.port}, expires_at={self.expires_at})"


def _actions(actions):
    return [actions] if isinstance(actions, dict) else list(actions)


class Browser:
    """The browser of a ``kind="browser"`` sandbox (API.md)."""

    def __init__(self, sandbox):
        self.sandbox = sandbox

    def _path(self, rest):
        return self.sandbox._path("/browser" + rest)

    def act(self, actions, observe=None, frame=None, strict=False, settle=None):
        """Run one action (a dict) or a list in order; returns {ok,
        results, observation?, timing}. An action that fails on the page is
        a result with ok false and its classified error, not an exception."""
        body = {"actions": _actions(actions)}
        for k, v in (("observe", observe), ("frame", frame), ("settle", settle)):
            if v is not None:
                body[k] = v
        if strict:
            body["strict"] = True
        return self.sandbox.client.json("POST", self._path("/actions"), body)

    def observe(self, screenshot="jpeg", quality=None, width=None, scale=None, axtree=False, som=False,
                text=False, full_page=False):
        q = {"screenshot": screenshot, "quality": quality, "width": width, "scale": scale,
             "axtree": axtree, "som": som, "text": text, "full_page": full_page}
        return self.sandbox.client.json("GET", self._path("/observation"), query=q)

    def screenshot(self, format="png", quality=None, width=None, scale=None, full_page=False):
        return self.sandbox.client.image(self._path("/screenshot"), {
            "format": format, "quality": quality, "width": width, "scale": scale, "full_page": full_page})

    def tabs(self):
        return self.sandbox.client.json("GET", self._path("/tabs"))["tabs"]

    def evaluate(self, expression):
        """Evaluate JavaScript in the active tab; returns its value."""
        return self.sandbox.client.json("POST", self._path("/evaluate"), {"expression": expression}).get("value")

    def network(self, har=False, since=None):
        return self.sandbox.client.json("GET", self._path("/network"),
                                        query={"format": "har" if har else None, "since": since})


class Desktop:
    """The X11 desktop of a ``kind="desktop"`` sandbox (API.md); actions in
    Orchard's, Anthropic's or OpenAI's computer-use vocabulary."""

    def __init__(self, sandbox):
        self.sandbox = sandbox

    def _path(self, rest):
        return self.sandbox._path("/desktop" + rest)

    def act(self, actions, observe=None, frame=None, strict=False):
        body = {"actions": _actions(actions)}
        if observe is not None:
            body["observe"] = observe
        if frame is not None:
            body["frame"] = frame
        if strict:
            body["strict"] = True
        return self.sandbox.client.json("POST", self._path("/actions"), body)

    def screenshot(self, format="png", quality=None, width=None, height=None):
        return self.sandbox.client.image(self._path("/screenshot"), {
            "format": format, "quality": quality, "width": width, "height": height})

    def cursor(self):
        return self.sandbox.client.json("GET", self._path("/cursor"))

    def status(self):
        return self.sandbox.client.json("GET", self._path("/status"))


class Episode:
    """One episode of the RL loop: step until done, then finish."""

    def __init__(self, client, doc):
        self.client = client
        self.id = doc["episode_id"]
        self.sandbox_id = doc.get("sandbox_id")
        self.observation = doc.get("observation")
        self.done = False

    def __repr__(self):
        return f"Episode({self.id!r}, sandbox={self.sandbox_id!r}, done={self.done})"

    def step(self, action):
        """One action; returns {observation, done, info}. A fault of the
        environment ends the episode (done) with info.error set."""
        r = self.client.json("POST", f"/episodes/{_seg(self.id)}/step", {"action": action})
        self.observation = r.get("observation", self.observation)
        self.done = bool(r.get("done"))
        return r

    def finish(self, answer=None):
        """Evaluate and end: {outcome (success, failure or env_error),
        reward, evaluation, attribution, recording_id}."""
        body = {} if answer is None else {"answer": answer}
        self.done = True
        return self.client.json("POST", f"/episodes/{_seg(self.id)}/finish", body)

    def abort(self):
        self.done = True
        return self.client.json("DELETE", f"/episodes/{_seg(self.id)}")

    def state(self):
        return self.client.json("GET", f"/episodes/{_seg(self.id)}")

    def fork(self, count):
        """Branch into ``count`` episodes that continue from here
        (Client.fork_episode)."""
        return self.client.fork_episode(self.id, count)

    def tree(self):
        return self.client.episode_tree(self.id)


class _Async:
    """An asyncio face on a blocking object of this module: each method
    call runs on the client's worker threads and the objects it returns
    get the same face."""

    def __init__(self, obj, pool):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_pool", pool)

    def __getattr__(self, name):
        value = getattr(self._obj, name)
        if isinstance(value, _WRAPPED):
            return _Async(value, self._pool)
        if callable(value):
            async def call(*args, **kwargs):
                fut = self._pool.submit(functools.partial(value, *args, **kwargs))
                try:
                    result = await asyncio.wrap_future(fut)
                except asyncio.CancelledError:
                    # The call goes on in its thread; what it creates for a
                    # caller that is gone would be left behind.
                    if name in _CREATES:
                        fut.add_done_callback(_release)
                    raise
                return _lift(result, self._pool)
            call.__name__ = name
            call.__doc__ = getattr(value, "__doc__", None)
            return call
        return value

    def __repr__(self):
        return f"Async{self._obj!r}"

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        # Only a sandbox is a context manager: leaving deletes it.
        await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(self._obj.__exit__, *exc))


_WRAPPED = (Sandbox, Browser, Desktop, Episode)

# The methods whose result is a sandbox or an episode the call created.
_CREATES = frozenset({"create_sandbox", "start_episode"})


def _release(fut):
    """Delete the sandbox or abort the episode a cancelled call created."""
    if fut.cancelled() or fut.exception() is not None:
        return
    obj = fut.result()
    try:
        if isinstance(obj, Sandbox):
            obj.delete()
        elif isinstance(obj, Episode):
            obj.abort()
    except OrchardError:
        pass


def _lift(value, pool):
    if isinstance(value, _WRAPPED):
        return _Async(value, pool)
    if isinstance(value, list) and value and isinstance(value[0], _WRAPPED):
        return [_Async(v, pool) for v in value]
    return value


class AsyncClient(_Async):
    """Client for asyncio code, for rollouts that run many sandboxes at
    once: the same methods as Client, awaited; the sandboxes, browsers,
    desktops and episodes it returns are awaited the same way. Calls run on
    up to workers threads of its own (each waits on the network, not the
    CPU), so as many requests are in flight at once.

        c = AsyncClient()
        async with await c.create_sandbox(kind="browser", block_network=False) as sb:
            r = await sb.browser.act({"type": "navigate", "url": url})
    """

    def __init__(self, *args, workers=64, **kwargs):
        super().__init__(Client(*args, **kwargs), concurrent.futures.ThreadPoolExecutor(workers, "orchard"))

    def close(self):
        """Stop the worker threads (after the calls in flight) and close
        their connections."""
        self._pool.shutdown(wait=True)
        self._obj.close()
