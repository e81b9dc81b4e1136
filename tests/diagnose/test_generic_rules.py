"""Rules of no engine (``<rules root>/_generic/``, docs/rules.md): a program every engine runs under or on prints them
(the NVIDIA container runtime, an accelerator's runtime). The loader copies each into every engine's rules as
``<engine>.<id>``: a log of any engine is read by it, and a paste that names no engine finds no engine in it (and
reports the rule's own id)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules, load_rules
from oomdoctor.errors import RuleError

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
RULES = default_rules()

ENGINE_YAML = "engine: {name}\nname: {name}\ndetect: [\"{name} engine starting\"]\ndetect_lines: [\"{name} engine starting\"]\n"
GENERIC = textwrap.dedent("""\
    id: runtime.demo_fault
    engine: any
    class: not_memory
    patterns:
      - regex: "demo runtime fault: (?P<detail>.+)"
    """)


def _root(tmp_path: Path, generic: str, layout: str = "plain") -> Path:
    root = tmp_path / "rules"
    for name in ("alpha", "beta"):
        edir = root / name / "rules" if layout == "package" else root / name
        edir.mkdir(parents=True)
        (edir / "engine.yaml").write_text(ENGINE_YAML.format(name=name))
    gdir = root / "_generic" / "rules" if layout == "package" else root / "_generic"
    gdir.mkdir(parents=True)
    (gdir / "demo.yaml").write_text(generic)
    return root


@pytest.mark.parametrize("layout", ["plain", "package"])
def test_a_generic_rule_is_copied_into_every_engine(tmp_path, layout):
    rs = load_rules(_root(tmp_path, GENERIC, layout))
    assert sorted((r.id, r.engine) for r in rs.rules) == [("alpha.runtime.demo_fault", "alpha"),
                                                          ("beta.runtime.demo_fault", "beta")]
    assert "_generic" not in rs.engines


def test_a_generic_rule_that_names_an_engine_is_refused(tmp_path):
    with pytest.raises(RuleError, match="names no engine"):
        load_rules(_root(tmp_path, GENERIC.replace("engine: any", "engine: alpha")))


def test_a_paste_of_a_generic_failure_names_no_engine(tmp_path):
    rs = load_rules(_root(tmp_path, GENERIC))
    log = tmp_path / "paste.log"
    log.write_text("demo runtime fault: device node missing\n")
    d = diagnose_file(log, rs)
    assert (d.klass, d.engine, d.rule) == ("not_memory", None, "runtime.demo_fault")   # its own id, no engine's
    assert [e["rule"] for e in d.evidence] == ["runtime.demo_fault"]


def test_a_log_of_an_engine_takes_that_engines_copy(tmp_path):
    rs = load_rules(_root(tmp_path, GENERIC))
    log = tmp_path / "beta.log"
    log.write_text("beta engine starting\ndemo runtime fault: device node missing\n")
    d = diagnose_file(log, rs)
    assert (d.klass, d.engine, d.rule) == ("not_memory", "beta", "beta.runtime.demo_fault")


def test_the_bundled_generic_rules_are_every_engines():
    for rid in ("container.nvidia_container_cli", "neuron.device_alloc_failed", "process.fatal_signal",
                "process.cxx_terminate", "process.cxx_what", "torch.oom_figures", "hami.device_quota_oom"):
        assert sorted(r.engine for r in RULES.rules if r.id.endswith("." + rid)) == sorted(RULES.engines)


@pytest.mark.parametrize("name", ["enroot_driver_not_loaded.log", "mount_error.log"])
def test_a_container_runtime_error_is_not_memory_and_names_no_engine(name):
    d = diagnose_file(LOGS / "nvidia-container-cli-quoted" / name, RULES)
    assert (d.klass, d.engine, d.rule) == ("not_memory", None, "container.nvidia_container_cli")


def test_a_neuron_device_allocation_failure_is_an_oom_of_a_likely_phase():
    d = diagnose_file(LOGS / "neuron-runtime-quoted" / "hbm_alloc_failed.log", RULES)
    assert (d.klass, d.phase, d.engine, d.phase_basis_kind, d.confidence) == (
        "weights_load_oom", "weights_load", None, "likely", "low")
    assert d.settle                      # the card names the lines that would settle the phase


def test_the_runtimes_info_breakdown_is_no_failure():
    d = diagnose_file(LOGS / "neuron-runtime-quoted" / "neff_memory_info.log", RULES)
    assert (d.klass, d.rule) == ("unknown", None)


def test_an_uncaught_cuda_error_of_no_engine_is_not_memory_and_names_no_engine():
    # libstdc++'s terminate report (it used to be LMDeploy's rule, so any C++ abort was called LMDeploy's)
    d = diagnose_file(LOGS / "cxx-terminate-quoted" / "cuda_error_what.log", RULES)
    assert (d.klass, d.engine, d.rule, d.root.n) == ("not_memory", None, "process.cxx_what", 3)


def test_an_uncaught_out_of_memory_error_is_still_a_memory_failure():
    d = diagnose_file(LOGS / "cxx-terminate-quoted" / "oom_what.log", RULES)
    assert d.is_memory_failure and d.rule.endswith("cuda_oom.torch") and d.root.n == 3


def test_turbominds_uncaught_oom_stays_lmdeploys():
    d = diagnose_file(LOGS / "field-guide" / "oe-049.log", RULES)
    assert (d.klass, d.engine) == ("runtime_oom", "lmdeploy")


TOOLS = {   # fixtures/logs/<folder>/<file>: the rule of oomdoctor/engines/_generic/rules/tools.yaml that reads it
    "shell-formatstrings/bash_script.log": "shell.command_not_found",
    "shell-formatstrings/zsh.log": "shell.command_not_found",
    "shell-formatstrings/dash.log": "shell.command_not_found",
    "nohup-formatstrings/failed_to_run.log": "nohup.failed_to_run",
    "build-formatstrings/make_link_failed.log": "build.ld_cannot_find",       # the linker's line, before collect2 and make
    "build-formatstrings/make_old_error.log": "build.make_error",
    "build-formatstrings/collect2_only.log": "build.collect2_ld_failed",
    "urllib3-formatstrings/requests_refused_1.26.log": "client.connection_failed",
    "urllib3-formatstrings/urllib3_2_refused.log": "client.connection_failed",
    "transformers-formatstrings/trust_remote_code_4.30.log": "transformers.trust_remote_code",
    "transformers-formatstrings/trust_remote_code_4.46.log": "transformers.trust_remote_code",
    "triton-formatstrings/model_load_failed.log": "triton.model_load_failed",
}


@pytest.mark.parametrize("rel", sorted(TOOLS))
def test_a_tools_failure_is_not_memory_and_names_no_engine(rel):
    d = diagnose_file(LOGS / rel, RULES)
    assert (d.klass, d.engine, d.rule) == ("not_memory", None, TOOLS[rel])   # its own id, not an engine's fallback


def test_the_tools_rules_are_every_engines():
    for rid in set(TOOLS.values()):
        assert sorted(r.engine for r in RULES.rules if r.id.endswith("." + rid)) == sorted(RULES.engines)


def test_a_memory_error_that_triton_relays_is_read_as_one():
    # Triton's "failed to load 'M' version 1: Internal: <the back end's error>": the relayed torch OOM is the root
    d = diagnose_file(LOGS / "triton-formatstrings" / "model_load_oom.log", RULES)
    assert d.is_memory_failure and d.klass == "weights_load_oom" and d.rule != "triton.model_load_failed"
    assert d.numbers["tried_to_allocate_bytes"] == 896 * 2**20
    assert diagnose_file(LOGS / "triton-formatstrings" / "models_loaded.log", RULES).klass == "unknown"


def test_a_client_that_found_no_server_does_not_hide_the_servers_oom(tmp_path):
    # the server ran out of memory at start-up; the benchmark client pasted after it could not connect
    log = tmp_path / "server_then_client.log"
    log.write_text((LOGS / "vllm-0.33.0-formatstrings" / "kv_capacity.log").read_text(encoding="utf-8")
                   + (LOGS / "urllib3-formatstrings" / "requests_refused_1.26.log").read_text(encoding="utf-8"))
    d = diagnose_file(log, RULES)
    assert (d.klass, d.engine) == ("kv_capacity", "vllm")


def test_a_wait_loops_print_of_a_refused_try_is_no_failure(tmp_path):
    # a script polling /health while the server starts prints each refused try (not the exception's own line)
    log = tmp_path / "wait.log"
    log.write_text("Server not ready: HTTPConnectionPool(host='0.0.0.0', port=8000): Max retries exceeded with url: "
                   "/health (Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7d30b0f93950>: "
                   "Failed to establish a new connection: [Errno 111] Connection refused'))\n", encoding="utf-8")
    d = diagnose_file(log, RULES)
    assert d.root is None and d.klass == "unknown"


def test_an_nccl_error_whose_last_error_is_an_allocation_is_a_memory_failure_of_the_engines_phase(tmp_path):
    # a vLLM worker's NCCL error that quotes NCCL's last error (ncclGetErrorString's "unhandled cuda error", then
    # the WARN's own text, nccl-formatstrings/ORIGIN.md), after the weights loaded: not vllm.other.nccl's fault
    h200 = (LOGS / "vllm-0.25.1-h200" / "A_pass.log").read_text(encoding="utf-8").splitlines()[:30]
    p = tmp_path / "tp.log"
    p.write_text("\n".join(h200 + [
        "(EngineCore pid=1271) ERROR 11-29 15:06:23 [core.py:1231] torch.distributed.DistBackendError: NCCL error in:"
        " ../torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for"
        " details), NCCL version 2.27.3",
        "(EngineCore pid=1271) ERROR 11-29 15:06:23 [core.py:1231] ncclUnhandledCudaError: Call to CUDA function failed.",
        "(EngineCore pid=1271) ERROR 11-29 15:06:23 [core.py:1231] Last error:",
        "(EngineCore pid=1271) ERROR 11-29 15:06:23 [core.py:1231] Cuda failure 'out of memory'",
    ]) + "\n", encoding="utf-8")
    d = diagnose_file(p, RULES)
    assert (d.rule, d.klass, d.engine) == ("vllm.nccl.cuda_oom", "profiling_oom", "vllm"), (d.rule, d.klass)
