"""``import oomsight.auto``: start the hook with settings from the environment.

Put it at the top of the training script. It never raises; on a machine without
CUDA, without NVML or with an unsuitable torch it logs one line and does nothing.
"""

from oomsight import start

start()
