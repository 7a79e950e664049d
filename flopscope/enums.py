"""String enums that compare equal to, and print as, their values (``Role.Q_PROJ ==
"q_proj"``)."""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """An enum of strings: ``str(member)`` is its value (Python 3.11's ``enum.StrEnum``,
    on 3.10 too)."""

    def __str__(self) -> str:
        return str(self.value)
