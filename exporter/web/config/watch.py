"""The web config file and its TLS files, looked at once a second off the event loop."""

from __future__ import annotations

import logging
import threading

from exporter.base.errors import ConfigError
from exporter.base.files import FileIdentity, file_identity
from exporter.web.config.reader import load_web_config
from exporter.web.config.schema import TlsSettings, WebConfig

#: The package's logger, not the module's: log lines keep ``logger=exporter.web.config``.
log = logging.getLogger(__package__)


class WebConfigWatch:
    """The web config file and its TLS files, re-read by ``refresh()`` when they change.

    ``refresh()`` does the file I/O (a stat of the config file and of the certificate, key
    and CA files; a re-read when one changed); the web server calls it once a second off the
    event loop. ``current()`` and ``tls_files`` only read what the last refresh found, so no
    request or handshake waits on the filesystem. While the file on disk is invalid,
    ``current()`` raises and ``last_good`` keeps the last valid version; both edges are
    logged once.
    """

    def __init__(self, path: str | None, initial: WebConfig) -> None:
        self._path = path
        self._signature = file_identity(path)
        self._good = initial
        self._error: ConfigError | None = None
        self._lock = threading.Lock()
        self._tls_files = _tls_identities(initial.tls)

    @property
    def last_good(self) -> WebConfig:
        """The last valid config, whatever the file holds now."""
        return self._good

    @property
    def tls_files(self) -> tuple[FileIdentity | None, ...]:
        """The certificate, key and CA files as the last refresh saw them (size, mtime, inode)."""
        return self._tls_files

    def current(self) -> WebConfig:
        """The config as the file held it at the last refresh.

        Raises:
            ConfigError: the file is now invalid (the server answers 500 until it is fixed).
        """
        if self._error is not None:
            raise self._error
        return self._good

    def refresh(self) -> None:
        """Look at the files again; reload the config when its file changed."""
        with self._lock:
            if self._path is not None:
                signature = file_identity(self._path)
                if signature != self._signature:
                    self._reload(self._path, signature)
            self._tls_files = _tls_identities(self._good.tls)

    def _reload(self, path: str, signature: FileIdentity | None) -> None:
        self._signature = signature
        try:
            config = load_web_config(path)
            if (config.tls is None) != (self._good.tls is None):
                raise ConfigError(
                    path, "tls_server_config", "turning TLS on or off needs a restart"
                )
        except ConfigError as exc:
            if self._error is None or str(exc) != str(self._error):
                log.error("web config invalid, answering 500 until fixed error=%r", str(exc))
            self._error = exc
            return
        if self._error is not None or config != self._good:
            log.info("web config reloaded path=%s", path)
        self._good, self._error = config, None


def _tls_identities(tls: TlsSettings | None) -> tuple[FileIdentity | None, ...]:
    if tls is None:
        return ()
    return tuple(file_identity(f) for f in (tls.cert_file, tls.key_file, tls.client_ca_file))
