"""Pure functions over wire documents: the OOM diagnosis, remedy estimates (advice), the
inventory of processes in a spool, timelines, unit formatting and profile-window planning."""
