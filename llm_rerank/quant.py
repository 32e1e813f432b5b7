"""W8A8 int8 serving after SmoothQuant (Xiao et al. 2023), calibrated offline on real prompts.

Activations of an LLM have a few outlier channels that make per-token int8 lossy; weights
are easy to quantise. SmoothQuant moves the difficulty: per input channel j,
``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)``, X is divided by s and W multiplied by s, which
leaves the product unchanged. The division is folded into the op that produced X, so the
calibrated model is an ordinary checkpoint with different numbers:

- q/k/v_proj: into ``input_layernorm.weight``; gate/up_proj: into the norm that feeds the MLP
  (``post_attention_layernorm`` in Llama/SmolLM2 and Qwen2, ``pre_feedforward_layernorm`` in
  Gemma 3, whose ``post_attention_layernorm`` normalises the attention output instead);
- down_proj: into the rows of ``up_proj`` (act(gate) * up is linear in up's output).
Gemma's RMSNorm scales by ``1 + weight``, so a factor is folded as ``(1 + w) / s - 1``.
``o_proj`` is left unsmoothed (its input mixes grouped heads; folding would need per-head
care) and is quantised plainly. Qwen2's q/k/v biases are untouched by smoothing (they add to
the output) and carried by the int8 GEMM in fp32.

``calibrate`` -> ``save_calibrated`` writes the folded model + ``calibration.json``;
``load_w8a8`` loads it, replaces every decoder ``nn.Linear`` by ``W8A8Linear`` (int8 weights per
output channel, activations quantised per token at run time, int8 x int8 -> int32 through
``torch._int_mm``, i.e. oneDNN VNNI on x86) and keeps the rest (embeddings, norms, attention,
lm_head) in fp32: the int8 GEMMs take and give fp32, so an fp32 remainder needs no dtype
conversion around them, and attention (the other large cost) runs as fast in fp32 as in bf16 on
these CPUs. Measured side by side on ML-100K prompts (526 tokens, 2 cores): bf16 remainder
465 ms, fp32 remainder 420-436 ms, all-bf16 model 566 ms (``rest_dtype`` selects).

Deliberately left out: static activation scales, int8 KV cache, the torchao/pt2e compiled paths
(compile time on 2 shared cores is minutes; see ``recsys bench llm`` for measured speeds).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch  # this module is imported only for precision 'int8'

CALIBRATION_FILE = "calibration.json"
METHOD = "smoothquant-w8a8-int8"


def quantise_tokens(x: torch.Tensor, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [tokens, in_features], fp32 per-token scales [tokens, 1]): symmetric, dynamic per token."""
    xf = x.reshape(-1, in_features).float()
    amax = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-8)
    # a multiply by 127/amax, not a divide by amax/127: |x| * 127/amax <= 127 needs no clamp, and the
    # broadcast divide measured 12x slower at 1536 features (2.1 ms vs 0.17 ms for 526 tokens)
    return (xf * (127.0 / amax)).round_().to(torch.int8), amax / 127.0


def quantise_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [in, out] view of the [out, in] weight, fp32 scale per output channel)."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.t(), scale  # [N, K] contiguous seen as [K, N]: the layout oneDNN's int8 GEMM prefers


def int8_product(xq: torch.Tensor, xscale: torch.Tensor, qweight_t: torch.Tensor, wscale: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """fp32 ``(xq @ qweight_t) * xscale * wscale (+ bias)`` through ``torch._int_mm``."""
    y = torch._int_mm(xq, qweight_t).float().mul_(xscale).mul_(wscale)
    return y.add_(bias) if bias is not None else y


class SharedActQuant:
    """Per-token int8 quantisation of one activation, reused by the projections that read it.

    q/k/v_proj (and gate/up_proj) receive the very same tensor object; quantising it once
    instead of three (two) times removes most of the eager-mode W8A8 overhead. Identity is the
    key: HF modules never modify a layer input in place between the projections that read it.
    """

    def __init__(self) -> None:
        self._x: torch.Tensor | None = None  # held, so its id cannot be reused while cached
        self._value: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, x: torch.Tensor, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 [tokens, in_features], fp32 per-token scales [tokens, 1]) of ``x``."""
        if x is not self._x or self._value is None:
            self._value, self._x = quantise_tokens(x, in_features), x
        return self._value

    def clear(self) -> None:
        self._x, self._value = None, None


class W8A8Linear(torch.nn.Module):
    """y = (q(x) @ Wq) * scale_x * scale_w (+ b), q = symmetric int8; weight per out channel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, quant: SharedActQuant | None = None,
                 release: bool = True):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # plain attributes, so model.to(bf16) leaves them in int8 / fp32
        self.qweight_t, self.wscale = quantise_weight(weight)
        self.bias_f = None if bias is None else bias.detach().float()
        self.quant = quant or SharedActQuant()
        self.release = release  # the last reader of a shared input drops it (no activations held)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, quant: SharedActQuant | None = None,
                    release: bool = True) -> W8A8Linear:
        return cls(linear.weight, linear.bias, quant, release)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xq, xscale = self.quant(x, self.in_features)
        if self.release:
            self.quant.clear()
        y = int8_product(xq, xscale, self.qweight_t, self.wscale, self.bias_f)
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)


class FusedW8A8(torch.nn.Module):
    """Projections that read one input (q/k/v, gate/up) as one int8 GEMM over their stacked weights.

    vLLM merges them the same way (QKVParallelLinear, MergedColumnParallelLinear): one
    quantisation of the input, one ``torch._int_mm`` and one dequantisation instead of three
    (two), which is what eager W8A8 pays for at small token counts. Weight scales stay per
    output channel, so the numbers equal those of separate ``W8A8Linear`` modules. The first
    member to run computes the whole product for that input object; each member returns its
    column slice, and the last one drops the cached product.
    """

    def __init__(self, linears: Sequence[torch.nn.Linear]):
        super().__init__()
        self.in_features = linears[0].in_features
        # per-output-channel scales: quantising the stacked weight equals quantising each part
        qweight_t, self.wscale = quantise_weight(torch.cat([lin.weight for lin in linears]))
        self.qweight_t = qweight_t.contiguous()
        biases = [lin.bias.detach().float() if lin.bias is not None else torch.zeros(lin.out_features)
                  for lin in linears]
        self.bias_f = None if all(lin.bias is None for lin in linears) else torch.cat(biases)
        self.bounds = [0]
        for lin in linears:
            self.bounds.append(self.bounds[-1] + lin.out_features)
        self._x: torch.Tensor | None = None
        self._y: torch.Tensor | None = None

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if x is not self._x or self._y is None:
            xq, xscale = quantise_tokens(x, self.in_features)
            y = int8_product(xq, xscale, self.qweight_t, self.wscale, self.bias_f)
            self._x, self._y = x, y.to(x.dtype)
        lo, hi = self.bounds[index], self.bounds[index + 1]
        out = self._y[:, lo:hi].reshape(*x.shape[:-1], hi - lo)  # a contiguous copy: HF calls .view on it
        if index == len(self.bounds) - 2:
            self._x, self._y = None, None
        return out


class FusedSlice(torch.nn.Module):
    """One member of a ``FusedW8A8`` group, in the place of the original ``nn.Linear``."""

    def __init__(self, group: FusedW8A8, index: int):
        super().__init__()
        self.group = [group]  # a list, so the shared group is not registered once per member
        self.index = index
        self.out_features = group.bounds[index + 1] - group.bounds[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group[0].output(x, self.index)


def _layers(model: Any) -> list[Any]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: expected a Llama/Qwen2/Gemma3-style model.model.layers")
    return list(layers)


def activation_maxima(model: Any, prompts: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Per linear module name, max |input| per input channel over all calibration tokens."""
    stats: dict[str, Any] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}":
            def hook(m: Any, args: tuple[Any, ...], _out: Any, key: str = name) -> None:
                cur = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0).float()
                stats[key] = cur if key not in stats else torch.maximum(stats[key], cur)
            hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            for ids in prompts:
                model(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    if not stats:
        raise ValueError("activation_maxima: no decoder linear layer saw any input (empty prompts?)")
    return stats


def _smooth(act_max: Any, linears: Sequence[Any], alpha: float) -> Any:
    w_max = torch.cat([lin.weight.detach().abs().float() for lin in linears], dim=0).amax(dim=0)
    s = act_max.clamp(min=1e-5).pow(alpha) / w_max.clamp(min=1e-5).pow(1 - alpha)
    s = s.clamp(min=1e-5)
    with torch.no_grad():
        for lin in linears:
            lin.weight.mul_(s.to(lin.weight.dtype)[None, :])
    return s


# RMSNorms that scale by (1 + weight) instead of weight (Gemma's; transformers' class names)
UNIT_OFFSET_NORMS = frozenset({"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"})


def mlp_input_norm(layer: Any) -> Any:
    """The norm whose output gate/up_proj read: Gemma 3's pre-feedforward norm, else Llama's post-attention one."""
    norm = getattr(layer, "pre_feedforward_layernorm", None)
    return norm if norm is not None else layer.post_attention_layernorm


def _fold_into_norm(norm: Any, s: Any) -> None:
    """Divide the norm's effective scale by ``s`` (in place): ``w / s``, or ``(1 + w) / s - 1`` for Gemma's."""
    w = norm.weight
    if type(norm).__name__ in UNIT_OFFSET_NORMS:
        w.copy_(((1.0 + w.float()) / s - 1.0).to(w.dtype))
    else:
        w.div_(s.to(w.dtype))


def calibrate(model: Any, prompts: Sequence[Sequence[int]], alpha: float = 0.5) -> dict[str, Any]:
    """Fold SmoothQuant factors into ``model`` (fp32, in place); return the calibration record."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"calibrate: alpha must be in [0, 1], got {alpha}")
    if not prompts:
        raise ValueError("calibrate: need at least one calibration prompt")
    t0 = time.perf_counter()
    stats = activation_maxima(model, prompts)
    prefix = "model.layers"
    with torch.no_grad():
        for i, layer in enumerate(_layers(model)):
            attn, mlp = layer.self_attn, layer.mlp
            s = _smooth(stats[f"{prefix}.{i}.self_attn.q_proj"], [attn.q_proj, attn.k_proj, attn.v_proj], alpha)
            _fold_into_norm(layer.input_layernorm, s)
            s = _smooth(stats[f"{prefix}.{i}.mlp.gate_proj"], [mlp.gate_proj, mlp.up_proj], alpha)
            _fold_into_norm(mlp_input_norm(layer), s)
            s = _smooth(stats[f"{prefix}.{i}.mlp.down_proj"], [mlp.down_proj], alpha)
            mlp.up_proj.weight.div_(s.to(mlp.up_proj.weight.dtype)[:, None])
            if mlp.up_proj.bias is not None:
                mlp.up_proj.bias.div_(s.to(mlp.up_proj.bias.dtype))
    return {"method": METHOD, "alpha": alpha, "prompts": len(prompts),
            "tokens": int(sum(len(p) for p in prompts)), "layers": len(_layers(model)),
            "smoothed": ["q_proj,k_proj,v_proj", "gate_proj,up_proj", "down_proj"],
            "seconds": time.perf_counter() - t0}


def save_calibrated(model: Any, tokenizer: Any, record: dict[str, Any], out_dir: Path | str,
                    source: str = "") -> Path:
    """Write the smoothed model, its tokenizer and ``calibration.json`` to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / CALIBRATION_FILE).write_text(json.dumps({**record, "source": source}, indent=2))
    return out


def read_calibration(location: Path | str) -> dict[str, Any]:
    path = Path(location) / CALIBRATION_FILE
    if not path.exists():
        raise FileNotFoundError(f"{location}: no {CALIBRATION_FILE}; precision 'int8' needs a SmoothQuant-"
                                "calibrated model (llm_rerank.quant.calibrate + save_calibrated, or "
                                "`recsys bench llm`, which writes one)")
    record = json.loads(path.read_text())
    if record.get("method") != METHOD:
        raise ValueError(f"{path}: method {record.get('method')!r}, expected {METHOD!r}")
    return record


def quantize_w8a8(model: Any, fuse: bool = True) -> int:
    """Replace every decoder-layer ``nn.Linear`` by an int8 one (in place); return how many.

    ``fuse``: q/k/v and gate/up become ``FusedSlice`` members of one ``FusedW8A8`` GEMM each
    (HF calls them in that order on the same input); otherwise each is a ``W8A8Linear`` and
    the group only shares the activation quantisation.
    """
    count = 0
    groups = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # projections sharing one input
    for layer in _layers(model):
        for parent in (layer.self_attn, layer.mlp):
            children = dict(parent.named_children())
            for group in groups:
                if fuse and all(isinstance(children.get(n), torch.nn.Linear) for n in group):
                    fused = FusedW8A8([children[n] for n in group])
                    for i, n in enumerate(group):
                        setattr(parent, n, FusedSlice(fused, i))
                        count += 1
            shared = {name: SharedActQuant() for name in ("qkv", "gate_up")}
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    group_name = "qkv" if name in groups[0] else "gate_up" if name in groups[1] else None
                    quant = shared[group_name] if group_name else None
                    last = name in ("v_proj", "up_proj") or group_name is None  # HF calls q, k, v and gate, up in order
                    setattr(parent, name, W8A8Linear.from_linear(child, quant, release=last))
                    count += 1
    return count


REST_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_w8a8(location: str, rest_dtype: str = "fp32") -> tuple[Any, Any, dict[str, Any]]:
    """(W8A8 model in eval mode, tokenizer, calibration record); ``rest_dtype`` for the non-int8 rest."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: imports transformers (and torch)

    if rest_dtype not in REST_DTYPES:
        raise ValueError(f"load_w8a8: rest_dtype must be one of {sorted(REST_DTYPES)}, got {rest_dtype!r}")
    record = read_calibration(location)
    model = AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32)
    record["quantized_linears"] = quantize_w8a8(model)
    record["rest_dtype"] = rest_dtype
    model = model.to(dtype=REST_DTYPES[rest_dtype]).eval()  # type: ignore[call-arg]  # transformers types .to oddly
    return model, AutoTokenizer.from_pretrained(location), record
