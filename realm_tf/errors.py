"""Errors a user can fix from the message alone; the CLI prints them without a traceback."""


class UserError(Exception):
    """Base class: bad input, a wrong path or a mismatched file. The message names the file/line/key."""


#: What the operating system and TensorFlow's file systems say when a write does not fit.
_DISK_FULL_ERRNOS = (28, 27, 122)  # ENOSPC, EFBIG (a file-size limit), EDQUOT
_DISK_FULL_TEXT = ("No space left on device", "File too large", "Disk quota exceeded")


def disk_full(error: BaseException) -> str:
    """The line of ``error`` (or of an exception it was raised from, e.g. inside a Beam pipeline) that says a write
    did not fit on the disk; "" when it is another error."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if getattr(error, "errno", None) in _DISK_FULL_ERRNOS:
            return str(error)
        for line in str(error).splitlines():
            if any(text in line for text in _DISK_FULL_TEXT):
                return line.strip()
        error = error.__cause__ or error.__context__
    return ""
