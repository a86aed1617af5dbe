"""Checks that the Kubernetes manifests (deploy/kubernetes/) agree with sked and its image.

Run by .ci/kubernetes: python kubernetes_check.py SKED_BINARY MANIFEST_DIR CONTAINERFILE.
Schemas are kubernetes-validate's business; this checks what no schema knows:

- every SKED_* variable a container sets is one its command (`sked server`, `sked worker`)
  reads, as its --help says;
- the ConfigMap's sked.toml passes `sked config check`, and every file it or a variable names
  (the config itself, the admin token, the secret key, the worker token, PostgreSQL's CA)
  is a key of a volume mounted at that place in the container that reads it;
- the probes ask sked's /readyz and /healthz on the port the image listens on;
- the containers run as the image's sked user, non-root, read-only, without capabilities, under
  the runtime's seccomp profile, and the stop grace outlasts the drain sked does at SIGTERM.

Prints each check; exits 1 after listing every failure.
"""

import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

binary, manifest_dir, containerfile = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def duration_seconds(text):
    """A sked duration as the manifests write them: 60s, 5m, 1h."""
    match = re.fullmatch(r"(\d+)(s|m|h)", text)
    if not match:
        raise SystemExit(f"cannot read the duration {text!r}")
    return int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]


resources = {}
for path in sorted(manifest_dir.glob("*.yaml")):
    if path.name == "kustomization.yaml":
        continue
    for doc in yaml.safe_load_all(path.read_text()):
        resources[(doc["kind"], doc["metadata"]["name"])] = doc

kustomization = yaml.safe_load((manifest_dir / "kustomization.yaml").read_text())
listed = set(kustomization["resources"])
on_disk = {p.name for p in manifest_dir.glob("*.yaml")} - {"kustomization.yaml"}
check(
    listed == on_disk - {"secrets.example.yaml"},
    f"kustomization.yaml lists every manifest but the Secrets' example ({sorted(listed)})",
)

# What the image gives: its user and the port it listens on.
image = containerfile.read_text()
uid = int(re.search(r"^USER (\d+):(\d+)$", image, re.M)[1])
image_port = int(re.search(r"SKED_LISTEN=[\d.]+:(\d+)", image)[1])
check(f"EXPOSE {image_port}" in image, f"the image exposes the port it listens on ({image_port})")

config_map = resources[("ConfigMap", "sked-config")]
toml_text = config_map["data"]["sked.toml"]
with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
    f.write(toml_text)
    f.flush()
    checked = subprocess.run([binary, "config", "check", f.name], capture_output=True, text=True)
check(
    checked.returncode == 0,
    "`sked config check` accepts the ConfigMap's sked.toml"
    + ("" if checked.returncode == 0 else ": " + checked.stderr.strip()),
)
config = tomllib.loads(toml_text)

secrets_example = {
    name: doc for (kind, name), doc in resources.items() if kind == "Secret"
}


def mounted_file(pod, container, path):
    """Where `path` comes from in this container: (volume kind, object name, key), or None."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(prefix):
            continue
        relative = path[len(prefix):]
        volume = volumes[mount["name"]]
        for kind, name_field in (("secret", "secretName"), ("configMap", "name")):
            if kind in volume:
                source = volume[kind]
                items = source.get("items")
                keys = {i["path"]: i["key"] for i in items} if items else None
                key = keys.get(relative) if keys is not None else relative
                return (kind, source[name_field], key) if key else None
        return ("emptyDir", mount["name"], relative) if "emptyDir" in volume else None
    return None


def sked_help(command):
    return subprocess.run([binary, command, "--help"], capture_output=True, text=True, check=True).stdout


for name, command in (("sked-server", "server"), ("sked-worker", "worker")):
    deployment = resources[("Deployment", name)]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    check(container["args"] == [command], f"{name} runs `sked {command}`")
    help_text = sked_help(command)
    env = {e["name"]: e for e in container.get("env", [])}
    for variable in env:
        check(f"[env: {variable}=" in help_text, f"{name}: `sked {command}` reads {variable}")

    # The config file, and every file it names for this command.
    config_path = env.get("SKED_CONFIG", {}).get("value", "")
    check(
        mounted_file(pod, container, config_path) == ("configMap", "sked-config", "sked.toml"),
        f"{name}: SKED_CONFIG ({config_path or 'not set'}) is the ConfigMap's sked.toml",
    )
    table = config.get(command, {})
    for key in ("admin-token-file", "secret-key-file", "token-file"):
        if key in table:
            source = mounted_file(pod, container, table[key])
            check(
                source is not None and source[0] == "secret" and source[1] in secrets_example
                and source[2] in secrets_example[source[1]]["stringData"],
                f"{name}: {key} ({table[key]}) is a key of a mounted Secret ({source})",
            )

    # Security: the image's user, nothing more.
    pod_security = pod["securityContext"]
    security = container["securityContext"]
    check(pod_security.get("runAsNonRoot") is True, f"{name}: runAsNonRoot")
    check(pod_security.get("runAsUser") == uid, f"{name}: runs as the image's user {uid}")
    check(pod_security.get("fsGroup") == uid, f"{name}: Secret files are readable by group {uid}")
    check(
        pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault",
        f"{name}: seccomp RuntimeDefault",
    )
    check(security.get("readOnlyRootFilesystem") is True, f"{name}: read-only root filesystem")
    check(security.get("allowPrivilegeEscalation") is False, f"{name}: no privilege escalation")
    check(security.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: drops ALL capabilities")
    check(pod.get("automountServiceAccountToken") is False, f"{name}: no service account token")
    check(pod.get("enableServiceLinks") is False, f"{name}: no service link variables beside SKED_*")
    limits = container["resources"]
    check(
        {"cpu", "memory"} <= set(limits.get("requests", {})) and "memory" in limits.get("limits", {}),
        f"{name}: requests cpu and memory, limits memory",
    )
    # What needs writing is an emptyDir: the worker's jobs run in workingDir.
    if "workingDir" in container:
        source = mounted_file(pod, container, container["workingDir"].rstrip("/") + "/x")
        check(source is not None and source[0] == "emptyDir", f"{name}: workingDir is an emptyDir")

server = resources[("Deployment", "sked-server")]
server_pod = server["spec"]["template"]["spec"]
(server_container,) = server_pod["containers"]
check(server["spec"]["replicas"] == 3, "three server nodes")
ports = {p["name"]: p["containerPort"] for p in server_container["ports"]}
check(ports.get("http") == image_port, f"the server's port is the image's ({image_port})")
probes = {
    "readinessProbe": "/readyz",
    "livenessProbe": "/healthz",
}
for probe, path in probes.items():
    get = server_container[probe]["httpGet"]
    check(get["path"] == path and get["port"] in ("http", image_port), f"{probe} asks {path}")
routes = subprocess.run(
    ["grep", "-rhoE", r'"/(readyz|healthz)"', "crates/server/src/api/mod.rs"],
    capture_output=True,
    text=True,
).stdout
check('"/readyz"' in routes and '"/healthz"' in routes, "the server serves /readyz and /healthz")
pre_stop = server_container["lifecycle"]["preStop"]["sleep"]["seconds"]
# A stopping node lets open requests finish for up to 10 s (docs/OPERATIONS.md).
check(
    server_pod["terminationGracePeriodSeconds"] >= pre_stop + 10 + 5,
    f"the server's grace ({server_pod['terminationGracePeriodSeconds']}s) outlasts preStop "
    f"({pre_stop}s) and the 10 s open requests have",
)
database_url = next(e for e in server_container["env"] if e["name"] == "SKED_DATABASE_URL")
reference = database_url["valueFrom"]["secretKeyRef"]
example_url = secrets_example[reference["name"]]["stringData"][reference["key"]]
check("sslmode=verify-full" in example_url, "the example database URL verifies the server (verify-full)")
root_cert = re.search(r"sslrootcert=([^&]+)", example_url)[1]
source = mounted_file(server_pod, server_container, root_cert)
check(
    source is not None and source[0] == "secret" and source[2] in secrets_example[source[1]]["stringData"],
    f"sslrootcert ({root_cert}) is a key of a mounted Secret ({source})",
)

worker = resources[("Deployment", "sked-worker")]
worker_pod = worker["spec"]["template"]["spec"]
# sked's default drain grace is 30s.
drain = duration_seconds(config.get("worker", {}).get("drain-grace", "30s"))
# After the drain grace, attempts still running get the kill grace (5 s), then are reported.
check(
    worker_pod["terminationGracePeriodSeconds"] >= drain + 5 + 10,
    f"the worker's grace ({worker_pod['terminationGracePeriodSeconds']}s) outlasts drain-grace "
    f"({drain}s) and the kill grace",
)
(worker_container,) = worker_pod["containers"]
servers = config.get("worker", {}).get("server")
service = resources[("Service", "sked")]
check(
    servers == [f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"],
    f"workers reach the servers through the Service ({servers})",
)
selector = service["spec"]["selector"]
server_labels = server["spec"]["template"]["metadata"]["labels"]
check(selector.items() <= server_labels.items(), "the Service selects the server pods")
check(
    not selector.items() <= worker["spec"]["template"]["metadata"]["labels"].items(),
    "the Service does not select the workers",
)
budget = resources[("PodDisruptionBudget", "sked-server")]
check(
    budget["spec"]["minAvailable"] == 2
    and budget["spec"]["selector"]["matchLabels"].items() <= server_labels.items(),
    "the disruption budget keeps two server nodes",
)

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("every check passed")
