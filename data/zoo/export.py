"""Write the weightless model zoo: torchvision CNNs exported by torch.onnx.export, weights stripped.

Run from the repository root, in the export venv (torch never enters `.venv` or `make test`):

    python3 -m venv .venv-export
    .venv-export/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx onnxscript   # pyproject's `export` extra
    .venv-export/bin/python data/zoo/export.py [--models resnet50 mobilenet_v2 ...] [--out data/zoo]

Each model is built with `weights=None` (nothing can be downloaded) after `torch.manual_seed(0)`,
and its BatchNorm running statistics are measured on random N(0, 1) images (a fresh network's are
0 and 1, which leaves 50-120 layers without normalisation in eval mode: MobileNetV2's and
EfficientNet's activations fell to 1e-9..1e-14 at the output, Inception-v3's rose to 1e12), so the
weights look like a trained network's as far as scale goes. Then, in eval mode, batch 1, it is
exported with the exporter's defaults (dynamo, its default opset; whether BatchNorm is folded into
the convolutions is the exporter's choice and is kept).
`stages.extract.weights.strip_weights` then keeps each float initializer's shape, dtype and
statistics only, so a model is a few hundred KB; `fill_weights` gives it seeded weights back.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import onnx
import torch
import torchvision

# The repo's module by its path: importing the `stages` package would need tunaflow's dependencies.
_spec = importlib.util.spec_from_file_location(
    "weights", Path(__file__).resolve().parents[2] / "stages" / "extract" / "weights.py")
weights = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(weights)

# name -> (constructor keyword arguments, input height = width)
MODELS: dict[str, tuple[dict, int]] = {
    "resnet50": ({}, 224),
    "mobilenet_v2": ({}, 224),
    "efficientnet_b0": ({}, 224),
    "densenet121": ({}, 224),
    "inception_v3": ({"aux_logits": False, "init_weights": True}, 299),
    "convnext_tiny": ({}, 224),
    "shufflenet_v2_x0_5": ({}, 224),
    "regnet_y_400mf": ({}, 224),
    "mobilenet_v3_small": ({}, 224),
    "squeezenet1_1": ({}, 224),
    "vit_b_16": ({}, 224),
}


def calibrate_batchnorm(model: torch.nn.Module, size: int, batches: int = 4, batch: int = 8) -> None:
    """Set every BatchNorm's running mean and variance to its input's over random images (the rest in eval
    mode, so EfficientNet's stochastic depth drops nothing)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
        m.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, 3, size, size))
    model.eval()


def export(name: str, out: Path, seed: int = 0) -> Path:
    """Export one model to OUT/<name>.onnx without its weights."""
    kwargs, size = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(weights=None, **kwargs).eval()
    if name.startswith("vit_"):  # torchvision zero-initialises ViT's head: every logit would be 0
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    calibrate_batchnorm(model, size)
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        program = torch.onnx.export(model, (x,), dynamo=True)
    proto = weights.strip_weights(program.model_proto)
    proto.graph.name = name
    path = out / f"{name}.onnx"
    onnx.save(proto, path)
    return path


def run(models: dict, export_one, description: str) -> None:
    """The exporters' command line: --models (default all) and --out (default this folder)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", nargs="+", choices=sorted(models), default=list(models))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        start = time.perf_counter()
        path = export_one(name, args.out)
        print(f"{name}: {path} ({path.stat().st_size / 1024:.0f} KB) in {time.perf_counter() - start:.1f} s")


def main() -> None:
    run(MODELS, export, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
