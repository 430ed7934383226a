"""What can go wrong with a tuning log, as one exception family the CLI prints as `error: ...`."""

from __future__ import annotations


class LogError(Exception):
    """A log that cannot be used as asked; the message names the file and the reason."""


class LogVersionError(LogError):
    """A part written with another schema version: refused, not skipped (it is not damage, and
    skipping it would hide records a newer tunaflow can read)."""


class LogWriteError(LogError):
    """The log could not be written (read-only, full, gone); says where, why and what is not in it."""


class LogBusyError(LogError):
    """Another process holds the log's writer lock."""
