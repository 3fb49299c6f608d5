"""On a CUDA GPU (skipped without one): BUTD's detector in plain PyTorch (the ``butd`` backend) extracts on the GPU
the regions it extracts on the CPU: the same proposals chosen (boxes within float rounding), the same object
distributions and features within float32's reordering of sums (cuDNN's convolutions add in another order), and a
batch equal to one image at a time. Small random weights in the pkl's layout, BUTD's own 600/1000 sizes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from vlbert.detectors.butd_model import ButdArchitecture, random_butd_state
from vlbert.detectors.butd_vg import ButdRegionDetector
from vlbert.detectors.selection import BoxSelection

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SMALL_NET = ButdArchitecture((1, 1, 1), 1, 16, 16, 12, 16, (8, 16, 32))


def test_butd_on_the_gpu_extracts_the_cpus_regions(tmp_path):
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # float32, not TF32
    weights = tmp_path / "faster_rcnn_from_caffe_attr.pkl"
    weights.write_bytes(pickle.dumps({"model": random_butd_state(SMALL_NET), "__author__": "test"}))
    selection = BoxSelection(4, 12, 0.2, 0.3)
    cpu = ButdRegionDetector(weights, "cpu", selection)
    gpu = ButdRegionDetector(weights, "cuda", selection)
    rs = np.random.RandomState(0)
    arrays = [(rs.rand(h, w, 3) * 255).astype(np.uint8) for h, w in ((480, 640), (640, 480), (480, 640))]
    ids = ["a", "b", "c"]
    on_gpu = gpu.extract_batch(arrays, ids, batch_size=2)
    for array, image_id, theirs in zip(arrays, ids, on_gpu, strict=True):
        ours = cpu(array, image_id)
        assert ours.num_regions == theirs.num_regions
        np.testing.assert_allclose(theirs.boxes, ours.boxes, atol=1e-2)
        np.testing.assert_allclose(
            theirs.class_probs.astype(np.float32), ours.class_probs.astype(np.float32), atol=2e-3
        )
        a, b = theirs.features.astype(np.float32), ours.features.astype(np.float32)
        assert (np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-6)).max() < 1e-2
