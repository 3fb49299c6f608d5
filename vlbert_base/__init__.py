"""What both :mod:`vlbert` and :mod:`detectors` need, below both: optional-dependency imports
(:func:`~vlbert_base.dependencies.require`), positional file reads (:class:`~vlbert_base.files.PositionalFiles`)
atomic text writes (:func:`~vlbert_base.files.write_text_atomically`), users' JSON / YAML files
(:mod:`~vlbert_base.user_files`) and the typed reading of config values (:mod:`~vlbert_base.typed_config`).
Imports the standard library only; nothing here imports vlbert or detectors."""
