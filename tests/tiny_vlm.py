"""Tiny random Qwen vision-language models built locally (no hub): image+text prompts on both engines, on CPU.

`build_vlm(folder, arch)` writes a normal HF model folder -- config.json, model.safetensors, a BPE
tokenizer trained here (with Qwen's chat/vision special tokens), a chat template that places the
image, and the processor configs (preprocessor_config.json, video_preprocessor_config.json) -- that
transformers (`AutoProcessor`, `<Arch>ForConditionalGeneration`) and vLLM 0.32 (same class names) load
through their normal code paths. arch: "qwen2_vl" (default), "qwen2_5_vl", "qwen3_vl"; all three were
checked token-for-token against vLLM on CPU.

Sizes: text hidden 128 x 2 layers (4 heads, 2 KV heads, head_dim 32, mrope), vision width 64 x depth 2,
patch 14 (Qwen3-VL: 16), spatial merge 2 -- a 112x84 image is 12 image tokens. Weights are scaled up
(initializer_range, as in tests/tiny_models.py) so greedy near-ties are rare in float32.

The video processor: transformers 5.x builds one for every Qwen-VL processor, and every real video
processor needs torchvision. With torchvision (the GPU machine) the folder names the real one
(Qwen2VLVideoProcessor / Qwen3VLVideoProcessor) and nothing else is needed. Without it (this CPU
environment: scripts/setup.sh removes PyPI's CUDA torchvision, which breaks `import vllm` next to
torch+cpu) the folder ships a stand-in instead (VIDEO_STUB_SOURCE), so:
  * loading the processor needs trust_remote_code=True (HF and vLLM) -- `needs_remote_code(folder)`;
  * the process that starts vLLM needs `write_vllm_cpu_shim(dir)` on PYTHONPATH (see SHIM_SOURCE).
Nothing here looks anything up on the network: every load is local_files_only (a test checks it with
the sockets refused).
Comparing engines: give vLLM the prompt with ONE <|image_pad|> per image (text, or token ids) plus the
image; vLLM expands it itself. Token ids that are already expanded (HF's input_ids) get expanded again,
silently. Pass the same min_pixels/max_pixels to both sides, in the same form.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Qwen2-VL's special tokens (same strings as the real model; ids are ours).
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2-VL's chat template, trimmed: a string content is plain text; a list content may hold
# {"type": "image"} (or "image"/"image_url" keys) parts, rendered as <|vision_start|><|image_pad|><|vision_end|>
# -- the processor then expands the single <|image_pad|> to one per merged patch.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# arch -> (HF and vLLM share the class name) model class, config class, processor class
ARCHS = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
         "qwen3_vl": "Qwen3VLForConditionalGeneration"}
CONFIGS = {"qwen2_vl": "Qwen2VLConfig", "qwen2_5_vl": "Qwen2_5_VLConfig", "qwen3_vl": "Qwen3VLConfig"}
PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}

# The stand-in video processor, for environments without torchvision (see the module docstring). Found
# through auto_map in video_preprocessor_config.json, so loading the processor then needs
# trust_remote_code=True. ProcessorMixin.__init__ type-checks the video_processor argument against a
# class it looks up on the transformers module, and without torchvision that class is unusable:
#   * transformers >= 5.18 checks VideoProcessorMixin (torchvision-free, but not exported then);
#   * transformers 5.17 checks BaseVideoProcessor (there only as a torchvision dummy then).
# The stand-in derives from what exists and puts itself (or the mixin) where the check looks, only
# when that name is missing or a dummy. It carries the sizes vLLM reads; calling it (videos) raises.
VIDEO_STUB_MODULE = "tiny_vlm_video"
VIDEO_STUB_SOURCE = '''"""Stand-in video processor for a test model: images only, no torchvision needed."""
import transformers
from transformers.processing_utils import VideosKwargs

try:  # transformers >= 5.18
    from transformers.video_processing_utils import VideoProcessorMixin as _Base
    _CHECKED = "VideoProcessorMixin"
except ImportError:  # transformers 5.17: no mixin; the check names BaseVideoProcessor
    from transformers.image_processing_utils import BaseImageProcessor as _Base
    _CHECKED = "BaseVideoProcessor"


class NoVideoProcessor(_Base):
    valid_kwargs = VideosKwargs
    model_input_names = ["pixel_values_videos", "video_grid_thw"]
    patch_size = 14
    temporal_patch_size = 2
    merge_size = 2
    min_pixels = 128 * 28 * 28
    max_pixels = 768 * 28 * 28
    size = {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        return cls()

    def __call__(self, *args, **kwargs):
        raise NotImplementedError("this test model's processor has no video support (no torchvision)")

    def preprocess(self, *args, **kwargs):
        raise NotImplementedError("this test model's processor has no video support (no torchvision)")


# Runs when this module is loaded, i.e. before the processor is constructed.
_current = getattr(transformers, _CHECKED, None)
if _current is None or type(_current).__name__ == "DummyObject":
    setattr(transformers, _CHECKED, _Base if _CHECKED == "VideoProcessorMixin" else NoVideoProcessor)
'''

# arch -> the real video processor class (used when torchvision is installed)
VIDEO_PROCESSORS = {"qwen2_vl": "Qwen2VLVideoProcessor", "qwen2_5_vl": "Qwen2VLVideoProcessor",
                    "qwen3_vl": "Qwen3VLVideoProcessor"}


def torchvision_available() -> bool:
    """Whether transformers will use torchvision here (its own test, so the two always agree)."""
    from transformers.utils import is_torchvision_available

    return bool(is_torchvision_available())


def needs_remote_code(folder: Path) -> bool:
    """Whether the model in `folder` ships the stand-in video processor, so that loading its processor
    (HF's AutoProcessor, vLLM's LLM) needs trust_remote_code=True."""
    return (Path(folder) / f"{VIDEO_STUB_MODULE}.py").is_file()


# vLLM 0.32's qwen2_vl.py (and qwen2_5_vl / qwen3_vl, which import it) does
#   from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
# and that transformers module imports torchvision at its top, so without torchvision vLLM cannot even
# import the model class (its registry inspects it in a fresh `python -m` subprocess, too). PyPI's
# torchvision is a CUDA build that fails against torch+cpu ("operator torchvision::nms does not exist").
# This sitecustomize, put on PYTHONPATH for the vLLM process *and its subprocesses*, serves that one
# module from its torchvision-free twin image_processing_pil_qwen2_vl (same smart_resize, "Copied from")
# -- only when torchvision is missing. transformers' own image-processor choice is untouched (it falls
# back to Qwen2VLImageProcessorPil by itself).
SHIM_SOURCE = '''"""Test shim: transformers.models.qwen2_vl.image_processing_qwen2_vl without torchvision."""
import importlib.abc
import importlib.util
import sys

_TARGET = "transformers.models.qwen2_vl.image_processing_qwen2_vl"


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

        module.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
        module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        try:
            import torchvision  # noqa: F401
            return None                     # the real module works: leave it alone
        except ImportError:
            return importlib.util.spec_from_loader(name, _Loader())


if not any(type(f).__name__ == "_Finder" and getattr(f, "_tiny_vlm", False) for f in sys.meta_path):
    _f = _Finder()
    _f._tiny_vlm = True
    sys.meta_path.insert(0, _f)
'''


def write_vllm_cpu_shim(folder: Path) -> Path:
    """Write the no-torchvision shim as `folder/sitecustomize.py` and return `folder`: put it first on
    PYTHONPATH of the process that starts vLLM (subprocesses inherit it). A process already running can
    also `sys.path.insert(0, str(folder)); import sitecustomize` -- but vLLM's registry subprocess still
    needs PYTHONPATH."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SHIM_SOURCE)
    return folder


def build_vlm_tokenizer(folder: Path, vocab_size: int = 1024) -> Any:
    """Byte-level BPE trained on stdlib sources (as tiny_models.build_tokenizer) but Qwen-style:
    Qwen's special tokens, NO bos and no post-processor (so `add_special_tokens=True` adds nothing
    and text-vs-ids tokenization agree on both engines), eos <|im_end|>, pad <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tiny_models import _corpus  # type: ignore[import-not-found]  # tests/ is on sys.path

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=QWEN_SPECIALS[1:])
    fast.chat_template = VLM_CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def _mrope_section(head_dim: int, arch: str) -> list[int]:
    """mrope splits the rotary half-dim over (t, h, w): real Qwen2/2.5-VL [16,24,24], Qwen3-VL [24,20,20]
    of 64; scaled here to head_dim/2."""
    half = head_dim // 2
    if arch == "qwen3_vl":
        hw = 5 * half // 16
        return [half - 2 * hw, hw, hw]
    hw = 3 * half // 8
    return [half - 2 * hw, hw, hw]


def build_vlm(folder: Path, arch: str = "qwen2_vl", seed: int = 0, *, init_range: float = 0.15,
              vision_init_range: float = 0.05, hidden_size: int = 128, num_hidden_layers: int = 2,
              vision_embed_dim: int = 64, vision_depth: int = 2, min_pixels: int = 56 * 56,
              max_pixels: int = 224 * 224, max_position_embeddings: int = 4096) -> Path:
    """Build a tiny random vision-language model of `arch` ("qwen2_vl", "qwen2_5_vl" or "qwen3_vl")
    into `folder` (float32) and return it.

    min_pixels / max_pixels are the image processor's defaults saved in preprocessor_config.json;
    callers that compare engines should still pass them explicitly to both sides (the same way)."""
    import torch
    import transformers
    from transformers import AutoProcessor

    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r}: one of {sorted(ARCHS)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_vlm_tokenizer(folder)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}

    heads = 4
    head_dim = hidden_size // heads
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 1000000.0,
                            "mrope_section": _mrope_section(head_dim, arch)}
    if arch == "qwen3_vl":
        rope["mrope_interleaved"] = True
    text_config: dict[str, Any] = dict(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=heads, num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-6, hidden_act="silu",
        initializer_range=init_range, rope_parameters=rope,
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=False,
    )
    common_vision = dict(depth=vision_depth, num_heads=4, in_channels=3, spatial_merge_size=2,
                         temporal_patch_size=2, initializer_range=vision_init_range)
    if arch == "qwen2_vl":
        text_config.update(use_sliding_window=False, max_window_layers=num_hidden_layers, bos_token_id=None)
        vision_config = dict(common_vision, embed_dim=vision_embed_dim, hidden_size=hidden_size,
                             hidden_act="quick_gelu", mlp_ratio=2, patch_size=14)
        patch = 14
    elif arch == "qwen2_5_vl":
        text_config.update(use_sliding_window=False, max_window_layers=num_hidden_layers, bos_token_id=None)
        # window_size 56 px = 2x2 merged tokens per window; the last block attends over the full image
        vision_config = dict(common_vision, hidden_size=vision_embed_dim, intermediate_size=2 * vision_embed_dim,
                             out_hidden_size=hidden_size, hidden_act="silu", patch_size=14, window_size=56,
                             fullatt_block_indexes=[vision_depth - 1], tokens_per_second=2)
        patch = 14
    else:  # qwen3_vl: learned 2-D position grid (8x8, interpolated) + deepstack from vision block 0
        text_config.update(head_dim=head_dim)
        vision_config = dict(common_vision, hidden_size=vision_embed_dim, intermediate_size=2 * vision_embed_dim,
                             out_hidden_size=hidden_size, hidden_act="gelu_pytorch_tanh", patch_size=16,
                             num_position_embeddings=64, deepstack_visual_indexes=[0])
        patch = 16
    config_cls = getattr(transformers, CONFIGS[arch])
    cfg = config_cls(
        text_config=text_config, vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    cfg.initializer_range = init_range
    cfg.architectures = [ARCHS[arch]]
    torch.manual_seed(seed)
    model = getattr(transformers, ARCHS[arch])(cfg).to(torch.float32).eval()
    model.save_pretrained(folder)
    gen = {"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"], "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))

    # Processor files, written by hand: preprocessor_config.json (the image processor, which falls back
    # to Qwen2VLImageProcessorPil without torchvision), the chat template, and the video processor.
    mean, std = (([0.5] * 3, [0.5] * 3) if arch == "qwen3_vl" else
                 ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]))
    pre = {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": PROCESSORS[arch],
        "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": mean, "image_std": std, "do_convert_rgb": True,
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        "patch_size": patch, "temporal_patch_size": 2, "merge_size": 2,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    (folder / "chat_template.jinja").write_text(VLM_CHAT_TEMPLATE)
    write_video_processor(folder, arch, patch, mean, std)
    # Fail here if the folder is incomplete; local files only: nothing may be looked up on the network.
    AutoProcessor.from_pretrained(folder, trust_remote_code=needs_remote_code(folder), local_files_only=True)
    return folder


def write_video_processor(folder: Path, arch: str, patch: int, mean: list[float], std: list[float],
                          stand_in: bool | None = None) -> None:
    """video_preprocessor_config.json: the real video processor when torchvision is installed, else
    the stand-in module beside it (`stand_in` forces one or the other; None: decide by torchvision)."""
    folder = Path(folder)
    if stand_in is None:
        stand_in = not torchvision_available()
    stub = folder / f"{VIDEO_STUB_MODULE}.py"
    common = {"processor_class": PROCESSORS[arch], "patch_size": patch, "temporal_patch_size": 2, "merge_size": 2}
    if stand_in:
        stub.write_text(VIDEO_STUB_SOURCE.replace("patch_size = 14", f"patch_size = {patch}"))
        video = {"video_processor_type": "NoVideoProcessor", **common,
                 "auto_map": {"AutoVideoProcessor": f"{VIDEO_STUB_MODULE}.NoVideoProcessor"}}
    else:
        stub.unlink(missing_ok=True)
        video = {"video_processor_type": VIDEO_PROCESSORS[arch], **common, "do_resize": True, "do_rescale": True,
                 "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": mean, "image_std": std,
                 "do_convert_rgb": True, "size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}}
    (folder / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
