"""Training: the generic trainer, run configs and the pretraining/fine-tuning task builders."""

from vlbert.training.run_config import load_run_config
from vlbert.training.trainer import NonFiniteLossError, Trainer, TrainingConfig

__all__ = ["Trainer", "TrainingConfig", "NonFiniteLossError", "load_run_config"]
