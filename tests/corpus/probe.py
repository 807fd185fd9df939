"""A ``run_ranks`` target that reports which addresses the job's processes listen on."""

from __future__ import annotations

import os
from pathlib import Path

from corpus.harness import children_of


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(link[8:-1])
    except OSError:
        pass
    return out


def _address(hex_addr: str) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080``; IPv6 as the kernel's 32 hex digits."""
    ip, _, port = hex_addr.partition(":")
    if len(ip) == 8:
        ip = ".".join(str(int(ip[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return f"{ip}:{int(port, 16)}"


def listening(payload: object) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket of the parent and of every rank."""
    parent = os.getppid()
    pids = [parent, *children_of(parent)]
    owners = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in owners:  # 0A: LISTEN
                found.append((owners[cols[9]], _address(cols[1])))
    return sorted(found)
