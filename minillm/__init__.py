"""minillm: a small, real LLM inference engine built to teach chunked prefill."""
from . import (accounting, attention, config, cost_model, engine, fidelity, hardware, kv_cache, metrics,
               model, model_runner, plots, request, sampler, scheduler, simulator, tokenizer, widgets,
               workloads)
from .config import ModelConfig
from .device import default_device
from .engine import LLMEngine
from .loader import build_model, load_hf_model
from .model_runner import prefill_kv
from .request import RequestOutput, SamplingParams
from .scheduler import SchedulerConfig
from .simulator import simulate

__all__ = ["ModelConfig", "build_model", "load_hf_model", "prefill_kv", "default_device",
           "LLMEngine", "SchedulerConfig", "SamplingParams", "RequestOutput", "simulate"]
