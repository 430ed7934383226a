"""Write more of the weightless zoo: models users brought that the zoo lacked, exported as they export them.

Run from the repository root, in the export venv (torch and transformers never enter `.venv` or `make test`):

    .venv-export/bin/python data/zoo/export_more.py [--models swin_t llama_2l ...] [--out data/zoo]

What each adds to the correctness net: torchvision's Swin-T (shifted windows: Slice/Concat rolls, a mask built
by constant ScatterNDs), MaxViT-T (Einsum attention, MBConv SE gates) and LR-ASPP MobileNetV3-Large (segmentation:
bilinear Resize), at 224x224; from Hugging Face configs (nothing downloaded; 2 layers where the config has layers)
wav2vec2 (1-D convs, GroupNorm, the positional conv's weight norm: ReduceL2) on 1 s of 16 kHz audio, a small Llama
(RMSNorm, rotary embeddings, grouped-query attention, SwiGLU; 256 wide, 8 heads, 2 KV heads, vocabulary 1000),
T5's encoder (relative position bias; 256 wide, 4 heads), Whisper-tiny's encoder (80x3000 log-mel frames),
MobileViT-S (256x256: convs and transformers on unfolded patches) and DistilBERT.
Each is called with keyword inputs, as users call it (text models with `input_ids` and `attention_mask`, int64,
64 tokens, the last quarter padding), and its outputs keep their names (`last_hidden_state`).

As in export.py: random weights after `torch.manual_seed(0)`, BatchNorm statistics measured on random images, eval
mode, batch 1, `torch.onnx.export(dynamo=True)` with its defaults, then `stages.extract.weights.strip_weights`; the
nodes' stack traces are dropped. Two departures keep the models `fill_weights` draws at a sane scale: BatchNorm
variances are taken about zero (`_image`), and MobileViT's BatchNorm scales start at 1 (`_mobilevit`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path

import export as zoo  # this folder's torchvision exporter: its command line, BatchNorm calibration, weights module
import onnx
import torch
import torchvision

weights = zoo.weights
SEQ = 64
STACK_TRACE = "pkg.torch.onnx.stack_trace"
Example = tuple[torch.nn.Module, dict[str, torch.Tensor]]


class Wrapped(torch.nn.Module):
    """The model called with keyword inputs and fixed options, its outputs a plain tuple (the exporter takes
    neither torchvision's dict nor Hugging Face's ModelOutput)."""

    def __init__(self, model: torch.nn.Module, names: list[str], **options: object):
        super().__init__()
        self.model, self.names, self.options = model, names, options
        self.eval()

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor:
        out = self.model(**dict(zip(self.names, inputs, strict=True)), **self.options)
        return tuple(out.values()) if isinstance(out, Mapping) else out


def _image(model: torch.nn.Module, name: str, size: int) -> Example:
    """An image model, BatchNorm calibrated on random images, each variance taken about zero (plus the mean
    squared): `fill_weights` redraws a conv's weights and the bias folded from its BatchNorm independently, so the
    bias stops cancelling its channel's mean, and normalised by the variance alone each layer grew ~1.3x (LR-ASPP's
    output to 1e3: its SE gates and head sigmoid saw pre-activations of hundreds, and onnxruntime's own two kernel
    sets disagreed by 1.4e-3 of the output; about zero, 200 and 3e-5)."""
    zoo.calibrate_batchnorm(model.eval(), size)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_var += m.running_mean**2
    return Wrapped(model, [name]), {name: torch.randn(1, 3, size, size)}


def _torchvision(name: str, segmentation: bool = False) -> Example:
    if segmentation:
        model = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None)
    else:
        model = getattr(torchvision.models, name)(weights=None)
    return _image(model, next(iter(inspect.signature(model.forward).parameters)), 224)  # `x`, LR-ASPP's `input`


def _text(model: torch.nn.Module, **options: object) -> Example:
    """A text model fed token ids over its vocabulary and a mask whose last quarter is padding."""
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    mask[:, SEQ - SEQ // 4:] = 0
    feeds = {"input_ids": torch.randint(0, model.config.vocab_size, (1, SEQ)), "attention_mask": mask}
    return Wrapped(model, list(feeds), **options), feeds


def _wav2vec2() -> Example:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    return Wrapped(Wav2Vec2Model(Wav2Vec2Config(num_hidden_layers=2)), ["input_values"]), \
        {"input_values": torch.randn(1, 16000)}


def _llama() -> Example:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=688, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=1000)
    return _text(LlamaModel(config), use_cache=False)


def _t5_encoder() -> Example:
    from transformers import T5Config, T5EncoderModel

    return _text(T5EncoderModel(T5Config(num_layers=2, d_model=256, d_ff=1024, num_heads=4, d_kv=64)))


def _whisper_encoder() -> Example:
    from transformers import WhisperConfig, WhisperModel

    config = WhisperConfig(encoder_layers=2, decoder_layers=2, d_model=384, encoder_attention_heads=6,
                           decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536)
    return Wrapped(WhisperModel(config).get_encoder(), ["input_features"]), \
        {"input_features": torch.randn(1, 80, 3000)}


def _mobilevit() -> Example:
    from transformers import MobileViTConfig, MobileViTModel

    model = MobileViTModel(MobileViTConfig())
    for m in model.modules():  # HF draws BatchNorm scales like weights, N(0, 0.02): every layer's output was ~0.02,
        if isinstance(m, torch.nn.BatchNorm2d):  # SiLU's linear range (with fresh statistics, 1e-35 at the output)
            m.reset_parameters()  # torch's (1, 0)
    return _image(model, "pixel_values", 256)


def _distilbert() -> Example:
    from transformers import DistilBertConfig, DistilBertModel

    return _text(DistilBertModel(DistilBertConfig(n_layers=2)))


# name -> the model (wrapped) and its example inputs, built after torch.manual_seed(0)
MODELS: dict[str, Callable[[], Example]] = {
    "swin_t": lambda: _torchvision("swin_t"),
    "maxvit_t": lambda: _torchvision("maxvit_t"),
    "lraspp_mobilenet_v3_large": lambda: _torchvision("lraspp_mobilenet_v3_large", segmentation=True),
    "wav2vec2_2l": _wav2vec2,
    "llama_2l": _llama,
    "t5_encoder_2l": _t5_encoder,
    "whisper_encoder_2l": _whisper_encoder,
    "mobilevit_s": _mobilevit,
    "distilbert_2l": _distilbert,
}


def export(name: str, out: Path, seed: int = 0) -> Path:
    """Export one model to OUT/<name>.onnx without its weights."""
    torch.manual_seed(seed)
    model, feeds = MODELS[name]()
    args = tuple(feeds.values())
    with torch.no_grad():
        eager = model.model(**feeds, **model.options)  # the outputs' names: ModelOutput's fields, torchvision's keys
        names = list(eager) if isinstance(eager, Mapping) else None
        program = torch.onnx.export(model, args, dynamo=True, input_names=list(feeds), output_names=names)
    proto = weights.strip_weights(program.model_proto)
    for node in proto.graph.node:  # the stack traces: half of a file, and the paths of the machine that wrote it
        kept = [p for p in node.metadata_props if p.key != STACK_TRACE]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    proto.graph.name = name
    path = out / f"{name}.onnx"
    onnx.save(proto, path)
    return path


def main() -> None:
    zoo.run(MODELS, export, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
