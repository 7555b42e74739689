"""What the history store raises (under errors.DistPerfError): each message names the option or URL."""

from __future__ import annotations

from pytest_distperf.errors import DistPerfError


class HistoryError(DistPerfError):
    """A history database or a report document that cannot be used."""


class HistoryUrlError(HistoryError):
    """A URL that names no usable database (bad scheme, unreachable server, missing driver)."""


class ReportDocumentError(HistoryError):
    """A report document without the fields a history entry needs."""


class SchemaVersionError(HistoryError):
    """A database written by a newer pytest-distperf (its schema version is above this code's)."""
