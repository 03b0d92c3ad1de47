"""Per-process device setup for trainers and engines, done before any collective is made."""

from __future__ import annotations

import os

import torch
import torch.multiprocessing


def use_file_system_sharing() -> None:
    """CPU tensors shared by file name (torch's ``file_system`` strategy): the CPU stand-in
    for CUDA IPC, which works between any two processes of one host."""
    torch.multiprocessing.set_sharing_strategy("file_system")


def prepare_process(device: str) -> None:
    """CPU: tensors shared by file name (the stand-in for CUDA IPC).

    CUDA on a machine with one GPU: every trainer rank and engine shares that GPU, and
    NCCL refuses two ranks on one GPU ("Duplicate GPU detected") unless each process
    says it is a host of its own (NCCL_HOSTID), talking over loopback sockets. That is
    for correctness, not speed; on a machine with a GPU per process nothing is set.
    """
    if device == "cpu":
        use_file_system_sharing()
        return
    if torch.cuda.device_count() == 1:
        os.environ.setdefault("NCCL_HOSTID", f"testbed-{os.getpid()}")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
    torch.cuda.set_device(0 if torch.cuda.device_count() == 1 else torch.cuda.current_device())
