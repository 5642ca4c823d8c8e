"""Loaded (via PYTHONPATH) only into `sam local invoke` by tests/sam-local.sh.

SAM's `--docker-network host` skips connecting the container to a network but
does not ask for host networking, so with podman's Docker API the function runs
on a bridge and cannot reach moto on the host's 127.0.0.1. This shim makes
SAM's container truly share the host network: it sets `network_mode="host"`,
drops the (then meaningless) port mapping, and tells the runtime interface
emulator to listen on the host port SAM will call. Everything stays on loopback.
"""

try:
    import docker.models.containers as _containers
except Exception:  # noqa: BLE001 - not SAM, nothing to do
    _containers = None

if _containers is not None:
    _original_create = _containers.ContainerCollection.create

    def _create(self, image, command=None, **kwargs):
        ports = kwargs.get("ports") or {}
        entry = kwargs.get("entrypoint")
        rapid = ports.get(8080) or ports.get("8080/tcp") or ports.get("8080")
        if rapid and isinstance(entry, list) and entry and entry[0].endswith("aws-lambda-rie"):
            host_port = rapid[1] if isinstance(rapid, tuple) else rapid
            kwargs.pop("ports", None)
            kwargs["network_mode"] = "host"
            kwargs["entrypoint"] = entry + ["--runtime-interface-emulator-address", f"127.0.0.1:{host_port}"]
        return _original_create(self, image, command, **kwargs)

    _containers.ContainerCollection.create = _create
