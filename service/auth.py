"""The one bearer check of the service: client keys for the embedding routes, admin keys for /adapt.

| keys configured | embedding routes, /v1/models, /info | /adapt |
|---|---|---|
| none | open | open to callers on this machine (`service.adapt.api_state.AdaptAPI.authorize`) |
| client keys only | client keys | 403 for client keys (401 without one) unless ``adapt_allow_client_keys`` |
| admin keys only | open | admin keys |
| both | client or admin keys | admin keys (403 for client keys) |

An admin key works wherever a client key does, so an operator needs one key, not two. Every key is compared
in constant time and all of them are compared each time, so timing reveals neither which key nor which kind
came close.

A request's caller (`Caller`) is named by its key's `key_id` — in logs, traces, audit records, the per-key
admission metrics and the fair share of capacity — or `ANONYMOUS` without a valid key (an open server).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from service.errors import ErrorKind, ServiceError
from service.settings import ServiceSettings

KEY_ID_CHARS = 12  # 48 bits of SHA-256: tells keys apart in logs and audit records, reveals nothing of the key


def key_id(key: str | bytes) -> str:
    """A key's public name in logs, metrics and audit records: a short SHA-256 hex digest, never the key itself."""
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_CHARS]


def bearer_token(authorization: str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None (missing, empty, another scheme), as the
    bytes the client sent: ASGI servers hand header values over decoded as latin-1, so encoding them back the same
    way recovers a key's UTF-8 bytes (a key with non-ASCII characters matches; keys are compared as UTF-8)."""
    scheme, _, token = (authorization or "").partition(" ")
    text = token.strip()
    try:
        given = text.encode("latin-1")
    except UnicodeEncodeError:  # not from an HTTP header (a caller that passed the text itself)
        given = text.encode()
    return given if scheme.lower() == "bearer" and given else None


ANONYMOUS = "anonymous"  # the caller of a request without a valid key (only an open route lets one in)


class Role(Enum):
    client = "client"
    admin = "admin"


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the role of its key (None without a valid one) and the key's public name."""

    role: Role | None
    key_id: str = ANONYMOUS


@dataclass(frozen=True)
class ApiKeys:
    """The bearer tokens a server accepts, by role. Built once per app (`from_settings`) and shared by the
    embedding routes and the /adapt router."""

    client: tuple[bytes, ...] = field(default=(), repr=False)
    admin: tuple[bytes, ...] = field(default=(), repr=False)
    admin_falls_back_to_client: bool = False  # adapt_allow_client_keys: client keys may use /adapt

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> ApiKeys:
        return cls.of(
            settings.api_key_values(),
            settings.admin_key_values(),
            admin_falls_back_to_client=settings.adapt.allow_client_keys,
        )

    @classmethod
    def of(
        cls, client: Sequence[str], admin: Sequence[str] = (), *, admin_falls_back_to_client: bool = False
    ) -> ApiKeys:
        """Keys from their plain values (settings, tests)."""
        return cls(
            client=tuple(key.encode() for key in client),
            admin=tuple(key.encode() for key in admin),
            admin_falls_back_to_client=admin_falls_back_to_client,
        )

    @property
    def client_auth_enabled(self) -> bool:
        """Whether the embedding routes need a key (only client keys turn it on: admin keys alone keep them open)."""
        return bool(self.client)

    @property
    def admin_auth_enabled(self) -> bool:
        return bool(self.client or self.admin)

    def key_ids(self) -> tuple[str, ...]:
        """The public names of every configured key, then `ANONYMOUS` (the per-key metrics' label values)."""
        return (*dict.fromkeys(key_id(key) for key in (*self.client, *self.admin)), ANONYMOUS)

    def identify(self, authorization: str | None) -> Caller:
        """The caller behind an ``Authorization: Bearer <key>`` header: its role and key id, or an anonymous
        caller (missing header, other scheme, unknown key). Compares against every key, without an early exit."""
        given = bearer_token(authorization)
        admin = [hmac.compare_digest(given or b"", key) for key in self.admin]
        client = [hmac.compare_digest(given or b"", key) for key in self.client]
        if given is None or not (any(admin) or any(client)):
            return Caller(None)
        return Caller(Role.admin if any(admin) else Role.client, key_id(given))

    def role(self, authorization: str | None) -> Role | None:
        """The role of the key in an ``Authorization`` header, or None (see `identify`)."""
        return self.identify(authorization).role

    def check_client(self, caller: Caller) -> None:
        """Embedding routes, /v1/models, /info: a client or an admin key (anyone when no client key is set).
        ``caller`` is `identify`'s answer, which the server computes once per request before anything else."""
        if self.client_auth_enabled and caller.role is None:
            raise ServiceError(
                ErrorKind.unauthorized,
                "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def check_admin(self, authorization: str | None) -> None:
        """/adapt: an admin key; a client key only with ``adapt_allow_client_keys`` (open when no key is set)."""
        if not self.admin_auth_enabled:
            return
        role = self.role(authorization)
        if role is Role.admin or (role is Role.client and self.admin_falls_back_to_client):
            return
        if role is Role.client:
            raise ServiceError(
                ErrorKind.forbidden,
                "this API key may embed but not start or read /adapt jobs: use an admin key (EMBED_ADMIN_API_KEYS)"
                + ("" if self.admin else "; the server has none set"),
            )
        raise ServiceError(
            ErrorKind.unauthorized,
            "/adapt needs an admin API key: send 'Authorization: Bearer <admin key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
