#!/usr/bin/env python3
"""Checks every file of deploy/ the way its consumer would, without a cluster or the network.

Run by tests/deploy.rs with the project's .venv (scripts/test.sh installs the packages):
    .venv/bin/python tests/deploy/validate.py

- YAML: every file parses.
- Kubernetes: each object validates against the Kubernetes OpenAPI schemas shipped by
  `kubernetes-validate` (strict: unknown fields are errors) for the oldest and newest versions
  in K8S_VERSIONS; the ServiceMonitor against a schema of the Prometheus Operator fields it
  uses; and the objects agree with each other and with the TOML they carry (selectors, port
  names and numbers, mount paths, probe service name, the security context, grace period).
  The same for the multi-replica fleet in kubernetes/multi/ (Kubernetes 1.37: TLS probes),
  and what a fleet needs: at least 3 replicas rolling one at a time, the PostgreSQL registry
  URL from a Secret, --advertise-address under the headless Service (which publishes
  not-ready pods), one client Service, one failover group, every allowed root on a shared
  ReadWriteMany claim, TLS files and peer_ca from a mounted Secret, a PodDisruptionBudget of
  one, and a preStop `ctl drain "$POD_NAME"` that fits in the grace period.
- Prometheus rules: rule-group structure, every `expr` parsed by a PromQL parser
  (`promql-parser`), `for` durations, metric names the service exports, annotations, and
  runbook links to existing sections of deploy/README.md; `promtool check rules` too when
  promtool is on PATH.
- Grafana: the JSON parses, the datasource and store_id variables, every panel's queries
  parse as PromQL (after substituting Grafana's variables), name exported metrics, respect
  the store_id variable, and together cover every exported metric.
- OpenTelemetry Collector: receivers, processors and exporters wired into pipelines, nothing
  referenced that is not defined, nothing defined that is unused.
- TOML: deploy/config.example.toml (and the ConfigMap's config.toml) parse with tomllib and use
  only the keys `serve` accepts, read from its serde structs in src/cli/; each key has the
  type its struct field has; every accepted key is shown (set or commented out).
- Containerfile (the repository root's): multi-stage, the last stage built on a base image
  holding only the binary (and the CA bundle) copied from the build stage, a numeric non-root
  USER equal to the manifests' runAsUser/runAsGroup, an exec-form ENTRYPOINT equal to the
  containers' `command` and a CMD equal to the single replica's `args`; the image every
  StatefulSet names is the one the file's documented build tags (`mushroom-backup:<Cargo.toml
  version>`); the build uses the lockfile and the release profile, and .dockerignore keeps
  target/ and .venv/ out of the build context.
- systemd: a structural check of the unit's sections and the directives the deployment relies
  on, always; `systemd-analyze verify` and `systemd-analyze security --offline` when
  systemd-analyze exists.

Exit status: 0 all good, 1 a check failed (each failure printed), 77 a dependency is missing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

try:
    import jsonschema
    import kubernetes_validate
    import promql_parser
    import yaml
except ImportError as e:  # pragma: no cover - exercised when .venv is incomplete
    print(
        f"validate.py: missing Python package {e.name!r}: `bash scripts/test.sh` installs it into .venv",
        file=sys.stderr,
    )
    sys.exit(77)

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# The oldest Kubernetes the manifests support, and the newest schema the package ships.
K8S_VERSIONS = ["1.29.0", "1.37.0"]

# What the service exports (src: the metrics listener, --metrics-listen / MUSHROOMDB_BACKUP_
# METRICS_LISTEN). Keep this list in step with the exporter.
STORE_METRICS = {
    "mushroom_backup_store_lag_seconds",
    "mushroom_backup_store_healthy",
    "mushroom_backup_store_durable_commit_seq",
    "mushroom_backup_store_shipped_commit_seq",
    "mushroom_backup_store_restore_point_commit_seq",
    "mushroom_backup_store_shipped_bytes_total",
    "mushroom_backup_store_shipped_objects_total",
    "mushroom_backup_store_failures_total",
    "mushroom_backup_store_lease_held",
    "mushroom_backup_store_lease_held_elsewhere",
    "mushroom_backup_store_last_restore_point_timestamp_seconds",
    "mushroom_backup_predicted_rto_seconds",
    "mushroom_backup_rto_target_seconds",
}
HISTOGRAMS = {"mushroom_backup_bucket_request_duration_seconds"}
OTHER_METRICS = {"mushroom_backup_bucket_requests_total", "mushroom_backup_stores", "mushroom_backup_stores_unhealthy"}
EXPORTED = (
    STORE_METRICS
    | OTHER_METRICS
    | {h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)
# Series Prometheus itself makes for every target.
PROMETHEUS_SERIES = {"up"}

errors: list[str] = []
notes: list[str] = []


def fail(where: str, msg: str) -> None:
    errors.append(f"{where}: {msg}")


def rel(p: pathlib.Path) -> str:
    return str(p.relative_to(ROOT))


# ---------------------------------------------------------------- source facts


def rust_struct_fields(path: pathlib.Path, name: str) -> dict[str, str]:
    """The fields of `struct name { ... }` in a Rust file: field name -> type text."""
    text = path.read_text()
    m = re.search(r"struct " + re.escape(name) + r" \{\n(.*?)\n\}", text, re.S)
    if not m:
        raise SystemExit(f"validate.py: struct {name} not found in {rel(path)}: update this script")
    fields = {}
    flatten = False
    for line in m.group(1).splitlines():
        if re.match(r"\s*#\[serde\(flatten\)\]", line):
            flatten = True
            continue
        f = re.match(r"\s*(?:pub\s+)?(\w+):\s*(.+?),\s*$", line)
        if f and flatten:
            # `#[serde(flatten)]`: the flattened struct's keys stand in this table.
            if f.group(2) not in FLATTENED:
                raise SystemExit(f"validate.py: flattened {f.group(2)} is not known: update FLATTENED")
            fields.update(rust_struct_fields(ROOT / FLATTENED[f.group(2)], f.group(2)))
            flatten = False
        elif f:
            fields[f.group(1)] = f.group(2)
    return fields


# The structs a TOML table flattens (`#[serde(flatten)]`) and the file that defines each.
FLATTENED = {"WorkerOverrides": "src/worker/overrides.rs"}


def toml_schema() -> dict:
    """What `serve --config` accepts, read from its serde structs (deny_unknown_fields)."""
    serve = ROOT / "src/cli/serve.rs"
    settings = ROOT / "src/cli/settings.rs"
    tables = {
        "ServeToml": rust_struct_fields(serve, "ServeToml"),
        "TlsToml": rust_struct_fields(serve, "TlsToml"),
        "WorkerToml": rust_struct_fields(settings, "WorkerToml"),
        "LimitsToml": rust_struct_fields(ROOT / "src/cli/serve_limits.rs", "LimitsToml"),
        # Arrays of tables (`[[limits.schedule]]`, `[[limits.endpoint]]`).
        "WindowToml": rust_struct_fields(ROOT / "src/cli/serve_limits.rs", "WindowToml"),
        "EndpointToml": rust_struct_fields(ROOT / "src/cli/serve_limits.rs", "EndpointToml"),
        # `#[serde(default)]`: every key may be left out.
        "mushroom_backup::cost::Prices": {
            k: f"Option<{t}>" for k, t in rust_struct_fields(ROOT / "src/cost.rs", "Prices").items()
        },
    }

    def resolve(fields: dict[str, str]) -> dict:
        out = {}
        for key, ty in fields.items():
            optional = ty.startswith("Option<")
            inner = ty[len("Option<") : -1] if optional else ty
            array = inner.startswith("Vec<") and inner[len("Vec<") : -1] in tables
            if array:
                inner = inner[len("Vec<") : -1]
            out[key] = {
                "optional": optional,
                "type": resolve(tables[inner]) if inner in tables else inner,
                "array": array,
            }
        return out

    return resolve(tables["ServeToml"])


def grpc_service_name() -> str:
    proto = (ROOT / "proto/mushroom/backup/v1/backup.proto").read_text()
    package = re.search(r"^package ([\w.]+);", proto, re.M).group(1)
    service = re.search(r"^service (\w+) \{", proto, re.M).group(1)
    return f"{package}.{service}"


def shutdown_bound_seconds() -> int:
    """How long a clean shutdown may take by design: the in-flight step's grace plus the flush."""
    text = (ROOT / "src/worker/config.rs").read_text()
    total = 0
    for field in ("shutdown_grace", "flush_timeout"):
        m = re.search(field + r": Duration::from_secs\((\d+)\)", text)
        if not m:
            raise SystemExit(f"validate.py: the default {field} is not found in src/worker/config.rs: update this script")
        total += int(m.group(1))
    return total


# ---------------------------------------------------------------- TOML


def check_toml_value(where: str, key: str, spec: dict, value) -> None:
    ty = spec["type"]
    if spec.get("array"):
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            fail(where, f"[[{key}]] must be an array of tables")
            return
        for v in value:
            check_toml_table(f"{where} [[{key}]]", ty, v)
        return
    if isinstance(ty, dict):
        if not isinstance(value, dict):
            fail(where, f"[{key}] must be a table")
            return
        check_toml_table(f"{where} [{key}]", ty, value)
        return
    ok = {
        "u64": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "u32": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32,
        "usize": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "bool": lambda v: isinstance(v, bool),
        "f64": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
        "String": lambda v: isinstance(v, str),
        "i64": lambda v: isinstance(v, int) and not isinstance(v, bool),
        # The overrides' enums, as their lowercase words (`src/worker/overrides.rs`).
        "CompressionKind": lambda v: v in ("zstd", "none"),
        "LockMode": lambda v: v in ("governance", "compliance"),
        "DurabilityMode": lambda v: v in ("async", "sync"),
        "PathBuf": lambda v: isinstance(v, str) and v != "",
        "Vec<PathBuf>": lambda v: isinstance(v, list) and all(isinstance(p, str) and p for p in v),
        "Vec<String>": lambda v: isinstance(v, list) and all(isinstance(p, str) for p in v),
        "SocketAddr": lambda v: isinstance(v, str) and socket_addr(v) is not None,
    }.get(ty)
    if ok is None:
        fail(where, f"{key}: this script does not know the Rust type {ty}: update it")
    elif not ok(value):
        fail(where, f"{key} = {value!r} is not a valid {ty}")
    if key == "conditional" and value not in ("on", "off"):
        fail(where, f'conditional = {value!r}: must be "on" or "off"')


def check_toml_table(where: str, schema: dict, table: dict) -> None:
    for key, value in table.items():
        if key not in schema:
            fail(where, f"unknown key {key!r}: serve accepts {sorted(schema)}")
            continue
        check_toml_value(where, key, schema[key], value)
    for key, spec in schema.items():
        if not spec["optional"] and key not in table:
            fail(where, f"missing required key {key!r}")


def socket_addr(text: str):
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d+)|([0-9.]+):(\d+)", text)
    if not m:
        return None
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    try:
        return ipaddress.ip_address(host), int(port)
    except ValueError:
        return None


def check_serve_toml(where: str, text: str) -> dict:
    schema = toml_schema()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        fail(where, f"TOML does not parse: {e}")
        return {}
    check_toml_table(where, schema, doc)
    # Settings left commented out (`#key = value`, `#[table]`) must be real keys with valid values.
    table = None
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(r"^#\[(\w+)\]\s*$", line):
            table = line[2:-1]
            if table not in schema or not isinstance(schema[table]["type"], dict):
                fail(f"{where}:{n}", f"commented-out table [{table}] is not one serve accepts")
            continue
        if re.match(r"^\[(\w+)\]\s*$", line):
            table = line.strip()[1:-1]
            continue
        # An array of tables, set or commented out: `[[limits.schedule]]`.
        a = re.match(r"^#?\[\[(\w+)\.(\w+)\]\]\s*$", line)
        if a:
            outer, inner = a.group(1), a.group(2)
            spec = schema.get(outer, {}).get("type")
            if not isinstance(spec, dict) or not spec.get(inner, {}).get("array"):
                fail(f"{where}:{n}", f"[[{outer}.{inner}]] is not an array of tables serve accepts")
                table = None
            else:
                table = (outer, inner)
            continue
        m = re.match(r"^#(\w+) = (.+)$", line)
        if not m:
            continue
        if isinstance(table, tuple):
            scope = schema[table[0]]["type"][table[1]]["type"]
        else:
            scope = schema[table]["type"] if table in schema and isinstance(schema[table]["type"], dict) else schema
        key = m.group(1)
        try:
            value = tomllib.loads(f"{key} = {m.group(2)}")[key]
        except tomllib.TOMLDecodeError as e:
            fail(f"{where}:{n}", f"commented-out setting does not parse once uncommented: {e}")
            continue
        if key not in scope:
            fail(f"{where}:{n}", f"commented-out key {key!r} is not one serve accepts")
        else:
            check_toml_value(f"{where}:{n}", key, scope[key], value)
    return doc


def check_example_toml() -> None:
    path = DEPLOY / "config.example.toml"
    where = rel(path)
    text = path.read_text()
    check_serve_toml(where, text)
    schema = toml_schema()
    lines = text.splitlines()
    # Every key serve accepts is shown, set or commented out, right after a comment saying what it is.
    tables = [(k, v["type"]) for k, v in schema.items() if isinstance(v["type"], dict)]
    arrays = [
        (f"{k}.{a}", s["type"])
        for k, v in tables
        for a, s in v.items()
        if s.get("array")
    ]
    for table, spec in [(None, schema)] + tables + arrays:
        shown = rf"^#?\[\[{re.escape(table)}\]\]\s*$" if table and "." in table else rf"^#?\[{table}\]\s*$"
        if table is not None and not any(re.match(shown, line) for line in lines):
            fail(where, f"the [{table}] table is not shown")
        for key, kspec in spec.items():
            if isinstance(kspec["type"], dict):
                continue
            hits = [i for i, line in enumerate(lines) if re.match(rf"^#?{key} = ", line)]
            if not hits:
                fail(where, f"{key} ({table or 'top level'}) is not shown, set or commented out")
            elif not any(i > 0 and lines[i - 1].startswith("#") for i in hits):
                fail(where, f"{key} has no comment above it")
    doc = tomllib.loads(text)
    for p in [doc.get("data_dir", "")] + doc.get("allow_roots", []):
        if not p.startswith("/"):
            fail(where, f"{p!r}: production paths in the example should be absolute")


# ---------------------------------------------------------------- YAML and Kubernetes


def load_yaml(path: pathlib.Path) -> list:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        fail(rel(path), f"YAML does not parse: {e}")
        return []
    if not docs:
        fail(rel(path), "no YAML document")
    return docs


def load_one_yaml(path: pathlib.Path):
    """The one YAML document of `path`, or None when there is none (a failure already said)."""
    docs = load_yaml(path)
    if not docs:
        return None
    (doc,) = docs
    return doc


SERVICEMONITOR_SCHEMA = {
    # The fields of monitoring.coreos.com/v1 ServiceMonitor this deployment uses, as the
    # Prometheus Operator's CRD defines them (closed, so that a misspelt field is an error).
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "matchExpressions": {"type": "array"},
                    },
                },
                "namespaceSelector": {"type": "object"},
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                            "scrapeTimeout": {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                        },
                    },
                },
            },
        },
    },
}


def subset(a: dict, b: dict) -> bool:
    return all(b.get(k) == v for k, v in a.items())


def check_kubernetes() -> None:
    # One replica (its own registry), and the multi-replica fleet on a shared registry, whose
    # probes speak TLS (grpc.mode: Kubernetes 1.37+).
    check_kubernetes_dir(DEPLOY / "kubernetes", K8S_VERSIONS, fleet=False)
    check_kubernetes_dir(DEPLOY / "kubernetes" / "multi", K8S_VERSIONS[-1:], fleet=True)


def check_kubernetes_dir(kdir: pathlib.Path, versions: list[str], fleet: bool) -> None:
    before = len(errors)
    objects: dict[str, tuple[str, dict]] = {}
    by_kind: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(kdir.glob("*.yaml")):
        for doc in load_yaml(path):
            where = f"{rel(path)} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            if doc.get("kind") == "ServiceMonitor":
                for e in jsonschema.Draft202012Validator(SERVICEMONITOR_SCHEMA).iter_errors(doc):
                    fail(where, f"{'/'.join(map(str, e.absolute_path))}: {e.message}")
            else:
                for version in versions:
                    try:
                        kubernetes_validate.validate(doc, version, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        fail(where, f"Kubernetes {version}: {e.message} at {'/'.join(map(str, e.absolute_path))}")
                    except kubernetes_validate.SchemaNotFoundError as e:
                        fail(where, f"Kubernetes {version}: no schema for it: {e}")
            if "namespace" in doc.get("metadata", {}):
                fail(where, "the set is namespace-less: apply it with -n, leave metadata.namespace out")
            objects[doc.get("kind")] = (where, doc)
            by_kind.setdefault(doc.get("kind"), []).append((where, doc))
    for kind in ("StatefulSet", "Service", "ConfigMap", "ServiceMonitor"):
        if kind not in objects:
            fail(rel(kdir), f"no {kind}")
    if len(errors) > before:
        return  # the cross-checks below assume well-formed objects
    sts_where, sts = objects["StatefulSet"]
    # The governing Service (the StatefulSet's serviceName); a fleet also has a client one.
    services = by_kind["Service"]
    governing = [s for s in services if s[1]["metadata"]["name"] == sts["spec"].get("serviceName")]
    svc_where, svc = governing[0] if governing else services[0]
    cm_where, cm = objects["ConfigMap"]
    sm_where, sm = objects["ServiceMonitor"]
    pod = sts["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    spec = pod["spec"]
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    env = {e["name"]: e for e in container.get("env", [])}
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    claims = {c["metadata"]["name"]: c for c in sts["spec"].get("volumeClaimTemplates", [])}

    # Selectors and names.
    if not subset(sts["spec"]["selector"]["matchLabels"], pod_labels):
        fail(sts_where, "spec.selector.matchLabels does not select the pod template's labels")
    if sts["spec"].get("serviceName") != svc["metadata"]["name"]:
        fail(sts_where, f"serviceName must be the governing Service {svc['metadata']['name']!r}")
    if svc["spec"].get("clusterIP") != "None":
        fail(svc_where, "the StatefulSet's governing Service must be headless (clusterIP: None)")
    if not subset(svc["spec"]["selector"], pod_labels):
        fail(svc_where, "spec.selector does not select the StatefulSet's pods")
    for p in svc["spec"]["ports"]:
        target = p.get("targetPort")
        if isinstance(target, str) and target not in ports:
            fail(svc_where, f"port {p['name']}: targetPort {target!r} is not a container port name")
        if isinstance(target, str) and ports.get(target) != p["port"]:
            fail(svc_where, f"port {p['name']}: port {p['port']} differs from the container's {ports.get(target)}")
    svc_ports = {p["name"] for p in svc["spec"]["ports"]}
    if not subset(sm["spec"]["selector"].get("matchLabels", {}), svc["metadata"].get("labels", {})):
        fail(sm_where, "spec.selector does not select the Service's labels")
    for ep in sm["spec"]["endpoints"]:
        if ep["port"] not in svc_ports:
            fail(sm_where, f"endpoint port {ep['port']!r} is not a named port of the Service {sorted(svc_ports)}")
    if {"grpc", "metrics"} - svc_ports:
        fail(svc_where, "needs the ports grpc and metrics")

    # Scrape annotations (the alternative to the ServiceMonitor) agree with it.
    ann = pod["metadata"].get("annotations", {})
    if ann.get("prometheus.io/scrape") != "true":
        fail(sts_where, 'pod template needs prometheus.io/scrape: "true"')
    if ann.get("prometheus.io/port") != str(ports.get("metrics")):
        fail(sts_where, f"prometheus.io/port {ann.get('prometheus.io/port')!r} is not the metrics port {ports.get('metrics')}")
    if ann.get("prometheus.io/path") != sm["spec"]["endpoints"][0].get("path", "/metrics"):
        fail(sts_where, "prometheus.io/path differs from the ServiceMonitor's path")
    metrics_listen = env.get("MUSHROOMDB_BACKUP_METRICS_LISTEN", {}).get("value", "")
    if socket_addr(metrics_listen) is None or socket_addr(metrics_listen)[1] != ports.get("metrics"):
        fail(sts_where, f"MUSHROOMDB_BACKUP_METRICS_LISTEN {metrics_listen!r} must listen on the metrics port {ports.get('metrics')}")

    # The config: mounted read-only from the ConfigMap where --config points.
    config_mount = next((m for m in mounts.values() if volumes.get(m["name"], {}).get("configMap")), None)
    if config_mount is None:
        fail(sts_where, "no volume from the ConfigMap is mounted")
        return
    if not config_mount.get("readOnly"):
        fail(sts_where, "the config must be mounted readOnly")
    cm_volume = volumes[config_mount["name"]]["configMap"]
    if cm_volume["name"] != cm["metadata"]["name"]:
        fail(sts_where, f"the config volume names ConfigMap {cm_volume['name']!r}, not {cm['metadata']['name']!r}")
    args = container.get("args", [])
    config_path = args[args.index("--config") + 1] if "--config" in args else None
    items = {i["path"]: i["key"] for i in cm_volume.get("items", [])} or {k: k for k in cm["data"]}
    file_name = pathlib.PurePosixPath(config_path or "").name
    if args[:1] != ["serve"] or config_path is None:
        fail(sts_where, "args must be: serve --config <path>")
    elif pathlib.PurePosixPath(config_path).parent != pathlib.PurePosixPath(config_mount["mountPath"]):
        fail(sts_where, f"--config {config_path} is not under the config mount {config_mount['mountPath']}")
    elif items.get(file_name) not in cm["data"]:
        fail(sts_where, f"--config {config_path}: the ConfigMap has no such key")
    toml_text = cm["data"].get(items.get(file_name, ""), "")
    conf = check_serve_toml(f"{cm_where} {items.get(file_name)}", toml_text)
    if not conf:
        return

    # The TOML agrees with the pod.
    listen = socket_addr(conf.get("listen", "127.0.0.1:50051"))
    if listen[0].is_loopback:
        fail(cm_where, "listen is loopback: the kubelet's probes and clients reach the pod IP")
    if listen[1] != ports.get("grpc"):
        fail(cm_where, f"listen port {listen[1]} is not the grpc containerPort {ports.get('grpc')}")
    if not conf.get("insecure") and not ("tls" in conf and "MUSHROOMDB_BACKUP_ADMIN_TOKEN" in env):
        fail(cm_where, "a non-loopback listener needs [tls] and the admin token, or insecure = true")
    token = env.get("MUSHROOMDB_BACKUP_ADMIN_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
    if not token or token.get("optional"):
        fail(sts_where, "MUSHROOMDB_BACKUP_ADMIN_TOKEN must come from a Secret, not optional")
    if conf.get("tls") and any((p.get("grpc") or {}).get("mode") != "TLS" for p in probes(container).values()):
        fail(sts_where, "with [tls] in the config the gRPC probes need `mode: TLS` (Kubernetes 1.37+)")
    data_mount = mounts.get("data")
    if "data" not in claims or data_mount is None:
        fail(sts_where, "the data dir needs a volumeClaimTemplate named data, mounted")
    elif conf.get("data_dir") != data_mount["mountPath"]:
        fail(cm_where, f"data_dir {conf.get('data_dir')!r} is not where the data volume is mounted ({data_mount['mountPath']})")
    writable = [m["mountPath"] for m in mounts.values() if not m.get("readOnly")]
    for root in conf.get("allow_roots", []):
        if not any(root == w or root.startswith(w.rstrip("/") + "/") for w in writable):
            fail(cm_where, f"allowed root {root} is on no writable volume (readOnlyRootFilesystem)")
    registry_secret = env.get("MUSHROOMDB_BACKUP_REGISTRY", {}).get("valueFrom", {}).get("secretKeyRef")
    if registry_secret:
        if "registry" in conf:
            fail(cm_where, "the registry comes from the Secret (MUSHROOMDB_BACKUP_REGISTRY): leave it out of the config")
    elif not conf.get("registry", "").startswith(("sqlite://" + conf.get("data_dir", "") + "/", "postgres://", "postgresql://")):
        fail(cm_where, "a SQLite registry must live on the data volume")

    # Probes: native gRPC on the gRPC port; readiness on the service whose status follows the
    # registry; liveness on the server as a whole.
    pr = probes(container)
    for name in ("startupProbe", "livenessProbe", "readinessProbe"):
        grpc = (pr.get(name) or {}).get("grpc")
        if not grpc:
            fail(sts_where, f"{name} must be a native grpc probe")
        elif grpc["port"] != ports.get("grpc"):
            fail(sts_where, f"{name} probes port {grpc['port']}, not the grpc port {ports.get('grpc')}")
    if errors:
        return
    want = grpc_service_name()
    if pr["readinessProbe"]["grpc"].get("service") != want:
        fail(sts_where, f"readinessProbe.grpc.service must be {want!r} (SERVING only while the registry answers)")
    if pr["livenessProbe"]["grpc"].get("service", ""):
        fail(sts_where, 'livenessProbe.grpc.service must be "" (the server): a registry outage must not restart the pod')

    # Security and shutdown.
    sc = container.get("securityContext", {})
    psc = spec.get("securityContext", {})
    if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
        fail(sts_where, "runAsNonRoot must be true")
    if not sc.get("readOnlyRootFilesystem"):
        fail(sts_where, "readOnlyRootFilesystem must be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        fail(sts_where, "allowPrivilegeEscalation must be false")
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        fail(sts_where, "capabilities.drop must contain ALL")
    if not container.get("resources", {}).get("requests"):
        fail(sts_where, "the container needs resource requests")
    bound = shutdown_bound_seconds()
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < 2 * bound:
        fail(sts_where, f"terminationGracePeriodSeconds {grace} s is short of twice the shutdown bound ({bound} s)")
    if fleet:
        check_fleet(kdir, by_kind, sts_where, sts, svc, conf, env, mounts, volumes, ports, pod_labels)
    elif len(services) != 1:
        fail(rel(kdir), "one replica has one Service, the headless one")


def check_fleet(kdir, by_kind, sts_where, sts, peers, conf, env, mounts, volumes, ports, pod_labels) -> None:
    """The multi-replica fleet: one control plane on a shared registry, one failover group."""
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    args = container.get("args", [])
    if spec.get("replicas", 1) < 3:
        fail(sts_where, "a fleet that survives a machine loss during an upgrade needs at least 3 replicas")
    if spec.get("updateStrategy", {}).get("type", "RollingUpdate") != "RollingUpdate":
        fail(sts_where, "updateStrategy must be RollingUpdate (one replica drained at a time)")
    # The registry: PostgreSQL, from a Secret.
    reg = env.get("MUSHROOMDB_BACKUP_REGISTRY", {}).get("valueFrom", {}).get("secretKeyRef")
    if not reg or reg.get("optional"):
        fail(sts_where, "MUSHROOMDB_BACKUP_REGISTRY (the shared PostgreSQL URL) must come from a Secret, not optional")
    # Peer addresses under the headless Service, on the gRPC port.
    if not peers["spec"].get("publishNotReadyAddresses"):
        fail(rel(kdir), "the headless Service must publish not-ready replicas: the others reach an owner while it drains")
    for var in ("POD_NAME", "POD_NAMESPACE"):
        if "fieldRef" not in env.get(var, {}).get("valueFrom", {}):
            fail(sts_where, f"{var} must come from the pod's fieldRef")
    want = f"$(POD_NAME).{peers['metadata']['name']}.$(POD_NAMESPACE).svc:{ports.get('grpc')}"
    got = args[args.index("--advertise-address") + 1] if "--advertise-address" in args else None
    if got != want:
        fail(sts_where, f"--advertise-address must be {want!r} (the headless Service's per-pod name), not {got!r}")
    if env.get("MUSHROOMDB_BACKUP_INSTANCE_ID", {}).get("value") != "$(POD_NAME)":
        fail(sts_where, "MUSHROOMDB_BACKUP_INSTANCE_ID must be $(POD_NAME): stable, and the name drain is given")
    # The client Service: every call, on the gRPC port only.
    clients = [s for _, s in by_kind["Service"] if s is not peers]
    if len(clients) != 1:
        fail(rel(kdir), "a fleet has one client Service besides the headless one")
    else:
        client = clients[0]
        if client["spec"].get("clusterIP") == "None" or not subset(client["spec"]["selector"], pod_labels):
            fail(rel(kdir), "the client Service must be a ClusterIP Service selecting the replicas")
        if [p.get("targetPort") for p in client["spec"]["ports"]] != ["grpc"]:
            fail(rel(kdir), "the client Service carries the grpc port only (metrics are scraped per replica)")
    for where, sm in by_kind["ServiceMonitor"]:
        if clients and subset(sm["spec"]["selector"].get("matchLabels", {}), clients[0]["metadata"].get("labels", {})):
            fail(where, "selects the client Service too: each replica would be scraped twice")
        if sm["spec"].get("jobLabel") != "app.kubernetes.io/name" or peers["metadata"]["labels"].get("app.kubernetes.io/name") != "mushroom-backup":
            fail(where, 'the alerts expect job="mushroom-backup": jobLabel app.kubernetes.io/name on a Service labelled so')
    # One failover group over one shared ReadWriteMany volume holding every allowed root.
    if not conf.get("failover_group") and "--failover-group" not in args:
        fail(sts_where, "the replicas need one failover_group")
    claims = {o["metadata"]["name"]: o for _, o in by_kind.get("PersistentVolumeClaim", [])}
    shared = [
        m for m in mounts.values()
        if (volumes.get(m["name"], {}).get("persistentVolumeClaim") or {}).get("claimName") in claims
        and "ReadWriteMany" in claims[volumes[m["name"]]["persistentVolumeClaim"]["claimName"]]["spec"]["accessModes"]
        and not m.get("readOnly")
    ]
    for root in conf.get("allow_roots", []):
        if not any(root == m["mountPath"] or root.startswith(m["mountPath"].rstrip("/") + "/") for m in shared):
            fail(rel(kdir), f"allowed root {root} is not on a shared ReadWriteMany volume: a claimant could not see the stores")
    if not conf.get("allow_roots"):
        fail(rel(kdir), "allow_roots must name the shared store volume")
    # Peer TLS and the certificates from a Secret.
    secret_mounts = [m["mountPath"] for m in mounts.values() if volumes.get(m["name"], {}).get("secret")]
    tls = conf.get("tls", {})
    for what, path in (("tls.cert", tls.get("cert")), ("tls.key", tls.get("key")), ("peer_ca", conf.get("peer_ca"))):
        if not path or not any(str(path).startswith(d.rstrip("/") + "/") for d in secret_mounts):
            fail(rel(kdir), f"{what} {path!r} must be a file of a mounted Secret (peer TLS)")
    # The peers' own token (never the admin token), a file of a mounted Secret.
    peer_token = env.get("MUSHROOMDB_BACKUP_PEER_TOKEN_FILE", {}).get("value") or conf.get("peer_token_file")
    if not peer_token or not any(str(peer_token).startswith(d.rstrip("/") + "/") for d in secret_mounts):
        fail(rel(kdir), f"the peer token {peer_token!r} must be a file of a mounted Secret (MUSHROOMDB_BACKUP_PEER_TOKEN_FILE): with an admin token a replica forwards nothing without it")
    # A PodDisruptionBudget over the replicas.
    pdbs = [o for _, o in by_kind.get("PodDisruptionBudget", [])]
    if not pdbs:
        fail(rel(kdir), "no PodDisruptionBudget")
    for pdb in pdbs:
        if not subset(pdb["spec"]["selector"].get("matchLabels", {}), pod_labels):
            fail(rel(kdir), "the PodDisruptionBudget does not select the replicas")
        if pdb["spec"].get("maxUnavailable") != 1 and pdb["spec"].get("minAvailable") != spec.get("replicas", 1) - 1:
            fail(rel(kdir), "the PodDisruptionBudget must allow exactly one replica down")
    # Rolling updates drain: preStop runs `ctl drain <this pod>`, within the grace period.
    hook = " ".join(container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", []))
    m = re.search(r"ctl\b.*--timeout-ms (\d+).*\bdrain \"?\$\{?POD_NAME\b", hook, re.S)
    if not m:
        fail(sts_where, f"preStop must run `mushroom-backup ctl --timeout-ms N drain \"$POD_NAME\"`, not {hook!r}")
    else:
        drain_s = int(m.group(1)) / 1000
        grace = pod.get("terminationGracePeriodSeconds", 30)
        bound = shutdown_bound_seconds()
        if grace <= drain_s + 2 * bound:
            fail(sts_where, f"terminationGracePeriodSeconds {grace} s must exceed the drain's {drain_s:.0f} s plus twice the shutdown bound ({bound} s)")
    if "--server" in hook and "https://localhost:" not in hook:
        fail(sts_where, "the drain calls this pod itself: --server https://localhost:<port>")


def probes(container: dict) -> dict:
    return {k: container.get(k) for k in ("startupProbe", "livenessProbe", "readinessProbe")}


# ---------------------------------------------------------------- PromQL


GRAFANA_VARS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "${__range}": "1h",
    "$__range": "1h",
}


def promql_metrics(where: str, expr: str) -> tuple[set[str], list]:
    """Parses `expr`; returns the metric names it selects and its selectors."""
    try:
        ast = promql_parser.parse(expr)
    except ValueError as e:
        fail(where, f"PromQL does not parse: {e}: {expr}")
        return set(), []
    selectors = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            selectors.append(node)

    promql_parser.walk(ast, visit)
    names = set()
    for s in selectors:
        name = s.name or next((m.value for m in s.matchers.matchers if m.name == "__name__"), None)
        if name is None:
            fail(where, f"a selector without a metric name: {expr}")
            continue
        names.add(name)
        if name not in EXPORTED and name not in PROMETHEUS_SERIES:
            fail(where, f"{name} is not a metric the service exports: {expr}")
    return names, selectors


def readme_anchors() -> set[str]:
    anchors = set()
    for line in (DEPLOY / "README.md").read_text().splitlines():
        m = re.match(r"^#+\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def check_alerts() -> None:
    path = DEPLOY / "prometheus/alerts.yaml"
    where = rel(path)
    doc = load_one_yaml(path)
    if doc is None:
        return
    if set(doc) != {"groups"} or not isinstance(doc["groups"], list) or not doc["groups"]:
        fail(where, "a rule file is a mapping with one key, groups: a non-empty list")
        return
    anchors = readme_anchors()
    group_names, alert_names = set(), set()
    for g in doc["groups"]:
        gw = f"{where} group {g.get('name')!r}"
        if set(g) - {"name", "interval", "limit", "rules", "labels", "query_offset"}:
            fail(gw, f"unknown group keys {sorted(set(g) - {'name', 'interval', 'limit', 'rules'})}")
        if not isinstance(g.get("name"), str) or g["name"] in group_names:
            fail(gw, "every group needs a unique name")
        group_names.add(g.get("name"))
        for r in g.get("rules") or []:
            rw = f"{gw} alert {r.get('alert')!r}"
            allowed = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            if set(r) - allowed:
                fail(rw, f"unknown rule keys {sorted(set(r) - allowed)}")
            if not isinstance(r.get("alert"), str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", r["alert"]):
                fail(rw, "needs an alert name (a valid label value of alertname)")
            if r.get("alert") in alert_names:
                fail(rw, "duplicate alert name")
            alert_names.add(r.get("alert"))
            if not isinstance(r.get("expr"), str):
                fail(rw, "needs an expr")
                continue
            promql_metrics(rw, r["expr"])
            for key in ("for", "keep_firing_for"):
                if key in r:
                    try:
                        promql_parser.parse_duration(str(r[key]))
                    except ValueError as e:
                        fail(rw, f"{key}: {r[key]!r} is not a duration: {e}")
            if "for" not in r:
                fail(rw, "needs a `for` (a single bad scrape must not page)")
            if (r.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
                fail(rw, "labels.severity must be critical, warning or info")
            ann = r.get("annotations") or {}
            for key in ("summary", "description", "runbook"):
                if not isinstance(ann.get(key), str) or not ann[key].strip():
                    fail(rw, f"annotations.{key} is missing")
            for key, text in ann.items():
                if str(text).count("{{") != str(text).count("}}"):
                    fail(rw, f"annotations.{key}: unbalanced {{{{ }}}}")
            m = re.fullmatch(r"deploy/README\.md#([\w-]+)", ann.get("runbook", ""))
            if not m or m.group(1) not in anchors:
                fail(rw, f"annotations.runbook {ann.get('runbook')!r} is not a section of deploy/README.md")
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
        if r.returncode != 0:
            fail(where, f"promtool check rules: {r.stdout}{r.stderr}")
    else:
        notes.append("promtool is not on PATH: rules checked with promql-parser only")


# ---------------------------------------------------------------- Grafana


def check_grafana() -> None:
    path = DEPLOY / "grafana/fleet-dashboard.json"
    where = rel(path)
    try:
        dash = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        fail(where, f"JSON does not parse: {e}")
        return
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        if key not in dash:
            fail(where, f"no {key}")
    if errors:
        return
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        fail(where, "needs a `datasource` variable of type datasource, query prometheus")
    store = variables.get("store_id")
    if not store or store.get("type") != "query":
        fail(where, "needs a `store_id` query variable")
    used: set[str] = set()

    def grafana_expr(text: str) -> str:
        for k, v in GRAFANA_VARS.items():
            text = text.replace(k, v)
        return text

    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q)
        if not m:
            fail(f"{where} variable {name}", f"query {q!r} is not label_values(<selector>, <label>)")
            continue
        used |= promql_metrics(f"{where} variable {name}", grafana_expr(m.group(1)))[0]
        if v.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"{where} variable {name}", "must use the ${datasource} variable")

    def all_panels(panels):
        for p in panels:
            yield p
            yield from all_panels(p.get("panels", []))

    ids = set()
    for p in all_panels(dash["panels"]):
        pw = f"{where} panel {p.get('id')} {p.get('title')!r}"
        if p.get("id") in ids:
            fail(pw, "duplicate panel id")
        ids.add(p.get("id"))
        if "gridPos" not in p:
            fail(pw, "no gridPos")
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            fail(pw, "must use the ${datasource} variable")
        if not p.get("targets"):
            fail(pw, "no queries")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}":
                fail(pw, f"target {t.get('refId')} must use the ${{datasource}} variable")
            names, selectors = promql_metrics(pw, grafana_expr(t.get("expr", "")))
            used |= names
            for s in selectors:
                if s.name in STORE_METRICS and not any(
                    m.name == "store_id" and "$store_id" in m.value for m in s.matchers.matchers
                ):
                    fail(pw, f"{s.name} ignores the store_id variable: {t['expr']}")
    histogram_series = {h + "_bucket" for h in HISTOGRAMS}
    missing = (STORE_METRICS | OTHER_METRICS | histogram_series) - used
    if missing:
        fail(where, f"no panel shows {sorted(missing)}")


# ---------------------------------------------------------------- OpenTelemetry Collector


def check_otel() -> None:
    path = DEPLOY / "otel-collector.yaml"
    where = rel(path)
    c = load_one_yaml(path)
    if c is None:
        return
    sections = ("receivers", "processors", "exporters", "extensions", "connectors")
    if set(c) - set(sections) - {"service"}:
        fail(where, f"unknown top-level keys {sorted(set(c) - set(sections) - {'service'})}")
    pipelines = (c.get("service") or {}).get("pipelines") or {}
    if not pipelines:
        fail(where, "service.pipelines is empty")
    used = {s: set() for s in sections}
    for name, p in pipelines.items():
        pw = f"{where} pipeline {name}"
        if name.split("/")[0] not in ("traces", "metrics", "logs"):
            fail(pw, "a pipeline is traces, metrics or logs[/name]")
        if set(p) - {"receivers", "processors", "exporters"}:
            fail(pw, f"unknown keys {sorted(set(p) - {'receivers', 'processors', 'exporters'})}")
        for part in ("receivers", "exporters"):
            if not p.get(part):
                fail(pw, f"needs {part}")
        for part in ("receivers", "processors", "exporters"):
            for comp in p.get(part) or []:
                used[part].add(comp)
                if comp not in (c.get(part) or {}):
                    fail(pw, f"{part[:-1]} {comp!r} is not defined under {part}")
        procs = p.get("processors") or []
        if "memory_limiter" in procs and procs[0] != "memory_limiter":
            fail(pw, "memory_limiter must be the first processor")
        if "batch" not in procs:
            fail(pw, "needs the batch processor")
    for ext in (c.get("service") or {}).get("extensions") or []:
        used["extensions"].add(ext)
        if ext not in (c.get("extensions") or {}):
            fail(where, f"service.extensions names {ext!r}, which is not defined")
    for part in sections:
        for comp in c.get(part) or {}:
            if comp not in used[part]:
                fail(where, f"{part[:-1]} {comp!r} is defined but no pipeline uses it")
    if "traces" not in pipelines:
        fail(where, "no traces pipeline")
    grpc = ((c.get("receivers") or {}).get("otlp") or {}).get("protocols", {}).get("grpc") or {}
    if not str(grpc.get("endpoint", "")).endswith(":4317"):
        fail(where, "the otlp receiver must take OTLP/gRPC on port 4317")
    exporters = set(c.get("exporters") or {})
    if "debug" not in exporters or not any(e.split("/")[0] == "otlp" for e in exporters):
        fail(where, "needs a debug exporter and an otlp exporter to the backend")


# ---------------------------------------------------------------- systemd

UNIT_REQUIRED = {
    # directive: a predicate on its values (all occurrences), with what it must be.
    ("Service", "User"): (lambda v: v == ["mushroom-backup"], "mushroom-backup"),
    ("Service", "DynamicUser"): (lambda v: v == ["no"], "no"),
    ("Service", "ExecStart"): (
        lambda v: v == ["/usr/bin/mushroom-backup serve --config /etc/mushroom-backup/config.toml"],
        "/usr/bin/mushroom-backup serve --config /etc/mushroom-backup/config.toml",
    ),
    ("Service", "EnvironmentFile"): (lambda v: "-/etc/mushroom-backup/env" in v, "-/etc/mushroom-backup/env"),
    ("Service", "StateDirectory"): (lambda v: v == ["mushroom-backup"], "mushroom-backup"),
    ("Service", "ProtectSystem"): (lambda v: v == ["strict"], "strict"),
    ("Service", "ReadWritePaths"): (
        lambda v: "/var/lib/mushroom-backup" in " ".join(v).split(),
        "to include /var/lib/mushroom-backup",
    ),
    ("Service", "RestrictAddressFamilies"): (lambda v: v == ["AF_INET AF_INET6 AF_UNIX"], "AF_INET AF_INET6 AF_UNIX"),
    ("Service", "CapabilityBoundingSet"): (lambda v: v == [""], "empty"),
    ("Service", "SystemCallFilter"): (lambda v: "@system-service" in v, "to include @system-service"),
    ("Service", "Restart"): (lambda v: v == ["on-failure"], "on-failure"),
    ("Service", "KillSignal"): (lambda v: v == ["SIGTERM"], "SIGTERM"),
    **{
        ("Service", k): (lambda v: v == ["yes"], "yes")
        for k in (
            "NoNewPrivileges",
            "PrivateTmp",
            "ProtectHome",
            "ProtectKernelTunables",
            "ProtectKernelModules",
            "ProtectKernelLogs",
            "LockPersonality",
            "MemoryDenyWriteExecute",
        )
    },
    ("Install", "WantedBy"): (lambda v: v == ["multi-user.target"], "multi-user.target"),
}


def parse_unit(text: str, where: str) -> dict:
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(("#", ";")):
            continue
        m = re.fullmatch(r"\[(\w+)\]", s)
        if m:
            current = sections.setdefault(m.group(1), {})
            continue
        m = re.fullmatch(r"([A-Za-z][A-Za-z0-9]*)=(.*)", s)
        if not m or current is None:
            fail(f"{where}:{n}", f"not a `Key=value` line inside a section: {line!r}")
            continue
        current.setdefault(m.group(1), []).append(m.group(2).strip())
    return sections


def seconds(span: str) -> float:
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*(ms|min|s|m|h)?", span):
        total += float(num) * {"ms": 0.001, "s": 1, "": 1, "min": 60, "m": 60, "h": 3600}[unit]
    return total


def check_systemd() -> None:
    path = DEPLOY / "systemd/mushroom-backup.service"
    where = rel(path)
    text = path.read_text()
    unit = parse_unit(text, where)
    for section in ("Unit", "Service", "Install"):
        if section not in unit:
            fail(where, f"no [{section}] section")
    for (section, key), (ok, want) in UNIT_REQUIRED.items():
        values = unit.get(section, {}).get(key)
        if values is None:
            fail(where, f"[{section}] {key}= is missing (want {want})")
        elif not ok(values):
            fail(where, f"[{section}] {key}={values} (want {want})")
    bound = shutdown_bound_seconds()
    stop = seconds((unit.get("Service", {}).get("TimeoutStopSec") or ["90s"])[-1])
    if stop < 2 * bound:
        fail(where, f"TimeoutStopSec={stop:g}s is short of twice the shutdown bound ({bound} s)")
    state_dir = "/var/lib/" + (unit.get("Service", {}).get("StateDirectory") or [""])[0]
    example = tomllib.loads((DEPLOY / "config.example.toml").read_text())
    if example.get("data_dir") != state_dir:
        fail(where, f"StateDirectory {state_dir} is not the example config's data_dir {example.get('data_dir')}")
    writable = " ".join(unit.get("Service", {}).get("ReadWritePaths", [])).split()
    for root in example.get("allow_roots", []):
        if not any(root == w.lstrip("-") or root.startswith(w.lstrip("-").rstrip("/") + "/") for w in writable):
            fail(where, f"allowed root {root} of config.example.toml is not in ReadWritePaths=")

    sysusers = DEPLOY / "systemd/mushroom-backup.sysusers"
    users = [
        line.split()
        for line in sysusers.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not any(u[:2] == ["u", "mushroom-backup"] for u in users):
        fail(rel(sysusers), "no `u mushroom-backup ...` line")
    for u in users:
        if u[0] not in ("u", "g", "m", "r"):
            fail(rel(sysusers), f"unknown line type {u[0]!r}")

    analyze = shutil.which("systemd-analyze")
    if not analyze:
        notes.append("systemd-analyze is not installed: the unit got the structural check only")
        return
    with tempfile.TemporaryDirectory() as tmp:
        # verify checks that ExecStart's binary exists: point it at the one just built.
        binary = os.environ.get("MB_BIN") or shutil.which("true")
        copy = pathlib.Path(tmp) / path.name
        copy.write_text(text.replace("ExecStart=/usr/bin/mushroom-backup ", f"ExecStart={binary} "))
        r = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True)
        complaints = [line for line in (r.stdout + r.stderr).splitlines() if path.name in line]
        if r.returncode != 0 or complaints:
            fail(where, f"systemd-analyze verify (exit {r.returncode}):\n  " + "\n  ".join(complaints or [r.stderr]))
        r = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(copy)], capture_output=True, text=True)
        m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
        if not m:
            notes.append(f"systemd-analyze security gave no exposure level (exit {r.returncode})")
        elif float(m.group(1)) > 2.0:
            fail(where, f"systemd-analyze security: exposure {m.group(1)} (want 2.0 or lower)")


# ---------------------------------------------------------------- Containerfile


def containerfile_stages(text: str) -> list[list[tuple[str, str]]]:
    """The Containerfile's stages, each a list of (INSTRUCTION, arguments), continuation lines
    joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not pending:
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[list[tuple[str, str]]] = []
    for line in logical:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        word, _, rest = line.strip().partition(" ")
        word = word.upper()
        if word == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((word, rest.strip()))
    return stages


def check_containerfile() -> None:
    where = "Containerfile"
    path = ROOT / "Containerfile"
    if not path.exists():
        fail(where, "missing: the image deploy/kubernetes/ names must be buildable from the repository")
        return
    text = path.read_text()
    stages = containerfile_stages(text)
    if len(stages) < 2:
        fail(where, f"{len(stages)} stage(s): build in one stage, ship the binary alone in another")
        return
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    version = cargo["package"]["version"]
    if isinstance(version, dict) and version.get("workspace"):
        # `version.workspace = true`: the workspace's one version.
        version = cargo["workspace"]["package"]["version"]
    image = f"mushroom-backup:{version}"
    if f"-t {image} -f Containerfile" not in text:
        fail(where, f"its documented build does not tag {image!r} (`podman build -t {image} -f Containerfile .`)")
    build = stages[0]
    build_name = build[0][1].split()[-1] if " AS " in build[0][1].upper() else None
    runs = " ".join(args for word, args in build if word == "RUN")
    if "cargo build --release --locked" not in runs:
        fail(where, "the build stage must run `cargo build --release --locked` (the lockfile, the lean release profile)")
    final = stages[-1]
    instructions = {word: args for word, args in final}
    copies = [args for word, args in final if word in ("COPY", "ADD")]
    for args in copies:
        if not build_name or f"--from={build_name}" not in args:
            fail(where, f"the shipped stage copies {args!r} from outside the build stage: it holds the binary only")
    destinations = sorted(args.split()[-1] for args in copies)
    if destinations != ["/etc/ssl/certs/ca-certificates.crt", "/usr/bin/mushroom-backup"]:
        fail(where, f"the shipped stage copies {destinations}: the binary (and the CA bundle) only")
    user = instructions.get("USER", "")
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or int(uid) == 0 or (gid and (not gid.isdigit() or int(gid) == 0)):
        fail(where, f"USER {user!r}: a numeric non-root uid:gid (runAsNonRoot can check only a number)")
    try:
        entrypoint = json.loads(instructions.get("ENTRYPOINT", "null"))
        cmd = json.loads(instructions.get("CMD", "null"))
    except json.JSONDecodeError as e:
        fail(where, f"ENTRYPOINT and CMD must be in exec (JSON) form: {e}")
        return
    if entrypoint != ["/usr/bin/mushroom-backup"]:
        fail(where, f"ENTRYPOINT {entrypoint!r}: the binary, exec form")
    ignore = (ROOT / ".dockerignore").read_text().split() if (ROOT / ".dockerignore").exists() else []
    for needed in ("target", ".venv"):
        if needed not in ignore:
            fail(".dockerignore", f"does not keep {needed}/ out of the build context")
    for sts_path, single in ((DEPLOY / "kubernetes" / "statefulset.yaml", True), (DEPLOY / "kubernetes" / "multi" / "statefulset.yaml", False)):
        for doc in load_yaml(sts_path):
            if doc.get("kind") != "StatefulSet":
                continue
            sts_where = f"{rel(sts_path)} StatefulSet/{doc['metadata']['name']}"
            pod = doc["spec"]["template"]["spec"]
            ctx = pod.get("securityContext", {})
            if uid.isdigit() and ctx.get("runAsUser") != int(uid):
                fail(sts_where, f"runAsUser {ctx.get('runAsUser')} is not the Containerfile's USER {uid}")
            if gid.isdigit() and ctx.get("runAsGroup") != int(gid):
                fail(sts_where, f"runAsGroup {ctx.get('runAsGroup')} is not the Containerfile's group {gid}")
            for c in pod["containers"]:
                if c.get("image") != image:
                    fail(sts_where, f"image {c.get('image')!r} is not the one the Containerfile builds, {image!r}")
                if c.get("command") != entrypoint:
                    fail(sts_where, f"command {c.get('command')!r} is not the Containerfile's ENTRYPOINT {entrypoint!r}")
                if single and c.get("args") != cmd:
                    fail(sts_where, f"args {c.get('args')!r} are not the Containerfile's CMD {cmd!r}")


# ---------------------------------------------------------------- README


def check_readme() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name != "README.md" and str(path.relative_to(DEPLOY)) not in readme:
            fail("deploy/README.md", f"does not say what {path.relative_to(DEPLOY)} is")


def main() -> int:
    for path in sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml")):
        load_yaml(path)
    for check in (check_example_toml, check_kubernetes, check_alerts, check_grafana, check_otel, check_systemd, check_containerfile, check_readme):
        check()
    for n in notes:
        print(f"note: {n}")
    unique = list(dict.fromkeys(errors))  # a file read by two checks reports its parse error once
    for e in unique:
        print(f"FAIL {e}")
    print(f"validate.py: {len(unique)} failure(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
