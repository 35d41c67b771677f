"""User-facing errors: the CLI prints them as one line and exits non-zero."""


class TunekitError(Exception):
    """A problem with the user's input or environment, explained in one line."""
