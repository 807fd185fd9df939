"""Meeting a launcher's other ranks (``setup.launched.join``) without one long wait in C++.

A rank waits for its peers with short tries and polls in Python against a deadline, so SIGTERM
or SIGINT (whose handlers run between them) ends a rank whose peers never come within a second
(issue 45: rank 0 of a Slurm step waited inside torch's store for up to 1800 s, deaf to both).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from gbdoctor.launcher import Launched

POLL_S = 0.1
"""How often a waiting rank looks again (the store's arrival count, rank 0's port)."""

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
CONNECT_TRY_S = 0.5
"""One try to reach the rendezvous store's port: a signal between tries ends the wait."""


def rendezvous(launched: Launched, timeout_s: float) -> Any:
    """The job's rendezvous store, once every rank has arrived, waited for in Python: short
    tries and polls with a deadline (``timeout_s``), so SIGTERM or SIGINT ends a rank that
    waits for peers that never come within a second (issue 45: rank 0 of a Slurm step waited
    inside torch's store for up to 1800 s, deaf to both). torchrun's agent hosts the store
    (``TORCHELASTIC_USE_AGENT_STORE``: ``dist.rendezvous`` connects to it, per restart);
    otherwise rank 0 serves it on the master address, loopback when the job is on one node,
    through a socket it bound itself (torch's own store listens on every interface)."""
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    timeout = timedelta(seconds=timeout_s)
    if os.environ.get(AGENT_STORE_ENV) == "True":
        store, _, _ = next(
            dist.rendezvous("env://", launched.rank, launched.world_size, timeout=timeout)
        )
    else:
        host = "127.0.0.1" if launched.nodes == 1 else launched.master_addr
        if launched.rank == 0:
            listening = _listen(host, launched.master_port)
            store = dist.TCPStore(
                host,
                launched.master_port,
                launched.world_size,
                True,
                timeout=timeout,
                wait_for_workers=False,
                master_listen_fd=listening.detach(),  # the store owns it from here
                use_libuv=False,  # the libuv server does not take a listening socket
            )
        else:
            _await_port(host, launched.master_port, deadline, timeout_s)
            store = dist.TCPStore(host, launched.master_port, launched.world_size, False, timeout)
    arrived = dist.PrefixStore("gbdoctor/arrived", store)
    arrived.add("ranks", 1)
    while arrived.add("ranks", 0) < launched.world_size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank arrived within {timeout_s:.0f} s")
        time.sleep(POLL_S)
    return store


def _listen(host: str, port: int) -> Any:
    """A socket listening on ``host:port`` only (IPv4 or IPv6, as ``host`` resolves)."""
    import socket

    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(socket.SOMAXCONN)
    return sock


def _await_port(host: str, port: int, deadline: float, timeout_s: float) -> None:
    """Until rank 0's store accepts connections: short Python connects (a signal's handler runs
    between them), instead of torch's client retrying in C++ up to its timeout."""
    import socket

    while True:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TRY_S):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank 0's store at {host}:{port} did not answer within {timeout_s:.0f} s"
                ) from None
            time.sleep(POLL_S)
