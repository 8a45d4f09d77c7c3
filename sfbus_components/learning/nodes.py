"""``sfbus run --nodes N --node-rank I --master HOST:PORT``: several nodes train one policy.

Registered with the kernel's ``run`` command under the ``sfbus.run_options`` entry-point group
(pyproject.toml), as commands are: the kernel knows nothing of nodes. The options are checked
before anything starts (a ``ValueError`` is exit 2) and put into the environment of every
process of the run under torchrun's names, which only the learners read
(:mod:`sfbus_components.learning.distributed`); a run that torchrun started has them already.
Each node's run directory is named with its rank (``cartpole-rank1-...``).

Several ranks on one machine (``torchrun --nproc-per-node G``, which sets ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE``) split it: rank ``r`` keeps the ``r``-th contiguous share of the cores this
process may use, before any of its processes starts (they inherit it, and a process's
``cpu_affinity`` then counts within the share), and its learner and inference take GPU ``r``
(:func:`sfbus_components.models.device.gpu_index`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence


def register(run: argparse.ArgumentParser) -> Callable[[argparse.Namespace], str]:
    """Add the node options to ``sfbus run``; returns what applies them to a parsed command."""
    run.add_argument("--nodes", type=int, default=None,
                     help="nodes that train the same policy together (torchrun: WORLD_SIZE)")
    run.add_argument("--node-rank", type=int, default=None,
                     help="this node's rank, 0..NODES-1 (rank 0 starts the others' weights)")
    run.add_argument("--master", metavar="HOST:PORT", default=None,
                     help="address where rank 0 gathers the nodes (a free TCP port)")
    return join_nodes


def join_nodes(args: argparse.Namespace) -> str:
    """Check ``--nodes/--node-rank/--master`` and put them in the environment of every process
    under torchrun's names; returns the run directory's name suffix (``-rank<i>``, or '')."""
    if args.nodes is None:
        if args.node_rank is not None or args.master is not None:
            raise ValueError("--node-rank and --master need --nodes")
        take_core_share()
        return _rank_suffix()
    if args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes}: must be at least 1")
    if args.nodes == 1:
        return ""
    if args.node_rank is None or args.master is None:
        raise ValueError(f"--nodes {args.nodes} needs --node-rank and --master")
    rank = args.node_rank
    if not 0 <= rank < args.nodes:
        raise ValueError(f"--node-rank {rank}: must be one of 0..{args.nodes - 1}")
    host, _, port = args.master.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:29500
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--master {args.master!r}: expected HOST:PORT, e.g. 10.0.0.1:29500")
    os.environ.update(WORLD_SIZE=str(args.nodes), RANK=str(rank), LOCAL_RANK="0",
                      MASTER_ADDR=host, MASTER_PORT=port)
    return _rank_suffix()


def _rank_suffix() -> str:
    """``-rank<i>`` when several nodes train together (torchrun's variables), else ''."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"-rank{int(os.environ.get('RANK', '0'))}"
    return ""


def core_share(cores: Sequence[int], rank: int, ranks: int) -> list[int]:
    """Local rank ``rank``'s share of ``cores`` among ``ranks`` ranks on one machine: contiguous
    and as even as can be; one core each, shared round-robin, when there are more ranks."""
    if not 0 <= rank < ranks:
        raise ValueError(f"LOCAL_RANK {rank} is not below LOCAL_WORLD_SIZE {ranks}")
    if ranks > len(cores):
        return [cores[rank % len(cores)]]
    return list(cores[rank * len(cores) // ranks:(rank + 1) * len(cores) // ranks])


def take_core_share() -> None:
    """Under torchrun with several ranks on this machine, keep only this rank's share of the
    cores (its processes inherit it), and say so: every rank pinning its rollout workers to the
    same cores halved each one's speed."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if ranks <= 1:
        return
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    share = core_share(sorted(os.sched_getaffinity(0)), rank, ranks)
    os.sched_setaffinity(0, share)
    print(f"note: local rank {rank} of {ranks}: cores {','.join(map(str, share))}; its learner "
          f"and inference take GPU {rank} of the machine's where the device is auto or cuda",
          file=sys.stderr)
