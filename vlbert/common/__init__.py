"""What both :mod:`vlbert` and :mod:`detectors` need, below both: optional-dependency imports
(:func:`~vlbert.common.dependencies.require`), positional file reads (:class:`~vlbert.common.files.PositionalFiles`)
atomic text writes (:func:`~vlbert.common.files.write_text_atomically`), users' JSON / YAML files
(:mod:`~vlbert.common.user_files`) and the typed reading of config values (:mod:`~vlbert.common.typed_config`).
Imports the standard library only; nothing here imports vlbert or detectors."""
