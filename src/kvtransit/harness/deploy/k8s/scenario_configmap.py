"""The scenario as a ConfigMap, and the agents' scenario flags read from it.

One key per `Scenario` field, its value the text `Scenario.to_argv()` gives the field (so every field is spelled
out, as in the compose testbed's .env), read back by `model.scenario.field_from_text`: the map round-trips to the
same `Scenario`. The pods take the map as environment (`envFrom` with the prefix below) and their argv names each
field's variable (`--prompt-mean $(KVTRANSIT_SCENARIO_prompt_mean)`), which the kubelet expands before the process
starts: the ConfigMap is the one copy of the scenario in the cluster, and every process reads the same one.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvtransit.harness.deploy import flow_deploy
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import REAL_MODEL_KV, Scenario, field_names, flag_for
from kvtransit.model.scenario_text import field_from_text

ENV_PREFIX = "KVTRANSIT_SCENARIO_"
# Fields that name a file the processes read. A pod cannot read this host's files, so a scenario that sets one is
# refused by the renderers until the file is baked into the image (the default needs no file).
HOST_FILE_FIELDS = {"trace": "", "kv_sample": "synthetic"}


def scenario_data(scenario: Scenario) -> dict[str, str]:
    """Field name → its text, in field order (`to_argv` pairs each flag with its value's text)."""
    values = scenario.to_argv()[1::2]
    return dict(zip(field_names(), values, strict=True))


def scenario_from_data(data: Mapping[str, str], where: str = "the scenario ConfigMap") -> Scenario:
    """The `Scenario` a ConfigMap's data describes; a missing or unknown key is a ConfigError naming it."""
    missing = [name for name in field_names() if name not in data]
    unknown = sorted(set(data) - set(field_names()))
    if missing or unknown:
        said = "; ".join(part for part in (f"missing {', '.join(missing)}" if missing else "",
                                           f"unknown {', '.join(unknown)}" if unknown else "") if part)
        raise ConfigError(f"{where}: not a kvtransit scenario ({said})")
    return Scenario.build(**{name: field_from_text(name, data[name]) for name in field_names()})


def scenario_configmap(scenario: Scenario, name: str, labels: Mapping[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": dict(labels)},
            "data": scenario_data(scenario)}


def scenario_args() -> list[str]:
    """Every scenario flag with its value from the pod's environment (`$(VAR)`, expanded by the kubelet)."""
    args: list[str] = []
    for name in field_names():
        args += [flag_for(name), f"$({ENV_PREFIX}{name})"]
    return args


def scenario_env_from(configmap: str) -> list[dict]:
    return [{"configMapRef": {"name": configmap}, "prefix": ENV_PREFIX}]


def expand(args: list[str], data: Mapping[str, str]) -> list[str]:
    """What the kubelet makes of `scenario_args()` given the ConfigMap's data (for tests and checks)."""
    env = {f"{ENV_PREFIX}{key}": value for key, value in data.items()}
    out = []
    for arg in args:
        if arg.startswith("$(") and arg.endswith(")") and arg[2:-1] in env:
            out.append(env[arg[2:-1]])
        else:
            out.append(arg)
    return out


def refuse_host_files(scenario: Scenario, what: str) -> None:
    """A scenario that reads a file of this host cannot run in a pod: say which field and why."""
    if scenario.kv_sample == REAL_MODEL_KV:
        raise ConfigError(f"--kv-sample {REAL_MODEL_KV}: {what} runs in pods, whose image has no real-model extra "
                          "(torch, transformers, the model file); run it with `kvtransit up` on a host with "
                          "pip install -e '.[realkv]', or leave --kv-sample at synthetic")
    if why := flow_deploy.refusal(scenario, "k8s", what):  # a flow the pods do not carry yet
        raise ConfigError(why)
    for field_name, default in HOST_FILE_FIELDS.items():
        value = getattr(scenario, field_name)
        if value != default:
            raise ConfigError(f"{flag_for(field_name)} {value}: {what} runs in pods, which cannot read this host's "
                              f"files; bake the file into the image and run it there, or leave "
                              f"{flag_for(field_name)} at {default or 'its default'!s}")
