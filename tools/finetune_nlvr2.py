#!/usr/bin/env python
"""Fine-tune a (VL-pretrained) BERT for NLVR2: is a statement true of a pair of images?

    python tools/finetune_nlvr2.py --init-from runs/vl-default                  # easy-VQA image pairs
    python tools/finetune_nlvr2.py --init-from DIR --set data.dataset=nlvr2 --set data.train_file=train.json \\
        --set data.eval_file=dev.json --set data.shards=regions/

``vlbert finetune --task nlvr2`` with the default config ``finetune/nlvr2-easy-vqa``
(vlbert/commands/finetune.py).
"""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
