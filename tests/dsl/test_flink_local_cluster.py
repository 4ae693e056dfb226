"""PyFlink's local mini-cluster listens on this host only: with a job running, every TCP socket this process and
its JVM listen on is a loopback address (the README's "every server binds 127.0.0.1"; Flink's REST API can cancel
jobs)."""

from __future__ import annotations

import ipaddress
import os
import time
from pathlib import Path

LISTEN = "0A"


def _children(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = {pid}, [pid]
    while todo:
        parent = todo.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_ip)
    # /proc/net/tcp* print each 32-bit word of the address in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def _listening(pids: set[int]) -> list[str]:
    inodes = _socket_inodes(pids)
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                hex_ip, hex_port = fields[1].split(":")
                out.append(f"{_address(hex_ip)}:{int(hex_port, 16)}")
    return out


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def test_the_local_mini_cluster_and_pyflink_listen_on_loopback_only(flink_env):
    flink_env.execute_sql("CREATE TEMPORARY TABLE bind_src (x BIGINT) WITH ('connector' = 'datagen', "
                          "'rows-per-second' = '1')")
    flink_env.execute_sql("CREATE TEMPORARY TABLE bind_sink (x BIGINT) WITH ('connector' = 'blackhole')")
    result = flink_env.execute_sql("INSERT INTO bind_sink SELECT x FROM bind_src")
    from pyflink.common import JobStatus

    client = result.get_job_client()
    try:
        deadline = time.monotonic() + 60
        while client.get_job_status().result() != JobStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.5)
        assert client.get_job_status().result() == JobStatus.RUNNING
        listening = _listening(_children(os.getpid()))
        assert listening, "found no listening socket of PyFlink's JVM: the check looks in the wrong place"
        assert [a for a in listening if not _loopback(a)] == []
    finally:
        client.cancel().result()
