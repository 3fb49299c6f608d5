"""Images -> regions (boxes in pixels, RoI features, scores, class distributions), region shards, and readers
for precomputed features. See :mod:`vlbert.detectors.regions` for the record every backend produces."""

from vlbert.detectors.regions import RegionError, Regions, whole_image_box
from vlbert.detectors.shards import ShardError, load_regions, read_shards, write_shards

__all__ = ["Regions", "RegionError", "whole_image_box", "ShardError", "load_regions", "read_shards", "write_shards"]
