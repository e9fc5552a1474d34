"""A run's budget: what it may spend before it stops (steps, calls, tokens, cost, time)."""

from __future__ import annotations

from tether._frozen import Value, frozen_dataclass

__all__ = ["Budget"]


@frozen_dataclass
class Budget(Value):
    """Limits counted in code (a limit that exists only in the prompt is a request).

    Every limit is None (unlimited) by default except ``max_identical_failures``.
    ``progress_extension`` grants that many extra steps each time a step makes
    progress, never beyond ``max_steps_ceiling`` (seed 000's progress-based budget).
    """

    max_steps: int | None = None
    max_model_calls: int | None = None
    max_tool_calls: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_seconds: float | None = None
    max_identical_failures: int | None = 3
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    progress_extension: int = 0
    max_steps_ceiling: int | None = None
    max_hung_threads: int = 3

    def __post_init__(self) -> None:
        for name in (
            "max_steps",
            "max_model_calls",
            "max_tool_calls",
            "max_tokens",
            "max_input_tokens",
            "max_output_tokens",
            "max_identical_failures",
            "max_steps_ceiling",
        ):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
        for name in ("max_cost_usd", "max_seconds"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            ):
                raise ValueError(f"{name} must be a number > 0 or None, got {value!r}")
        for name in ("progress_extension", "max_hung_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if self.progress_extension < 0:
            raise ValueError(f"progress_extension must be >= 0, got {self.progress_extension!r}")
        if self.progress_extension and self.max_steps is None:
            raise ValueError("progress_extension needs max_steps")
        if (
            self.max_steps_ceiling is not None
            and self.max_steps is not None
            and self.max_steps_ceiling < self.max_steps
        ):
            raise ValueError(
                f"max_steps_ceiling must be >= max_steps ({self.max_steps}), got {self.max_steps_ceiling!r}"
            )
        if self.max_hung_threads < 1:
            raise ValueError(f"max_hung_threads must be >= 1, got {self.max_hung_threads!r}")
