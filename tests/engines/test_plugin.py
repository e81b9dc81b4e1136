"""The vLLM plugin against a FAKE minimal vLLM (no torch, no GPU): the same names and call chain as
vLLM 0.25.1 / 0.33.0 — EngineArgs.create_engine_config (mutating defaults like the real one), LLM ->
LLMEngine.from_engine_args -> LLMEngine.__init__ -> launch_core_engines -> an EngineCore child process
(fork, or spawn with the plugin loaded through its entry point) -> wait_for_engine_startup raising
"Engine core initialization failed", and vllm.plugins.load_general_plugins over entry points.

The engine core child prints vLLM 0.25.1's real start-up-check ValueError (tests/../fixtures B_fail)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from oomdoctor.card import store as cardmod

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30
H200_TOTAL = 150_754_820_096

FAKE_VLLM = {
    "vllm/__init__.py": '''
        __version__ = "0.25.1"
        def __getattr__(name):
            if name == "LLM":
                from vllm.entrypoints.llm import LLM
                return LLM
            raise AttributeError(name)
    ''',
    "vllm/logger.py": '''
        import logging, sys
        _FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
        def _configure_vllm_root_logger():
            lg = logging.getLogger("vllm")
            for h in list(lg.handlers):          # what logging.config.dictConfig does to a configured logger
                lg.removeHandler(h)
            h = logging.StreamHandler(sys.stdout)
            h.setFormatter(logging.Formatter(_FORMAT, "%m-%d %H:%M:%S"))
            lg.addHandler(h)
            lg.setLevel(logging.INFO)
            lg.propagate = False
        def init_logger(name):
            return logging.getLogger(name)
        _configure_vllm_root_logger()
    ''',
    "vllm/envs.py": '''
        import os
        def __getattr__(name):
            if name == "VLLM_PLUGINS":
                return None if "VLLM_PLUGINS" not in os.environ else os.environ["VLLM_PLUGINS"].split(",")
            raise AttributeError(name)
    ''',
    "vllm/plugins/__init__.py": '''
        import logging
        import vllm.envs as envs
        logger = logging.getLogger(__name__)
        DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
        plugins_loaded = False
        def load_plugins_by_group(group):
            from importlib.metadata import entry_points
            allowed = envs.VLLM_PLUGINS
            out = {}
            for ep in entry_points(group=group):
                if allowed is None or ep.name in allowed:
                    try:
                        out[ep.name] = ep.load()
                    except Exception:
                        logger.exception("Failed to load plugin %s", ep.name)
            return out
        def load_general_plugins():
            global plugins_loaded
            if plugins_loaded:
                return
            plugins_loaded = True
            for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
                func()
    ''',
    "vllm/usage/__init__.py": "",
    "vllm/usage/usage_lib.py": '''
        from enum import Enum
        class UsageContext(str, Enum):
            UNKNOWN_CONTEXT = "UNKNOWN_CONTEXT"
            LLM_CLASS = "LLM_CLASS"
            OPENAI_API_SERVER = "OPENAI_API_SERVER"
            ENGINE_CONTEXT = "ENGINE_CONTEXT"
    ''',
    "vllm/config.py": '''
        from dataclasses import dataclass, field
        @dataclass
        class CompilationConfig:
            mode: int = 3
            cudagraph_capture_sizes: list = field(default_factory=list)
        @dataclass
        class ModelConfig:
            model: str
            max_model_len: int
            enforce_eager: bool = False
            quantization: str = None
            dtype: str = "bfloat16"
        @dataclass
        class CacheConfig:
            gpu_memory_utilization: float
            kv_cache_memory_bytes: int = None
            cache_dtype: str = "auto"
            block_size: int = 16
        @dataclass
        class SchedulerConfig:
            max_num_seqs: int
            max_num_batched_tokens: int
        @dataclass
        class ParallelConfig:
            tensor_parallel_size: int = 1
            pipeline_parallel_size: int = 1
            data_parallel_size: int = 1
        @dataclass
        class VllmConfig:
            model_config: ModelConfig
            cache_config: CacheConfig
            scheduler_config: SchedulerConfig
            parallel_config: ParallelConfig
    ''',
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": '''
        import json, logging, os
        from dataclasses import dataclass, field
        from vllm.config import (CacheConfig, CompilationConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                                 VllmConfig)
        from vllm.usage.usage_lib import UsageContext
        logger = logging.getLogger(__name__)
        @dataclass
        class EngineArgs:
            model: str = "Qwen/Qwen3-0.6B"
            max_model_len: int = None
            gpu_memory_utilization: float = 0.92
            kv_cache_memory_bytes: int = None
            kv_cache_dtype: str = "auto"
            max_num_seqs: int = None
            max_num_batched_tokens: int = None
            block_size: int = None
            enforce_eager: bool = False
            tensor_parallel_size: int = 1
            pipeline_parallel_size: int = 1
            quantization: str = None
            disable_log_stats: bool = False
            revision: str = None
            hf_token: str = None
            compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
            def __post_init__(self):
                if isinstance(self.compilation_config, dict):
                    self.compilation_config = CompilationConfig(**self.compilation_config)
                from vllm.plugins import load_general_plugins
                load_general_plugins()
            @classmethod
            def from_cli_args(cls, ns):
                import dataclasses
                return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)})
            def create_engine_config(self, usage_context=None, headless=False):
                if not 0 < self.gpu_memory_utilization <= 1:
                    raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
                try:
                    derived = json.load(open(os.path.join(self.model, "config.json")))["max_position_embeddings"]
                except OSError:
                    derived = 2048
                if self.max_model_len is not None and self.max_model_len > derived:
                    raise ValueError(f"User-specified max_model_len ({self.max_model_len}) is greater than the derived "
                                     f"max_model_len (max_position_embeddings={derived} in model's config.json).")
                mml = self.max_model_len or derived
                logger.info("Using max model len %s", mml)
                # like vLLM: the defaults are resolved INTO the EngineArgs instance
                if self.max_num_batched_tokens is None:
                    self.max_num_batched_tokens = 16384 if usage_context == UsageContext.LLM_CLASS else 8192
                if self.max_num_seqs is None:
                    self.max_num_seqs = 1024
                return VllmConfig(
                    ModelConfig(self.model, mml, self.enforce_eager, self.quantization),
                    CacheConfig(self.gpu_memory_utilization, self.kv_cache_memory_bytes, self.kv_cache_dtype,
                                self.block_size or 16),
                    SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens),
                    ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size))
        @dataclass
        class AsyncEngineArgs(EngineArgs):
            enable_log_requests: bool = False
    ''',
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/utils.py": '''
        import logging, math, multiprocessing, os, sys
        logger = logging.getLogger(__name__)
        def format_gib(b):
            return f"{round(b / (1 << 30), 2)}"
        def run_engine_core(vllm_config):
            from vllm.plugins import load_general_plugins
            load_general_plugins()
            lg = logging.getLogger("vllm.v1.engine.core")
            lg.info("Initializing a V1 LLM engine (v0.25.1) with config: model=%r, max_seq_len=%d, "
                    "tensor_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto",
                    vllm_config.model_config.model, vllm_config.model_config.max_model_len)
            free = int(os.environ.get("FAKE_FREE_BYTES", str(140 << 30)))
            total = int(os.environ.get("FAKE_TOTAL_BYTES", "150109880320"))
            util = vllm_config.cache_config.gpu_memory_utilization
            requested = math.ceil(total * util)
            if free < requested:
                try:
                    raise ValueError(
                        f"Free memory on device cuda:0 ({format_gib(free)}/{format_gib(total)} GiB) on startup is less "
                        f"than desired GPU memory utilization ({util}, {format_gib(requested)} GiB). Decrease GPU "
                        f"memory utilization or reduce GPU memory used by other processes.")
                except ValueError:
                    lg.exception("EngineCore failed to start.")
                    sys.exit(1)
            lg.info("init engine (profile, create kv cache, warmup model) took 1.00 seconds")
        def wait_for_engine_startup(proc):
            proc.join(60)
            if proc.exitcode != 0:
                raise RuntimeError("Engine core initialization failed. See root cause above. "
                                   f"Failed core proc(s): {{'EngineCore': {proc.exitcode}}}")
        def launch_core_engines(vllm_config):
            ctx = multiprocessing.get_context(os.environ.get("FAKE_VLLM_MP", "fork"))
            p = ctx.Process(target=run_engine_core, name="EngineCore", args=(vllm_config,))
            p.start()
            wait_for_engine_startup(p)
    ''',
    "vllm/v1/engine/llm_engine.py": '''
        from vllm.usage.usage_lib import UsageContext
        class LLMEngine:
            def __init__(self, vllm_config, executor_class=None, log_stats=False,
                         usage_context=UsageContext.ENGINE_CONTEXT, multiprocess_mode=True):
                from vllm.v1.engine.utils import launch_core_engines
                launch_core_engines(vllm_config)
                self.vllm_config = vllm_config
            @classmethod
            def from_engine_args(cls, engine_args, usage_context=UsageContext.ENGINE_CONTEXT):
                vllm_config = engine_args.create_engine_config(usage_context)
                return cls(vllm_config=vllm_config, usage_context=usage_context)
    ''',
    "vllm/v1/engine/async_llm.py": '''
        from vllm.usage.usage_lib import UsageContext
        class AsyncLLM:
            def __init__(self, vllm_config, executor_class=None, log_stats=False,
                         usage_context=UsageContext.ENGINE_CONTEXT):
                from vllm.v1.engine.utils import launch_core_engines
                launch_core_engines(vllm_config)
                self.vllm_config = vllm_config
            @classmethod
            def from_vllm_config(cls, vllm_config, usage_context=UsageContext.ENGINE_CONTEXT):
                return cls(vllm_config=vllm_config, usage_context=usage_context)
    ''',
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/llm.py": '''
        import logging
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.llm_engine import LLMEngine
        logger = logging.getLogger("vllm.entrypoints.serve.utils.api_utils")
        class LLM:
            def __init__(self, model, *, gpu_memory_utilization=0.92, **kwargs):
                kwargs.setdefault("disable_log_stats", True)
                engine_args = EngineArgs(model=model, gpu_memory_utilization=gpu_memory_utilization, **kwargs)
                logger.info("non-default args: %s", {"model": model, **kwargs})
                self.llm_engine = LLMEngine.from_engine_args(engine_args, usage_context=UsageContext.LLM_CLASS)
    ''',
    "vllm/entrypoints/serve_fake.py": '''
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM
        def serve(ns):
            engine_args = AsyncEngineArgs.from_cli_args(ns)
            vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
            return AsyncLLM.from_vllm_config(vllm_config, usage_context=UsageContext.OPENAI_API_SERVER)
    ''',
}


def write_fake_vllm(root: Path) -> None:
    for rel, src in FAKE_VLLM.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(src).lstrip("\n"))


def write_entry_point(root: Path) -> None:
    """A dist-info that declares oomdoctor's entry point (what `pip install oomdoctor` leaves behind)."""
    d = root / "oomdoctor_plugin_shim-0.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: oomdoctor-plugin-shim\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text("[vllm.general_plugins]\noomdoctor = oomdoctor.engines.vllm.plugin:register\n")


def purge_vllm() -> None:
    for m in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[m]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fresh fake vLLM on sys.path, a model folder, an incidents folder, the plugin state reset."""
    from oomdoctor.engines.vllm import plugin

    site = tmp_path / "site"
    write_fake_vllm(site)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4_000_000,
                                                   "model_type": "llama"}))
    inc = tmp_path / "incidents"
    purge_vllm()
    plugin._reset_for_tests()
    monkeypatch.syspath_prepend(str(site))
    for k in list(os.environ):
        if k.startswith("OOMDOCTOR_") or k.startswith("FAKE_") or k == "VLLM_PLUGINS":
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OOMDOCTOR_INCIDENTS", str(inc))
    monkeypatch.setenv("OOMDOCTOR_NO_NVML", "1")
    monkeypatch.chdir(tmp_path)
    yield {"site": site, "model": str(model), "inc": inc, "tmp": tmp_path}
    plugin._reset_for_tests()
    logging.getLogger("vllm").handlers.clear()
    purge_vllm()


def starts(inc: Path) -> list[dict]:
    p = inc / "starts.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def fake_device(free: int, total: int = H200_TOTAL) -> dict:
    return {"status": "captured", "reason": "", "source": "nvml", "captured_at": "2026-11-29T15:00:00Z",
            "gpus": [{"index": 0, "name": "NVIDIA H200", "total_bytes": total, "free_bytes": free,
                      "used_bytes": total - free, "processes": []}]}


# ----------------------------------------------------------------------------- off by default
@pytest.mark.slow
def test_off_by_default_changes_nothing(fake):
    from oomdoctor.engines.vllm import plugin
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    before = (EngineArgs.__dict__["create_engine_config"], LLMEngine.__dict__["__init__"], list(logging.getLogger("vllm").handlers))
    plugin.register()
    for v in ("0", "", "no"):
        os.environ["OOMDOCTOR_PLUGIN"] = v
        plugin.register()
    os.environ.pop("OOMDOCTOR_PLUGIN")
    assert EngineArgs.__dict__["create_engine_config"] is before[0]
    assert LLMEngine.__dict__["__init__"] is before[1]
    assert logging.getLogger("vllm").handlers == before[2]
    from vllm import LLM

    LLM(model=fake["model"], max_model_len=4096)
    assert not fake["inc"].exists()


# ----------------------------------------------------------------------------- on: what is recorded
@pytest.mark.slow
def test_records_explicit_vs_defaults_and_resolved(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_" + "a" * 30)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    plugin.register()
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    assert getattr(EngineArgs.create_engine_config, plugin.MARK)
    llm = LLM(model=fake["model"], max_model_len=4096, kv_cache_dtype="fp8")
    cfg = llm.llm_engine.vllm_config
    assert cfg.model_config.max_model_len == 4096 and cfg.scheduler_config.max_num_seqs == 1024
    [rec] = starts(fake["inc"])
    assert rec["outcome"] == "started" and rec["launcher"] == "vllm-llm" and rec["usage_context"] == "LLM_CLASS"
    # explicit: what the caller set (+ what LLM itself sets, as vLLM's own "non-default args" line shows)
    assert rec["explicit_names"] == ["disable_log_stats", "kv_cache_dtype", "max_model_len"]
    assert rec["explicit"]["max_model_len"] == 4096
    # left at vLLM's defaults, read from a default-constructed EngineArgs: max_num_seqs was None BEFORE
    # create_engine_config filled it in (the record is taken before the call)
    for k in ("gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs", "max_num_batched_tokens", "enforce_eager"):
        assert k in rec["left_at_default"], k
    assert rec["defaults"]["gpu_memory_utilization"] == 0.92 and rec["defaults"]["max_num_seqs"] is None
    assert "default-constructed" in rec["defaults_source"]
    assert rec["resolved"]["max_num_seqs"] == 1024 and rec["resolved"]["max_num_batched_tokens"] == 16384
    assert rec["resolved"]["kv_cache_dtype"] == "fp8" and rec["resolved"]["max_model_len"] == 4096
    assert rec["engine"] == {"name": "vllm", "version": "0.25.1"}
    cj = Path(fake["model"]) / "config.json"
    assert rec["model"]["config_sha256"] == hashlib.sha256(cj.read_bytes()).hexdigest()
    assert rec["model"]["config"]["max_position_embeddings"] == 4_000_000
    assert rec["device"]["status"] == "unavailable" and "OOMDOCTOR_NO_NVML" in rec["device"]["reason"]
    assert rec["env"]["HF_TOKEN"] == "***REDACTED***" and rec["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert not any(k.startswith("OOMDOCTOR") for k in rec["env"])
    assert not list(fake["inc"].glob("*.yaml"))          # a passing start writes no card


def test_explicit_args_reads_vllm_defaults_not_constants(fake):
    from oomdoctor.engines.vllm.plugin import argv_fields, explicit_args
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

    ea = EngineArgs(model=fake["model"], gpu_memory_utilization=0.5, compilation_config={"mode": 0})
    ex, d, how = explicit_args(ea)
    assert set(ex) == {"gpu_memory_utilization", "compilation_config"} and d["gpu_memory_utilization"] == 0.92
    # the same value as the default is invisible by value ... but not when typed on a serve command line
    ea = AsyncEngineArgs(model=fake["model"], gpu_memory_utilization=0.92, max_model_len=8192)
    ex, _, _ = explicit_args(ea, ["serve", fake["model"], "--gpu-memory-utilization", "0.92", "--max-model-len=8k",
                                  "-tp", "1", "--no-enforce-eager", "--kv-cache-memory", "1G"])
    assert set(ex) == {"gpu_memory_utilization", "max_model_len", "tensor_parallel_size", "enforce_eager",
                       "kv_cache_memory_bytes"}
    assert argv_fields(["--port", "8000", "--host=x"], ["max_model_len", "model"]) == []


@pytest.mark.slow
def test_register_is_idempotent(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    from vllm.engine.arg_utils import EngineArgs

    orig = EngineArgs.__dict__["create_engine_config"]
    plugin.register()
    first = EngineArgs.__dict__["create_engine_config"]
    plugin.register()
    plugin.register()
    assert EngineArgs.__dict__["create_engine_config"] is first and first.__wrapped__ is orig
    assert sum(isinstance(h, plugin.Capture) for h in logging.getLogger("vllm").handlers) == 1
    from vllm import LLM

    LLM(model=fake["model"], max_model_len=4096)
    from vllm.v1.engine.llm_engine import LLMEngine

    init = LLMEngine.__dict__["__init__"]
    assert not getattr(init.__wrapped__, plugin.MARK, False)      # wrapped once, not twice
    LLM(model=fake["model"], max_model_len=2048)
    assert LLMEngine.__dict__["__init__"] is init
    assert [r["outcome"] for r in starts(fake["inc"])] == ["started", "started"]


def test_dictconfig_reconfiguration_keeps_the_capture(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    plugin.register()
    import vllm.logger as vlog

    vlog._configure_vllm_root_logger()          # 0.33.0 re-runs dictConfig: foreign handlers dropped
    assert any(isinstance(h, plugin.Capture) for h in logging.getLogger("vllm").handlers)


# ----------------------------------------------------------------------------- failures → cards
@pytest.mark.slow
def test_engine_start_failure_writes_a_retestable_card(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin
    from oomdoctor.retest import run as rt

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("FAKE_FREE_BYTES", str(24 * GiB))        # a ballast left 24 GiB on the H200
    monkeypatch.setenv("HF_TOKEN", "hf_" + "b" * 30)
    monkeypatch.setattr("oomdoctor.engines.vllm.plugin.record.capture_device", lambda: fake_device(24 * GiB + (512 << 20)))
    plugin.register()
    from vllm import LLM

    with pytest.raises(RuntimeError) as ei:
        LLM(model=fake["model"], max_model_len=32768)
    assert str(ei.value) == "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}"
    [cp] = list(fake["inc"].glob("*.yaml"))
    card = cardmod.load_dict(cp)                          # the schema accepts it
    assert card["classification"]["class"] == "free_memory_below_utilization"
    assert card["engine"]["version"] == "0.25.1"
    wl = card["workload"]
    assert wl["launcher"] == "vllm-llm" and wl["model"] == fake["model"]
    assert wl["engine_args"] == {"max_model_len": 32768, "disable_log_stats": True}
    assert wl["explicit_args"] == ["disable_log_stats", "max_model_len"]
    assert wl["free_at_start_bytes"] == 24 * GiB + (512 << 20) and wl["gpu_total_bytes"] == H200_TOTAL
    assert wl["env"]["HF_TOKEN"] == "***REDACTED***"
    assert card["levers"][0]["id"] == "gpu_memory_utilization"
    # the engine core's own lines came from the child process (forked: the inherited handler spooled them)
    src = card["plugin"]["log_sources"]
    assert src["used"] == "captured" and sum(src["child_processes"]["records_by_pid"].values()) >= 2
    log_text = Path(card["source"]["path"]).read_text()
    assert "(EngineCore pid=" in log_text and "less than desired GPU memory utilization" in log_text
    assert card["plugin"]["failure"]["stage"] == "engine_start"
    assert card["plugin"]["failure"]["where"] in ("wait_for_engine_startup", "LLMEngine.__init__")
    [rec] = starts(fake["inc"])
    assert rec["outcome"] == "failed" and rec["card"] == str(cp)
    import tempfile

    assert not list(Path(tempfile.gettempdir()).glob(f"oomdoctor-spool-{rec['id']}*"))
    # `oomdoctor retest` can re-run exactly that launch: the offline runner with the recorded kwargs
    lever = rt.choose_lever(card, None, False)
    p = rt.plan(card, lever, None, 0, False)
    assert p.argv[1:4] == ["-m", "oomdoctor.retest.engine_runner", fake["model"]]
    assert json.loads(p.argv[4]) == {"disable_log_stats": True, "max_model_len": 32768,
                                     "gpu_memory_utilization": lever["change"]["gpu_memory_utilization"]}
    assert p.emulate_free_bytes == 24 * GiB + (512 << 20)


def test_create_engine_config_failure_writes_a_card(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    plugin.register()
    from vllm import LLM

    with pytest.raises(ValueError, match="greater than the derived max_model_len"):
        LLM(model=fake["model"], max_model_len=8_000_000)
    [cp] = list(fake["inc"].glob("*.yaml"))
    card = cardmod.load_dict(cp)
    assert card["plugin"]["failure"]["stage"] == "config"
    assert card["plugin"]["failure"]["exception"] == "ValueError"
    assert "greater than the derived max_model_len" in Path(card["source"]["path"]).read_text()
    assert card["workload"]["engine_args"]["max_model_len"] == 8_000_000


@pytest.mark.slow
def test_log_file_is_used_when_pointed_at(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    fx = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200" / "B_fail.log"
    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("OOMDOCTOR_PLUGIN_LOG", str(fx))
    monkeypatch.setenv("FAKE_FREE_BYTES", str(40 * GiB))
    plugin.register()
    from vllm import LLM

    with pytest.raises(RuntimeError):
        LLM(model=fake["model"], max_model_len=32768)
    [cp] = list(fake["inc"].glob("*.yaml"))
    card = cardmod.load_dict(cp)
    assert card["plugin"]["log_sources"]["used"] == "file"
    assert card["plugin"]["log_sources"]["file"]["path"] == str(fx)
    assert card["classification"]["class"] == "free_memory_below_utilization"
    assert card["numbers"]["free_at_start_bytes"] > 0


@pytest.mark.slow
def test_serve_launch_records_flags_and_argv(fake, monkeypatch):
    import argparse

    from oomdoctor.engines.vllm import plugin

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("FAKE_FREE_BYTES", str(24 * GiB))
    argv = ["vllm", "serve", fake["model"], "--max-model-len", "32768", "--api-key", "sk-" + "c" * 30, "--port", "8011"]
    monkeypatch.setattr(sys, "argv", argv)
    plugin.register()
    from vllm.entrypoints.serve_fake import serve

    ns = argparse.Namespace(model=fake["model"], max_model_len=32768, gpu_memory_utilization=0.92,
                            enable_log_requests=False)
    with pytest.raises(RuntimeError, match="Engine core initialization failed"):
        serve(ns)
    [cp] = list(fake["inc"].glob("*.yaml"))
    card = cardmod.load_dict(cp)
    wl = card["workload"]
    assert wl["launcher"] == "vllm-serve" and wl["engine_args"] == {"max_model_len": 32768}
    assert wl["argv"][:3] == ["vllm", "serve", fake["model"]] and "sk-" + "c" * 30 not in json.dumps(wl)
    from oomdoctor.retest import run as rt

    p = rt.plan(card, rt.choose_lever(card, None, False), None, 0, False)
    assert p.argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", fake["model"]]
    assert "--max-model-len" in p.argv


# ----------------------------------------------------------------------------- never breaks a start
def _boom(*a, **k):
    raise RuntimeError("recorder exploded")


@pytest.mark.slow
def test_a_failing_recorder_never_changes_a_passing_start(fake, monkeypatch, caplog):
    from oomdoctor.engines.vllm import plugin

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    plugin.register()
    from vllm import LLM

    ok = LLM(model=fake["model"], max_model_len=4096).llm_engine.vllm_config
    logging.getLogger("vllm").propagate = True
    for name in ("hooks._before_config", "lifecycle.after_config", "record.capture_device", "lifecycle.append_start",
                 "record.explicit_args"):
        with monkeypatch.context() as m:
            m.setattr(f"oomdoctor.engines.vllm.plugin.{name}", _boom)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="vllm.oomdoctor"):
                got = LLM(model=fake["model"], max_model_len=4096).llm_engine.vllm_config
            assert got == ok, name
            assert any("internal error" in r.getMessage() and "recorder exploded" in r.getMessage()
                       for r in caplog.records), name


@pytest.mark.slow
def test_a_failing_recorder_never_changes_the_engines_exception(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("FAKE_FREE_BYTES", str(24 * GiB))
    plugin.register()
    from vllm import LLM

    with monkeypatch.context() as m:              # the card writer and NVML fail: the engine's own exception
        m.setattr("oomdoctor.engines.vllm.plugin.card.write_card", _boom)
        m.setattr("oomdoctor.engines.vllm.plugin.record.capture_device", _boom)
        with pytest.raises(RuntimeError) as ei:
            LLM(model=fake["model"], max_model_len=4096)
        assert str(ei.value) == ("Engine core initialization failed. See root cause above. "
                                 "Failed core proc(s): {'EngineCore': 1}")
    assert not list(fake["inc"].glob("*.yaml"))
    with monkeypatch.context() as m:              # the recorder fails before create_engine_config raises
        m.setattr("oomdoctor.engines.vllm.plugin.hooks._before_config", _boom)
        with pytest.raises(ValueError, match="greater than the derived"):
            LLM(model=fake["model"], max_model_len=9_000_000)
    with monkeypatch.context() as m:              # the log collection fails: same exception again
        m.setattr("oomdoctor.engines.vllm.plugin.card.collect_log", _boom)
        with pytest.raises(RuntimeError, match="^Engine core initialization failed"):
            LLM(model=fake["model"], max_model_len=4096)
    assert not list(fake["inc"].glob("*.yaml"))


# ----------------------------------------------------------------------------- profiles in the plugin
PROFILES = {
    "schema": "oomdoctor.serving-profiles/v1",
    "profiles": {
        "raw_4m": {"window": 4_000_000, "declared_free_bytes": 300 * GiB},
        "long_262k": {"window": 262144, "settings": {"kv_cache_memory_bytes": 17179869184, "max_num_seqs": 16},
                      "requires_free_bytes": 22 * GiB,
                      "measured": {"receipt": "ladder-262k.yaml", "pass_free_bytes": 22 * GiB, "fail_free_bytes": 21 * GiB,
                                   "engine_version": "0.25.1", "device": "nvidia-h200"}},
        "mid_131k": {"window": 131072, "settings": {"gpu_memory_utilization": 0.95, "max_num_seqs": 64},
                     "requires_free_bytes": 14 * GiB,
                     "measured": {"receipt": "ladder-131k.yaml", "pass_free_bytes": 14 * GiB, "engine_version": "0.25.1"}},
    },
}


@pytest.mark.slow
def test_profile_selected_and_only_defaults_filled(fake, monkeypatch, caplog):
    from oomdoctor.engines.vllm import plugin

    pf = fake["tmp"] / "profiles.yaml"
    pf.write_text(yaml.safe_dump(PROFILES))
    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("OOMDOCTOR_PROFILES", str(pf))
    monkeypatch.setattr("oomdoctor.engines.vllm.plugin.record.capture_device", lambda: fake_device(24 * GiB))
    plugin.register()
    logging.getLogger("vllm").propagate = True
    from vllm import LLM

    with caplog.at_level(logging.INFO, logger="vllm.oomdoctor"):
        cfg = LLM(model=fake["model"]).llm_engine.vllm_config      # flagless
    assert cfg.model_config.max_model_len == 262144
    assert cfg.cache_config.kv_cache_memory_bytes == 17179869184 and cfg.scheduler_config.max_num_seqs == 16
    msgs = [r.getMessage() for r in caplog.records]
    assert ("oomdoctor: max_model_len default 4000000 -> 262144 (profile long_262k, measured 23,622,320,128 B free "
            "needed, 25,769,803,776 B free)") in msgs
    assert any("NOT a clamp" in m and "gpu_memory_utilization" in m for m in msgs)
    rec = starts(fake["inc"])[-1]
    assert rec["profile"]["selected"] == "long_262k" and rec["outcome"] == "started"
    # an explicit --max-model-len wins: only a profile with that window may fill the other defaults
    caplog.clear()
    cfg = LLM(model=fake["model"], max_model_len=131072).llm_engine.vllm_config
    assert cfg.model_config.max_model_len == 131072 and cfg.scheduler_config.max_num_seqs == 64
    # mid_131k's 0.95 (unpinned) is clamped to what is free: floor(24 GiB x 0.98 / 150,754,820,096, 3)
    assert cfg.cache_config.gpu_memory_utilization == 0.167
    cfg = LLM(model=fake["model"], max_model_len=65536).llm_engine.vllm_config
    assert cfg.model_config.max_model_len == 65536 and cfg.scheduler_config.max_num_seqs == 1024
    assert starts(fake["inc"])[-1]["profile"]["selected"] is None


@pytest.mark.slow
def test_profiles_without_nvml_leave_defaults(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    pf = fake["tmp"] / "profiles.json"
    pf.write_text(json.dumps(PROFILES))
    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("OOMDOCTOR_PROFILES", str(pf))          # OOMDOCTOR_NO_NVML=1 from the fixture
    plugin.register()
    from vllm import LLM

    cfg = LLM(model=fake["model"]).llm_engine.vllm_config
    assert cfg.model_config.max_model_len == 4_000_000 and cfg.cache_config.gpu_memory_utilization == 0.92
    prof = starts(fake["inc"])[-1]["profile"]
    assert prof["selected"] is None and "NVML unavailable" in prof["reasons"][0]


@pytest.mark.slow
def test_profile_forced_by_env_and_broken_profile_file(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    pf = fake["tmp"] / "profiles.yaml"
    pf.write_text(yaml.safe_dump(PROFILES))
    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("OOMDOCTOR_PROFILES", str(pf))
    monkeypatch.setenv("OOMDOCTOR_PROFILE", "mid_131k")
    monkeypatch.setattr("oomdoctor.engines.vllm.plugin.record.capture_device", lambda: fake_device(100 * GiB))
    plugin.register()
    from vllm import LLM

    cfg = LLM(model=fake["model"]).llm_engine.vllm_config
    assert cfg.model_config.max_model_len == 131072 and cfg.cache_config.gpu_memory_utilization == 0.697
    pf.write_text("profiles: [")                                   # malformed: ignored, logged, defaults kept
    cfg = LLM(model=fake["model"]).llm_engine.vllm_config
    assert cfg.model_config.max_model_len == 4_000_000
    assert "malformed YAML" in starts(fake["inc"])[-1]["profile"]["error"]


# ----------------------------------------------------------------------------- vLLM's own loader, spawn
@pytest.mark.slow
def test_entry_point_loads_the_plugin_in_every_process_spawn(tmp_path):
    """What `pip install oomdoctor` gives (and tools/gpu/plugin_demo.sh emulates with a dist-info shim):
    vLLM's load_general_plugins calls register() in the front end AND in a spawned engine core, whose
    records then reach the card."""
    site = tmp_path / "site"
    write_fake_vllm(site)
    write_entry_point(site)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4_000_000}))
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        if __name__ == "__main__":
            from vllm import LLM
            try:
                LLM(model={str(model)!r}, max_model_len=32768)
            except RuntimeError as e:
                print("ENGINE_ERROR", e)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMDOCTOR_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), OOMDOCTOR_PLUGIN="1", OOMDOCTOR_NO_NVML="1",
               OOMDOCTOR_INCIDENTS=str(tmp_path / "inc"), FAKE_VLLM_MP="spawn", FAKE_FREE_BYTES=str(24 * GiB))
    r = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "ENGINE_ERROR Engine core initialization failed" in r.stdout, r.stdout + r.stderr
    [cp] = list((tmp_path / "inc").glob("*.yaml"))
    card = cardmod.load_dict(cp)
    assert card["classification"]["class"] == "free_memory_below_utilization"
    assert sum(card["plugin"]["log_sources"]["child_processes"]["records_by_pid"].values()) >= 2
    # the dist-info shim alone is enough for vLLM's loader to find the entry point
    r2 = subprocess.run([sys.executable, "-c", "from importlib.metadata import entry_points as e; "
                         "print(sorted({x.dist.name for x in e(group='vllm.general_plugins')}))"],
                        env=env, capture_output=True, text=True, timeout=60)
    assert "oomdoctor-plugin-shim" in r2.stdout, r2.stderr
    # VLLM_PLUGINS allow-list without 'oomdoctor': vLLM does not call register() at all
    env["VLLM_PLUGINS"] = "someone_else"
    env["OOMDOCTOR_INCIDENTS"] = str(tmp_path / "inc2")
    r = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "ENGINE_ERROR" in r.stdout and not (tmp_path / "inc2").exists()


# ----------------------------------------------------------------------------- small pieces
def test_engine_gpus_follow_cuda_visible_devices(monkeypatch):
    from oomdoctor.engines.vllm.plugin import engine_gpus

    st = {"gpus": [{"index": i, "uuid": f"GPU-{i}{i}{i}-abc", "free_bytes": 1, "total_bytes": 2} for i in range(4)]}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert engine_gpus(st, 2) == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert engine_gpus(st, 1) == [3] and engine_gpus(st, 2) == [3, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-222,GPU-000")
    assert engine_gpus(st, 2) == [2, 0]


def test_records_are_formatted_like_vllm_lines():
    from oomdoctor.engines.vllm.plugin import format_record

    try:
        raise ValueError("Free memory on device cuda:0 (23.0/31.36 GiB) on startup is less than desired")
    except ValueError:
        rec = logging.LogRecord("vllm.v1.engine.core", logging.ERROR, "/x/core.py", 1231, "EngineCore failed to start.",
                                None, sys.exc_info())
    lines = format_record(rec, child=True).split("\n")
    assert all(ln.startswith(f"(MainProcess pid={os.getpid()}) ERROR ") and "[core.py:1231] " in ln for ln in lines)
    assert lines[0].endswith("EngineCore failed to start.") and lines[-1].endswith("on startup is less than desired")
    assert format_record(rec).startswith("ERROR ")


@pytest.mark.slow
def test_the_log_tail_is_bounded(fake, monkeypatch):
    from oomdoctor.engines.vllm import plugin

    monkeypatch.setenv("OOMDOCTOR_PLUGIN", "1")
    monkeypatch.setenv("OOMDOCTOR_PLUGIN_TAIL_LINES", "60")
    monkeypatch.setenv("FAKE_FREE_BYTES", str(24 * GiB))
    plugin.register()
    lg = logging.getLogger("vllm.noise")
    for i in range(500):
        lg.info("noise %d", i)
    assert len(plugin.S["handler"].buf) == 60
    from vllm import LLM

    with pytest.raises(RuntimeError):
        LLM(model=fake["model"], max_model_len=32768)
    [cp] = list(fake["inc"].glob("*.yaml"))
    card = cardmod.load_dict(cp)
    text = Path(card["source"]["path"]).read_text().splitlines()
    assert len(text) <= 2 + 1 + 60 + 40          # header + tail + the exception
    assert card["classification"]["class"] == "free_memory_below_utilization"


@pytest.mark.parametrize("layout", ["package", "plain"])
def test_a_broken_engine_folder_leaves_the_vllm_rules_alone(tmp_path, monkeypatch, layout):
    """The fallback rule set holds vLLM's rules and nothing else, for the package's ``engines/<e>/rules/`` layout
    and for a plain ``OOMDOCTOR_RULES`` root (``<e>/engine.yaml``)."""
    import shutil

    from oomdoctor.diagnose.rules import load_rules
    from oomdoctor.engines.vllm.plugin.card import ruleset
    from oomdoctor.paths import ENGINES_DIR

    root = tmp_path / "rules"
    for eng in ("vllm", "llamacpp", "sglang"):
        dest = root / eng / "rules" if layout == "package" else root / eng
        shutil.copytree(ENGINES_DIR / eng / "rules", dest)
    if layout == "package":
        (root / "vllm" / "stray.yaml").write_text("id: [not a rule\n")     # beside rules/, never read
    full = {r.id for r in load_rules(root).rules if r.engine == "vllm"}
    broken = root / "llamacpp" / ("rules" if layout == "package" else "") / "zz_broken.yaml"
    broken.write_text("id: [broken\n")
    monkeypatch.setenv("OOMDOCTOR_RULES", str(root))
    rs, note = ruleset()
    assert set(rs.engines) == {"vllm"} and {r.engine for r in rs.rules} == {"vllm"}
    assert {r.id for r in rs.rules} == full
    assert note and "the vLLM rules alone were used" in note and "zz_broken.yaml" in note
