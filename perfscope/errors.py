"""The one exception type users see: its message is the single sentence the CLI prints."""


class PerfscopeError(Exception):
    """A problem with the user's input or environment, stated in one sentence."""


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
