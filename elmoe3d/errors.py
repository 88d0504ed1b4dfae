"""Errors that are the user's to fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input (file, tensor, field, parameter). The message names it."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a batch scheduler stopping a job) while an ``elmoe3d``
    command runs: raised as a ``KeyboardInterrupt`` so that every command's Ctrl-C clean-up
    runs (no partial output, a sweep's ``sweep.json`` saying "interrupted"); the command
    exits with status 143 (128 + 15)."""
