"""The Python API under hostile use (issue 29): Ctrl-C stops a non-streaming generate, the context is
checked as the CLI checks it, and wrong-typed or out-of-range arguments are tandem.Error naming the
argument (never pybind11's cast error, never a value cut to its low bits)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import tandem


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hostile") / "tiny")
    tandem.synth("tiny", out)
    return out


def variant(src, dst, edit):
    """A copy of model folder `src` (weights linked) with edit(name, json) applied to its JSON files."""
    os.makedirs(dst)
    for f in os.listdir(src):
        path = os.path.join(src, f)
        if f.endswith(".json"):
            j = json.load(open(path, encoding="utf-8"))
            edit(f, j)
            json.dump(j, open(os.path.join(dst, f), "w", encoding="utf-8"))
        else:
            os.symlink(path, os.path.join(dst, f))
    return dst


def test_generate_checks_the_context(tiny, tmp_path):
    def short(name, j):
        if name == "config.json":
            j["text_config"]["max_position_embeddings"] = 16
    m = variant(tiny, str(tmp_path / "ctx16"), short)
    with tandem.Engine(m, device="cpu") as eng:
        with pytest.raises(tandem.Error, match="plus max_new_tokens 100 exceeds the context of 16 tokens"):
            eng.generate("hello there", max_new_tokens=100)
        with pytest.raises(tandem.Error, match="exceeds the context of 16 tokens"):
            eng.generate("hello", max_new_tokens=10**9, stream=True).__next__()
        assert isinstance(eng.generate("hi", max_new_tokens=4, temperature=0), str)


def test_ctrl_c_stops_generate_without_stream(tiny, tmp_path):
    # No stop ids at all (eos lists empty, the specials renamed): only Ctrl-C ends this generation early.
    def no_eos(name, j):
        if name == "config.json":
            j["text_config"]["eos_token_id"] = []
            j.pop("eos_token_id", None)
        elif name == "generation_config.json":
            j["eos_token_id"] = []
        elif name == "tokenizer.json":
            for t in j["added_tokens"]:
                if t["content"] in ("<|im_end|>", "<|endoftext|>"):
                    t["content"] = t["content"].replace("|>", "_off|>")
    m = variant(tiny, str(tmp_path / "noeos"), no_eos)
    script = ("import sys, tandem\n"
              "with tandem.Engine(sys.argv[1], device='cpu', threads=1) as e:\n"
              "    print('ready', flush=True)\n"
              "    e.generate('hello', max_new_tokens=200000, temperature=0)\n")
    p = subprocess.Popen([sys.executable, "-c", script, m], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    assert p.poll() is None, "the generation ended by itself; the test needs it running"
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("SIGINT did not stop Engine.generate")
    assert time.monotonic() - t0 < 15
    assert "KeyboardInterrupt" in err, err[-2000:]


@pytest.mark.parametrize("kwargs, message", [
    (dict(threads="4"), "threads must be an integer"),
    (dict(threads=100000), r"threads: 100000 is out of range \(1..4096\)"),
    (dict(context=2**70), "context: 1180591620717411303424 is out of range"),
    (dict(gpu_mem=2**70), "gpu_mem: 1180591620717411303424 is out of range"),
])
def test_engine_arguments_are_checked(tiny, kwargs, message):
    with pytest.raises(tandem.Error, match=message):
        tandem.Engine(tiny, device="cpu", **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(seed=2**70), "seed: 1180591620717411303424 is out of range"),
    (dict(seed="1"), "seed must be an integer"),
    (dict(top_k=2**32 + 16), "top_k: 4294967312 is out of range"),
    (dict(temperature="hot"), "temperature must be a number"),
    (dict(max_new_tokens=10**30), "max_new_tokens: 10{30} is out of range"),
    (dict(max_new_tokens="5"), "max_new_tokens must be an integer"),
])
def test_generate_arguments_are_checked(tiny, kwargs, message):
    with tandem.Engine(tiny, device="cpu") as eng:
        with pytest.raises(tandem.Error, match=message):
            eng.generate("hi", **kwargs)
        with pytest.raises(tandem.Error, match="prefill: 1180591620717411303424 is out of range"):
            eng.logits([1, 2], prefill=2**70)


def test_module_functions_check_their_arguments(tiny, tmp_path):
    with pytest.raises(tandem.Error, match="seed: -1 is out of range"):
        tandem.synth("tiny", str(tmp_path / "s"), seed=-1)
    with pytest.raises(tandem.Error, match="threads must be an integer"):
        tandem.profile(tiny, ["hi"], threads=1.5)
    with pytest.raises(tandem.Error, match="context must be an integer"):
        tandem.plan(tiny, gpu_mem="1GiB", context="4096")
