"""Deprecation warnings under LangGraph's names (``langgraph.warnings``).

Programs and their tests filter or expect these classes by name (``pytest.warns(
LangGraphDeprecatedSinceV11)``, ``warnings.filterwarnings(...)``), so bulksync warns with
classes of the same names for the same deprecations. Each is a ``DeprecationWarning``.
"""

from __future__ import annotations


class LangGraphDeprecationWarning(DeprecationWarning):
    """Raised (as a warning) for an API LangGraph deprecated; says since when and until when."""

    def __init__(
        self,
        message: str,
        *args: object,
        since: tuple[int, int],
        expected_removal: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message, *args)
        self.message = message.rstrip(".")
        self.since = since
        self.expected_removal = expected_removal or (since[0] + 1, 0)

    def __str__(self) -> str:
        since, removal = self.since, self.expected_removal
        return (
            f"{self.message}. Deprecated since LangGraph V{since[0]}.{since[1]}, to be removed "
            f"in V{removal[0]}.{removal[1]}."
        )


class LangGraphDeprecatedSinceV05(LangGraphDeprecationWarning):
    """Raised (as a warning) for what LangGraph deprecated in 0.5 (removal in 2.0)."""

    def __init__(self, message: str, *args: object) -> None:
        super().__init__(message, *args, since=(0, 5), expected_removal=(2, 0))


class LangGraphDeprecatedSinceV10(LangGraphDeprecationWarning):
    """Raised (as a warning) for what LangGraph deprecated in 1.0 (removal in 2.0)."""

    def __init__(self, message: str, *args: object) -> None:
        super().__init__(message, *args, since=(1, 0), expected_removal=(2, 0))


class LangGraphDeprecatedSinceV11(LangGraphDeprecationWarning):
    """Raised (as a warning) for what LangGraph deprecated in 1.1 (removal in 3.0)."""

    def __init__(self, message: str, *args: object) -> None:
        super().__init__(message, *args, since=(1, 1), expected_removal=(3, 0))
