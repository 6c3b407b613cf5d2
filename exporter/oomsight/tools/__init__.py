"""What users run: the command line, local mode (``run``), reports, the tape recorder and
player, the demo, the batch-size probe and measured remedies. The top layer."""
