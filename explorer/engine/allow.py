"""Which engines the app's Engine tab may fetch, and HTTP clients that cannot reach anything else.

The Engine tab makes the *server* send requests (/v1/models, /metrics, /v1/completions) to URLs its visitors type.
On a page served beyond this machine that is a server-side request forgery into the host's own network, so:

- bound to loopback and not shared (the default), the only visitor is the person at this machine: the tab fetches
  hosts whose every address is a loopback address (engines on this machine), plus the URLs the operator listed;
- served beyond this machine (bound to 0.0.0.0 or a LAN address, a share link, behind a proxy), it fetches only
  the URLs listed in ``EXPLORER_ENGINE_URLS`` (comma-separated) and, once that variable is set, the engines
  ``python -m explorer engine start`` launched on this host while they run. Without the variable it fetches
  nothing at all.

The check runs on resolved addresses (``socket.getaddrinfo``): a host name with even one address outside what is
allowed is refused. Against DNS rebinding the clients here resolve and check again at every connection and then
connect to the very addresses they checked (``_PinnedBackend``), never to the name. Redirects are never followed,
and proxies from the environment are never used (a proxy would fetch any URL for us).

The command line does not use this: its user types URLs on their own machine.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpcore
import httpx

from explorer.engine.server import live_engines
from explorer.errors import ExplorerError

ENV_VAR = "EXPLORER_ENGINE_URLS"
PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip")  # a reverse proxy adds them
DEFAULT_PORTS = {"http": 80, "https": 443}


class EngineRefused(ExplorerError):
    """A URL the Engine tab may not fetch (the message is one line for the visitor)."""


def check_url(url: str | None, what: str = "the engine URL") -> str:
    """A non-empty http(s) URL without its trailing slash, or one clear error naming ``what``."""
    url = (url or "").strip()
    if not url:
        raise ExplorerError(f"{what} is empty; start one with `python -m explorer engine start` or give the URL "
                            "of your vLLM server (http://host:port)")
    if not url.startswith(("http://", "https://")):
        raise ExplorerError(f"{what} must start with http:// or https:// (got {url!r})")
    return url.rstrip("/")


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is not part of the address
    return (ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else ip


def is_loopback_name(host: str | None) -> bool:
    """A bind address or client host that is this machine only: localhost, 127.0.0.0/8, ::1."""
    host = (host or "").strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return _ip(host).is_loopback
    except ValueError:
        return False


def exposure(bind: str | None = None, shared: bool = False, root_path: str = "",
             headers: Mapping[str, str] | None = None, client_host: str | None = None,
             env: Mapping[str, str] | None = None) -> str:
    """Why the app counts as served beyond this machine (a few words), or "" when it is not.

    ``bind`` is the address the app listens on; what the launch did not say is read from Gradio's own variables
    (GRADIO_SERVER_NAME, unset: 127.0.0.1; GRADIO_SHARE; GRADIO_ROOT_PATH). A proxy shows itself by a root path or
    by the forwarding headers it adds to the visitor's request."""
    env = os.environ if env is None else env
    bind = bind or env.get("GRADIO_SERVER_NAME")
    if shared or env.get("GRADIO_SHARE", "").lower() == "true":
        return "a share link"
    if bind and not is_loopback_name(bind):
        return f"bound to {bind}"
    if root_path or env.get("GRADIO_ROOT_PATH"):
        return "behind a proxy (a root path)"
    if headers and any(name.lower() in PROXY_HEADERS for name in headers):
        return "behind a proxy"
    if client_host and not is_loopback_name(client_host):
        return f"a visitor from {client_host}"
    return ""


def listed_urls(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The http(s) URLs in ``EXPLORER_ENGINE_URLS`` (comma-separated; anything else is skipped)."""
    text = (os.environ if env is None else env).get(ENV_VAR, "")
    parts = (part.strip().rstrip("/") for part in text.split(","))
    return tuple(part for part in parts if part.startswith(("http://", "https://")))


def _origin(url: str) -> tuple[str, int]:
    """(host, port) of ``url`` as httpx parses it: the host the clients below connect to."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ExplorerError(f"{url!r} is not a valid URL ({exc})") from None
    if not parsed.host:
        raise ExplorerError(f"{url!r} has no host")
    return parsed.host, parsed.port or DEFAULT_PORTS.get(parsed.scheme, 80)


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (TCP), in getaddrinfo's order, each once; [] when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    out: list[str] = []
    for *_, sockaddr in infos:
        address = str(_ip(str(sockaddr[0])))
        if address not in out:
            out.append(address)
    return out


@dataclass(frozen=True)
class EnginePolicy:
    """What one app's Engine tab may fetch; ``addresses`` is the check, the clients below enforce it."""

    loopback: bool  # any loopback address, any port (the app is bound to loopback and not shared)
    listed: tuple[str, ...] = ()  # EXPLORER_ENGINE_URLS
    exposed_by: str = ""  # why the app counts as served beyond this machine ("" when it does not)
    home: Path | None = None  # where `engine start` records its engines (None: the engine home)

    @property
    def closed(self) -> bool:
        """Nothing may be fetched: served beyond this machine and no engine listed."""
        return not self.loopback and not self.listed

    def closed_message(self) -> str:
        return (f"The Engine tab fetches nothing here: this app is served beyond this machine ({self.exposed_by}). "
                f"To allow engines, start it with {ENV_VAR}=http://host:port[,…] (the engines `python -m explorer "
                "engine start` launched on this host then count as listed).")

    def endpoints(self) -> set[tuple[str, int]]:
        """(address, port) of every listed URL and, once some URL is listed, of every engine started here that runs."""
        if not self.listed:
            return set()
        urls = list(self.listed) + [engine.url for engine in live_engines(self.home)]
        out = set()
        for url in urls:
            try:
                host, port = _origin(url)
            except ExplorerError:  # a listed entry httpx cannot parse allows nothing
                continue
            out |= {(address, port) for address in resolve(host, port)}
        return out

    def addresses(self, host: str, port: int, url: str = "", what: str = "the engine URL") -> list[str]:
        """The addresses of ``host`` if every one of them is allowed at ``port``; else one EngineRefused."""
        if self.closed:
            raise EngineRefused(self.closed_message())
        shown = f"{what} {url or f'{host}:{port}'}"
        found = resolve(host, port)
        if not found:
            raise EngineRefused(f"{shown}: the host {host!r} does not resolve")
        listed = self.endpoints()
        # every address, not any: a name that also resolves elsewhere could be made to connect there
        if all((self.loopback and _ip(a).is_loopback) or (a, port) in listed for a in found):
            return found
        if self.exposed_by:
            raise EngineRefused(f"{shown} is not an engine this app allows: served beyond this machine, it fetches "
                                f"only the URLs in {ENV_VAR} and the engines started here")
        raise EngineRefused(f"{shown} is not on this machine: the Engine tab fetches only loopback addresses "
                            f"unless {ENV_VAR} lists the engine")

    def check_url(self, url: str | None, what: str = "the engine URL") -> str:
        """``check_url`` and then the policy: the URL as given (trailing slash cut), or one ExplorerError."""
        if self.closed:
            raise EngineRefused(self.closed_message())
        url = check_url(url, what)
        host, port = _origin(url)
        self.addresses(host, port, url, what)
        return url

    def client(self, timeout: float | httpx.Timeout = 5.0) -> httpx.Client:
        """A client that connects only where this policy allows and follows no redirect. (Given a transport,
        httpx takes no proxy from the environment; ``trust_env=False`` says so.)"""
        transport = httpx.HTTPTransport(verify=_ssl_context(), trust_env=False)
        transport._pool = httpcore.ConnectionPool(  # httpx takes no network backend: give it a pool that has ours
            ssl_context=_ssl_context(), network_backend=_PinnedBackend(self))
        return httpx.Client(transport=transport, follow_redirects=False, trust_env=False, timeout=timeout)

    def async_client(self, timeout: float | httpx.Timeout = 5.0) -> httpx.AsyncClient:
        """The asyncio twin of ``client`` (what the openai client streams through)."""
        transport = httpx.AsyncHTTPTransport(verify=_ssl_context(), trust_env=False)
        transport._pool = httpcore.AsyncConnectionPool(ssl_context=_ssl_context(),
                                                       network_backend=_AsyncPinnedBackend(self))
        return httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False, timeout=timeout)


def policy_for(exposed_by: str, env: Mapping[str, str] | None = None, home: Path | None = None) -> EnginePolicy:
    """The policy of an app that is served beyond this machine for ``exposed_by`` ("" when it is not)."""
    return EnginePolicy(loopback=not exposed_by, listed=listed_urls(env), exposed_by=exposed_by, home=home)


def environment_policy(env: Mapping[str, str] | None = None, home: Path | None = None) -> EnginePolicy:
    """The policy the environment alone gives (no launched app to ask): Gradio's variables and ``ENV_VAR``."""
    return policy_for(exposure(env=env), env, home)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verifying context for every client (/metrics is polled ten times a second; loading CAs is not free)."""
    return httpx.create_ssl_context(trust_env=False)


# ---------------------------------------------------------------------------------------------
# connections: resolve, check every address, connect to one of the checked addresses (never to the name again)

class _PinnedBackend(httpcore.SyncBackend):
    def __init__(self, policy: EnginePolicy) -> None:
        self.policy = policy

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:
        error: Exception | None = None
        for address in self.policy.addresses(host, port):
            try:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        raise error or httpcore.ConnectError("no address")


class _AsyncPinnedBackend(httpcore.AnyIOBackend):
    def __init__(self, policy: EnginePolicy) -> None:
        self.policy = policy

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options=None) -> httpcore.AsyncNetworkStream:
        addresses = await anyio.to_thread.run_sync(self.policy.addresses, host, port)
        error: Exception | None = None
        for address in addresses:
            try:
                return await super().connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        raise error or httpcore.ConnectError("no address")
