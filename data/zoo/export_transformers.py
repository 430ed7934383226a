"""Write the weightless transformer zoo: Hugging Face BERT and GPT-2 (2 layers each) as torch.onnx.export writes them.

Run from the repository root, in the export venv (torch and transformers never enter `.venv` or `make test`):

    .venv-export/bin/pip install torch==2.14.1 transformers onnx onnxscript
    .venv-export/bin/python data/zoo/export_transformers.py [--models bert_2l gpt2_2l_classic ...] [--out data/zoo]

Each model is `BertModel` / `GPT2Model` from its default config with 2 layers (BERT-base and GPT-2 small
otherwise: 768 wide, 12 heads, their vocabularies), built with random weights after `torch.manual_seed(0)`
(nothing is downloaded), in eval mode, called as a user would: `input_ids` and `attention_mask`, both int64.
Both exporters are kept, as they write the attention mask differently (dynamo: GatherND and And; classic:
Gather, Flatten, And, Expand): the dynamo export has the static shape [1, seq]; the classic one
has dynamic axes `batch` and `sequence`, bound at import (`--input-shape batch=1 --input-shape sequence=128`).
BERT's outputs are the last hidden state and the pooled output, GPT-2's the last hidden state (no cache).
`stages.extract.weights.strip_weights` then keeps each float initializer's shape, dtype and statistics only.
"""

from __future__ import annotations

from pathlib import Path

import export as zoo  # this folder's torchvision exporter: its command line and the repo's weights module
import onnx
import torch

weights = zoo.weights

# name -> (architecture, sequence length, exporter)
MODELS: dict[str, tuple[str, int, str]] = {
    "bert_2l": ("bert", 128, "dynamo"),
    "bert_2l_classic": ("bert", 128, "classic"),
    "gpt2_2l": ("gpt2", 64, "dynamo"),
    "gpt2_2l_classic": ("gpt2", 64, "classic"),
}
INPUTS = ("input_ids", "attention_mask")


class Wrapped(torch.nn.Module):
    """The model called with token ids and a mask; its outputs as a plain tuple (no cache)."""

    def __init__(self, model: torch.nn.Module, gpt2: bool):
        super().__init__()
        self.model, self.extra = model, {"use_cache": False} if gpt2 else {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.model(input_ids=input_ids, attention_mask=attention_mask, **self.extra).values())


def build(arch: str) -> torch.nn.Module:
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    model = BertModel(BertConfig(num_hidden_layers=2)) if arch == "bert" else GPT2Model(GPT2Config(n_layer=2))
    return Wrapped(model.eval(), arch == "gpt2").eval()


def export(name: str, out: Path, seed: int = 0) -> Path:
    """Export one model to OUT/<name>.onnx without its weights."""
    arch, seq, exporter = MODELS[name]
    torch.manual_seed(seed)
    model = build(arch)
    ids = torch.randint(0, 1000, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.int64)
    path = out / f"{name}.onnx"
    with torch.no_grad():
        if exporter == "dynamo":
            proto = torch.onnx.export(model, (ids, mask), dynamo=True).model_proto
        else:
            axes = {n: {0: "batch", 1: "sequence"} for n in INPUTS}
            torch.onnx.export(model, (ids, mask), path, dynamo=False, input_names=list(INPUTS), dynamic_axes=axes,
                              opset_version=17)
            proto = onnx.load(path)
    proto = weights.strip_weights(proto)
    proto.graph.name = name
    onnx.save(proto, path)
    return path


def main() -> None:
    zoo.run(MODELS, export, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
