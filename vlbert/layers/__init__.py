"""Building blocks below both the models and the objective units (timm's ``timm.layers`` is the anchor): activation
functions, the custom autograd kernels, the losses with their prediction counts, the pretraining heads and the
fine-tuning MLP head. Imports torch and nothing of vlbert but :mod:`vlbert.config` (for type hints)."""
