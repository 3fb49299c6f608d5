"""List the shipped run configs: each name works as ``--config NAME`` from any directory.

vlbert configs              # text/default, vl/uniter-base, finetune/vqa-easy-vqa, ...
vlbert configs --path       # with the file each name resolves to
"""

from __future__ import annotations

import argparse

from vlbert.training.run_config import config_dir, config_names


def main(argv=None) -> int:
    """Print one shipped config name per line (with ``--path``, its file); returns 0."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", action="store_true", help="also print the file each name resolves to")
    args = p.parse_args(argv)
    for name in config_names():
        print(f"{name}\t{config_dir() / name}.yaml" if args.path else name)
    return 0
