"""PyTorch Lightning: ``Trainer(callbacks=[OomsightCallback()])``.

Starts the hook at fit start if it is not running, and every ``log_every_n_steps`` optimizer
steps (the trainer's own cadence unless ``every_n_steps`` is given) hands this process's
``oomsight/...`` values (``reading``) to every logger of the trainer with
``logger.log_metrics(values, step)``: plain floats, no tensors, so logging adds no
host-to-device copy to the step. A new OOM is one warning with its cause; an OOM that ends
the fit is logged from ``on_exception``, after the hook has written it.

``OomsightCallback`` subclasses ``pytorch_lightning.Callback`` where that package is
installed, else ``lightning.pytorch.Callback``; ``callback_class("lightning.pytorch")``
gives the other one when both are installed.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Optional

from oomsight.tools.integrations.reading import LogFeed, MemoryReader

PACKAGES = ("pytorch_lightning", "lightning.pytorch")
logger = logging.getLogger(__name__)
_classes: dict[str, type] = {}


def callback_class(package: Optional[str] = None) -> type:
    """The oomsight callback for ``package`` (``pytorch_lightning`` or ``lightning.pytorch``;
    default: the first of them installed)."""
    for name in (package,) if package else PACKAGES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if name not in _classes:
            _classes[name] = type("OomsightCallback", (_Logic, module.Callback), {"__module__": __name__})
        return _classes[name]
    raise ImportError("oomsight's Lightning callback needs Lightning: pip install 'oomsight[lightning]'")


class _Logic:
    """The callback's behaviour; mixed with the installed package's ``Callback``."""

    def __init__(
        self,
        every_n_steps: Optional[int] = None,
        reader: Optional[MemoryReader] = None,
        **settings: Any,
    ) -> None:
        """``every_n_steps``: log cadence (default: the trainer's ``log_every_n_steps``);
        ``settings``: passed to ``oomsight.start()`` when the hook is not running yet."""
        super().__init__()
        self.every_n_steps = every_n_steps
        self.feed = LogFeed(reader, settings)
        self.last_values: dict[str, float] = {}
        self._logged_step = -1

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.feed.start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        every = self.every_n_steps or int(getattr(trainer, "log_every_n_steps", 50) or 50)
        if step != self._logged_step and step % every == 0:
            self._log(trainer, step, force=False)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._log(trainer, int(trainer.global_step), force=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # the hook wrote the OOM event (fsync'd) before the exception reached the trainer
        try:
            self._log(trainer, int(trainer.global_step), force=True)
        except Exception as exc:  # a failing logger must not hide the exception that ends the fit
            logger.warning("oomsight: could not log the values after %s: %s", type(exception).__name__, exc)

    def _log(self, trainer: Any, step: int, force: bool) -> None:
        self._logged_step = step
        self.last_values = self.feed.values(force=force)
        for lg in getattr(trainer, "loggers", None) or []:
            lg.log_metrics(dict(self.last_values), step=step)


def __getattr__(name: str) -> Any:
    if name == "OomsightCallback":
        return callback_class()
    raise AttributeError(name)
