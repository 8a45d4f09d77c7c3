"""Learners of one policy on several nodes, averaging gradients in the DD-PPO manner.

Each node runs a whole ``sfbus run`` process tree (samplers, inference, learner; shared memory
and the bus stay local). Only the learners talk to each other, with ``torch.distributed``: gloo
when the policy lives on the CPU, NCCL on CUDA. Who is in the group comes from torchrun's
variables ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (and ``LOCAL_RANK``), which
``sfbus run --nodes N --node-rank I --master HOST:PORT`` sets for its processes, so a tree
started by ``torchrun`` joins the same way. Several GPUs for one policy on one machine are
several trees on one machine, each its own rank (``torchrun --nproc-per-node G -m sfbus run
FILE``), each tree in its own run directory (the default ``runs/<name>-rank<i>-<time>``; give
each node its own ``--run-dir``). ``NodeGroup.local_rank`` is the GPU a rank should train on;
the group's backend follows the device of the learner's training state (NCCL for CUDA, else gloo).

Per training batch a learner:

- on joining (``on_start``) takes rank 0's policy, optimizer and returns-normalizer state, so every
  rank starts identical (rank 0's checkpoint wins on resume; each node checkpoints into its own
  run directory);
- per SGD step makes **one** all-reduce of one flat buffer: its gradients, its normalizer
  statistics (observations and returns: each rank updates them from its own samples, the group
  averages them, approximately the pooled statistics), a finite-loss flag, a leaving flag and its
  sample count. Gradients are summed and divided by the ranks that contributed, *before*
  grad-norm clipping, so every rank clips and steps with the same gradient and the weights stay
  identical. A step is skipped on every rank if any rank's loss was not finite, so the ranks keep
  making the same collectives in the same order (each batch is ``num_epochs *
  num_batches_per_epoch`` steps on every rank, whatever its data).

Policy versions, lag and frame counts stay per node. A learner that stops (or whose peer fails
or times out) ends the group for everyone: the leaver makes one last all-reduce with the leaving
flag set, which pairs with its peers' next step; from then on each learner trains alone (a
warning says so). A collective with a dead peer fails when its connection drops or after
``peer_timeout_s``, and the survivors go on alone too. A restarted learner does not rejoin.
Every node's learner joins in its ``on_start``, so the nodes must start within the run's
``start_timeout_s`` of each other.

With ``WORLD_SIZE`` > 1 each learner appends one line per synchronised batch to
``<run_dir>/logs/distributed_policy_<id>.jsonl`` (checksum of its weights, world size, local and
group samples): the audit that the ranks agree.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import ipaddress
import json
import logging
import os
import socket
import struct
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sfbus_components.learning.training_state import TrainingState

# Trailing entries of the all-reduced buffer: finite-loss ranks, leaving ranks, samples.
_FINITE, _LEAVING, _SAMPLES = -3, -2, -1


@dataclass(frozen=True)
class NodeGroup:
    """This process's place in a group of learners (torchrun's environment variables)."""

    world_size: int
    rank: int
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500


def group_from_env(environ: Mapping[str, str] = os.environ) -> NodeGroup | None:
    """The group named by ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``; None unless ``WORLD_SIZE`` > 1."""
    world_size = int(environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return None
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not environ.get(k)]
    if missing:
        raise ValueError(f"WORLD_SIZE is {world_size} but {', '.join(missing)} is not set")
    rank = int(environ["RANK"])
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK {rank} is not below WORLD_SIZE {world_size}")
    return NodeGroup(world_size, rank, int(environ.get("LOCAL_RANK", "0")),
                     environ["MASTER_ADDR"], int(environ["MASTER_PORT"]))


def check_supported(num_policies: int) -> None:
    """Raise ValueError if the environment names several nodes and the run trains a population."""
    group = group_from_env()
    if group is not None and num_policies > 1:
        raise ValueError(f"distributed mode (WORLD_SIZE {group.world_size}) is not supported with "
                         f"several policies (num_policies {num_policies}); run one policy per "
                         f"group of nodes")


class Peers:
    """This learner's link to the learners of the same policy on the other nodes."""

    def __init__(self, group: NodeGroup, params: Sequence[torch.Tensor],
                 buffers: Sequence[torch.Tensor], timeout_s: float,
                 log: logging.Logger | None = None, audit: Path | None = None) -> None:
        self.group = group
        self.audit = audit
        """Where :meth:`record_batch` appends its lines (None: nowhere)."""
        self.params = list(params)
        self.buffers = [b for b in buffers if b.is_floating_point()]
        self.timeout = timedelta(seconds=timeout_s)
        self.log = log or logging.getLogger(__name__)
        self.device = self.params[0].device
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.active = False
        """True while the group trains together (joined, and nobody left or failed)."""
        self.synced_steps = 0
        """SGD steps averaged with the whole group."""
        self.group_samples = 0
        """Samples of the whole group in the steps since the last ``take_group_samples``."""
        sizes = [p.numel() for p in self.params] + [b.numel() for b in self.buffers]
        self._flat = torch.zeros(sum(sizes) + 3, dtype=torch.float32, device=self.device)
        self._views = list(self._flat[:-3].split(sizes))

    def join(self) -> None:
        """Block until every rank joined, meeting at rank 0's store on the master address."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            pin_gloo(self.group.master_addr, self.group.master_port)
        dist.init_process_group(self.backend, store=rendezvous(self.group, self.timeout),
                                timeout=self.timeout, world_size=self.group.world_size,
                                rank=self.group.rank)
        self.active = True

    def broadcast(self, state: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's ``state`` (tensors, numbers, strings, nested dicts and lists), on every rank.

        Sent as the bytes of ``torch.save`` and read with ``weights_only=True``: a peer's bytes
        can never run code here, unlike ``broadcast_object_list``'s pickles."""
        device = self.device if self.backend == "nccl" else torch.device("cpu")
        payload = torch.zeros(0, dtype=torch.uint8)
        if self.group.rank == 0:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
        dist.broadcast(size, src=0)
        data = payload.to(device) if self.group.rank == 0 else torch.empty(
            int(size.item()), dtype=torch.uint8, device=device)
        dist.broadcast(data, src=0)
        if self.group.rank == 0:
            return state
        return torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=True,
                          map_location=self.device)

    def average(self, finite: bool, samples: int) -> bool:
        """All-reduce this step's gradients and statistics; True if every rank's loss was finite.

        Call after ``backward`` (or, for a non-finite loss, instead of it) and before clipping.
        Writes the mean gradient into each ``.grad`` and the mean statistics into the buffers.
        Once the group has ended it does nothing and returns ``finite``.
        """
        if not self.active:
            return finite
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if finite:
            torch.cat([t.reshape(-1).to(self._flat.dtype) for t in (*grads, *self.buffers)],
                      out=self._flat[:-3])
        else:  # its gradients are undefined: it adds nothing, and every rank skips the step
            self._flat[:-3].zero_()
        self._flat[_FINITE], self._flat[_LEAVING] = float(finite), 0.0
        self._flat[_SAMPLES] = samples
        if not self._all_reduce():
            return finite
        leaving = int(self._flat[_LEAVING])
        contributors = self.group.world_size - leaving
        all_finite = int(self._flat[_FINITE]) == contributors
        if all_finite:
            self._flat[:-3].div_(contributors)
            for param, view in zip(self.params, self._views, strict=False):
                if param.grad is None:
                    param.grad = torch.empty_like(param)
                param.grad.copy_(view.view_as(param))
            for buffer, view in zip(self.buffers, self._views[len(self.params):], strict=True):
                buffer.copy_(view.view_as(buffer))
        self.group_samples += int(self._flat[_SAMPLES])
        if leaving:
            self._end(f"{leaving} learner(s) left the group")
        else:
            self.synced_steps += 1
        return all_finite

    def take_group_samples(self) -> int:
        """The group's samples in the steps since the last call (each epoch counts them again)."""
        samples, self.group_samples = self.group_samples, 0
        return samples

    def record_batch(self, version: int, samples: int, num_epochs: int) -> None:
        """Append a batch's line to the audit log, if the whole batch was trained together."""
        group_samples = self.take_group_samples() // max(1, num_epochs)
        if not self.active or self.audit is None:
            return
        line = {"step": self.synced_steps, "version": version, "rank": self.group.rank,
                "world_size": self.group.world_size, "samples": samples,
                "group_samples": group_samples, "checksum": self.checksum()}
        with self.audit.open("a") as out:
            out.write(json.dumps(line) + "\n")

    def leave(self) -> None:
        """Tell the others this learner stops: one all-reduce that pairs with their next step."""
        if not self.active:
            return
        self._flat.zero_()
        self._flat[_LEAVING] = 1.0
        if self._all_reduce():
            self.active = False
            self.log.info("rank %d: left the group", self.group.rank)

    def close(self) -> None:
        """Leave the group (if still in it) and destroy the process group."""
        self.leave()
        if dist.is_initialized():
            dist.destroy_process_group()

    def checksum(self) -> str:
        """A digest of the weights: equal on every rank while the group trains together."""
        digest = hashlib.sha1()
        for param in self.params:
            digest.update(param.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def _all_reduce(self) -> bool:
        try:
            dist.all_reduce(self._flat)
        except RuntimeError as error:  # a peer died or timed out: it cannot come back
            self._end(f"a collective failed ({error})")
            return False
        return True

    def _end(self, why: str) -> None:
        self.active = False
        self.log.warning("rank %d: %s; training alone from now on", self.group.rank, why)


def pin_gloo(master_addr: str, master_port: int,
             environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Have gloo listen on the interface this host reaches the master address through (the
    loopback for a master on 127.0.0.1), unless ``GLOO_SOCKET_IFNAME`` already names one; the
    interface, or None where none holds that address (gloo then picks, by the host name)."""
    if environ.get("GLOO_SOCKET_IFNAME"):
        return environ["GLOO_SOCKET_IFNAME"]
    family, *_, target = socket.getaddrinfo(master_addr, master_port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)  # UDP: chooses the route and its source address, sends nothing
        local = ipaddress.ip_address(probe.getsockname()[0].split("%")[0])
    for name, addresses in interface_addresses().items():
        if local in addresses:
            environ["GLOO_SOCKET_IFNAME"] = name
            return name
    return None


def interface_addresses() -> dict[str, set[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """Each network interface's IPv4 and IPv6 addresses (Linux: SIOCGIFADDR, /proc/net/if_inet6)."""
    found: dict[str, set[ipaddress.IPv4Address | ipaddress.IPv6Address]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):  # no IPv4 address
                reply = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)
                found.setdefault(name, set()).add(ipaddress.IPv4Address(reply[20:24]))
    with contextlib.suppress(OSError):  # no IPv6
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            hex_address, *_, name = line.split()
            found.setdefault(name, set()).add(ipaddress.IPv6Address(bytes.fromhex(hex_address)))
    return found


_SIOCGIFADDR = 0x8915


def rendezvous(group: NodeGroup, timeout: timedelta) -> dist.TCPStore:
    """The group's key-value store. Rank 0 serves it on the master address only (``env://``
    listens on every interface, even for ``--master 127.0.0.1:PORT``); the others connect."""
    host, port = group.master_addr, group.master_port
    if group.rank != 0:
        return dist.TCPStore(host, port, group.world_size, False, timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen()
    except OSError:
        listener.close()
        raise
    # The store owns the socket from here on (it closes it).
    return dist.TCPStore(host, port, group.world_size, True, timeout, wait_for_workers=False,
                         master_listen_fd=listener.detach(), use_libuv=True)


def join_peers(training: TrainingState, timeout_s: float, log: logging.Logger, name: str,
               audit: Path | None = None) -> Peers | None:
    """Join the group the environment names and take rank 0's learned state into ``training``;
    None when alone.

    Runs on a thread (it blocks until every rank joined). ``audit``: the batches' log
    (:meth:`Peers.record_batch`).
    """
    group = group_from_env()
    if group is None:
        return None
    rn = training.returns_normalizer
    peers = Peers(group, list(training.policy.parameters()),
                  [*training.policy.buffers(), *(() if rn is None else rn.buffers())],
                  timeout_s, log, audit)
    log.info("%s: joining a group of %d learners as rank %d (%s)", name, group.world_size,
             group.rank, peers.backend)
    peers.join()
    state = peers.broadcast(training.learned_state())
    if group.rank != 0:
        training.load_learned_state(state)
    return peers
