"""`training/kubernetes/train-job.yaml`: an Indexed Job whose pod index is the JAX process id.
Every object valid against Kubernetes' own schemas (kubernetes-validate, strict), the pieces
agreeing with each other and with `training/Dockerfile`, and the Job's command run on this
machine as two processes with the environment the Job gives its pods."""

import json
import os
import re
import socket
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from tests.limits import limit
from tests.serving_helpers import REPO_ROOT

KUBERNETES = "1.33"
JOB_FILE = os.path.join(REPO_ROOT, "training", "kubernetes", "train-job.yaml")
INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def _objects():
    with open(JOB_FILE) as handle:
        return [obj for obj in yaml.safe_load_all(handle) if obj]


def _one(kind, name=None):
    (found,) = [
        o for o in _objects() if o["kind"] == kind and name in (None, o["metadata"]["name"])
    ]
    return found


def _container():
    (container,) = _one("Job")["spec"]["template"]["spec"]["containers"]
    return container


def _env(container):
    return {entry["name"]: entry for entry in container["env"]}


@pytest.mark.parametrize("index", range(len(_objects())))
def test_every_object_is_valid_for_kubernetes(index):
    kubernetes_validate.validate(_objects()[index], KUBERNETES, strict=True)


def test_the_pod_index_is_the_process_id_and_pod_0_the_coordinator():
    job, service = _one("Job"), _one("Service")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"]  # every process runs at once
    env = _env(_container())
    assert env["KERAS_DISTRIBUTION_NUM_PROCESSES"]["value"] == str(spec["completions"])
    assert env["KERAS_DISTRIBUTION_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        INDEX_FIELD
    )
    assert env["KERAS_BACKEND"]["value"] == "jax"
    # Pod 0's DNS name: <job>-0.<subdomain>, the headless Service of the Job's pods.
    host, port = env["KERAS_DISTRIBUTION_JOB_ADDRESSES"]["value"].split(":")
    name = job["metadata"]["name"]
    assert (
        host == f"{name}-0.{pod['subdomain']}" and pod["subdomain"] == service["metadata"]["name"]
    )
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    (service_port,) = service["spec"]["ports"]
    assert int(port) == ports[service_port["targetPort"]] == service_port["port"]


def test_the_job_runs_the_image_s_command_on_its_volumes():
    with open(os.path.join(REPO_ROOT, "training", "Dockerfile")) as handle:
        (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", handle.read(), re.M)
    container = _container()
    assert container["command"] == json.loads(entrypoint)
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])
    assert os.path.isfile(os.path.join(REPO_ROOT, flags["config"]))  # the image's WORKDIR
    pod = _one("Job")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for flag in ("data-dir", "output-dir"):
        (mount,) = [path for path in mounts if flags[flag].startswith(path + "/")]
        claim = volumes[mounts[mount]["name"]]["persistentVolumeClaim"]["claimName"]
        assert _one("PersistentVolumeClaim", claim)
    assert "ReadWriteMany" in _one("PersistentVolumeClaim", "antisym-runs")["spec"]["accessModes"]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("jax") is None, reason="needs JAX")
def test_the_job_s_command_trains_as_two_processes_with_the_pods_environment(tmp_path):
    """The Job's command and environment, with what only a cluster has replaced: pod 0's
    DNS name by 127.0.0.1, the volumes by folders here, the paper config (which needs
    Fashion-MNIST) by a small digits run. Both processes end 0; process 0 writes the run."""
    container = _container()
    port = _free_port()
    config = tmp_path / "small.yaml"
    config.write_text("task: digits\nunits: 8\nbatch_size: 32\nsteps: 4\nlog_every: 2\n"
                      "checkpoint_every: 2\n")  # fmt: skip
    (tmp_path / "data").mkdir()
    local = {"config": str(config), "data-dir": str(tmp_path / "data"),
             "output-dir": str(tmp_path / "run")}  # fmt: skip
    args = []
    for arg in container["args"]:
        flag = arg.removeprefix("--").split("=", 1)[0]
        args.append(f"--{flag}={local[flag]}")
    assert container["command"][0] == "python"
    command = [sys.executable, *container["command"][1:], *args]
    processes = []
    for index in range(int(_env(container)["KERAS_DISTRIBUTION_NUM_PROCESSES"]["value"])):
        env = {k: os.environ[k] for k in ("PATH", "PYTHONPATH", "LANG") if k in os.environ}
        for name, entry in _env(container).items():
            env[name] = str(index) if "valueFrom" in entry else entry["value"]
        host = env["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(":")[0]
        env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] = f"127.0.0.1:{port}"
        env["HOME"] = str(tmp_path)
        env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
        log = open(tmp_path / f"process-{index}.log", "w")  # noqa: SIM115 - the child's
        processes.append(
            subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()
    assert host.endswith(".antisym-train")
    try:
        statuses = [process.wait(timeout=limit(240)) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    logs = [(tmp_path / f"process-{i}.log").read_text() for i in range(len(processes))]
    assert statuses == [0, 0], "\n".join(log[-2000:] for log in logs)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["steps"] == 4
    # One collective of two ranks; the pod of index 0 is the chief that wrote the run.
    for index, log in enumerate(logs):
        assert f"Rank {index} is connected to 1 peer ranks" in log, log[-2000:]
    assert "[chief]" in logs[0] and "[chief]" not in logs[1]
