"""Callbacks for the frameworks people train with (``docs/integrations.md``):

- ``oomsight.tools.integrations.lightning.OomsightCallback`` (PyTorch Lightning)
- ``oomsight.tools.integrations.hf.OomsightCallback`` (Hugging Face ``Trainer``)

Each starts the hook if it is not running and logs this process's headroom, peaks, the
leak flag, the OOM forecast (where there is one) and the last OOM's cause through the
framework's own loggers. Importing this package imports neither framework; ``reading``
is the framework-free part (what is logged, read from the spool).
"""
