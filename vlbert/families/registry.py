"""``FAMILIES``: every published checkpoint family by its name (``--from`` of vlbert convert)."""

from __future__ import annotations

from vlbert.families.base import CheckpointFamily
from vlbert.families.lxmert import LXMERT
from vlbert.families.oscar import OSCAR
from vlbert.families.uniter import UNITER
from vlbert.families.visualbert import VISUALBERT
from vlbert.families.vl_bert import VL_BERT

FAMILIES: dict[str, CheckpointFamily] = {family.name: family for family in (UNITER, VISUALBERT, OSCAR, VL_BERT, LXMERT)}

__all__ = ["FAMILIES"]
