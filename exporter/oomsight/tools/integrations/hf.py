"""Hugging Face ``transformers``: ``Trainer(callbacks=[OomsightCallback()])``, or
``install(trainer)`` to have the reporting integrations see the values too.

Starts the hook at train begin if it is not running, and adds this process's ``oomsight/...``
values (``reading``) to every log the trainer makes (``logging_steps``) in ``on_log``, and to
the matching ``state.log_history`` entry (so ``trainer_state.json`` has them). The trainer
calls its reporting callbacks (TensorBoard, W&B, MLflow) before the ones passed in
``callbacks=``; ``install(trainer)`` puts this callback first so they log the values as well.
A new OOM is one warning with its cause.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError("oomsight's Hugging Face callback needs transformers: pip install 'oomsight[hf]'") from exc

from oomsight.tools.integrations.reading import LogFeed, MemoryReader


class OomsightCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]  # Any where transformers has no types
    def __init__(self, reader: Optional[MemoryReader] = None, **settings: Any) -> None:
        """``settings``: passed to ``oomsight.start()`` when the hook is not running yet."""
        self.feed = LogFeed(reader, settings)
        self.last_values: dict[str, float] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.feed.start()

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        self.last_values = self.feed.values(force=state.global_step >= (state.max_steps or 0) > 0)
        if logs is not None:
            logs.update(self.last_values)
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(self.last_values)


def install(trainer: Any, callback: Optional[OomsightCallback] = None) -> OomsightCallback:
    """Put an oomsight callback first in ``trainer``'s callbacks, before the reporters."""
    cb = callback or OomsightCallback()
    trainer.callback_handler.callbacks.insert(0, cb)
    return cb
