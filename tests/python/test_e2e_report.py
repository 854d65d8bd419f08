"""bench/e2e_report.py's planner predictions: a run's config names the heat map by the path it had on the
GPU machine; the report reads the heat.yaml beside the config instead, so a run placed by a heat map is
predicted with it (not as the uniform placement), and a run without one stays uniform. Run by `make test`
through CTest with the bindings' tests (TANDEM_CLI: the tandem binary)."""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
CLI = os.environ.get("TANDEM_CLI", os.path.join(ROOT, "build", "tandem"))


def load_report():
    spec = importlib.util.spec_from_file_location("e2e_report", os.path.join(ROOT, "bench", "e2e_report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def model35(tmp_path):
    cfg = json.load(open(os.path.join(HERE, "..", "data", "spec_config_qwen3.5-35b-a3b.json")))
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
                                  "dynamic": {"lm_head": {}, "model.language_model.embed_tokens": {}, "-:.*attn.*": {},
                                              "-:.*shared_expert.*": {}, "-:.*mtp.*": {}, "-:.*visual.*": {}}}
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d), cfg


def write_run(raw, model_cfg, heat_line):
    text = model_cfg["text_config"]
    layers, experts = text["num_hidden_layers"], text["num_experts"]
    # 16 hot experts a layer take most of the activations
    rows = ["  - [" + ", ".join("1000" if e < 16 else "1" for e in range(experts)) + "]" for _ in range(layers)]
    (raw / "heat.yaml").write_text("tokens: 2000\ntop_k: 8\nnum_experts: %d\nlayers:\n%s\n" % (experts, "\n".join(rows)))
    config = "gpu:\n  memory: 12GiB\n  reserve: 512MiB\ncontext: 1040\nexperts:\n  select: frequency\n%s\n" % heat_line
    (raw / "hybrid-12gib.yaml").write_text(config)
    return str(raw / "hybrid-12gib.yaml")


def test_prediction_uses_the_runs_heat_map(tmp_path, model35):
    report = load_report()
    model_dir, cfg = model35
    bw = {"gpu": 4.0e12, "pcie": 25e9, "cpu": 80e9}
    with_heat = tmp_path / "with"
    with_heat.mkdir()
    # the path the config had on the GPU machine, which does not exist here
    path = write_run(with_heat, cfg, "  heat: /tmp/gpu-session/session/e2e/heat.yaml")
    hot = report.predict(CLI, model_dir, path, bw)
    without = tmp_path / "without"
    without.mkdir()
    uniform = report.predict(CLI, model_dir, write_run(without, cfg, ""), bw)
    # 16 of 256 experts with ~98% of the activations: the plan puts them on the GPU in every layer
    assert hot["expected_gpu_expert_fraction"] > 0.9
    assert uniform["expected_gpu_expert_fraction"] < 0.6
    assert hot["predicted_decode_tok_s"] > uniform["predicted_decode_tok_s"]
