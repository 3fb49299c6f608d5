"""The float32 gradient all-reduce of bf16-params training, overlapped with the backward, bucket by bucket.

With bf16 weights the processes average the float32 sums of the micro-batches' gradients
(:class:`~vlbert.training.master_weights.MasterWeights`), not the bf16 gradients DDP would reduce, so DDP's own
overlap does not apply. Here the flat float32 gradient buffer is cut into buckets of about 25 MB, the last
parameters first (DDP's default cap and order: a backward gives the last layers' gradients first); during the
backward of a step's last micro-batch each bucket's all-reduce is launched (asynchronously) as soon as the backward
has filled it, and the step waits for all of them only before clipping and the optimizer step. Every bucket's
all-reduce but the embeddings' (filled when the backward ends) runs under the backward; docs/distributed.md has
the sizes and times.

Buckets are launched in bucket order on every process, whatever order this process's backward filled them in (as
DDP's reducer does): processes whose batches take different paths through the model (an objective one rank has and
another has not, a parameter idle on one rank) still issue the same sequence of collectives. The parameters a
micro-batch does not use (``ObjectiveOutput.unused_parameters``: the other objectives' heads) hold no bucket back
(:meth:`~vlbert.training.master_weights.MasterWeights.begin_backward`); a bucket holding any other parameter that
got no gradient in the last micro-batch waits for the end of the backward, then goes (its slice is the sum of the
earlier micro-batches, or zeros), and so does every bucket after it.

Why our own hooks and not FSDP2 (``torch.distributed.fsdp.fully_shard`` with ``MixedPrecisionPolicy(param_dtype=
bf16, reduce_dtype=float32)``), the well-kept engine that would own the masters and overlap a reduce-scatter:

- Checkpoints: under FSDP2 parameters and optimizer states become DTensor shards; our checkpoints hold the float32
  masters in the Hugging Face layout and the optimizer's state keyed by them, and runs written before must still
  load and resume exactly. That is a gather on every save and a scatter on every load, plus a second format.
- One path for one and several processes: FSDP2 needs a process group, so a one-GPU run (the quick start, most
  fine-tuning) would keep :class:`MasterWeights` while several processes ran FSDP2's masters and accumulation. The
  exactness tests assert precisely that N processes at batch b equal one process at batch N x b; with one
  accumulation code for both the only difference is the reduction itself.
- Nothing to shard yet: the models here are BERT-base-sized (~110-140 M parameters: float32 masters, gradients and
  AdamW states ~2 GB a GPU of 80). FSDP2 would add an all-gather of the bf16 weights before every forward
  (and again in the backward with ``reshard_after_forward``) for memory we do not need. Past ~1 B parameters that
  changes, and FSDP2 is the way to go then.

The engine under this module is torch's: ``Tensor.register_post_accumulate_grad_hook`` (the hook torch documents
for work done as each gradient is ready, e.g. an optimizer step in the backward) and asynchronous
``torch.distributed.all_reduce`` (NCCL on its own stream: the host never waits, the compute stream waits for the
reduction only at :meth:`BucketedAllReduce.finish`; gloo on the CPU, which the tests run).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

#: bytes of float32 gradient per bucket (DDP's ``bucket_cap_mb`` default, 25 MiB)
BUCKET_BYTES = 25 * 2**20


def gradient_buckets(numels: list[int], bucket_elements: int) -> list[range]:
    """Cut parameters ``0 .. len(numels) - 1`` (``model.parameters()`` order) into buckets: ranges of parameter
    indices, the last parameters first, each holding at most ``bucket_elements`` elements unless one parameter alone
    is larger (it then has a bucket of its own). Every parameter is in exactly one bucket.

    Raises ValueError if ``bucket_elements`` < 1."""
    if bucket_elements < 1:
        raise ValueError(f"bucket_elements must be at least 1, got {bucket_elements}")
    buckets: list[range] = []
    stop, size = len(numels), 0
    for i in range(len(numels) - 1, -1, -1):
        if size and size + numels[i] > bucket_elements:
            buckets.append(range(i + 1, stop))
            stop, size = i + 1, 0
        size += numels[i]
    if stop:
        buckets.append(range(0, stop))
    return buckets


class BucketedAllReduce:
    """The sum over the processes of the default process group of a flat float32 ``buffer``, bucket by bucket.

    Args:
        buffer: float32 [N], contiguous (the masters' gradient buffer).
        slices: per bucket, ``(start, stop)`` element offsets into ``buffer`` (the buckets' order is the launch
            order, identical on every process).
    :meth:`ready` marks a bucket filled; buckets are launched (``async_op=True``) in their order, each as soon as it
    and every bucket before it is filled. :meth:`finish` launches the rest and waits for all. ``launched`` lists
    the bucket indices in launch order.
    """

    def __init__(self, buffer: torch.Tensor, slices: list[tuple[int, int]]):
        self.buffer, self.slices = buffer, slices
        self.filled = [False] * len(slices)
        self.launched: list[int] = []
        self._works: list = []

    def ready(self, bucket: int) -> None:
        """Bucket ``bucket`` holds its final values on this process: launch it, and any filled bucket after it,
        once every bucket before it is launched."""
        self.filled[bucket] = True
        while len(self.launched) < len(self.slices) and self.filled[len(self.launched)]:
            self._launch(len(self.launched))

    def _launch(self, bucket: int) -> None:
        start, stop = self.slices[bucket]
        self._works.append(dist.all_reduce(self.buffer[start:stop], async_op=True))
        self.launched.append(bucket)

    def finish(self) -> None:
        """Launch the buckets not launched yet (in order), then wait for every reduction (on CUDA the current
        stream waits for NCCL's, the host does not)."""
        for bucket in range(len(self.launched), len(self.slices)):
            self._launch(bucket)
        for work in self._works:
            work.wait()
        self._works = []


__all__ = ["BUCKET_BYTES", "BucketedAllReduce", "gradient_buckets"]
