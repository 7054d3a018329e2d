"""A provider's credential header and client TLS; a credential file is re-read when it changes (a
rotated Secret needs no restart), and the value never reaches a repr, an exception or a log."""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from pydantic import SecretStr

from worker.runtime.logs import get_logger
from worker.settings import ProviderConnection, provider_env_prefix

__all__ = ["RECHECK_S", "Credential", "ProviderConfigError", "client_tls"]

log = get_logger(__name__)

#: How often a credential file's modification time is checked.
RECHECK_S: Final = 5.0
#: Visible ASCII and inner spaces: what an HTTP header value may carry (no CR/LF injection).
_HEADER_VALUE: Final = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$")
MAX_CREDENTIAL_LENGTH: Final = 8192


class ProviderConfigError(ValueError):
    """A provider's connection settings cannot be used; the message names what, never a
    secret."""


class Credential:
    """The header one provider's calls carry: ``{auth_header: "<scheme> <secret>"}``."""

    def __init__(
        self,
        provider: str,
        header: str,
        scheme: str,
        *,
        secret: SecretStr | None = None,
        file: Path | None = None,
        recheck_s: float = RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (secret is None) == (file is None):
            raise ValueError("a credential needs exactly one of a secret and a file")
        self.provider = provider
        self.header = header
        self._scheme = scheme
        self._file = file
        self._recheck_s = recheck_s
        self._clock = clock
        self._checked_at = clock()
        self._stamp: tuple[int, int] | None = None
        if secret is not None:
            self._headers = self._build(secret.get_secret_value(), "TOKEN")
        else:
            assert file is not None
            self._stamp = _stamp(file)
            self._headers = self._build(self._read(file), "TOKEN_FILE")

    @classmethod
    def for_provider(cls, name: str, connection: ProviderConnection) -> Credential | None:
        """The credential of provider ``name``, or None when it has none configured."""
        if not connection.has_credential:
            return None
        return cls(
            name,
            connection.auth_header,
            connection.scheme,
            secret=connection.token,
            file=connection.token_file,
        )

    def headers(self) -> dict[str, str]:
        """The header to send (a fresh dict); re-reads a changed file first."""
        if self._file is not None and self._clock() - self._checked_at >= self._recheck_s:
            self._reload(self._file)
        return dict(self._headers)

    def _reload(self, file: Path) -> None:
        self._checked_at = self._clock()
        stamp = _stamp(file)
        if stamp is None or stamp == self._stamp:
            return
        try:
            self._headers = self._build(self._read(file), "TOKEN_FILE")
        except ProviderConfigError as exc:
            log.error("provider_credential_reload_failed", provider=self.provider, error=str(exc))
            return
        self._stamp = stamp
        log.info("provider_credential_reloaded", provider=self.provider, file=str(file))

    def _read(self, file: Path) -> str:
        try:
            data = file.read_bytes()[: MAX_CREDENTIAL_LENGTH + 2]
        except OSError as exc:
            raise ProviderConfigError(
                f"{self._where('TOKEN_FILE')}: cannot read {file}: {exc.strerror or exc}"
            ) from None
        try:
            return data.decode("ascii").strip()
        except UnicodeDecodeError:
            raise ProviderConfigError(
                f"{self._where('TOKEN_FILE')}: {file} is not ASCII text"
            ) from None

    def _build(self, value: str, variable: str) -> dict[str, str]:
        if not value:
            raise ProviderConfigError(f"{self._where(variable)}: the credential is empty")
        if len(value) > MAX_CREDENTIAL_LENGTH or not _HEADER_VALUE.fullmatch(value):
            raise ProviderConfigError(
                f"{self._where(variable)}: the credential is not a valid header value "
                f"(visible ASCII, at most {MAX_CREDENTIAL_LENGTH} characters)"
            )
        return {self.header: f"{self._scheme} {value}" if self._scheme else value}

    def _where(self, variable: str) -> str:
        return f"provider {self.provider!r} ({provider_env_prefix(self.provider)}{variable})"

    def __repr__(self) -> str:
        source = f"file={str(self._file)!r}" if self._file is not None else "secret='**********'"
        return f"Credential({self.provider!r}, header={self.header!r}, {source})"


def _stamp(file: Path) -> tuple[int, int] | None:
    try:
        st = file.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _no_password() -> bytes:
    raise ProviderConfigError("the client key is encrypted; give an unencrypted key file")


def client_tls(name: str, connection: ProviderConnection) -> ssl.SSLContext | None:
    """The TLS context of provider ``name`` (CA bundle, client certificate), or None for the
    default verification; ``ProviderConfigError`` names a file that cannot be loaded."""
    cert, key, ca = connection.client_cert_file, connection.client_key_file, connection.ca_file
    if cert is None and ca is None:
        return None
    prefix = provider_env_prefix(name)
    try:
        context = ssl.create_default_context(cafile=None if ca is None else str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ProviderConfigError(
            f"provider {name!r} ({prefix}CA_FILE): cannot load {ca}: {_reason(exc)}"
        ) from None
    if cert is not None:
        try:
            context.load_cert_chain(str(cert), None if key is None else str(key), _no_password)
        except ProviderConfigError as exc:
            raise ProviderConfigError(
                f"provider {name!r} ({prefix}CLIENT_KEY_FILE): {exc}"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise ProviderConfigError(
                f"provider {name!r} ({prefix}CLIENT_CERT_FILE/CLIENT_KEY_FILE): cannot load "
                f"{cert}{'' if key is None else f' with {key}'}: {_reason(exc)}"
            ) from None
    return context


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or "not a PEM certificate or key"
    return exc.strerror or type(exc).__name__
