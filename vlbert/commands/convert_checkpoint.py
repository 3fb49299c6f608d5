"""Convert a published vision-language checkpoint into a vlbert model directory, which every tool then takes with
``--init-from DIR`` and ``vlbert.inference.pipeline(DIR)`` answers with.

    vlbert convert --from uniter uniter-base.pt --output-dir models/uniter-base
    vlbert convert --from uniter vqa-ft.pt --labels ans2label.json --output-dir models/uniter-vqa
    vlbert convert --from visualbert visualbert-vqa/ --labels answers.txt --output-dir models/vb-vqa
    vlbert convert --from oscar vinvl-base/ --output-dir models/vinvl-base
    vlbert convert --from uniter uniter-base.pt --output-dir models/uniter-base \
        --push-to-hub my-org/uniter-base      # then: --init-from my-org/uniter-base, pipeline("my-org/uniter-base")

SRC: UNITER's ``.pt`` file (its ``config/uniter-*.json`` with ``--config`` for other head counts than 64 per head);
a VisualBERT directory as transformers saves it (``uclanlp/visualbert-*``); an Oscar/VinVL directory
(``config.json`` + ``pytorch_model.bin``); VL-BERT's ``.model`` (``--config`` its ``cfgs/*.yaml``); an LXMERT
directory as transformers saves it (``unc-nlp/lxmert-*``) or airsplay/lxmert's ``.pth``. A directory must hold its
``config.json`` (the head count is not in the tensors); a damaged file, a missing or foreign tensor, and another
family's checkpoint are refused in one line naming the file, the tensor and the family. ``--tokenizer``: a directory or hub name (default: the family's own,
bert-base-cased for UNITER, bert-base-uncased for VisualBERT and Oscar; online). ``--labels``: the answer list of a
fine-tuned VQA head (UNITER's ``ans2label.json``, a JSON list, or one answer per line).
"""

from __future__ import annotations

import argparse
import json
import logging

from vlbert.families import FAMILIES, convert_checkpoint
from vlbert.hub import is_repo_id, push_model_directory


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="SRC", help="the published checkpoint (file or directory)")
    p.add_argument("--from", dest="family", required=True, choices=sorted(FAMILIES), help="its family")
    p.add_argument("--output-dir", required=True, help="the vlbert model directory to write (must not exist)")
    p.add_argument("--tokenizer", help="tokenizer directory or hub name (default: the family's)")
    p.add_argument("--labels", help="answer/label names of a fine-tuned head, in output order")
    p.add_argument("--config", help="the family's own config JSON (UNITER: config/uniter-base.json)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="convert tensors that hold NaN or inf (refused otherwise: the checkpoint diverged or is damaged)",
    )
    p.add_argument(
        "--push-to-hub",
        metavar="REPO",
        help="then upload --output-dir, with a model card, to the hub "
        "repository REPO (org/name; needs a token: hf auth login)",
    )
    args = p.parse_args(argv)
    if args.push_to_hub and not is_repo_id(args.push_to_hub):
        raise ValueError(f"--push-to-hub {args.push_to_hub!r} is not a hub repository id; write it as org/name")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    report = convert_checkpoint(
        args.family,
        args.source,
        args.output_dir,
        tokenizer=args.tokenizer,
        labels=args.labels,
        config=args.config,
        overwrite=args.overwrite,
        allow_nonfinite=args.allow_nonfinite,
    )
    if args.push_to_hub:
        report["pushed"] = {"repo": args.push_to_hub, "files": push_model_directory(args.output_dir, args.push_to_hub)}
    print(json.dumps({"output_dir": args.output_dir, **report}))
    return 0
