"""End to end, the way a client in another language sees the service.

The client is generated from `proto/` by grpcio-tools at test time (into a temporary directory;
generated code is never committed). It talks over real TCP to the real `mushroom-backup serve`
binary, started here on port 0 with a temporary data dir, its default SQLite registry and an
admin token. The binary's path comes from `MUSHROOM_BACKUP_BIN`, which `tests/python_client.rs`
sets; run it with `cargo test --test python_client` (or `bash scripts/test.sh`).

- `test_standard_health_and_reflection`: `grpc.health.v1` and server reflection.
- `test_bad_input_gets_its_code`: a table of bad requests and the gRPC code each must get.
- `test_backup_lifecycle`: Register, a node streaming 2,000 commits, health, a restore point,
  restore and digest, a restart that keeps the registry, and Adopt.

Every wait has a deadline and fails naming what it waited for, the last thing it saw and the
end of the server's log. Every process started here is killed when the test ends, pass or fail.
"""

import importlib
import json
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "py-e2e-admin-token"
CALL_TIMEOUT = 30  # seconds, for every unary call
COMMITS = 2000
SERVICE = "mushroom.backup.v1.BackupControl"


# --- the generated client -------------------------------------------------------------------


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """The `mushroom.backup.v1` messages and stub, generated from proto/ for this run."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("stubs")
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{REPO / 'proto'}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "mushroom/backup/v1/backup.proto",
        ]
    )
    assert rc == 0, f"grpc_tools.protoc failed on proto/ (exit {rc})"
    sys.path.insert(0, str(out))
    try:
        messages = importlib.import_module("mushroom.backup.v1.backup_pb2")
        services = importlib.import_module("mushroom.backup.v1.backup_pb2_grpc")
    finally:
        sys.path.remove(str(out))

    class Generated:
        m = messages
        BackupControlStub = services.BackupControlStub

    return Generated


# --- the binary -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def binary():
    path = os.environ.get("MUSHROOM_BACKUP_BIN")
    if not path:
        pytest.fail(
            "MUSHROOM_BACKUP_BIN is not set: run this through `cargo test --test python_client`, "
            "or point it at a built mushroom-backup binary"
        )
    assert os.access(path, os.X_OK), f"MUSHROOM_BACKUP_BIN={path} is not an executable"
    return path


def run_cli(binary, *args, timeout=120):
    """Runs one `mushroom-backup` command to completion; returns its last stdout line as JSON."""
    done = subprocess.run(
        [binary, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "MUSHROOMDB_BACKUP_LOG": "warn"},
    )
    assert done.returncode == 0, (
        f"mushroom-backup {' '.join(map(str, args))} exited {done.returncode}\n"
        f"stdout: {done.stdout}\nstderr: {done.stderr}"
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"mushroom-backup {' '.join(map(str, args))} printed nothing"
    return json.loads(lines[-1])


class Server:
    """One `mushroom-backup serve` process on port 0; `restart` keeps its data dir."""

    def __init__(self, binary, data_dir: Path, root: Path, log_dir: Path, pb):
        self.binary, self.data_dir, self.root, self.log_dir, self.pb = (
            binary,
            data_dir,
            root,
            log_dir,
            pb,
        )
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        self.stdout_path = self.log_dir / f"serve-{self.starts}.stdout"
        self.log_path = self.log_dir / f"serve-{self.starts}.log"
        env = {
            **os.environ,
            "MUSHROOMDB_BACKUP_ADMIN_TOKEN": ADMIN_TOKEN,
            "MUSHROOMDB_BACKUP_LOG": "warn,mushroom_backup=info",
        }
        with open(self.stdout_path, "wb") as out, open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    str(self.data_dir),
                    "--allow-root",
                    str(self.root),
                ],
                stdout=out,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        # The one JSON line on stdout says where it listens.
        deadline = time.monotonic() + 60
        line = ""
        while not line.endswith("\n"):
            if self.proc.poll() is not None:
                pytest.fail(
                    f"serve exited {self.proc.returncode} before listening\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"serve printed no `listening` line within 60 s\n{self.log_tail()}")
            time.sleep(0.05)
            line = self.stdout_path.read_text()
        started = json.loads(line.splitlines()[0])
        self.addr = started["listening"]
        self.instance_id = started["instance_id"]
        assert self.addr.startswith("127.0.0.1:") and not self.addr.endswith(":0"), started
        self.channel = grpc.insecure_channel(self.addr)
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = self.pb.BackupControlStub(self.channel)
        return self

    def call(self, method, request, token=ADMIN_TOKEN):
        """An operator call with the admin token (or `token`; None sends none)."""
        metadata = () if token is None else (("authorization", f"Bearer {token}"),)
        return getattr(self.stub, method)(request, metadata=metadata, timeout=CALL_TIMEOUT)

    def stop(self, timeout=120):
        """SIGTERM, then the exit code (the server flushes every store first)."""
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"serve did not exit within {timeout} s of SIGTERM\n{self.log_tail()}")

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines=40):
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no server log)"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])


@dataclass
class Dirs:
    root: Path  # the one allowed root; stores live under it
    buckets: Path  # file:// destinations
    outside: Path  # not under any allowed root
    scratch: Path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e").resolve()
    d = Dirs(base / "root", base / "buckets", base / "outside", base / "scratch")
    for p in (d.root, d.buckets, d.outside, d.scratch):
        p.mkdir()
    return d


@pytest.fixture(scope="module")
def server(binary, dirs, pb, tmp_path_factory):
    s = Server(binary, dirs.scratch / "data", dirs.root, tmp_path_factory.mktemp("logs"), pb)
    s.start()
    yield s
    s.kill()


# --- helpers --------------------------------------------------------------------------------


def wait_until(what, probe, server, timeout=60, every=0.2):
    """Polls `probe()` -> (done, seen) until done; fails naming `what` and the last `seen`."""
    deadline = time.monotonic() + timeout
    while True:
        done, seen = probe()
        if done:
            return seen
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s; last seen:\n{seen}\n{server.log_tail()}")
        time.sleep(every)


def code_of(call):
    """The gRPC status code `call()` fails with (fails the test if it succeeds)."""
    try:
        answer = call()
    except grpc.RpcError as e:
        return e.code(), e.details()
    pytest.fail(f"expected an error, got a success: {answer!r}")


POSITION = struct.Struct("<8s16s16sQQQI")  # wal.position (DESIGN.md section 2)


def read_position(store_dir: Path, pb):
    """The store's `wal.position` as a PositionReport (minus store_id); re-reads torn reads."""
    for _ in range(100):
        raw = (store_dir / "wal.position").read_bytes()
        if len(raw) == POSITION.size:
            magic, snap, wal, number, durable_len, commit_seq, crc = POSITION.unpack(raw)
            assert magic == b"MDBPOS01", f"{store_dir}/wal.position has magic {magic!r}"
            if zlib.crc32(raw[:-4]) == crc:
                snapshot = uuid.UUID(bytes=snap)
                return pb.m.PositionReport(
                    snapshot_id="" if snapshot.int == 0 else str(snapshot),
                    wal_id=str(uuid.UUID(bytes=wal)),
                    wal_number=number,
                    durable_len=durable_len,
                    commit_seq=commit_seq,
                )
        time.sleep(0.01)  # rewritten in place: a torn read; read again
    pytest.fail(f"{store_dir}/wal.position did not read back with a valid CRC")


class NodeStream:
    """A database node's ReportPosition stream: reports go in, the server's commands come out."""

    def __init__(self, server, store_id, token):
        self.store_id = store_id
        self.outbox = queue.Queue()
        self.commands = []
        self.error = None
        self.call = server.stub.ReportPosition(
            iter(self.outbox.get, None), metadata=(("authorization", f"Bearer {token}"),)
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            for command in self.call:
                self.commands.append(command)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.error = e

    def report(self, position):
        assert self.error is None, f"the position stream failed: {self.error}"
        report = type(position)()
        report.CopyFrom(position)
        report.store_id = self.store_id
        self.outbox.put(report)

    def close(self):
        self.outbox.put(None)
        self.call.cancel()
        self.reader.join(timeout=10)
        assert self.error is None, f"the position stream failed: {self.error}"


def health_of(server, store_id):
    (h,) = server.call("Health", server.pb.m.HealthRequest(store_id=store_id)).stores
    return h


def healthy_with(server, store_id, commits):
    """A probe: healthy, with `commits` durable and shipped."""

    def probe():
        h = health_of(server, store_id)
        done = (
            h.healthy and h.durable_commit_seq == commits and h.shipped_commit_seq == commits
        )
        return done, h

    return probe


def write_store(binary, path, commits):
    return run_cli(binary, "store", "write", path, "--commits", commits)


# --- the standard services ------------------------------------------------------------------


def test_standard_health_and_reflection(server):
    health = health_pb2_grpc.HealthStub(server.channel)
    for service in ("", SERVICE):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, (
            f"grpc.health.v1 Check({service!r}) = {answer}"
        )

    # grpcio-reflection's own client speaks v1alpha; the server serves v1 too, whose messages
    # are v1alpha's on the wire, so a raw call on the v1 path reads the same.
    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    raw_v1 = server.channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    for version, reflect in (("v1alpha", stub.ServerReflectionInfo), ("v1", raw_v1)):
        (answer,) = list(
            reflect(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30)
        )
        names = [s.name for s in answer.list_services_response.service]
        assert SERVICE in names, f"reflection {version} lists {names}, not {SERVICE}"


# --- bad input ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registered(server, dirs, binary):
    """A small registered store, for the bad-input cases that need one."""
    store_dir = dirs.root / "bad-input-store"
    write_store(binary, store_dir, 5)
    destination = f"file://{dirs.buckets / 'bad-input-store'}"
    m = server.pb.m
    r = server.call(
        "Register", m.RegisterRequest(store_dir=str(store_dir), destination=destination)
    )
    return {"store_id": r.store_id, "store_dir": store_dir, "destination": destination}


def _register(dir_, destination="file:///tmp/unused-bucket"):
    return lambda s, d, r: s.call(
        "Register", s.pb.m.RegisterRequest(store_dir=dir_(d), destination=destination)
    )


def _on_store(method, registered=False, **fields):
    """`method` (its request `<method>Request`) naming the registered store, or if not
    `registered` a store id no store has; each of `fields` a function of the messages module
    giving that field's value."""

    def call(s, d, r):
        m = s.pb.m
        store_id = r["store_id"] if registered else str(uuid.uuid4())
        values = {name: value(m) for name, value in fields.items()}
        return s.call(method, getattr(m, f"{method}Request")(store_id=store_id, **values))

    return call


def _wrong_node_token(s, d, r):
    position = read_position(r["store_dir"], s.pb)
    position.store_id = r["store_id"]
    return list(
        s.stub.ReportPosition(
            iter([position]),
            metadata=(("authorization", "Bearer not-the-node-token"),),
            timeout=CALL_TIMEOUT,
        )
    )


def _adopt_into_non_empty(s, d, r):
    target = d.root / "non-empty"
    target.mkdir(exist_ok=True)
    (target / "someone-elses-file").write_text("keep me")
    return s.call(
        "Adopt", s.pb.m.AdoptRequest(store_dir=str(target), destination=r["destination"])
    )


# (case, expected code, the call: (server, dirs, registered) -> answer)
BAD_INPUTS = [
    ("relative store_dir", "INVALID_ARGUMENT", _register(lambda d: "relative/store")),
    ("store_dir with ..", "INVALID_ARGUMENT", _register(lambda d: f"{d.root}/a/../b")),
    (
        "store_dir over 4096 bytes",
        "INVALID_ARGUMENT",
        _register(lambda d: f"{d.root}/" + "d/" * 2100 + "store"),
    ),
    ("store_dir outside every root", "PERMISSION_DENIED", _register(lambda d: f"{d.outside}/s")),
    ("store_dir is the root itself", "PERMISSION_DENIED", _register(lambda d: str(d.root))),
    (
        "store_dir already registered",
        "ALREADY_EXISTS",
        lambda s, d, r: s.call(
            "Register",
            s.pb.m.RegisterRequest(
                store_dir=str(r["store_dir"]), destination=f"file://{d.buckets}/other"
            ),
        ),
    ),
    ("unknown store_id (Health)", "NOT_FOUND", _on_store("Health")),
    (
        "unknown store_id (Trigger)",
        "NOT_FOUND",
        _on_store("Trigger", kind=lambda m: m.TRIGGER_KIND_RESTORE_POINT),
    ),
    ("unknown store_id (Pause)", "NOT_FOUND", _on_store("Pause")),
    (
        "Pause until a past instant",
        "INVALID_ARGUMENT",
        _on_store("Pause", registered=True, until_unix_ms=lambda m: 1),
    ),
    ("unknown store_id (Drill)", "NOT_FOUND", _on_store("Drill")),
    (
        "Drill at a commit no restore point reaches",
        "FAILED_PRECONDITION",
        _on_store("Drill", registered=True, at_commit_seq=lambda m: 10**9),
    ),
    (
        "drill_interval_ms below a minute",
        "INVALID_ARGUMENT",
        lambda s, d, r: s.call(
            "Register",
            s.pb.m.RegisterRequest(
                store_dir=f"{d.root}/drill-interval-store",
                destination="file:///tmp/unused-bucket",
                options=s.pb.m.StoreOptions(drill_interval_ms=1000),
            ),
        ),
    ),
    (
        "ftp:// destination",
        "INVALID_ARGUMENT",
        _register(lambda d: f"{d.root}/ftp-store", destination="ftp://example.com/backups"),
    ),
    ("wrong node token", "UNAUTHENTICATED", _wrong_node_token),
    (
        "no admin token",
        "UNAUTHENTICATED",
        lambda s, d, r: s.call("ListStores", s.pb.m.ListStoresRequest(), token=None),
    ),
    (
        "wrong admin token",
        "UNAUTHENTICATED",
        lambda s, d, r: s.call("ListStores", s.pb.m.ListStoresRequest(), token="guess"),
    ),
    ("Adopt into a non-empty dir", "FAILED_PRECONDITION", _adopt_into_non_empty),
]


@pytest.mark.parametrize(
    "case,expected,call", BAD_INPUTS, ids=[case for case, _, _ in BAD_INPUTS]
)
def test_bad_input_gets_its_code(server, dirs, registered, case, expected, call):
    code, details = code_of(lambda: call(server, dirs, registered))
    assert code == getattr(grpc.StatusCode, expected), (
        f"{case}: expected {expected}, got {code.name}: {details}"
    )
    assert ADMIN_TOKEN not in (details or ""), f"{case}: the error message echoes a token"


def test_pause_and_resume(server, registered):
    m = server.pb.m
    store_id = registered["store_id"]
    p = server.call("Pause", m.PauseRequest(store_id=store_id, reason="python maintenance"))
    assert p.reason == "python maintenance" and not p.was_paused, p
    assert p.until_unix_ms > p.paused_at_unix_ms, p
    # Pause answers once health shows it.
    h = health_of(server, store_id)
    assert h.paused and h.paused_reason == "python maintenance", h
    assert h.paused_until_unix_ms == p.until_unix_ms and h.healthy, h
    r = server.call("Resume", m.ResumeRequest(store_id=store_id))
    assert r.was_paused, r
    assert not health_of(server, store_id).paused
    assert not server.call("Resume", m.ResumeRequest(store_id=store_id)).was_paused


def test_drill(server, registered):
    m = server.pb.m
    store_id = registered["store_id"]
    wait_until(
        "a restore point to drill",
        lambda: ((h := health_of(server, store_id)).restore_point_commit_seq == 5, h),
        server,
    )
    d = server.call("Drill", m.DrillRequest(store_id=store_id))
    assert d.ok and d.commit_seq == 5 and d.bytes > 0 and not d.error, d
    h = health_of(server, store_id)
    assert h.healthy and h.last_drill.ok and h.last_drill.commit_seq == 5, h


# --- the lifecycle --------------------------------------------------------------------------


def test_backup_lifecycle(server, dirs, binary):
    m = server.pb.m
    source = dirs.root / "lifecycle" / "source"
    destination = f"file://{dirs.buckets / 'lifecycle'}"

    # A node writes 2,000 commits; the store is registered once it exists.
    writer = subprocess.Popen(
        [binary, "store", "write", str(source), "--commits", str(COMMITS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "MUSHROOMDB_BACKUP_LOG": "warn"},
    )
    try:
        wait_until(
            "the writer creates wal.position",
            lambda: ((source / "wal.position").exists(), f"writer exit: {writer.poll()}"),
            server,
        )
        reg = server.call(
            "Register",
            m.RegisterRequest(
                store_dir=str(source), destination=destination, labels={"suite": "py-e2e"}
            ),
        )
        store_id = reg.store_id
        assert store_id and reg.node_token, "Register answered no store_id or node_token"

        # The node streams its durable position from wal.position while it writes, then its
        # final position, and keeps the stream open.
        node = NodeStream(server, store_id, reg.node_token)
        last = None
        while True:
            finished = writer.poll() is not None
            position = read_position(source, server.pb)
            if position != last:
                node.report(position)
                last = position
            if finished:
                break
            time.sleep(0.01)
        out, err = writer.communicate()
        assert writer.returncode == 0, f"store write exited {writer.returncode}: {err!r}"
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert last.commit_seq == COMMITS, f"the writer's final position is {last}"
    source_digest = run_cli(binary, "store", "digest", source)
    assert source_digest["commit_seq"] == COMMITS, source_digest

    try:
        wait_until(
            f"Health healthy with all {COMMITS} commits shipped",
            healthy_with(server, store_id, COMMITS),
            server,
        )
        h = health_of(server, store_id)
        assert h.lease_held and h.instance_id == server.instance_id, h

        # A restore point now names the newest commit.
        trigger = m.TriggerRequest(store_id=store_id, kind=m.TRIGGER_KIND_RESTORE_POINT)
        server.call("Trigger", trigger)

        def newest_restore_point():
            points = server.call(
                "ListRestorePoints", m.ListRestorePointsRequest(store_id=store_id)
            ).restore_points
            return bool(points) and points[0].commit_seq == COMMITS and points[0].is_latest, points

        points = wait_until(
            "ListRestorePoints names the newest commit", newest_restore_point, server
        )
        newest = points[0]
        assert newest.manifest_key.startswith("manifests/") and newest.bytes > 0, newest
    finally:
        node.close()

    # Disaster recovery without the service: restore, and the digest matches the source's.
    restored = dirs.scratch / "restored"
    report = run_cli(binary, "restore", "--from", destination, "--to", restored, "--json")
    assert report.get("commit_seq") == COMMITS, f"restore reported {report}"
    assert run_cli(binary, "store", "digest", restored) == source_digest

    # A restart keeps the registry and respawns the worker.
    code = server.stop()
    assert code == 0, f"serve exited {code} on SIGTERM\n{server.log_tail()}"
    server.start()
    ids = [s.store_id for s in server.call("ListStores", m.ListStoresRequest()).stores]
    assert store_id in ids, f"after a restart ListStores has {ids}, not {store_id}"
    wait_until(
        "Health healthy again after the restart",
        healthy_with(server, store_id, COMMITS),
        server,
    )

    # Boot restore: the source node is lost, so its store is deregistered (flushing; its
    # worker releases the bucket lease) and the backup is adopted into a new empty dir.
    server.call("Deregister", m.DeregisterRequest(store_id=store_id, flush=True))
    ids = [s.store_id for s in server.call("ListStores", m.ListStoresRequest()).stores]
    assert store_id not in ids, f"Deregister left {store_id} in ListStores: {ids}"
    target = dirs.root / "lifecycle" / "adopted"
    adopted = server.call("Adopt", m.AdoptRequest(store_dir=str(target), destination=destination))
    assert adopted.commit_seq == COMMITS, f"Adopt restored commit {adopted.commit_seq}"
    assert adopted.parent_manifest == newest.manifest_key, (
        f"Adopt restored from {adopted.parent_manifest}, not the newest {newest.manifest_key}"
    )
    assert adopted.store_id != store_id and adopted.node_token, "Adopt gave no new id and token"
    wait_until(
        "the adopted store turns healthy",
        healthy_with(server, adopted.store_id, COMMITS),
        server,
    )
    assert run_cli(binary, "store", "digest", target) == source_digest
