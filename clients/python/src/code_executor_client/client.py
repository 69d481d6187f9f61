"""The client: HTTP/JSON over `http.client`, one kept-alive connection per
thread and replica, retries on `503 busy`, sessions pinned to their replica.
"""

import http.client
import json
import logging
import random
import socket
import threading
import time
from http.cookies import SimpleCookie
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Union
from urllib.parse import quote, urlsplit

__all__ = [
    "Busy",
    "Client",
    "CodeExecutorError",
    "Event",
    "Result",
    "RetryPolicy",
    "Session",
    "SessionLost",
]

# Retries are logged here (INFO), with the wait and the refusal.
_log = logging.getLogger("code_executor_client")

# Error codes of a 503 after which nothing ran: worth another try.
_RETRYABLE_CODES = ("busy", "draining", "unavailable")


class CodeExecutorError(Exception):
    """An error answer of the server: `status` (HTTP), `code` and `message`
    of its `{"error": {"code", "message"}}` body."""

    def __init__(self, status: int, code: str, message: str, replica: Optional[str] = None):
        super().__init__("%s (%s): %s" % (code, status, message))
        self.status = status
        self.code = code
        self.message = message
        # The replica that answered (its `x-replica` header), if it said.
        self.replica = replica


class Busy(CodeExecutorError):
    """`503 busy` (or draining, unavailable) after every retry the policy allows."""


class SessionLost(CodeExecutorError):
    """The session is gone: `404 unknown_session` (closed, expired, lost, or on
    a replica this call did not reach; the message says which), or an
    earlier call reported `session_lost`."""


class Result(dict):
    """A JSON object of the server's, with its keys as attributes too
    (`r.stdout`, `r["stdout"]`); a missing key reads as None."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)


class Event(NamedTuple):
    """One server-sent event of a streamed run: `kind` is "stdout" or
    "stderr" (`data` a chunk of text, as the run wrote it) or "result"
    (`data` the whole `Result`, the last event)."""

    kind: str
    data: Any


class RetryPolicy:
    """How retryable failures are retried: at most `attempts` tries in all,
    none started after `deadline` seconds, waits of `backoff` doubling up to
    `max_backoff` (each scaled by a random factor in [1 - jitter, 1]) and
    never shorter than the server's Retry-After."""

    def __init__(
        self,
        attempts: int = 8,
        deadline: float = 120.0,
        backoff: float = 0.1,
        max_backoff: float = 10.0,
        jitter: float = 0.5,
    ):
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.attempts = attempts
        self.deadline = deadline
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.jitter = jitter

    def wait(self, retry: int, retry_after: Optional[float]) -> float:
        """Seconds to wait before retry number `retry` (0 for the first)."""
        step = min(self.max_backoff, self.backoff * (2 ** retry))
        step *= 1.0 - self.jitter * random.random()
        return max(step, retry_after or 0.0)


class _Retryable(Exception):
    """A try that failed before anything ran: try again (or give up)."""

    def __init__(self, error: Exception, retry_after: Optional[float] = None):
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class _Replica:
    """One base URL: its parts, and the kept-alive connections to it (one
    per thread, as `http.client` connections are not thread-safe)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http(s) URL: %r" % url)
        self.url = url.rstrip("/")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.local = threading.local()

    def connection(self, timeout: float) -> "tuple[http.client.HTTPConnection, bool]":
        """This thread's connection, and whether it was used before."""
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
                return conn, True
            return conn, False
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=timeout)
        self.local.conn = conn
        return conn, False

    def drop(self) -> None:
        """Close this thread's connection (its state is unknown)."""
        conn = getattr(self.local, "conn", None)
        self.local.conn = None
        if conn is not None:
            conn.close()


class Client:
    """A code-executor client. `urls` is one base URL (a server, or the load
    balancer in front of several) or a list of replicas taken in turn.
    Thread-safe: each thread uses its own connections."""

    def __init__(
        self,
        urls: Union[str, Sequence[str]],
        token: Optional[str] = None,
        timeout: float = 330.0,
        retry: Optional[RetryPolicy] = None,
        headers: Optional[Dict[str, str]] = None,
    ):
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("at least one URL is needed")
        self._replicas = [_Replica(u) for u in urls]
        self._next = 0
        self._lock = threading.Lock()
        self.token = token
        # Socket timeout of a request: beyond any run's own timeout.
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.headers = dict(headers or {})

    # ---- the API ----

    def execute(self, code: str, **fields: Any) -> Result:
        """Run `code` in a clean process (`POST /execute`); the result. Other
        fields of the request go as keywords: env, timeout, stdin, files,
        limits, artifacts, session."""
        fields["code"] = code
        return self._json("POST", "/execute", fields)

    def stream(self, code: str, **fields: Any) -> Iterator[Event]:
        """Run `code` streaming its output: `Event`s of kind stdout and
        stderr as the run writes them, then one of kind result. Leaving the
        loop early cancels the run."""
        fields["code"] = code
        return self._stream("/execute", fields)

    def grade(self, code: str, tests: Optional[List[Dict[str, Any]]] = None, **fields: Any) -> Result:
        """Grade `code` against `tests` (`POST /grade`); the report. Other
        fields (compare, entry, env, timeout, stop_on_first_failure, ...) go
        as keywords."""
        fields["code"] = code
        if tests is not None:
            fields["tests"] = tests
        return self._json("POST", "/grade", fields)

    def session(self, **fields: Any) -> "Session":
        """Create a session (`POST /sessions`: env, ttl, timeout, limits as
        keywords); use it as a context manager to close it at the end."""
        replica, body, cookies, answered_by = self._request("POST", "/sessions", fields, pin=None)
        return Session(self, replica, Result(body), cookies, answered_by)

    def health(self) -> Result:
        """`GET /health` of the next replica (a 503 answer is returned too:
        it is readiness, not an error)."""
        replica = self._pick()
        status, body, _, headers = self._once(replica, "GET", "/health", None, {})
        return Result(body)

    def list_envs(self) -> List[Result]:
        return [Result(e) for e in self._json("GET", "/list-envs", None)["envs"]]

    def close(self) -> None:
        """Close this thread's connections."""
        for replica in self._replicas:
            replica.drop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- requests ----

    def _pick(self) -> _Replica:
        with self._lock:
            replica = self._replicas[self._next % len(self._replicas)]
            self._next += 1
        return replica

    def _headers(self, cookies: Optional[Dict[str, str]]) -> Dict[str, str]:
        headers = {"Accept": "application/json"}
        headers.update(self.headers)
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        if cookies:
            headers["Cookie"] = "; ".join("%s=%s" % kv for kv in cookies.items())
        return headers

    def _json(
        self,
        method: str,
        path: str,
        body: Optional[Dict[str, Any]],
        pin: Optional[_Replica] = None,
        cookies: Optional[Dict[str, str]] = None,
    ) -> Result:
        _, answer, _, _ = self._request(method, path, body, pin=pin, cookies=cookies)
        return Result(answer)

    def _request(self, method, path, body, pin, cookies=None):
        """Send with retries; (replica, JSON body, cookies it set, the
        `x-replica` that answered)."""

        def attempt(replica: _Replica):
            status, answer, set_cookies, headers = self._once(
                replica, method, path, body, self._headers(cookies)
            )
            if status >= 400:
                raise self._error(status, answer, headers)
            return replica, answer, set_cookies, headers.getheader("x-replica")

        return self._with_retries(attempt, pin)

    def _with_retries(self, attempt, pin: Optional[_Replica]):
        """Call `attempt(replica)` until it does not raise `_Retryable`, within
        the retry policy. Unpinned calls move on to the next replica at
        each try; pinned ones (a session's) stay on theirs."""
        policy = self.retry
        started = time.monotonic()
        tried_in_round = 0
        retries = 0
        for number in range(policy.attempts):
            replica = pin or self._pick()
            try:
                return attempt(replica)
            except _Retryable as failed:
                last = failed
            tried_in_round += 1
            if number + 1 >= policy.attempts:
                break
            if pin is None and tried_in_round < len(self._replicas):
                continue  # another replica may take it now: no wait
            tried_in_round = 0
            wait = policy.wait(retries, last.retry_after)
            retries += 1
            if time.monotonic() - started + wait > policy.deadline:
                break
            _log.info(
                "retrying in %.3f s (try %d of %d): %s",
                wait,
                number + 2,
                policy.attempts,
                last.error,
            )
            time.sleep(wait)
        error = last.error
        if isinstance(error, CodeExecutorError) and not isinstance(error, Busy):
            error = Busy(error.status, error.code, error.message, error.replica)
        raise error

    def _once(self, replica: _Replica, method: str, path: str, body, headers):
        """One request on `replica`; (status, JSON body, cookies set,
        headers). A refused connection is `_Retryable`; a kept-alive
        connection found closed before any answer is reopened once."""
        payload = None if body is None else json.dumps(body).encode()
        if payload is not None:
            headers = dict(headers, **{"Content-Type": "application/json"})
        for fresh_try in (False, True):
            conn, reused = replica.connection(self.timeout)
            try:
                conn.request(method, replica.prefix + path, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                replica.drop()
                if reused and not fresh_try:
                    continue  # the server had closed it: the request was not read
                raise
            except (ConnectionRefusedError, socket.gaierror) as e:
                replica.drop()
                raise _Retryable(e)
            except BaseException:
                replica.drop()
                raise
            if response.getheader("Connection", "").lower() == "close":
                replica.drop()
            answer = _parse_json(data)
            return response.status, answer, _cookies_of(response), response

    def _error(self, status: int, answer: Any, response) -> Exception:
        err = answer.get("error") if isinstance(answer, dict) else None
        err = err if isinstance(err, dict) else {}
        code = str(err.get("code") or "http_%d" % status)
        message = str(err.get("message") or answer)
        replica = response.getheader("x-replica")
        if status == 404 and code == "unknown_session":
            return SessionLost(status, code, message, replica)
        error = CodeExecutorError(status, code, message, replica)
        if status == 503 and code in _RETRYABLE_CODES:
            return _Retryable(error, _retry_after(response))
        return error

    def _event_error(self, data: str, response) -> Exception:
        """The error of an `error` event (the stream's HTTP status was 200):
        as the same refusal would have been answered without streaming."""
        answer = _parse_json(data.encode())
        code = _code_of(data)
        status = 503 if code in _RETRYABLE_CODES else (404 if code == "unknown_session" else 500)
        return self._error(status, answer, response)

    def _stream(
        self,
        path: str,
        body: Dict[str, Any],
        pin: Optional[_Replica] = None,
        cookies: Optional[Dict[str, str]] = None,
    ) -> Iterator[Event]:
        """POST with `Accept: text/event-stream`; the events. A `busy` error
        event (no worker was free: nothing ran) is retried as a 503 is."""
        headers = self._headers(cookies)
        headers["Accept"] = "text/event-stream"
        headers["Content-Type"] = "application/json"
        payload = json.dumps(body).encode()

        def attempt(replica: _Replica):
            # Streams get a connection of their own: the thread's kept-alive
            # one may be needed while the caller iterates.
            cls = http.client.HTTPSConnection if replica.https else http.client.HTTPConnection
            conn = cls(replica.host, replica.port, timeout=self.timeout)
            try:
                conn.request("POST", replica.prefix + path, body=payload, headers=headers)
                response = conn.getresponse()
            except ConnectionRefusedError as e:
                conn.close()
                raise _Retryable(e)
            except BaseException:
                conn.close()
                raise
            if response.status >= 400:
                answer = _parse_json(response.read())
                conn.close()
                raise self._error(response.status, answer, response)
            events = _sse_events(response)
            try:
                first = next(events)
            except StopIteration:
                conn.close()
                raise CodeExecutorError(response.status, "stream_ended", "the stream ended without a result")
            except BaseException:
                conn.close()
                raise
            if first[0] == "error":
                conn.close()
                raise self._event_error(first[1], response)
            return conn, response, first, events

        conn, response, first, events = self._with_retries(attempt, pin)
        try:
            pending = [first]
            while True:
                if pending:
                    kind, data = pending.pop()
                else:
                    try:
                        kind, data = next(events)
                    except StopIteration:
                        raise CodeExecutorError(
                            response.status, "stream_ended", "the stream ended without a result"
                        )
                if kind in ("stdout", "stderr"):
                    yield Event(kind, json.loads(data))
                elif kind == "result":
                    yield Event("result", Result(json.loads(data)))
                    return
                elif kind == "error":
                    error = self._event_error(data, response)
                    raise error.error if isinstance(error, _Retryable) else error
        finally:
            # Closing before the result cancels the run on the server.
            conn.close()


class Session:
    """A session: one persistent Python namespace on one replica. Every call
    goes to the replica it was created on, with the affinity cookie the load
    balancer set then. Close it (or use `with`) to free its worker."""

    def __init__(
        self,
        client: Client,
        replica: _Replica,
        info: Result,
        cookies: Dict[str, str],
        answered_by: Optional[str] = None,
    ):
        self._client = client
        self._replica = replica
        self.info = info
        self.id: str = info["id"]
        # The server replica that holds the session (its `x-replica`).
        self.replica = answered_by
        # The balancer's affinity cookie(s), sent with every call.
        self.cookies = cookies
        # Why the session is gone, once it is.
        self.lost: Optional[str] = None

    def execute(self, code: str, **fields: Any) -> Result:
        """Run `code` in the session; the result (`SessionLost` once gone)."""
        self._check()
        fields["code"] = code
        fields["session"] = self.id
        try:
            result = self._client._json("POST", "/execute", fields, pin=self._replica, cookies=self.cookies)
        except SessionLost as e:
            self.lost = e.message
            raise
        if result.get("session_lost"):
            self.lost = result["session_lost"]
        return result

    def stream(self, code: str, **fields: Any) -> Iterator[Event]:
        """`Client.stream` in the session."""
        self._check()
        fields["code"] = code
        fields["session"] = self.id
        try:
            for event in self._client._stream("/execute", fields, pin=self._replica, cookies=self.cookies):
                if event.kind == "result" and event.data.get("session_lost"):
                    self.lost = event.data["session_lost"]
                yield event
        except SessionLost as e:
            self.lost = e.message
            raise

    def close(self) -> None:
        """End the session (a session already gone is not an error)."""
        if self.lost is not None:
            return
        try:
            self._client._json(
                "DELETE", "/sessions/" + quote(self.id, safe=""), None, pin=self._replica, cookies=self.cookies
            )
        except SessionLost:
            pass
        self.lost = "it was closed"

    def _check(self) -> None:
        if self.lost is not None:
            raise SessionLost(404, "unknown_session", "session %r is gone: %s" % (self.id, self.lost))

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8")) if data else {}
    except ValueError:
        return {"error": {"code": "not_json", "message": data[:200].decode("utf-8", "replace")}}


def _code_of(data: str) -> Optional[str]:
    body = _parse_json(data.encode())
    err = body.get("error") if isinstance(body, dict) else None
    return err.get("code") if isinstance(err, dict) else None


def _retry_after(response) -> Optional[float]:
    value = response.getheader("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _cookies_of(response) -> Dict[str, str]:
    """Name and value of every cookie the answer sets (attributes dropped)."""
    jar: Dict[str, str] = {}
    for header in response.msg.get_all("Set-Cookie") or []:
        parsed = SimpleCookie()
        try:
            parsed.load(header)
        except Exception:
            continue
        for name, morsel in parsed.items():
            jar[name] = morsel.value
    return jar


def _sse_events(response) -> Iterator["tuple[str, str]"]:
    """(event, data) pairs of a text/event-stream answer."""
    kind, data = "message", []
    while True:
        line = response.readline()
        if not line:
            return
        line = line.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield kind, "\n".join(data)
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "event":
                kind = value
            elif field == "data":
                data.append(value)
