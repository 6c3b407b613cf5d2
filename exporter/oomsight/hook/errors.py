"""The hook's one error path: every error it swallows is counted per component (exported
as ``oomsight_hook_errors_total{component}``) and logged once, with what to do."""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterator

logger = logging.getLogger("oomsight.hook")


class ErrorBook:
    """Counts swallowed errors per component and logs the first of each once."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def record(self, component: str, exc: BaseException, hint: str = "") -> None:
        self.counts[component] += 1
        if self.counts[component] == 1:
            logger.warning(
                "oomsight: %s failed (%s: %s); training continues, this is counted in oomsight_hook_errors_total%s",
                component,
                type(exc).__name__,
                exc,
                f". {hint}" if hint else "",
            )

    @contextlib.contextmanager
    def guard(self, component: str, hint: str = "") -> Iterator[None]:
        """``with errors.guard("nvml"):`` — the block's exception is recorded, never raised."""
        try:
            yield
        except Exception as exc:
            self.record(component, exc, hint)
