"""What both :mod:`vlbert` and :mod:`detectors` need, below both: optional-dependency imports
(:func:`~vlbert_base.dependencies.require`) and positional file reads (:class:`~vlbert_base.files.PositionalFiles`).
Imports the standard library only; nothing here imports vlbert or detectors."""
