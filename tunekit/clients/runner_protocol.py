"""What tunekit's search loop needs from a runner besides MetaSchedule's `Runner.run`.

SessionRunner (one fleet) and FanoutRunner (several) both satisfy it; the loop reads these
attributes directly instead of guessing them with getattr."""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class MeasuringRunner(Protocol):
    timings: dict           # artifact path -> RunTiming (load_s, run_s), popped by the loop per candidate
    hangs: int              # candidates that ran past their timeout
    session_failures: int   # sessions dropped after a failure (any cause)

    @property
    def fatal(self) -> Exception | None:
        """Set when every server of the share is gone: the loop raises it after recording the batch."""

    def run(self, runner_inputs: list) -> list:
        """MetaSchedule's Runner.run: one future per input."""

    def fault_counts(self) -> dict:
        """report.json's runner fault counts."""

    def shutdown(self) -> None:
        """Stop measuring; candidates still queued are answered NOT_MEASURED."""
