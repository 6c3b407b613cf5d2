"""What runs inside the training process: the runtime that wires the parts (``runtime``), the
only toucher of ``torch.cuda`` (``cuda``), NVML, the sampler thread, the step hook, OOM capture,
profiler windows, the leak scan, the process identity and the zero-code startup folder.
It never imports ``metrics`` or ``tools``, nor prometheus_client, kubernetes or grafanalib."""
