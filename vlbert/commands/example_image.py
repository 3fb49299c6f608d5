"""Write an example image the quick start's commands can read: an easy-VQA test picture (64x64 PNG, one coloured
shape), with the questions the dataset asks about it and their answers.

    vlbert example-image                        # -> photo.png: test/0, its questions and answers printed
    vlbert example-image red-circle.png --color red --shape circle
    vlbert predict runs/vqa-easy-vqa --image photo.png --text "what color is the shape?"

The image is a test-split picture, so no quick-start run trained on it.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from vlbert.data.easy_vqa import COLORS, SHAPES, color_and_shape, image_paths, load_questions


def main(argv=None) -> int:
    """Copy the chosen easy-VQA test image to the output path and print its questions and answers.

    Raises:
        ValueError: no test image has the asked colour and shape, an unknown image id, or --id with --color or
            --shape (they cannot both choose).
        FileExistsError: the output path exists (never overwritten; pass another path).
    """
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", nargs="?", default="photo.png", help="where to write the PNG (default: photo.png)")
    p.add_argument("--id", help="an easy-VQA test image id such as test/0 (default: the first that fits)")
    p.add_argument("--color", choices=COLORS)
    p.add_argument("--shape", choices=SHAPES)
    args = p.parse_args(argv)
    if args.id is not None and (args.color or args.shape):
        chooser = "--color" if args.color else "--shape"
        raise ValueError(f"{chooser} chooses an image and --id names one: give --id alone, or {chooser} without --id")
    output = Path(args.output)
    if output.exists():
        raise FileExistsError(f"{output} exists; pass another path (example-image never overwrites a file)")
    paths, known = image_paths("test"), color_and_shape("test")
    if args.id is not None:
        if args.id not in paths:
            raise ValueError(f"no easy-VQA test image {args.id!r}; ids run from test/0 to test/{len(paths) - 1}")
        image_id = args.id
    else:
        fits = [i for i, (c, s) in known.items() if args.color in (None, c) and args.shape in (None, s)]
        if not fits:
            raise ValueError(
                f"no easy-VQA test image is a {args.color or ''} {args.shape or 'shape'}; drop --color or --shape"
            )
        image_id = min(fits, key=lambda i: int(i.split("/")[1]))
    shutil.copyfile(paths[image_id], output)
    color, shape = known.get(image_id, ("?", "?"))
    print(f"wrote {output}: easy-VQA {image_id}, a {color} {shape} (64x64); its questions and answers:")
    for q in load_questions("test"):
        if q.image_id == image_id:
            print(f"  {q.question}  ->  {q.answer}")
    return 0
