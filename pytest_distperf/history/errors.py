"""What the history store raises: each message names the option or file it is about."""

from __future__ import annotations


class HistoryError(Exception):
    """A history database or a report document that cannot be used."""


class HistoryUrlError(HistoryError):
    """A URL that names no usable database (bad scheme, unreachable server, missing driver)."""


class ReportDocumentError(HistoryError):
    """A report document without the fields a history entry needs."""


class SchemaVersionError(HistoryError):
    """A database written by a newer pytest-distperf (its schema version is above this code's)."""
