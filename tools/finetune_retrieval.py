#!/usr/bin/env python
"""Fine-tune for image-text retrieval; report Recall@1/5/10 (image->text, text->image).

    python tools/finetune_retrieval.py --init-from runs/vl-default --output-dir runs/retrieval
    python tools/finetune_retrieval.py --init-from DIR --output-dir runs/coco --set data.dataset=karpathy \\
        --set data.captions_file=dataset_coco.json --set data.shards=coco_regions/ --set data.image_id_format={cocoid}

``vlbert finetune --task retrieval`` with the default config ``finetune/retrieval-easy-vqa``
(vlbert/commands/finetune.py).
"""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
