"""Tandem: run Qwen3.5-MoE models across one GPU and the host CPU, from Python.

    import tandem
    with tandem.Engine("models/tiny", device="cpu") as eng:
        print(eng.generate("Hello", max_new_tokens=32, temperature=0))
        for piece in eng.generate("Tell me a story", stream=True, seed=1):
            print(piece, end="", flush=True)
        logits = eng.logits(eng.tokenizer.encode("Hello world"))   # numpy float32 [n, vocab]
    with tandem.Engine("models/tiny", device="cpu", batch=4) as eng:   # 4 sequences at once
        print(eng.generate(["Hello", "Bonjour", "Hallo"], max_new_tokens=16, seed=[1, 2, 3]))
        rows = eng.logits_batch([[1, 2, 3], [4, 5]])                  # [3, vocab] and [2, vocab]
        print(eng.plan()["predicted_decode_tok_s"])                  # with a GPU budget

Errors are `tandem.Error` (a RuntimeError) with the same messages as the `tandem` CLI, wrong-typed or
out-of-range arguments included. Compute runs with the GIL released; an Engine serves one call at a
time, separate Engines run in parallel. Ctrl-C during generate / chat raises KeyboardInterrupt (the
generation stops at its next token).
"""
from __future__ import annotations

import json as _json
import numbers as _numbers
import operator as _operator
import queue as _queue
import threading as _threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _tandem

Error = _tandem.Error
Error.__doc__ = "A Tandem error (bad path, bad config, bad input); the message says what and where."
Error.__module__ = "tandem"

__all__ = ["Engine", "Tokenizer", "Error", "synth", "profile", "plan", "parse_reply"]
__version__ = "0.1.0"

_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
             "seed", "preset")


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


_INT64_MAX, _UINT64_MAX, _MAX_THREADS, _MAX_BATCH, _MAX_DRAFT = 2**63 - 1, 2**64 - 1, 4096, 256, 16  # core/limits.h: kMaxThreads, kMaxBatch, kMaxDraft


def _int(value: Any, name: str, lo: int, hi: int = _INT64_MAX) -> int:
    """An integer argument in lo..hi, or tandem.Error naming it (not pybind11's cast error, not its low bits)."""
    if isinstance(value, bool):
        raise Error(f"{name} must be an integer (got {value!r})")
    try:
        v = _operator.index(value)
    except TypeError:
        raise Error(f"{name} must be an integer (got {type(value).__name__} {repr(value)[:60]})") from None
    if not lo <= v <= hi:
        raise Error(f"{name}: {v} is out of range ({lo}..{hi})")
    return v


def _opt_int(value: Any, name: str, lo: int, hi: int = _INT64_MAX) -> Optional[int]:
    return None if value is None else _int(value, name, lo, hi)


def _gpu_mem(value: Any) -> Union[None, int, str]:
    return value if value is None or isinstance(value, str) else _int(value, "gpu_mem", 1)


def _sampling_args(sampling: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for k, v in sampling.items():
        if k not in _SAMPLING:
            raise Error(f"unknown sampling parameter '{k}' (known: {', '.join(_SAMPLING)})")
        if v is None:
            out[k] = v
        elif k == "seed":
            out[k] = _int(v, k, 0, _UINT64_MAX)
        elif k == "top_k":
            out[k] = _int(v, k, 0, 2**31 - 1)
        elif k == "preset":
            if not isinstance(v, str):
                raise Error(f"preset must be a string (got {type(v).__name__} {repr(v)[:60]})")
            out[k] = v
        else:
            if isinstance(v, bool) or not isinstance(v, _numbers.Real):
                raise Error(f"{k} must be a number (got {type(v).__name__} {repr(v)[:60]})")
            out[k] = float(v)
    return out


class Tokenizer:
    """The model's tokenizer (identical to HF `tokenizers` on the model's tokenizer.json)."""

    def __init__(self, core: "_tandem.Engine"):
        self._core = core

    def encode(self, text: str) -> List[int]:
        """Token ids of `text` (no special tokens added)."""
        return self._core.encode(text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`."""
        return _text(self._core.decode(list(ids), skip_special_tokens))


class Engine:
    """A model loaded on a placement.

    model_dir: a folder with config.json, safetensors and tokenizer.json (e.g. from `tandem.synth`).
    config:    placement for device="hybrid": a YAML path (configs/*.yaml) or a dict of the same schema.
    device:    "auto" (hybrid when a CUDA device exists, else cpu), "ref", "cpu", "gpu", "hybrid".
    gpu_mem:   GPU budget, bytes (int) or text ("24GiB"); overrides the config's gpu.memory.
    threads:   CPU worker threads (default: physical cores).
    context:   KV cache length for the GPU placements (default: the config's, else 4096).
    eager:     GPU placements: launch every kernel eagerly, no CUDA graphs (debugging).
    batch:     sequences decoded at once (slots; GPU placements hold a KV cache and state for each;
               default: the config's batch, else 1).
    draft:     speculative decoding: tokens the model's MTP head drafts a step (0 = off; "auto": as many
               as pay, up to 4, chosen as it runs; default: the config's speculative.draft, else 0).
               Greedy output is the same as without drafts; stats() gives the acceptance.
    experts_format: "auto" (as stored) or "int4": a BF16 checkpoint's routed experts and the MTP head's
               quantized on load (a quarter of their bytes; default: the config's experts.gpu_format).
    quant_cache: the folder for experts_format="int4"'s cache (default: MODEL/.tandem-cache when it can be
               written, else ~/.cache/tandem); the first load quantizes, later ones read it.
    kv_format: the KV cache: "bf16" (default: the config's kv_cache.format), "int8" or "fp8" (codes
               with a scale per token and KV head: half the bytes, twice the context; docs/usage.md
               gives the accuracy).
    """

    def __init__(self, model_dir: str, config: Union[None, str, Dict[str, Any]] = None, device: str = "auto",
                 gpu_mem: Union[None, int, str] = None, threads: Optional[int] = None, context: Optional[int] = None,
                 eager: bool = False, batch: Optional[int] = None, draft: Union[None, int, str] = None,
                 experts_format: Optional[str] = None, quant_cache: Optional[str] = None, kv_format: Optional[str] = None):
        self._core = _tandem.Engine(str(model_dir), config, device, _gpu_mem(gpu_mem), _opt_int(threads, "threads", 1, _MAX_THREADS),
                                    _opt_int(context, "context", 1), eager, _opt_int(batch, "batch", 1, _MAX_BATCH),
                                    draft if isinstance(draft, str) else _opt_int(draft, "draft", 0, _MAX_DRAFT),
                                    experts_format, None if quant_cache is None else str(quant_cache), kv_format)
        self.model_dir = str(model_dir)
        self.tokenizer = Tokenizer(self._core)

    # -- lifetime
    def close(self) -> None:
        """Free GPU memory, pinned host memory and the weights now (also done by `with`)."""
        self._core.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- generation
    def generate(self, prompt: Union[str, Sequence[str]], max_new_tokens: int = 256, stream: bool = False,
                 stop: Optional[Sequence[str]] = None, **sampling: Any) -> Union[str, Iterator[str], List[str]]:
        """Continue `prompt`. Returns the text, or with stream=True an iterator of text pieces.

        Sampling keywords: temperature (0 = greedy), top_k, top_p, min_p, presence_penalty,
        frequency_penalty, repetition_penalty, seed, preset ("thinking", "thinking-coding", "instruct",
        "instruct-reasoning"); defaults come from the model's generation_config.json.

        A list of prompts is decoded together (the engine's `batch` sequences at a time, the rest as
        slots free up) and returns a list of texts, each the text that prompt gives alone; `seed` may
        then be a list (one per prompt). Not with stream=True.
        """
        if isinstance(prompt, str):
            return self._run(prompt, max_new_tokens, stream, stop, sampling)
        prompts = list(prompt)
        if stream:
            raise Error("stream=True takes one prompt (got a list of prompts)")
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise Error(f"prompt {i} must be a string (got {type(p).__name__})")
        seeds = sampling.pop("seed", None)
        if isinstance(seeds, (list, tuple)):
            if len(seeds) != len(prompts):
                raise Error(f"seed: {len(seeds)} seeds for {len(prompts)} prompts")
        else:
            seeds = [seeds] * len(prompts)
        per = [_sampling_args(dict(sampling, seed=s)) for s in seeds]
        out = self._core.generate_batch(prompts, _int(max_new_tokens, "max_new_tokens", 1), per, list(stop or []))
        return [_text(r["text"]) for r in out]

    def chat(self, messages: Sequence[Dict[str, Any]], enable_thinking: bool = True, max_new_tokens: int = 1024,
             stream: bool = False, stop: Optional[Sequence[str]] = None,
             tools: Optional[Sequence[Union[Dict[str, Any], str]]] = None, **sampling: Any) -> Union[str, Iterator[str]]:
        """Reply to OpenAI-style messages with the model's chat template (see `render_chat`)."""
        text = self.render_chat(messages, tools=tools, enable_thinking=enable_thinking)
        return self._run(text, max_new_tokens, stream, stop, sampling)

    def render_chat(self, messages: Sequence[Dict[str, Any]], tools: Optional[Sequence[Union[Dict[str, Any], str]]] = None,
                    enable_thinking: bool = True, add_generation_prompt: bool = True, add_vision_id: bool = False) -> str:
        """The prompt text of a conversation: the Qwen3.5 chat template, byte for byte as HF's
        apply_chat_template(..., tokenize=False) renders it.

        messages: [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]; content may also be a
        list of parts ({"type": "text", "text": ...}, {"type": "image"|"image_url"|"video", ...}); assistant
        messages may carry "reasoning_content" and OpenAI "tool_calls" ([{"type": "function", "function":
        {"name": ..., "arguments": {...} or "{...json...}"}}]); tools: OpenAI tool definitions
        ({"type": "function", "function": {...}}) as dicts or JSON strings.
        """
        return self._core.render_chat(_json_text(list(messages), "messages"), _json_text(list(tools or []), "tools"),
                                      enable_thinking, add_generation_prompt, add_vision_id)

    def _run(self, text, max_new_tokens, stream, stop, sampling):
        sampling = _sampling_args(sampling)
        max_new_tokens = _int(max_new_tokens, "max_new_tokens", 1)
        stop = list(stop or [])
        if not stream:
            # Through the streaming path: the generation runs on a worker thread while this one waits in
            # Python, where Ctrl-C raises KeyboardInterrupt (and stops the worker at its next token).
            return "".join(self._stream(text, max_new_tokens, stop, sampling))
        return self._stream(text, max_new_tokens, stop, sampling)

    def _stream(self, text, max_new_tokens, stop, sampling) -> Iterator[str]:
        q: "_queue.Queue" = _queue.Queue()
        done = object()
        result: Dict[str, Any] = {}

        def work():
            try:
                self._core.generate(text, max_new_tokens, sampling, stop, lambda b: q.put(_text(b)))
            except BaseException as e:  # re-raised in the consumer
                result["error"] = e
            finally:
                q.put(done)

        t = _threading.Thread(target=work, daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    break
                yield item
            if "error" in result:
                raise result["error"]
        finally:  # an abandoned iterator (or Ctrl-C) stops the generation at the next token
            while t.is_alive():  # again until it ends: a cancel before the worker's start is reset by it
                self._core.cancel()
                t.join(0.05)

    # -- inspection
    def logits(self, ids: Sequence[int], prefill: Optional[int] = None):
        """float32 numpy array [len(ids), vocab]: the first `prefill` ids (default all) in one forward call,
        the rest one at a time through the cache (the same as `tandem logits`)."""
        return self._core.logits([_int(i, "ids", -2**31, 2**31 - 1) for i in ids], _opt_int(prefill, "prefill", 0))

    def logits_batch(self, sequences: Sequence[Sequence[int]]) -> List[Any]:
        """One float32 numpy array [len(ids), vocab] per sequence of ids: each sequence fed in one step beside
        the others (the engine's `batch` at a time), the same numbers as `logits(ids)` on it alone."""
        seqs = [[_int(i, f"sequence {n}", -2**31, 2**31 - 1) for i in ids] for n, ids in enumerate(sequences)]
        return self._core.logits_batch(seqs)

    def plan(self) -> Dict[str, Any]:
        """The placement plan for this engine's config and budget (the fields of `tandem plan --json`)."""
        return _json.loads(self._core.plan_json())

    def stats(self) -> Dict[str, Any]:
        """The device, memory and the last generation's figures (tokens, tok/s, stop reason; with drafts,
        verify_steps, tokens_per_step, drafted / accepted and acceptance_by_position)."""
        return self._core.stats()


def _json_text(value: Any, what: str) -> str:
    try:
        return _json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Error(f"{what} must be JSON data (dicts, lists, strings, numbers, booleans, None): {e}") from None


def parse_reply(text: str, tools: Optional[Sequence[Union[Dict[str, Any], str]]] = None, thinking: bool = False) -> Dict[str, Any]:
    """A model reply split as an OpenAI-compatible server returns it: {"reasoning_content", "content",
    "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": JSON text}}]}. thinking: the
    prompt ended in "<think>\n" (text up to "</think>" is reasoning). tools: the OpenAI tool definitions
    whose JSON schemas type the arguments (integer, number, boolean, null, object, array; strings verbatim).
    Malformed calls come back as content, never as an error."""
    if not isinstance(text, str):
        raise Error(f"text must be a string (got {type(text).__name__})")
    tool_list = [_json.loads(t) if isinstance(t, str) else t for t in (tools or [])]
    r = _tandem.parse_reply(text, _json_text(tool_list, "tools"), bool(thinking))
    calls = [{"id": c["id"], "type": "function", "function": {"name": _text(c["function"]["name"]), "arguments": _text(c["function"]["arguments"])}}
             for c in r["tool_calls"]]
    return {"reasoning_content": _text(r["reasoning_content"]), "content": _text(r["content"]), "tool_calls": calls}


def synth(preset: str, out: str, quant: Optional[str] = None, seed: int = 0, routing_skew: float = 1.0, threads: int = 0,
          config_only: bool = False, force: bool = False) -> Dict[str, Any]:
    """Write a model folder with random weights in the real format (`tandem synth`): preset "tiny", "small"
    or "qwen3.5-35b-a3b"; quant "bf16" or "gptq-int4" (default: the preset's)."""
    return _tandem.synth(preset, str(out), quant, _int(seed, "seed", 0, _UINT64_MAX), routing_skew, _int(threads, "threads", 0, 1024),
                         config_only, force)


def profile(model_dir: str, prompts: Sequence[str], out: Optional[str] = None, device: str = "cpu", gen: int = 0,
            max_tokens: int = 2048, chat: bool = False, threads: int = 0) -> Dict[str, Any]:
    """Count routed-expert activations over `prompts` (`tandem profile`); with `out`, write the heat map the
    planner reads (experts.heat). Returns tokens, counts [layer][expert] and the top-20% share."""
    return _tandem.profile(str(model_dir), list(prompts), None if out is None else str(out), device, _int(gen, "gen", 0),
                           _int(max_tokens, "max_tokens", 1), chat, _int(threads, "threads", 0, _MAX_THREADS))


def plan(model_dir: str, config: Union[None, str, Dict[str, Any]] = None, gpu_mem: Union[None, int, str] = None,
         context: Optional[int] = None) -> Dict[str, Any]:
    """The placement plan for a model folder (only config.json is read) without loading it (`tandem plan --json`)."""
    return _json.loads(_tandem.plan(str(model_dir), config, _gpu_mem(gpu_mem), _opt_int(context, "context", 1)))
