"""The admission round trip alone: the Link over TCP against the Link rpc.

    python tools/bench/link_rtt.py                  # 4 blocks of 1,000 per transport
    python tools/bench/link_rtt.py --blocks 8 --per-block 500 --json rtt.json
    python tools/bench/link_rtt.py --bare           # the transports alone: echo round trips

Starts one scheduler (this working tree) with one endpoint that needs no probing,
and two of the dataplane's scheduler links in this process (on uvloop, as a
dataplane runs): one over the Link over TCP, one over the Link rpc. Then asks for
admission one turn at a time, each turn's report riding with the next request as
a dataplane's does, the links alternated block by block as
[Methodology](docs/benchmarks/methodology.md#alternation) describes. Reports each
link's p50 per block and its p50, p90 and mean over all blocks.

``--bare`` measures what the transports cost before any of our code runs: a
120-byte message echoed by a child process (on uvloop, as the services run), over
length-prefixed frames on a TCP socket and over a grpc.aio bidirectional stream,
3,000 round trips each after 300 of warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # python tools/bench/X.py: import tools.bench from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvloop

from luftpause._proto.luftpause.scheduler.v1 import scheduler_pb2 as pb
from luftpause.dataplane.link_codec import Admitted
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.scheduler_link import SchedulerLink
from luftpause.procs import launch, stop_all
from tools.bench.stats import rank_at

TRANSPORTS = ("tcp", "grpc")


def summary(times: list[float]) -> dict[str, Any]:
    """Round trips (s) as count, p50, p90 and mean in ms."""
    return {
        "n": len(times),
        "p50_ms": rank_at(times, 0.5) * 1000,
        "p90_ms": rank_at(times, 0.9) * 1000,
        "mean_ms": statistics.mean(times) * 1000,
    }


def row(label: str, r: dict[str, Any], *extra: str) -> str:
    cells = [label, str(r["n"]), *(f"{r[k]:.3f}" for k in ("p50_ms", "p90_ms", "mean_ms"))]
    return "| " + " | ".join([*cells, *extra]) + " |"


async def block(link: SchedulerLink, tag: str, n: int) -> list[float]:
    times: list[float] = []
    for i in range(n):
        turn, run = f"{tag}-t{i}", f"{tag}-r{i}"
        req = pb.AdmitRequest(
            turn_id=turn, run_id=run, model="m", service_class=pb.SERVICE_CLASS_BATCH,
            caller="bench", kind=pb.ENDPOINT_KIND_GENERATIVE,
        )  # fmt: skip
        t0 = time.perf_counter()
        outcome = await link.admit(req)
        times.append(time.perf_counter() - t0)
        if not isinstance(outcome, Admitted):
            raise SystemExit(f"turn {turn} was not admitted: {outcome}")
        link.report(pb.TurnEvent(turn_id=turn, run_id=run, failed=pb.TurnFailed(reason="bench")))
    return times


async def measure(address: str, blocks: int, per_block: int) -> dict[str, Any]:
    links = {
        t: SchedulerLink(
            address, f"rtt-{t}", RunTable(time.monotonic, 600), 0.2, tcp_link=t == "tcp"
        )
        for t in TRANSPORTS
    }
    tasks = [asyncio.create_task(link.maintain()) for link in links.values()]
    try:
        for t, link in links.items():
            await asyncio.wait_for(link.ready.wait(), 10)
            if link.transport != t:
                raise SystemExit(f"the {t} link came up over {link.transport}")
            await block(link, f"warm-{t}", 200)
        times: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
        per: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
        for b in range(blocks):
            order = TRANSPORTS if b % 2 == 0 else TRANSPORTS[::-1]
            for t in order:
                got = await block(links[t], f"{t}-{b}", per_block)
                times[t] += got
                per[t].append(statistics.median(got) * 1000)
            print(
                f"  block {b + 1}/{blocks}: "
                + ", ".join(f"{t} p50 {per[t][-1]:.3f} ms" for t in TRANSPORTS),
                file=sys.stderr,
                flush=True,
            )
        return {t: {**summary(times[t]), "block_p50_ms": per[t]} for t in TRANSPORTS}
    finally:
        for link in links.values():
            await link.close(0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ------------------------------------------------------------------ --bare

ECHO_N, ECHO_WARM, ECHO_MESSAGE = 3000, 300, b"x" * 120


async def _tcp_echo_server(port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readexactly(4)
            writer.write(head + await reader.readexactly(int.from_bytes(head, "big")))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def _grpc_echo_server(port: int) -> None:
    import grpc

    async def echo(requests: Any, context: Any) -> Any:
        async for message in requests:
            yield message

    handler = grpc.stream_stream_rpc_method_handler(
        echo, request_deserializer=bytes, response_serializer=bytes
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("e.E", {"Echo": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def _tcp_echo_client(port: int) -> list[float]:
    import socket

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frame = len(ECHO_MESSAGE).to_bytes(4, "big") + ECHO_MESSAGE
    times = []
    for _ in range(ECHO_WARM + ECHO_N):
        t0 = time.perf_counter()
        writer.write(frame)
        head = await reader.readexactly(4)
        await reader.readexactly(int.from_bytes(head, "big"))
        times.append(time.perf_counter() - t0)
    writer.close()
    return times[ECHO_WARM:]


async def _grpc_echo_client(port: int) -> list[float]:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            "/e.E/Echo", request_serializer=bytes, response_deserializer=bytes
        )()
        times = []
        for _ in range(ECHO_WARM + ECHO_N):
            t0 = time.perf_counter()
            await call.write(ECHO_MESSAGE)
            await call.read()
            times.append(time.perf_counter() - t0)
        call.cancel()
    return times[ECHO_WARM:]


def bare() -> dict[str, Any]:
    import socket
    import subprocess

    out: dict[str, Any] = {}
    for kind, client in (("tcp", _tcp_echo_client), ("grpc", _grpc_echo_client)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        child = subprocess.Popen([sys.executable, __file__, "--echo-server", kind, str(port)])
        try:
            deadline = time.monotonic() + 30
            while True:  # until the child listens
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or child.poll() is not None:
                        raise SystemExit(f"the {kind} echo server did not start") from None
                    time.sleep(0.05)
            times = uvloop.run(client(port))
        finally:
            child.terminate()
            child.wait(10)
        out[kind] = summary(times)
    return out


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--echo-server":  # the child of --bare
        server = _tcp_echo_server if sys.argv[2] == "tcp" else _grpc_echo_server
        uvloop.run(server(int(sys.argv[3])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4, help="blocks per transport (4)")
    parser.add_argument("--per-block", type=int, default=1000, help="turns per block (1000)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument(
        "--bare", action="store_true", help="only the transports: echo round trips, no scheduler"
    )
    args = parser.parse_args()
    if args.blocks < 1 or args.per_block < 1:
        parser.error("--blocks and --per-block must be at least 1")
    if args.bare:
        result = bare()
        print("| transport, echo of 120 bytes | round trips | p50 ms | p90 ms | mean ms |")
        print("|---|---|---|---|---|")
        for kind, r in result.items():
            label = "framed bytes on TCP" if kind == "tcp" else "grpc.aio bidirectional stream"
            print(row(label, r))
        if args.json:
            Path(args.json).write_text(json.dumps({"command": sys.argv, "bare": result}, indent=2))
        return 0
    started = []
    with tempfile.TemporaryDirectory(prefix="luftpause-rtt-") as tmp_s:
        tmp = Path(tmp_s)
        config = tmp / "stack.toml"
        config.write_text(
            "[scheduler]\ngrpc_port = 0\nhttp_port = 0\n"
            '[[endpoints]]\nname = "e"\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n'
            'health_path = ""\nmetrics = "none"\n'
        )
        try:
            sched = launch(
                ("scheduler", "--config", str(config), "--log-level", "WARNING"),
                name="scheduler", ready_file=tmp / "s.json", stderr=tmp / "s.log",
            )  # fmt: skip
            started.append(sched)
            sched.wait_ready(60)
            result = uvloop.run(
                measure(f"127.0.0.1:{sched.ports['grpc']}", args.blocks, args.per_block)
            )
        finally:
            stop_all(started)
    print("| link | turns | p50 ms | p90 ms | mean ms | p50 per block, ms |")
    print("|---|---|---|---|---|---|")
    for t, r in result.items():
        blocks = ", ".join(f"{v:.3f}" for v in r["block_p50_ms"])
        label = "Link over TCP" if t == "tcp" else "Link rpc (gRPC)"
        print(row(label, r, blocks))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": sys.argv, "results": result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
