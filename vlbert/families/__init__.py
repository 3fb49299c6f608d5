"""Published vision-language checkpoint families: ``FAMILIES`` (:mod:`.registry`) maps a family's name to its
entry (how its files are read, its key map, tokenizer and features; :class:`~vlbert.families.base.CheckpointFamily`);
:func:`convert_checkpoint` writes one as a normal vlbert model directory. Adding a family is one module and one
line in the registry."""

from vlbert.families.base import CheckpointFamily, Converted
from vlbert.families.convert import convert_checkpoint, detect_family
from vlbert.families.registry import FAMILIES

__all__ = ["FAMILIES", "CheckpointFamily", "Converted", "convert_checkpoint", "detect_family"]
