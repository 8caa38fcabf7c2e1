"""Every single fault of a cluster, under load: what a client sees, and for how long.

    uv run python -m bench.cluster_faults [--faults F1,F2,F3,F4] [--observe 25] [--warmup 25]
        [--broker amqp|redis] [--api-workers 2] [--out report.json]

Loopback only, bounded in time (about 4 minutes for the four faults). It starts:
- a Redis Cluster of 3 masters and 3 replicas (shared/commands/clusterproc.py: AOF fsynced
  every second, `cluster-node-timeout 2000`);
- a RabbitMQ node of its own as the broker (`rabbitmq-server` with its own node name, port,
  Mnesia directory and no plugins), so F2 can kill it without touching the machine's RabbitMQ;
  with `--broker redis`, a redis-server of its own instead (AOF on, so its queue survives F2);
- the fake LLM (tests/fakellm.py) as the summarizer, answering in `--llm-delay` seconds;
- `prefit up --api-workers 2` (its own summary worker) and one more `prefit worker`;
- 4 clients appending 20 conversations turn by turn, each append followed by a prepare and
  every fifth by a GET (tests/api/traffic.py; a 503'd append is resent with the same
  `expected_length`).

After `--warmup` seconds (summaries flowing) it injects, one at a time, `--observe` seconds
apart:
- F1: SIGKILL the master serving the first conversation; restart it 10 s later (it rejoins as
  a replica of the master its replica became);
- F2: SIGKILL the broker, start it again 10 s later (F2 also counts the summaries written
  while the broker was down, from 3 s after the kill: jobs already running finish anyway);
- F3: SIGKILL the extra worker while jobs run (started again once the figures are taken);
- F4: SIGSTOP a master (another conversation's) for 5 s, then SIGCONT.

For each fault it prints: answers by status (500s and 503s), the 503 window (last 503 after
the fault, from the fault), the slowest answer, when summaries flowed again (the first moment
after the fault when as many summaries were written over 2 s as the pre-fault rate's half),
and the worst conversation's wait for a new summary across the fault. At the end, every
conversation's stored messages are compared with what the clients sent: acknowledged appends
lost, doubled or out of order. Prints markdown (and `--out` JSON); asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from shared.commands.clusterproc import ClusterProcess
from shared.commands.redisproc import RedisProcess, free_port
from shared.settings import Settings
from shared.store import Store, keys
from tests.api.traffic import Traffic, turn
from tests.fakellm import FakeLLM

ROOT = Path(__file__).resolve().parent.parent
TENANT, KEY, MODEL = "drill", "drill-key", "drill-model"
CONVERSATIONS, CLIENTS = 20, 4
START_TIMEOUT_S = 60.0
RABBIT_BIN = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class RabbitNode:
    """A rabbitmq-server of our own on a free port (its own node name, data and config)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="prefit-rabbit-"))
        self.name = f"prefitdrill{uuid.uuid4().hex[:6]}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self) -> RabbitNode:
        # the Debian wrapper on PATH switches to the rabbitmq user and drops our environment
        exe = RABBIT_BIN if Path(RABBIT_BIN).exists() else shutil.which("rabbitmq-server") or ""
        (self.dir / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        env = {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
        }
        with (self.dir / "out.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [exe], env=env, stdout=out, stderr=out, start_new_session=True
            )
        _wait(lambda: _amqp_answers(self.url), START_TIMEOUT_S, "RabbitMQ to answer")
        return self

    def kill(self) -> None:
        """SIGKILL the Erlang VM (the process group: the VM and its helpers)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        self.kill()
        if self.proc is not None and self.proc.returncode not in (0, -signal.SIGKILL):
            print((self.dir / "out.log").read_text()[-2000:], file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisBroker:
    """A redis-server of our own as the broker (AOF fsynced: the queue survives a kill)."""

    def __init__(self) -> None:
        self.server = RedisProcess(appendonly=True)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> RedisBroker:
        self.server.restart() if self.server.dir is not None else self.server.start()
        return self

    def kill(self) -> None:
        self.server.kill()

    def stop(self) -> None:
        self.server.stop()


@dataclass
class Figures:
    """What one fault did to the clients and the summaries."""

    fault: str
    what: str
    answers: dict[str, int] = field(default_factory=dict)
    errors_500: int = 0
    answers_503: int = 0
    last_503_s: float | None = None  # from the fault's start
    slowest_s: float = 0.0
    flowing_s: float | None = None  # summaries flowing again, from the fault's start
    worst_wait_s: float | None = None  # the longest a conversation waited for a new summary
    affected: int = 0  # conversations the fault hit (on the master; jobs on the worker; all)
    affected_s: float | None = None  # the last of them to get a new summary, from the start
    notes: list[str] = field(default_factory=list)


class Summaries:
    """Polls every conversation's best record: when each new one appeared."""

    def __init__(self, store: Store, conversations: list[str]) -> None:
        self.store, self.conversations = store, conversations
        self.seen: dict[str, list[float]] = {c: [] for c in conversations}
        self._last: dict[str, int] = {}
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Summaries:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for conv in self.conversations:
                with contextlib.suppress(Exception):  # a read during a fault: next round
                    best = self.store.records.best(TENANT, conv)
                    if best is not None and best.upto != self._last.get(conv):
                        self._last[conv] = best.upto
                        self.seen[conv].append(time.monotonic())

    def all_times(self) -> list[float]:
        return sorted(t for ts in self.seen.values() for t in ts)

    def flowing_after(self, start: float, end: float, window: float = 2.0) -> float | None:
        """The first time after `end` when `window` seconds held half the pre-fault rate."""
        times = self.all_times()
        before = [t for t in times if start - 20 <= t < start]
        rate = len(before) / 20
        need = max(1, int(rate * window / 2))
        for t in (x for x in times if x >= end):
            if len([x for x in times if t - window < x <= t]) >= need:
                return t
        return None

    def next_after(self, convs: list[str], start: float) -> float | None:
        """When the last of `convs` (those with a summary before `start`) had a new one."""
        firsts = []
        for conv in convs:
            ts = self.seen[conv]
            if any(t < start for t in ts):
                firsts.append(min((t for t in ts if t >= start), default=float("inf")))
        return max(firsts) if firsts else None

    def worst_wait(self, start: float, until: float) -> float | None:
        """Across conversations that had a summary before `start`: the longest gap between the
        last new record before `start` and the first after it (until `until` if none came)."""
        waits = []
        for ts in self.seen.values():
            last = max((t for t in ts if t < start), default=None)
            if last is None:
                continue
            nxt = min((t for t in ts if t >= start), default=until)
            waits.append(nxt - last)
        return max(waits) if waits else None


class Drill:
    """The processes of the drill, their faults and the figures."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.cluster = ClusterProcess(3, replicas=1, appendonly=True, node_timeout_ms=2000)
        self.rabbit: RabbitNode | RedisBroker = (
            RedisBroker() if args.broker == "redis" else RabbitNode()
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port = free_port()
        self.queue = f"summaries-drill-{uuid.uuid4().hex[:8]}"
        self.conversations = [f"d{i}-{uuid.uuid4().hex[:6]}" for i in range(CONVERSATIONS)]
        self.llm_url = ""

    def env(self, llm_url: str) -> dict[str, str]:
        models = {MODEL: {"max_input_tokens": 3000, "reserve_output": 500}}
        return {
            **os.environ,
            "REDIS_URL": self.cluster.url,
            "PREFIT_REDIS_CLUSTER": "true",
            "PREFIT_BROKER_URL": self.rabbit.url,
            "PREFIT_SUMMARY_QUEUE": self.queue,
            "PREFIT_API_KEYS": f"{TENANT}:{KEY}",
            "PREFIT_MODELS": json.dumps(models),
            "PREFIT_CHUNK_TOKENS": "1000",
            "PREFIT_SUMMARIZER_URL": llm_url,
            "PREFIT_SUMMARIZER_MODEL": "fake-summarizer",
            "PREFIT_WORKER_CONCURRENCY": "16",
            "PREFIT_LOG_JSON": "true",
            "PREFIT_PORT": str(self.port),
            "PREFIT_RABBITMQ_CONSUMER_TIMEOUT_ARG": "false",
        }

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with (self.work / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
            )

    def prefit(self) -> list[str]:
        return [sys.executable, "-c", "import sys; from shared.commands.cli import main; "
                "sys.exit(main(sys.argv[1:]))"]  # fmt: skip

    def worker_pids(self) -> list[int]:
        """The Celery worker processes `prefit up` started (its children running celery)."""
        up = self.procs["up"].pid
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                cmd = (entry / "cmdline").read_bytes()
                if ppid == up and b"celery" in cmd:
                    found.append(int(entry.name))
        return found


def _amqp_answers(url: str) -> bool:
    from kombu.connection import Connection

    conn = Connection(url, connect_timeout=1.0, heartbeat=0)
    try:
        conn.ensure_connection(max_retries=0)
        return True
    except Exception:
        return False
    finally:
        conn.release()


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"cluster_faults: timed out waiting for {what}")
        time.sleep(0.1)


def _ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
    return False


@contextlib.contextmanager
def running(args: argparse.Namespace) -> Iterator[tuple[Drill, Store, Traffic, Summaries]]:
    work = Path(tempfile.mkdtemp(prefix="prefit-drill-"))
    drill = Drill(args, work)
    store: Store | None = None
    traffic: Traffic | None = None
    summaries: Summaries | None = None
    with FakeLLM(delay=args.llm_delay) as fake:
        try:
            drill.cluster.start()
            drill.rabbit.start()
            drill.llm_url = fake.base_url
            env = drill.env(fake.base_url)
            workers = ["--api-workers", str(args.api_workers)]
            drill.spawn("up", [*drill.prefit(), "up", *workers], env)
            drill.spawn("extra", [*drill.prefit(), "worker", "-n", "extra@%h"], env)
            url = f"http://127.0.0.1:{drill.port}"
            _wait(lambda: _ready(url), START_TIMEOUT_S, "the API")
            settings = Settings(
                redis_url=drill.cluster.url, redis_cluster=True, broker_url=drill.rabbit.url
            )
            store = Store.from_url(drill.cluster.url, settings)
            headers = {"Authorization": f"Bearer {KEY}"}
            traffic = Traffic(
                url, headers, MODEL, drill.conversations, clients=CLIENTS, pause_s=args.pause
            )
            summaries = Summaries(store, drill.conversations).start()
            traffic.start()
            print(f"drill: logs in {work}", flush=True)
            yield drill, store, traffic, summaries
        finally:
            if traffic is not None:
                traffic.finish()
            if summaries is not None:
                summaries.stop.set()
            for proc in drill.procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in drill.procs.values():
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            if store is not None:
                store.close()
            drill.rabbit.stop()
            drill.cluster.stop()


@dataclass
class Injected:
    """One fault as it was injected."""

    what: str
    start: float
    end: float  # when the fault itself was over (the process back)
    affected: list[str]
    notes: list[str] = field(default_factory=list)


def inject(drill: Drill, store: Store, fault: str) -> Injected:
    """Run one fault; returns once it is over (the killed process started again)."""
    start = time.monotonic()
    if fault == "F0":
        return Injected("no fault (the baseline)", start, start, drill.conversations)
    if fault in ("F1", "F4"):
        conv = drill.conversations[0 if fault == "F1" else 1]
        master = drill.cluster.primary_for(keys.conv_messages(TENANT, conv))
        on = [c for c in drill.conversations if on_node(drill, c, master.port)]
        if fault == "F1":
            master.kill()
            time.sleep(10)
            master.restart()
            return Injected("SIGKILL a master, restarted after 10 s", start, start, on)
        assert master.pid is not None
        os.kill(master.pid, signal.SIGSTOP)
        time.sleep(5)
        os.kill(master.pid, signal.SIGCONT)
        return Injected("SIGSTOP a master for 5 s", start, start + 5, on)
    if fault == "F2":
        broker = "Redis (broker)" if isinstance(drill.rabbit, RedisBroker) else "RabbitMQ"
        before = len(summaries_seen(store, drill))
        drill.rabbit.kill()
        time.sleep(3)  # the jobs running at the kill finish whatever the broker does
        middle = len(summaries_seen(store, drill))
        time.sleep(7)
        during = len(summaries_seen(store, drill)) - middle
        drill.rabbit.start()
        back = f"{broker} answered again {time.monotonic() - start:.1f} s after the kill"
        notes = [back, f"{during} summaries written 3-10 s after the kill (broker down); "
                 f"{middle - before} in the first 3 s"]  # fmt: skip
        what = f"SIGKILL {broker}, started again after 10 s"
        return Injected(what, start, start + 10, drill.conversations, notes)
    if fault == "F3":
        deadline = start + 15
        while len(running := running_jobs(store, drill.queue)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # mid-task: wait for jobs running (likely on both workers)
        start = time.monotonic()
        proc = drill.procs["extra"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        note = f"{len(running)} jobs were running (on both workers) at the kill"
        return Injected("SIGKILL the extra worker mid-task", start, start, running, [note])
    raise SystemExit(f"unknown fault {fault}")


def summaries_seen(store: Store, drill: Drill) -> list[int]:
    """The `upto` of every conversation's best record now (one entry per conversation with
    one): more entries or larger ones mean new summaries."""
    found = []
    for conv in drill.conversations:
        with contextlib.suppress(Exception):
            found.extend(r.upto for r in store.records.list(TENANT, conv))
    return found


def on_node(drill: Drill, conv: str, port: int) -> bool:
    return drill.cluster.primary_for(keys.conv_messages(TENANT, conv)).port == port


def running_jobs(store: Store, queue: str) -> list[str]:
    """The conversations with a job in the in-flight registry now."""
    raw: dict[bytes, bytes] = store.client.hgetall(keys.inflight_jobs(queue))  # type: ignore[assignment]
    found = {json.loads(v)["kwargs"].get("conversation_id") for v in raw.values()}
    return sorted(c for c in found if isinstance(c, str))


def figures(fault: str, done: Injected, until: float, traffic: Traffic, s: Summaries) -> Figures:
    """The figures of one fault, observed until `until`."""
    start, end = done.start, done.end
    answers = [a for a in traffic.answers if start <= a.at < until]
    f = Figures(fault, done.what, notes=done.notes, affected=len(done.affected))
    last = s.next_after(done.affected, start)
    f.affected_s = round(last - start, 2) if last is not None and last < until else None
    for a in answers:
        f.answers[str(a.status)] = f.answers.get(str(a.status), 0) + 1
    f.errors_500 = f.answers.get("500", 0)
    f.answers_503 = f.answers.get("503", 0)
    late = [a.at for a in answers if a.status == 503]
    f.last_503_s = round(max(late) - start, 2) if late else None
    f.slowest_s = round(max((a.seconds for a in answers), default=0.0), 3)
    flowing = s.flowing_after(start, end)
    f.flowing_s = round(flowing - start, 2) if flowing is not None else None
    worst = s.worst_wait(start, until)
    f.worst_wait_s = round(worst, 2) if worst is not None else None
    return f


def lost(store: Store, traffic: Traffic) -> dict[str, int]:
    """Acknowledged appends missing, and conversations not exactly their turns in order."""
    missing = wrong = 0
    for conv in traffic.conversations:
        stored = store.conversations.read(TENANT, conv)
        n = traffic.landed.get(conv, 0)
        expected = [m for i in range(n) for m in turn(conv, i)]
        if stored != expected:
            wrong += 1
        acked = traffic.acknowledged.get(conv, 0)
        have = [m for i in range(acked) for m in turn(conv, i)]
        if stored[: len(have)] != have:
            missing += 1
    return {"conversations_wrong": wrong, "conversations_missing_acknowledged": missing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default="F0,F1,F2,F3,F4")
    parser.add_argument("--warmup", type=float, default=25.0)
    parser.add_argument("--observe", type=float, default=25.0)
    parser.add_argument("--llm-delay", type=float, default=1.0)
    parser.add_argument("--pause", type=float, default=0.3, help="a client's pause per turn")
    parser.add_argument("--broker", choices=("amqp", "redis"), default="amqp")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"faults": []}
    with running(args) as (drill, store, traffic, summaries):
        time.sleep(args.warmup)
        for fault in args.faults.split(","):
            done = inject(drill, store, fault)
            until = done.start + args.observe
            time.sleep(max(0.0, until - time.monotonic()))
            f = figures(fault, done, until, traffic, summaries)
            report["faults"].append(asdict(f))
            print(json.dumps(asdict(f)), flush=True)
            if fault == "F3":  # the pool as before for the next fault
                env = drill.env(drill.llm_url)
                drill.spawn("extra", [*drill.prefit(), "worker", "-n", "extra2@%h"], env)
        traffic.finish()
        report["requests"] = len(traffic.answers)
        report["acknowledged_appends"] = sum(traffic.acknowledged.values())
        report["statuses"] = dict(traffic.count())
        report["slowest_s"] = round(max((a.seconds for a in traffic.answers), default=0.0), 3)
        report["lost"] = lost(store, traffic)
        report["summaries"] = len(summaries.all_times())
    print_markdown(report)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2, default=str))
    return 0


def print_markdown(report: dict[str, Any]) -> None:
    print()
    print("| fault | 500 | 503 | last 503 (s) | slowest answer (s) | summaries flowing (s) "
          "| affected conversations: all with a new summary (s) | worst wait (s) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for f in report["faults"]:
        print(
            f"| {f['fault']}: {f['what']} | {f['errors_500']} | {f['answers_503']} | "
            f"{f['last_503_s'] if f['last_503_s'] is not None else '-'} | {f['slowest_s']} | "
            f"{f['flowing_s']} | {f['affected']}: {f['affected_s']} | {f['worst_wait_s']} |"
        )
    print()
    print(
        f"{report['requests']} requests ({report['statuses']}), "
        f"{report['acknowledged_appends']} acknowledged appends, slowest {report['slowest_s']} s, "
        f"{report['summaries']} summaries seen; lost: {report['lost']}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
