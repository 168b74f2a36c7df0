"""The one error type every entry point turns into a clear message."""


class ExplorerError(ValueError):
    """Bad input or an unusable configuration; the message is meant for the user as is."""
