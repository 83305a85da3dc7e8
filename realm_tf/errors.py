"""Errors a user can fix from the message alone; the CLI prints them without a traceback."""


class UserError(Exception):
    """Base class: bad input, a wrong path or a mismatched file. The message names the file/line/key."""
