"""The one exception type users see: its message is the single sentence the CLI prints."""


class PerfscopeError(Exception):
    """A problem with the user's input or environment, stated in one sentence."""
