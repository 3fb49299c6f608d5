#!/usr/bin/env python
"""Fine-tune a (VL-pretrained) BERT for visual question answering and report the official VQA accuracy.

    python tools/finetune_vqa.py --dataset easy-vqa --init-from runs/vl-default --output-dir runs/vqa
    python tools/finetune_vqa.py --dataset easy-vqa --init-from minilm --output-dir runs/vqa-no-vl
    python tools/finetune_vqa.py --dataset vqa-v2 --init-from DIR --output-dir runs/vqa2 \\
        --set data.train_questions=... --set data.train_annotations=... --set data.eval_questions=... \\
        --set data.eval_annotations=... --set data.shards=regions/ --set data.min_answer_count=9

``vlbert finetune --task vqa`` with the default config ``finetune/vqa-easy-vqa``
(vlbert/commands/finetune.py).
"""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
