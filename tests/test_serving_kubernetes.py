"""`serving/kustomization.yaml` and `serving/kubernetes/`: every object valid against
Kubernetes' own OpenAPI schemas (kubernetes-validate, strict: no unknown field), and the
pieces agree with each other and with the container (`serving/Dockerfile`) and its configs."""

import json
import os
import re

import kubernetes_validate
import pytest
import yaml
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from tests.serving_helpers import REPO_ROOT

SERVING = os.path.join(REPO_ROOT, "serving")
#: The Kubernetes release the manifests are checked against.
KUBERNETES = "1.33"


def _kustomization():
    with open(os.path.join(SERVING, "kustomization.yaml")) as handle:
        return yaml.safe_load(handle)


def _objects():
    """Every object `kubectl apply -k serving` creates, the generated ConfigMap included."""
    kustomization = _kustomization()
    labels = {k: v for entry in kustomization["labels"] for k, v in entry["pairs"].items()}
    objects = []
    for resource in kustomization["resources"]:
        with open(os.path.join(SERVING, resource)) as handle:
            objects += [obj for obj in yaml.safe_load_all(handle) if obj]
    for generator in kustomization["configMapGenerator"]:
        data = {}
        for name in generator["files"]:
            with open(os.path.join(SERVING, name)) as handle:
                data[name] = handle.read()
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": generator["name"]}, "data": data})  # fmt: skip
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(labels)
    return objects


def _one(kind):
    (found,) = [obj for obj in _objects() if obj["kind"] == kind]
    return found


def _entrypoint():
    """The `ENTRYPOINT [...]` of serving/Dockerfile, and its FROM image."""
    with open(os.path.join(SERVING, "Dockerfile")) as handle:
        text = handle.read().replace("\\\n", "")
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    (image,) = re.findall(r"^FROM (\S+)$", text, re.M)
    return json.loads(entrypoint), image


@pytest.mark.parametrize("index", range(len(_objects())))
def test_every_object_is_valid_for_kubernetes(index):
    obj = _objects()[index]
    kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_the_validator_refuses_what_kubernetes_would():
    deployment = _one("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["containerPorts"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)
    service = _one("Service")
    service["spec"]["ports"][0]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES, strict=True)


def test_the_server_runs_as_the_container_does_with_the_repository_s_configs():
    entrypoint, image = _entrypoint()
    deployment = _one("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == image
    assert [*container["command"], *container["args"]] == entrypoint
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    # Every config file a flag names is in the mounted ConfigMap, which holds the files.
    config = _one("ConfigMap")
    assert volumes[mounts["/config"]["name"]]["configMap"]["name"] == config["metadata"]["name"]
    for flag in ("model_config_file", "batching_parameters_file", "monitoring_config_file"):
        folder, name = os.path.split(flags[flag])
        assert folder == "/config" and name in config["data"], flag
    # The models' base path lies on the volume every replica mounts read-only.
    models = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(config["data"]["models.config"], models)
    (model,) = models.model_config_list.config
    claim = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
    assert claim["claimName"] == _one("PersistentVolumeClaim")["metadata"]["name"]
    assert claim["readOnly"] and mounts["/models"]["readOnly"]
    assert model.base_path.startswith("/models/")
    # The probes ask for that model on the REST port; metrics are scraped where they are.
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (ports["grpc"], ports["http"]) == (int(flags["port"]), int(flags["rest_api_port"]))
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": f"/v1/models/{model.name}", "port": "http"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in config["data"]["monitoring.config"]
    assert annotations["prometheus.io/port"] == flags["rest_api_port"]


def test_the_service_the_budget_and_the_autoscaler_reach_the_server_s_pods():
    deployment = _one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    names = {port["name"] for port in container["ports"]}
    service = _one("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {port["targetPort"] for port in service["spec"]["ports"]} == names
    budget = _one("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    scaler = _one("HorizontalPodAutoscaler")
    target = scaler["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert scaler["spec"]["minReplicas"] == deployment["spec"]["replicas"]


KSERVE = os.path.join(SERVING, "kubernetes", "kserve", "inference-service.yaml")
# KServe's own fields of a predictor's model; the rest are a Kubernetes container's.
KSERVE_MODEL_FIELDS = {"modelFormat", "protocolVersion", "storageUri", "runtime", "runtimeVersion"}


def _inference_service():
    with open(KSERVE) as handle:
        return yaml.safe_load(handle)


def test_the_kserve_service_serves_the_models_volume_with_the_tensorflow_runtime():
    service = _inference_service()
    assert (service["apiVersion"], service["kind"]) == (
        "serving.kserve.io/v1beta1", "InferenceService"
    )  # fmt: skip
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["modelFormat"] == {"name": "tensorflow"} and model["protocolVersion"] == "v1"
    # pvc://<claim>/<folder>: the claim every replica of the Deployment mounts, the folder of
    # the model's versions; KServe names the model after the InferenceService.
    claim, folder = re.fullmatch(r"pvc://([^/]+)/(.+)", model["storageUri"]).groups()
    assert claim == _one("PersistentVolumeClaim")["metadata"]["name"]
    models = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(_one("ConfigMap")["data"]["models.config"], models)
    (served,) = models.model_config_list.config
    assert served.base_path == f"/models/{folder}"
    assert service["metadata"]["name"] == served.name
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    annotations = service["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert annotations["prometheus.io/path"] in _one("ConfigMap")["data"]["monitoring.config"]


def test_the_kserve_model_s_container_fields_are_valid_for_kubernetes():
    """KServe's model spec is a Kubernetes container with a few fields of its own: the rest
    is checked against Kubernetes' container schema, in a pod."""
    model = _inference_service()["spec"]["predictor"]["model"]
    container = {k: v for k, v in model.items() if k not in KSERVE_MODEL_FIELDS}
    assert container  # resources and securityContext at least
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "predictor"},
        "spec": {"containers": [{"name": "kserve-container", "image": "x", **container}]},
    }
    kubernetes_validate.validate(pod, KUBERNETES, strict=True)
    pod["spec"]["containers"][0]["resource"] = {}  # a typo Kubernetes would refuse
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)
