"""Gradient averaging between two real processes (sfbus_components.learning.distributed): over
gloo on the CPU, over NCCL with a GPU per rank where the machine has two."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from sfbus_components.learning.distributed import (
    NodeGroup,
    Peers,
    check_supported,
    group_from_env,
    interface_addresses,
)
from tests.kernel.runs import free_port, listening, tcp_listeners

pytestmark = pytest.mark.timeout(60)

WORLD = 2
HALF = 4  # samples per rank
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
DEVICES = [
    pytest.param("cpu", id="cpu-gloo"),
    pytest.param("cuda", id="cuda-nccl", marks=pytest.mark.skipif(
        GPUS < WORLD, reason=f"needs {WORLD} CUDA GPUs (NCCL gives each rank its own GPU); "
                             f"this machine has {GPUS}")),
]


class Net(nn.Module):
    """A linear layer and a float64 statistic, like a policy with its observation normalizer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("stat", torch.zeros(2, dtype=torch.float64))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch; rank r trains on rows r*HALF..(r+1)*HALF."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(WORLD * HALF, 3, generator=g), torch.randn(WORLD * HALF, 2, generator=g)


def _rank(rank: int, port: int, out: str, device_type: str) -> None:
    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    torch.manual_seed(rank)  # different weights on each rank until the broadcast
    net = Net().to(device)
    peers = Peers(group_from_env(), list(net.parameters()), list(net.buffers()), timeout_s=20)
    peers.join()
    net.load_state_dict(peers.broadcast(net.state_dict()))
    start = {k: v.clone() for k, v in net.state_dict().items()}
    x, y = (t.to(device) for t in data())
    rows = slice(rank * HALF, (rank + 1) * HALF)
    nn.functional.mse_loss(net.fc(x[rows]), y[rows]).backward()
    net.stat.fill_(rank + 1.0)  # each rank's own statistic; the group keeps their mean
    ok = peers.average(True, HALF)
    first = {"ok": ok, "grads": [p.grad.clone() for p in net.parameters()],
             "stat": net.stat.clone(), "samples": peers.take_group_samples()}
    # A non-finite loss on rank 1: both ranks skip the step.
    skipped = peers.average(rank == 0, HALF)
    # Rank 0 stops; rank 1's next step pairs with its leaving and goes on alone.
    net.zero_grad()
    nn.functional.mse_loss(net.fc(x[rows]), y[rows]).backward()
    local = [p.grad.clone() for p in net.parameters()]
    if rank == 0:
        peers.leave()
        alone = True
    else:
        alone = peers.average(True, HALF)
    left = {"ok": alone, "active": peers.active, "unchanged": all(
        torch.equal(p.grad, g) for p, g in zip(net.parameters(), local, strict=True))}
    peers.close()
    torch.save({"start": start, "first": first, "skipped": skipped, "left": left},
               Path(out, f"rank{rank}.pt"))  # read back with map_location="cpu"


def _dying(rank: int, port: int, out: str) -> None:
    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    net = Net()
    peers = Peers(group_from_env(), list(net.parameters()), list(net.buffers()), timeout_s=20)
    peers.join()
    if rank == 1:
        os._exit(0)  # dies without leaving
    x, y = data()
    nn.functional.mse_loss(net.fc(x), y).backward()
    local = [p.grad.clone() for p in net.parameters()]
    ok = peers.average(True, HALF)
    unchanged = all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), local, strict=True))
    peers.close()
    torch.save({"ok": ok, "active": peers.active, "unchanged": unchanged}, Path(out, "rank0.pt"))


def test_a_dead_peer_leaves_the_survivor_training_alone(tmp_path: Path) -> None:
    mp.spawn(_dying, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    assert torch.load(tmp_path / "rank0.pt") == {"ok": True, "active": False, "unchanged": True}


@pytest.mark.parametrize("device_type", DEVICES)
def test_two_ranks_average_like_one_big_batch(tmp_path: Path, device_type: str) -> None:
    mp.spawn(_rank, args=(free_port(), str(tmp_path), device_type), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in range(WORLD)]
    # Rank 0's weights reached rank 1.
    for key, value in results[0]["start"].items():
        assert torch.equal(value, results[1]["start"][key])
    # The averaged gradient is the gradient of the concatenated batch.
    net = Net()
    net.load_state_dict(results[0]["start"])
    x, y = data()
    nn.functional.mse_loss(net.fc(x), y).backward()
    for result in results:
        first = result["first"]
        assert first["ok"] and first["samples"] == WORLD * HALF
        for grad, expected in zip(first["grads"], net.parameters(), strict=True):
            torch.testing.assert_close(grad, expected.grad)
        assert first["stat"].tolist() == [1.5, 1.5]
        assert result["skipped"] is False  # one rank's bad loss skips the step everywhere
        assert result["left"]["ok"] and not result["left"]["active"]
    assert results[1]["left"]["unchanged"]  # alone: its own gradient, not halved


def test_group_comes_from_torchrun_variables() -> None:
    assert group_from_env({}) is None
    assert group_from_env({"WORLD_SIZE": "1"}) is None
    env = {"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
           "MASTER_PORT": "1"}
    assert group_from_env(env) == NodeGroup(world_size=4, rank=2, local_rank=1, master_addr="h",
                                            master_port=1)
    with pytest.raises(ValueError, match="MASTER_ADDR, MASTER_PORT is not set"):
        group_from_env({"WORLD_SIZE": "2", "RANK": "0"})
    with pytest.raises(ValueError, match="RANK 2 is not below WORLD_SIZE 2"):
        group_from_env({**env, "WORLD_SIZE": "2"})


def test_populations_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    check_supported(4)  # alone: fine
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    check_supported(1)
    with pytest.raises(ValueError, match="not supported with several policies"):
        check_supported(4)


def test_the_rendezvous_listens_on_the_master_address_only() -> None:
    from datetime import timedelta

    from sfbus_components.learning.distributed import rendezvous

    port = free_port()
    store = rendezvous(NodeGroup(2, 0, master_addr="127.0.0.1", master_port=port),
                       timedelta(seconds=5))
    try:
        assert listening(port) == {"127.0.0.1"}  # not 0.0.0.0 or ::
        store.set("k", "v")
        client = rendezvous(NodeGroup(2, 1, master_addr="127.0.0.1", master_port=port),
                            timedelta(seconds=5))
        assert client.get("k") == b"v"
    finally:
        del store


def _own_listeners(rank: int, addr: str, port: int, out: str) -> None:
    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), MASTER_ADDR=addr,
                      MASTER_PORT=str(port))
    net = Net()
    peers = Peers(group_from_env(), list(net.parameters()), list(net.buffers()), timeout_s=20)
    peers.join()
    inodes = {int(link[8:-1]) for fd in Path("/proc/self/fd").iterdir()
              if (link := os.readlink(fd) if fd.exists() else "").startswith("socket:[")}
    mine = sorted({address for address, _, inode in tcp_listeners() if inode in inodes})
    peers.average(True, HALF)  # both ranks looked while the group was up
    peers.close()
    Path(out, f"rank{rank}.txt").write_text(" ".join(mine))


def _beyond_loopback() -> str | None:
    """An IPv4 address of this machine that is not a loopback one, or None."""
    return next((str(a) for addresses in interface_addresses().values() for a in addresses
                 if a.version == 4 and not a.is_loopback), None)


@pytest.mark.parametrize("where", ["loopback", "beyond"])
def test_gloo_listens_on_the_masters_interface_only(where: str, tmp_path: Path) -> None:
    """Gloo's own listeners (not the rendezvous) bind the address this host reaches the master
    through, never what the host name resolves to (here 127.0.0.1 whatever the master)."""
    addr = "127.0.0.1" if where == "loopback" else _beyond_loopback()
    if addr is None:
        pytest.skip("this machine has no IPv4 address beyond loopback")
    mp.spawn(_own_listeners, args=(addr, free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        assert (tmp_path / f"rank{rank}.txt").read_text() == addr
