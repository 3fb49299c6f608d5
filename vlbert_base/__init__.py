"""What both :mod:`vlbert` and :mod:`detectors` need, below both: optional-dependency imports
(:func:`~vlbert_base.dependencies.require`), positional file reads (:class:`~vlbert_base.files.PositionalFiles`)
and atomic text writes (:func:`~vlbert_base.files.write_text_atomically`).
Imports the standard library only; nothing here imports vlbert or detectors."""
