"""``oomsight predict``: a training step's peak CUDA memory and the largest batch that fits,
predicted on the CPU (docs/prediction.md)."""

from oomsight.predict.predictor import BatchSearch, Prediction, largest_batch, predict_peak

__all__ = ["BatchSearch", "Prediction", "largest_batch", "predict_peak"]
