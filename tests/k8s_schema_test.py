"""deploy/k8s/ validated against the Kubernetes API schemas of the versions docs/deploy.md claims.

Under pytest (issue 32 §4), ctest k8s_schema:

    python -m pytest tests/k8s_schema_test.py::test_k8s_schema

Every built-in object of every manifest (Secret, DaemonSet, ConfigMap, ...) is validated,
strictly (an unknown field is an error, as `kubectl apply`'s default strict field
validation makes it), against the OpenAPI schemas of each claimed Kubernetes minor version
that kubernetes-validate (PyPI, in requirements.lock) bundles in its wheel: no network.
The PyTorchJob is a custom resource that Kubernetes has no schema for: its pod templates
(spec.pytorchReplicaSpecs.*.template) and its metadata are validated as core/v1
PodTemplate parts of each version, and its own fields against PYTORCHJOB_V1 below, the
fields of the Kubeflow training-operator's v1 CRD written out as a JSON schema. Then the
mutated manifests (a misspelt field, a wrong type, a missing required field, ...) must be
rejected with an error that names the field, so that the validation can fail.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any, Callable

import yaml
from elastic_run_testing import Checks

try:
    import jsonschema
    import kubernetes_validate
except ImportError as e:
    raise ImportError(f"{e}: kubernetes-validate is in requirements.lock; run scripts/setup-venv.sh") from e

_log = logging.getLogger(__name__)

# docs/deploy.md, "Kubernetes": every minor version from 1.30 to 1.37.
CLAIMED = [f"1.{minor}" for minor in range(30, 38)]

# The PyTorchJob's own fields, from kubeflow/training-operator v1.9.0 (the last release with
# the v1 API): the CRD manifests/base/crds/kubeflow.org_pytorchjobs.yaml (openAPIV3Schema of
# version v1, types and formats) and the admission webhook pkg/webhooks/pytorch/
# pytorchjob_webhook.go (replica types Master/Worker, a Worker when elastic, a container
# named "pytorch" with an image, Master replicas 1, Worker replicas >= 1, the name a
# DNS-1035 label). The enums of rdzvBackend and restartPolicy are the Go constants of
# pkg/apis/kubeflow.org/v1 (pytorch_types.go, common_types.go). The pod template is left
# open here: it is validated as a core/v1 PodTemplateSpec of each Kubernetes version.
INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
PYTORCHJOB_V1: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "$defs": {
        "replica": {
            "type": "object",
            "additionalProperties": False,
            "required": ["template"],
            "properties": {
                "replicas": INT32,
                "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                "template": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["containers"],
                            "properties": {
                                "containers": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {
                                        "type": "object",
                                        "required": ["image"],
                                        "properties": {"image": {"type": "string", "minLength": 1}},
                                    },
                                    "contains": {
                                        "type": "object",
                                        "required": ["name"],
                                        "properties": {"name": {"const": "pytorch"}},
                                    },
                                }
                            },
                        }
                    },
                },
            },
        }
    },
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v1"},
        "kind": {"const": "PyTorchJob"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "maxLength": 63, "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$"}},
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["pytorchReplicaSpecs"],
            "properties": {
                "runPolicy": {"type": "object"},
                "nprocPerNode": {"type": "string"},
                "elasticPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "minReplicas": INT32,
                        "maxReplicas": INT32,
                        "maxRestarts": INT32,
                        "nProcPerNode": INT32,
                        "rdzvPort": INT32,
                        "rdzvBackend": {"enum": ["c10d", "etcd", "etcd-v2"]},
                        "rdzvHost": {"type": "string"},
                        "rdzvId": {"type": "string"},
                        "standalone": {"type": "boolean"},
                        "metrics": {"type": "array"},
                        "rdzvConf": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                            },
                        },
                    },
                },
                "pytorchReplicaSpecs": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        "Master": {
                            "$ref": "#/$defs/replica",
                            "required": ["replicas"],
                            "properties": {"replicas": {"const": 1}},
                        },
                        "Worker": {"$ref": "#/$defs/replica", "properties": {"replicas": {"minimum": 1}}},
                    },
                },
            },
            "if": {"required": ["elasticPolicy"]},
            "then": {"properties": {"pytorchReplicaSpecs": {"required": ["Worker"]}}},
        },
    },
}


def describe(e: jsonschema.ValidationError) -> str:
    """The error as `kubectl` would name it: the field's path, then what is wrong."""
    return f"{'.'.join(str(p) for p in e.absolute_path) or '<top>'}: {e.message}"


def k8s_errors(obj: dict[str, Any], version: str) -> tuple[list[str], str | None]:
    """The errors of a built-in object against the strict schemas of `version`, and the
    version whose schemas were used (kubernetes-validate falls back to an older one)."""
    try:
        return [], kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [describe(e)], e.version


def pod_template(job: dict[str, Any], replica: str) -> dict[str, Any]:
    """A replica's pod template, with the job's metadata, as the core/v1 PodTemplate that
    the CRD's `template` field is (a PodTemplateSpec)."""
    template = job.get("spec", {}).get("pytorchReplicaSpecs", {}).get(replica, {}).get("template", {})
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": job.get("metadata", {}), "template": template}


def errors_of(obj: dict[str, Any], version: str) -> list[str]:
    """Every error of one manifest object against the schemas of one Kubernetes version."""
    if obj.get("kind") == "PyTorchJob":
        errs = [describe(e) for e in jsonschema.Draft202012Validator(PYTORCHJOB_V1).iter_errors(obj)]
        for replica in obj.get("spec", {}).get("pytorchReplicaSpecs", {}):
            sub, used = k8s_errors(pod_template(obj, replica), version)
            errs += [f"spec.pytorchReplicaSpecs.{replica}.{e}" if e.startswith("template") else e for e in sub]
            if used != version:
                errs.append(f"no schema of Kubernetes {version} for the PodTemplate (got {used})")
        return errs
    try:
        errs, used = k8s_errors(obj, version)
    except kubernetes_validate.SchemaNotFoundError as e:
        return [e.message]
    return errs + ([f"validated against the schemas of {used}, not {version}"] if used != version else [])


def load(repo: str) -> list[tuple[str, dict[str, Any]]]:
    k8s = os.path.join(repo, "deploy/k8s")
    docs = []
    for name in sorted(os.listdir(k8s)):
        if name.endswith(".yaml"):
            with open(os.path.join(k8s, name)) as f:
                docs += [(name, d) for d in yaml.safe_load_all(f) if d is not None]
    return docs


def check_manifests(check: Checks, docs: list[tuple[str, dict[str, Any]]]) -> None:
    for name, obj in docs:
        what = f"{name}: {obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        bad = {v: errors_of(obj, v) for v in CLAIMED}
        bad = {v: e for v, e in bad.items() if e}
        check(
            not bad,
            f"{what} is valid in Kubernetes {CLAIMED[0]} to {CLAIMED[-1]}"
            + "".join(f"\n    {v}: {e}" for v, errs in bad.items() for e in errs),
        )
    kinds = {obj.get("kind") for _, obj in docs}
    check(kinds >= {"Secret", "DaemonSet", "ConfigMap", "PyTorchJob"}, f"every kind was validated: {sorted(kinds)}")


Mutation = Callable[[dict[str, Any]], Any]


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "PyTorchJob":
        return obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


# (kind, what is wrong, the mutation, what the error must say: the field's path and words)
MUTATIONS: list[tuple[str, str, Mutation, list[str]]] = [
    (
        "DaemonSet",
        "a misspelt pod field (hostIpc)",
        lambda d: pod(d).update(hostIpc=True),
        ["spec.template.spec:", "'hostIpc' was unexpected"],
    ),
    (
        "DaemonSet",
        "containerPort as a string",
        lambda d: pod(d)["containers"][0]["ports"][0].update(containerPort="7480"),
        ["spec.template.spec.containers.0.ports.0.containerPort:", "not of type 'integer'"],
    ),
    ("DaemonSet", "no selector", lambda d: d["spec"].pop("selector"), ["spec:", "'selector' is a required property"]),
    (
        "DaemonSet",
        "a misspelt volume source (hostpath)",
        lambda d: pod(d)["volumes"][0].update(hostpath=pod(d)["volumes"][0].pop("hostPath")),
        ["spec.template.spec.volumes.0:", "'hostpath' was unexpected"],
    ),
    (
        "DaemonSet",
        "a probe's periodSeconds as a string",
        lambda d: pod(d)["containers"][0]["readinessProbe"].update(periodSeconds="5"),
        ["containers.0.readinessProbe.periodSeconds:", "not of type 'integer'"],
    ),
    (
        "Secret",
        "a misspelt field (stringdata)",
        lambda d: d.update(stringdata=d.pop("stringData")),
        ["<top>:", "'stringdata' was unexpected"],
    ),
    (
        "ConfigMap",
        "a data value that is not a string",
        lambda d: d["data"].update({"n": 4}),
        ["data.n:", "not of type 'string'"],
    ),
    (
        "ConfigMap",
        "immutable as a string",
        lambda d: d.update(immutable="yes"),
        ["immutable:", "not of type 'boolean'"],
    ),
    (
        "DaemonSet",
        "a volume mount without mountPath",
        lambda d: pod(d)["containers"][0]["volumeMounts"][0].pop("mountPath"),
        ["spec.template.spec.containers.0.volumeMounts.0:", "'mountPath' is a required property"],
    ),
    (
        "PyTorchJob",
        "a pod template's container without a name",
        lambda d: pod(d)["containers"][0].pop("name"),
        ["spec.pytorchReplicaSpecs.Worker.template.spec.containers.0:", "'name' is a required property"],
    ),
    (
        "PyTorchJob",
        "an env entry with a misspelt valueFrom",
        lambda d: pod(d)["containers"][0]["env"][1].update(
            valuefrom=pod(d)["containers"][0]["env"][1].pop("valueFrom")
        ),
        ["Worker.template.spec.containers.0.env.1:", "'valuefrom' was unexpected"],
    ),
    (
        "PyTorchJob",
        "a misspelt elasticPolicy field (rdzvbackend)",
        lambda d: d["spec"]["elasticPolicy"].update(rdzvbackend=d["spec"]["elasticPolicy"].pop("rdzvBackend")),
        ["spec.elasticPolicy:", "'rdzvbackend' was unexpected"],
    ),
    (
        "PyTorchJob",
        "minReplicas as a string",
        lambda d: d["spec"]["elasticPolicy"].update(minReplicas="1"),
        ["spec.elasticPolicy.minReplicas:", "not of type 'integer'"],
    ),
    (
        "PyTorchJob",
        "an unknown rendezvous backend",
        lambda d: d["spec"]["elasticPolicy"].update(rdzvBackend="c10"),
        ["spec.elasticPolicy.rdzvBackend:", "'c10' is not one of"],
    ),
    (
        "PyTorchJob",
        "an unknown replica type (Workers)",
        lambda d: d["spec"]["pytorchReplicaSpecs"].update(Workers=d["spec"]["pytorchReplicaSpecs"].pop("Worker")),
        ["spec.pytorchReplicaSpecs:", "'Workers' was unexpected"],
    ),
    (
        "PyTorchJob",
        "no container named pytorch",
        lambda d: pod(d)["containers"][0].update(name="trainer"),
        ["Worker.template.spec.containers:", "does not contain items matching"],
    ),
    (
        "PyTorchJob",
        "a misspelt replica field (restartpolicy)",
        lambda d: d["spec"]["pytorchReplicaSpecs"]["Worker"].update(restartpolicy="OnFailure"),
        ["spec.pytorchReplicaSpecs.Worker:", "'restartpolicy' was unexpected"],
    ),
    (
        "PyTorchJob",
        "its only replica type a Master (elastic needs a Worker)",
        lambda d: d["spec"]["pytorchReplicaSpecs"].update(Master=d["spec"]["pytorchReplicaSpecs"].pop("Worker")),
        ["spec.pytorchReplicaSpecs:", "'Worker' is a required property"],
    ),
    (
        "PyTorchJob",
        "0 Worker replicas",
        lambda d: d["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas=0),
        ["spec.pytorchReplicaSpecs.Worker.replicas:", "less than the minimum of 1"],
    ),
    (
        "PyTorchJob",
        "a misspelt metadata field (label)",
        lambda d: d["metadata"].update(label={"a": "b"}),
        ["metadata:", "'label' was unexpected"],
    ),
    (
        "PyTorchJob",
        "no pytorchReplicaSpecs",
        lambda d: d["spec"].pop("pytorchReplicaSpecs"),
        ["spec:", "'pytorchReplicaSpecs' is a required property"],
    ),
    (
        "PyTorchJob",
        "a job name that is not a DNS-1035 label",
        lambda d: d["metadata"].update(name="Tenplex_GPT"),
        ["metadata.name:", "does not match"],
    ),
]


def check_mutations(check: Checks, docs: list[tuple[str, dict[str, Any]]]) -> None:
    by_kind = {obj["kind"]: obj for _, obj in docs}
    for kind, what, mutate, expect in MUTATIONS:
        obj = copy.deepcopy(by_kind[kind])
        try:
            mutate(obj)
        except (KeyError, IndexError) as e:
            check(False, f"{kind} with {what}: the mutation no longer fits the manifest (no {e})")
            continue
        for version in (CLAIMED[0], CLAIMED[-1]):
            errs = errors_of(obj, version)
            named = [e for e in errs if all(x in e for x in expect)]
            check(bool(named), f"{kind} with {what} is rejected in {version}: {named[:1] or errs}")


def test_k8s_schema(repo: str) -> None:
    _log.info("kubernetes-validate %s, claimed Kubernetes versions %s", kubernetes_validate.__version__, CLAIMED)
    check = Checks()
    t0 = time.time()
    docs = load(repo)
    check_manifests(check, docs)
    check_mutations(check, docs)
    _log.info(
        "%d objects x %d versions and %d mutations in %.1f s", len(docs), len(CLAIMED), len(MUTATIONS), time.time() - t0
    )
    check.finish()
