"""Errors that are the user's to fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input (file, tensor, field, parameter). The message names it."""
