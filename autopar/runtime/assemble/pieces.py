"""Where this rank's tensors sit in the serial model's tensors, in the form
``torch.distributed.checkpoint`` saves and loads (``Pieces``).

A local tensor under a plan is not always one rectangle of the serial tensor: a tensor-parallel
shard of a fused qkv weight is three rectangles (a slice of q, of k and of v), and FSDP2 then
keeps only a dim-0 chunk of that. DCP's own DTensor support covers one rectangle per rank, so
this module describes each local tensor as a list of rectangles (``Piece``: offsets into the
serial tensor and the local view holding them) and implements DCP's checkpointable protocol
(``__create_write_items__``, ``__create_chunk_list__``, ``__get_tensor_shard__``) over them.
DCP then writes each rectangle once (replicas deduplicated), and a load under any other plan
reads exactly the rectangles it needs from whatever rectangles were saved.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Piece:
    offsets: tuple[int, ...]     # where the view starts in the serial tensor
    view: torch.Tensor           # a view of this rank's storage (writes go through)


class Pieces:
    """This rank's rectangles of one serial tensor of shape ``size``."""

    def __init__(self, size, pieces: list[Piece]):
        self.global_size = torch.Size(size)
        self.pieces = [p for p in pieces if p.view.numel() > 0]

    def size(self):
        return self.global_size

    def _chunk(self, p: Piece):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        return ChunkStorageMetadata(offsets=torch.Size(p.offsets), sizes=p.view.size())

    def __create_write_items__(self, fqn, obj):
        from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
        return [WriteItem(index=MetadataIndex(fqn, torch.Size(p.offsets)), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=self._chunk(p),
                                                      properties=TensorProperties.create_from_tensor(p.view),
                                                      size=self.global_size))
                for p in self.pieces]

    def __create_chunk_list__(self):
        return [self._chunk(p) for p in self.pieces]

    def __get_tensor_shard__(self, index):
        for p in self.pieces:
            if torch.Size(p.offsets) == index.offset:
                return p.view
        raise ValueError(f"no piece of {index.fqn} at {list(index.offset)}")


Rect = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # serial offsets, local offsets, sizes


def tp_rects(local_shape, full_size, dim: int | None, segments, tp_rank: int, tp: int) -> list[Rect]:
    """The rectangles of the serial tensor that a tensor-parallel shard of shape
    ``local_shape`` holds: replicated (``dim`` None): the whole tensor; sharded along ``dim``:
    rank r's 1/tp of it, or of each fused segment (``segments``: the serial sizes of the fused
    parts along ``dim``, e.g. q, k and v of a fused qkv weight)."""
    zeros = (0,) * len(full_size)
    if dim is None or tp == 1:
        return [(zeros, zeros, tuple(local_shape))]
    segs = list(segments) if segments and len(segments) > 1 else [full_size[dim]]
    out, local_at, serial_at = [], 0, 0
    for seg in segs:
        n = seg // tp
        serial, local, sizes = list(zeros), list(zeros), list(local_shape)
        serial[dim], local[dim], sizes[dim] = serial_at + tp_rank * n, local_at, n
        out.append((tuple(serial), tuple(local), tuple(sizes)))
        local_at += n
        serial_at += seg
    return out


def keep_rows(rects: list[Rect], start: int, stop: int) -> list[Rect]:
    """The rectangles left when only rows [start, stop) of the local tensor are kept (an FSDP2
    dim-0 shard), with local offsets relative to that shard."""
    out = []
    for serial, local, sizes in rects:
        if not sizes:
            out.append((serial, local, sizes))
            continue
        lo, hi = max(local[0], start), min(local[0] + sizes[0], stop)
        if hi <= lo:
            continue
        out.append(((serial[0] + lo - local[0], *serial[1:]), (lo - start, *local[1:]),
                    (hi - lo, *sizes[1:])))
    return out


def pieces_of(tensor: torch.Tensor, full_size, rects: list[Rect]) -> Pieces:
    """``Pieces`` whose views are the rectangles ``rects`` of ``tensor`` (this rank's storage)."""
    out = []
    for serial, local, sizes in rects:
        view = tensor
        for d, (o, n) in enumerate(zip(local, sizes)):
            if o != 0 or n != view.size(d):
                view = view.narrow(d, o, n)
        out.append(Piece(serial, view))
    return Pieces(full_size, out)


def planners():
    """DCP's default save and load planners, taught to find a ``Pieces`` rectangle by offset
    (DCP looks a rectangle up with ``isinstance(obj, torch.Tensor)`` first, and its load
    planner replaces values of types it does not know by None)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner

    def lookup(state_dict, index, default):
        obj = state_dict.get(index.fqn)
        return obj.__get_tensor_shard__(index) if isinstance(obj, Pieces) else default(index)

    class SavePlanner(DefaultSavePlanner):
        def lookup_object(self, index):
            return lookup(self.state_dict, index, super().lookup_object)

    class LoadPlanner(DefaultLoadPlanner):
        def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
            kept = {k: v for k, v in state_dict.items() if isinstance(v, Pieces)}
            super().set_up_planner(state_dict, metadata, is_coordinator)  # sets unknown types to None
            state_dict.update(kept)
            self.state_dict.update(kept)

        def lookup_tensor(self, index):
            return lookup(self.state_dict, index, super().lookup_tensor)

    return (SavePlanner(flatten_state_dict=False, flatten_sharded_tensors=False, dedup_save_to_lowest_rank=True),
            LoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False))
